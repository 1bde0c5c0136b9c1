//! The kubelet prepares many pods at once: 200 claims in 50 concurrent calls against the real
//! plugin, mixing whole GPUs, dynamic MIG devices, MPS and consumable-capacity shares, many of
//! them contending for the same device or overlapping placements — over one HTTP/2
//! connection (the kubelet's one gRPC client per plugin) and over several — then unprepared
//! in a different grouping and order.
//!
//! Invariants after the prepares: no device held twice except by shares, no two MIG instances
//! on overlapping memory slices, exactly one winner per contended exclusive device, MIG
//! instances and MPS daemons exactly what the successful claims need, and checkpoint and CDI
//! directory exactly the successful calls. After the unprepares: nothing at all.

mod plugin_support;

use std::collections::{BTreeMap, BTreeSet};

use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::{DraApi, connect_unix};
use gpu_dra::kubelet::proto::dra_v1::{
    self, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
    dra_plugin_client::DraPluginClient,
};
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{as_share, live_daemons, mps_config, with_config};
use plugin_support::{Node, Plugin};
use serde_json::json;
use tonic::transport::Channel;

const CLAIMS: usize = 200;
const CALLS: usize = 50;

/// What a claim asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    FullGpu,
    Mig,
    Mps,
    Share,
}

struct TestClaim {
    claim: ClaimRef,
    device: String,
    kind: Kind,
}

/// xorshift: deterministic, so a failure can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// 10 claims of whole GPU 6; 100 of dynamic MIG devices on GPUs 0–2 (1g.10gb at any slice,
/// and 3g.40gb pairs on GPU 2 that overlap them); 20 MPS claims of GPUs 3 and 5; 70
/// consumable-capacity shares of GPUs 4 and 7.
fn claim_set(rng: &mut Rng) -> Vec<TestClaim> {
    let mut out = Vec::with_capacity(CLAIMS);
    for i in 0..CLAIMS {
        let (kind, device) = match i {
            0..10 => (Kind::FullGpu, "gpu-6".to_string()),
            10..110 => {
                let gpu = rng.below(3);
                let device = if gpu == 2 && rng.below(4) == 0 {
                    format!("gpu-2-mig-3g40gb-{}", 4 * rng.below(2))
                } else {
                    format!("gpu-{gpu}-mig-1g10gb-{}", rng.below(7))
                };
                (Kind::Mig, device)
            }
            110..130 => (Kind::Mps, format!("gpu-{}", [3, 5][rng.below(2)])),
            _ => (Kind::Share, format!("gpu-{}", [4, 7][rng.below(2)])),
        };
        let name = format!("c{i}");
        out.push(TestClaim {
            claim: claim_ref(&name, &format!("uid-c{i}")),
            device,
            kind,
        });
    }
    out
}

fn put_claims(node: &Node, set: &[TestClaim]) {
    for (i, c) in set.iter().enumerate() {
        let claim = claims::on_node(&c.claim.name, &c.claim.uid, &[&c.device]);
        let claim = match c.kind {
            Kind::Mps => with_config(claim, &[], mps_config("GpuConfig", 50, "4Gi")),
            Kind::Share => as_share(
                claim,
                0,
                &format!("{i:08x}"),
                json!({"memory": "1Gi", "multiprocessors": "2"}),
            ),
            Kind::FullGpu | Kind::Mig => claim,
        };
        node.api.put_claim(claim);
    }
}

fn proto(c: &ClaimRef) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: c.namespace.clone(),
        uid: c.uid.clone(),
        name: c.name.clone(),
    }
}

/// `count` DRA clients: all on one connection, or each on its own.
async fn clients(node: &Node, count: usize, one_connection: bool) -> Vec<DraPluginClient<Channel>> {
    let shared = connect_unix(&node.dra_socket()).await.expect("connect");
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = if one_connection {
            shared.clone()
        } else {
            connect_unix(&node.dra_socket()).await.expect("connect")
        };
        out.push(DraPluginClient::new(channel));
    }
    out
}

/// Sends `groups` as concurrent NodePrepareResources calls; the per-claim outcomes.
async fn prepare_all(
    clients: Vec<DraPluginClient<Channel>>,
    groups: Vec<Vec<ClaimRef>>,
) -> BTreeMap<String, Result<(), String>> {
    let calls = clients.into_iter().zip(groups).map(|(mut client, group)| {
        tokio::spawn(async move {
            let request = NodePrepareResourcesRequest {
                claims: group.iter().map(proto).collect(),
            };
            let response = client.node_prepare_resources(request).await;
            let response = response.expect("the call itself succeeds").into_inner();
            assert_eq!(group.len(), response.claims.len(), "one answer per claim");
            response
                .claims
                .into_iter()
                .map(|(uid, answer)| {
                    let outcome = if answer.error.is_empty() {
                        assert_eq!(1, answer.devices.len(), "{uid}: one device");
                        Ok(())
                    } else {
                        Err(answer.error)
                    };
                    (uid, outcome)
                })
                .collect::<Vec<_>>()
        })
    });
    let mut out = BTreeMap::new();
    for call in futures_join(calls).await {
        out.extend(call);
    }
    out
}

async fn unprepare_all(clients: Vec<DraPluginClient<Channel>>, groups: Vec<Vec<ClaimRef>>) {
    let calls = clients.into_iter().zip(groups).map(|(mut client, group)| {
        tokio::spawn(async move {
            let request = NodeUnprepareResourcesRequest {
                claims: group.iter().map(proto).collect(),
            };
            let response = client.node_unprepare_resources(request).await;
            let response = response.expect("the call itself succeeds").into_inner();
            for (uid, answer) in response.claims {
                assert_eq!("", answer.error, "unprepare of {uid}");
            }
        })
    });
    futures_join(calls).await;
}

async fn futures_join<T: Send + 'static>(
    tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let handles: Vec<_> = tasks.collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.expect("a call task panicked"));
    }
    out
}

/// The claims in `CALLS` groups of four, in the order given.
fn grouped(set: &[&TestClaim]) -> Vec<Vec<ClaimRef>> {
    set.chunks(CLAIMS / CALLS)
        .map(|chunk| chunk.iter().map(|c| c.claim.clone()).collect())
        .collect()
}

fn check_prepared(
    node: &Node,
    plugin: &Plugin,
    set: &[TestClaim],
    results: &BTreeMap<String, Result<(), String>>,
    context: &str,
) {
    assert_eq!(CLAIMS, results.len(), "{context}: an answer per claim");
    let won: Vec<&TestClaim> = set
        .iter()
        .filter(|c| results[&c.claim.uid].is_ok())
        .collect();
    for c in set {
        if let Err(error) = &results[&c.claim.uid] {
            assert!(
                c.kind != Kind::Share
                    && (error.contains("is not free")
                        || error.contains("NVML_ERROR_INSUFFICIENT_RESOURCES")),
                "{context}: {} ({:?} {}) failed for a reason other than contention: {error}",
                c.claim.uid,
                c.kind,
                c.device
            );
        }
    }
    let count = |kind| won.iter().filter(|c| c.kind == kind).count();
    eprintln!(
        "{context}: prepared {} of {CLAIMS} (whole GPU {}, MIG {}, MPS {}, shares {})",
        won.len(),
        count(Kind::FullGpu),
        count(Kind::Mig),
        count(Kind::Mps),
        count(Kind::Share)
    );
    assert!(
        won.len() < CLAIMS,
        "{context}: the set must contend for devices, or the test proves nothing"
    );
    let uids: Vec<&str> = won.iter().map(|c| c.claim.uid.as_str()).collect();
    let snapshot = node.snapshot();
    snapshot.assert_converged(&uids, &format!("{context}\n{}", plugin.log()));

    let mut exclusive = BTreeSet::new();
    for c in won.iter().filter(|c| c.kind != Kind::Share) {
        assert!(
            exclusive.insert(c.device.clone()),
            "{context}: {} allocated twice",
            c.device
        );
    }
    for (kind, device) in [
        (Kind::FullGpu, "gpu-6"),
        (Kind::Mps, "gpu-3"),
        (Kind::Mps, "gpu-5"),
    ] {
        let wanted = set.iter().any(|c| c.kind == kind && c.device == device);
        let winners = won.iter().filter(|c| c.device == device).count();
        assert_eq!(
            usize::from(wanted),
            winners,
            "{context}: winners of {device}"
        );
    }
    let instances = &snapshot.instances;
    for (i, a) in instances.iter().enumerate() {
        for b in &instances[i + 1..] {
            let overlap =
                a.gpu == b.gpu && a.start < b.start + b.size && b.start < a.start + a.size;
            assert!(
                !overlap,
                "{context}: overlapping MIG instances {a:?} and {b:?}"
            );
        }
    }
    let mig_won = won.iter().filter(|c| c.kind == Kind::Mig).count();
    assert_eq!(mig_won, instances.len(), "{context}: MIG instances");
    let share_gpus: BTreeSet<&str> = won
        .iter()
        .filter(|c| c.kind == Kind::Share)
        .map(|c| c.device.as_str())
        .collect();
    let mps_won = won.iter().filter(|c| c.kind == Kind::Mps).count();
    assert_eq!(
        mps_won + share_gpus.len(),
        live_daemons(node.root()).len(),
        "{context}: MPS daemons (one per MPS claim, one per shared GPU)"
    );
}

async fn run(one_connection: bool, seed: u64) {
    let context = format!(
        "seed {seed}, {}",
        if one_connection {
            "one connection"
        } else {
            "a connection per call"
        }
    );
    let mut rng = Rng(seed);
    let node = Node::new();
    let set = claim_set(&mut rng);
    put_claims(&node, &set);
    // Every profile on every GPU: the default `split` gives GPUs 0-2 no 1g.10gb.
    let plugin = node
        .start_with(&[
            ("GPU_DRA_SHARED_GPUS", "8"),
            ("GPU_DRA_MIG_PROFILES", "all"),
        ])
        .await;
    let _kubelet = plugin.register(DraApi::V1).await;

    let mut order: Vec<&TestClaim> = set.iter().collect();
    rng.shuffle(&mut order);
    let results = prepare_all(clients(&node, CALLS, one_connection).await, grouped(&order)).await;
    check_prepared(&node, &plugin, &set, &results, &context);

    rng.shuffle(&mut order);
    unprepare_all(clients(&node, CALLS, one_connection).await, grouped(&order)).await;
    node.snapshot().assert_converged(
        &[],
        &format!("{context}: after unprepare\n{}", plugin.log()),
    );
    assert_eq!(
        Vec::<u32>::new(),
        live_daemons(node.root()),
        "{context}: MPS daemons after unprepare"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_claims_in_fifty_concurrent_calls_on_one_connection_hold_every_invariant() {
    run(true, 0x5eed_0001).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_claims_in_fifty_concurrent_calls_on_fifty_connections_hold_every_invariant() {
    run(false, 0x5eed_0002).await;
}
