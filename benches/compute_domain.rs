//! A 256-pod ComputeDomain job on 64 nodes (`cargo bench --bench compute_domain`): how long
//! from the ComputeDomain's creation (and from its pods being bound) until every node's IMEX
//! daemon is ready (each node's channel prepares return then) and until the domain's status
//! is `Ready` with 64 nodes; how many API writes that takes, and how many conflicted (409).
//!
//! As the chart deploys it: the controller (`gpu_dra::compute_domain::controller`, the code
//! `gpu-dra compute-domain-controller` runs) with leader election on, against a fake API
//! server that speaks TLS with client certificates, answers watches, and takes
//! `GPU_DRA_BENCH_WRITE_LATENCY_US` (default 2,000 µs, an etcd write) per write and
//! `GPU_DRA_BENCH_GET_LATENCY_US` (default 500 µs) per GET. The 64 nodes are GB200 NVL72
//! trays in 4 NVLink cliques (18, 18, 18, 10 nodes), each with its own client doing what its
//! kubelet plugin and IMEX daemon write: the plugin labels its node when the first of its 4
//! channel claims is prepared; the daemon lists its clique's `ComputeDomainNode`s, takes the
//! lowest free index, creates its own object (NotReady), and once `nvidia-imex` is up
//! (`GPU_DRA_BENCH_IMEX_START_MS`, default 100 ms) re-checks its index against concurrent
//! starters (the later-created one re-picks) and writes itself Ready. No object is written by
//! more than one party, so the target is 0 conflicts. `GPU_DRA_BENCH_ROUNDS` (default 3)
//! domains are run one after the other, each deleted (and its clean-up timed) before the
//! next.
//!
//! Target (issue 24): every channel prepared within 30 s of the pods being bound.

#[path = "../tests/cd_support/mod.rs"]
mod cd_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cd_support::{DRIVER_NS, NODES, ObjServer, WORKLOAD_NS, domain_path};
use gpu_dra::compute_domain::api::{
    self, ComputeDomainNode, ComputeDomainNodeSpec, ComputeDomainNodeState, Readiness,
};
use gpu_dra::compute_domain::controller::{self, ControllerConfig, Settings, leader};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::ResourceExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NODE_COUNT: usize = 64;
const PODS_PER_NODE: usize = 4;
const CLIQUE_SIZES: [usize; 4] = [18, 18, 18, 10];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn clique_of(node: usize) -> String {
    let mut left = node;
    for (i, size) in CLIQUE_SIZES.iter().enumerate() {
        if left < *size {
            return format!("6f0e1c2a-0000-4000-8000-00000000000{i}.{}", i + 1);
        }
        left -= size;
    }
    unreachable!("64 nodes in 4 cliques")
}

/// One node's plugin and IMEX daemon: label the node, then create and ready the daemon's
/// object. Returns when the object is Ready (when this node's channel prepares return).
async fn node_agent(
    client: Client,
    uid: String,
    domain: String,
    node: String,
    clique: String,
    ip: String,
    imex_start: Duration,
) -> (Instant, bool) {
    // The plugin, preparing the node's first channel claim: the node joins the domain.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {api::NODE_LABEL: uid}}})),
        )
        .await
        .expect("label the node");
    let objects: Api<ComputeDomainNode> =
        Api::namespaced_with(client, DRIVER_NS, &api::compute_domain_node_resource());
    let selector = format!("{}={uid}", api::DOMAIN_UID_LABEL);
    let taken = |list: &[ComputeDomainNode], me: &str| -> Vec<u32> {
        list.iter()
            .filter(|o| o.spec.clique_id == clique && o.name_any() != me)
            .filter_map(|o| o.status.as_ref().map(|s| s.index))
            .collect()
    };
    let lowest_free = |used: &[u32]| (0..).find(|i| !used.contains(i)).expect("an index");
    let name = api::compute_domain_node_name(&uid, &node);
    // The daemon starts: the lowest index its clique does not use yet.
    let peers = objects
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list peers")
        .items;
    let mut object = ComputeDomainNode::new(
        &name,
        &api::compute_domain_node_resource(),
        ComputeDomainNodeSpec {
            domain_uid: uid.clone(),
            domain_namespace: WORKLOAD_NS.to_string(),
            domain_name: domain,
            node_name: node.clone(),
            clique_id: clique.clone(),
        },
    );
    object.metadata.labels = Some([(api::DOMAIN_UID_LABEL.to_string(), uid.clone())].into());
    object.status = Some(ComputeDomainNodeState {
        ip_address: ip,
        index: lowest_free(&taken(&peers, &name)),
        status: Readiness::NotReady,
        reason: Some("DaemonStarting".into()),
        message: Some("nvidia-imex is starting".into()),
    });
    let mut object = objects
        .create(&PostParams::default(), &object)
        .await
        .expect("create the node object");
    tokio::time::sleep(imex_start).await;
    // nvidia-imex is up. Indices settle in (creationTimestamp, name) order: once every
    // earlier-created peer of the clique is Ready (a Ready index never changes), keep this
    // index unless one of them holds it, else take the lowest they leave free.
    let key = |o: &ComputeDomainNode| {
        (
            o.metadata.creation_timestamp.clone().map(|t| t.0),
            o.name_any(),
        )
    };
    let clash = loop {
        let peers = objects
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("list peers")
            .items;
        let earlier: Vec<&ComputeDomainNode> = peers
            .iter()
            .filter(|p| p.spec.clique_id == clique && key(p) < key(&object))
            .collect();
        let ready = |p: &&ComputeDomainNode| {
            p.status
                .as_ref()
                .is_some_and(|s| s.status == Readiness::Ready)
        };
        if earlier.iter().all(ready) {
            let used: Vec<u32> = earlier
                .iter()
                .filter_map(|p| p.status.as_ref().map(|s| s.index))
                .collect();
            let state = object.status.as_mut().expect("status");
            if used.contains(&state.index) {
                state.index = lowest_free(&used);
                break true;
            }
            break false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let state = object.status.as_mut().expect("status");
    state.status = Readiness::Ready;
    state.reason = None;
    state.message = None;
    objects
        .replace(&name, &PostParams::default(), &object)
        .await
        .expect("write Ready");
    (Instant::now(), clash)
}

struct Round {
    bound: Duration,
    daemons_ready: Duration,
    domain_ready: Duration,
    deleted: Duration,
    writes: usize,
    by_kind: Vec<(String, usize)>,
    conflicts: Vec<String>,
    status_writes: usize,
    gets: usize,
    repicks: usize,
}

fn kind_of(method: &str, path: &str) -> String {
    let resource = path
        .split('/')
        .rev()
        .find(|s| {
            [
                "computedomains",
                "computedomainnodes",
                "resourceclaimtemplates",
                "daemonsets",
                "nodes",
                "leases",
                "events",
                "status",
            ]
            .contains(s)
        })
        .unwrap_or("other");
    let resource = if resource == "status" {
        "computedomains/status"
    } else {
        resource
    };
    format!("{method} {resource}")
}

async fn round(
    server: &ObjServer,
    user: &Api<api::ComputeDomain>,
    agents: &[Client],
    name: &str,
    imex_start: Duration,
) -> Round {
    let before = server.requests().len();
    let started = Instant::now();
    let mut domain: api::ComputeDomain =
        serde_json::from_value(cd_support::domain(name, 0)).unwrap();
    domain.spec.num_nodes = NODE_COUNT as u32;
    let created = user
        .create(&PostParams::default(), &domain)
        .await
        .expect("create the domain");
    let uid = created.uid().unwrap();
    // The pods are bound once their claims exist: once the workload template does.
    let template = format!("{}/{name}-channel", cd_support::templates_path(WORKLOAD_NS));
    while server.get(&template).is_none() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let bound_at = Instant::now();
    let tasks: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(i, client)| {
            tokio::spawn(node_agent(
                client.clone(),
                uid.clone(),
                name.to_string(),
                format!("gb200-{i:02}"),
                clique_of(i),
                format!("10.1.{}.{}", i / 200, i % 200 + 1),
                imex_start,
            ))
        })
        .collect();
    let mut last_ready = bound_at;
    let mut repicks = 0;
    for t in tasks {
        let (ready, repicked) = t.await.expect("node agent");
        last_ready = last_ready.max(ready);
        repicks += usize::from(repicked);
    }
    let path = domain_path(WORKLOAD_NS, name);
    let ready_at = loop {
        let d = server.get(&path).expect("the domain");
        let nodes = d["status"]["nodes"].as_array().map_or(0, Vec::len);
        if d["status"]["status"] == "Ready" && nodes == NODE_COUNT {
            break Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    // Every clique's daemons hold the indices 0..n, each once.
    let mut indices: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for n in d_nodes(server, &path) {
        indices
            .entry(n["cliqueID"].as_str().unwrap().to_string())
            .or_default()
            .push(n["index"].as_u64().unwrap());
    }
    for (clique, mut got) in indices {
        got.sort();
        let want: Vec<u64> = (0..got.len() as u64).collect();
        assert_eq!(got, want, "indices of clique {clique}");
    }
    let requests = server.requests()[before..].to_vec();
    let writes: Vec<_> = requests.iter().filter(|r| r.is_write()).collect();
    let mut by_kind: std::collections::BTreeMap<String, usize> = Default::default();
    for w in &writes {
        *by_kind.entry(kind_of(&w.method, &w.path)).or_default() += 1;
    }
    let conflicts = requests
        .iter()
        .filter(|r| r.code == 409)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let status_writes = writes
        .iter()
        .filter(|w| w.path.ends_with("/status"))
        .count();
    let gets = requests.len() - writes.len();

    // Delete, and wait until the finalizer let the domain go.
    let deleting = Instant::now();
    assert_eq!(server.delete(&path), 200);
    while server.get(&path).is_some() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let deleted = deleting.elapsed();
    // Requests are recorded as they are answered: let the last ones land in this round.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        server
            .list(
                &cd_support::node_objects_path(),
                &format!("{}={uid}", api::DOMAIN_UID_LABEL)
            )
            .is_empty(),
        "node objects left behind"
    );
    Round {
        bound: bound_at - started,
        daemons_ready: last_ready - bound_at,
        domain_ready: ready_at - started,
        deleted,
        writes: writes.len(),
        by_kind: by_kind.into_iter().collect(),
        conflicts,
        status_writes,
        gets,
        repicks,
    }
}

fn d_nodes(server: &ObjServer, path: &str) -> Vec<serde_json::Value> {
    server.get(path).expect("the domain")["status"]["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn main() {
    let write_latency = Duration::from_micros(env_u64("GPU_DRA_BENCH_WRITE_LATENCY_US", 2000));
    let get_latency = Duration::from_micros(env_u64("GPU_DRA_BENCH_GET_LATENCY_US", 500));
    let imex_start = Duration::from_millis(env_u64("GPU_DRA_BENCH_IMEX_START_MS", 100));
    let rounds = env_u64("GPU_DRA_BENCH_ROUNDS", 3) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ObjServer::start_tls();
    server.set_write_latency(write_latency);
    server.set_get_latency(get_latency);
    for i in 0..NODE_COUNT {
        server.create(NODES, cd_support::node(&format!("gb200-{i:02}"), None));
    }
    println!(
        "compute_domain: {NODE_COUNT} nodes x {PODS_PER_NODE} pods, cliques {CLIQUE_SIZES:?}, \
         writes {write_latency:?}, GETs {get_latency:?}, nvidia-imex start {imex_start:?}, TLS"
    );
    runtime.block_on(async {
        let stop = CancellationToken::new();
        let controller_client = server.client(dir.path()).await;
        let config = ControllerConfig {
            kubeconfig: None,
            settings: Settings {
                namespace: DRIVER_NS.into(),
                image: "gpu-dra:bench".into(),
                daemon_service_account: "gpu-dra-imex-daemon".into(),
                simulated_imex: false,
            },
            leader_election: true,
            identity: "bench".into(),
            timing: leader::Timing::default(),
            retry_after: Duration::from_secs(1),
            metrics_addr: None,
            resync_period: controller::RESYNC_PERIOD,
            daemon_stop_wait: controller::DAEMON_STOP_WAIT,
            own_pod: None,
            binding_conditions: false,
            binding_timeout: controller::binding::BINDING_TIMEOUT,
        };
        let running = tokio::spawn(controller::run_with_client(
            controller_client,
            config,
            stop.clone(),
        ));
        let lease = format!(
            "/apis/coordination.k8s.io/v1/namespaces/{DRIVER_NS}/leases/{}",
            controller::LEASE_NAME
        );
        while server.get(&lease).is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let user: Api<api::ComputeDomain> = Api::namespaced_with(
            server.client(dir.path()).await,
            WORKLOAD_NS,
            &api::compute_domain_resource(),
        );
        let mut agents = Vec::new();
        for _ in 0..NODE_COUNT {
            agents.push(server.client(dir.path()).await);
        }
        let agents = Arc::new(agents);
        println!(
            "{:>5} {:>9} {:>15} {:>14} {:>9} {:>7} {:>7} {:>6} {:>5} {:>8}",
            "round", "bound", "daemons ready", "domain Ready", "deleted", "writes", "status", "GETs", "409s", "re-picks"
        );
        let mut all = Vec::new();
        for i in 0..rounds {
            let r = round(&server, &user, &agents, &format!("job-{i}"), imex_start).await;
            println!(
                "{:>5} {:>9.1?} {:>15.1?} {:>14.1?} {:>9.1?} {:>7} {:>7} {:>6} {:>5} {:>8}",
                i,
                r.bound,
                r.daemons_ready,
                r.domain_ready,
                r.deleted,
                r.writes,
                r.status_writes,
                r.gets,
                r.conflicts.len(),
                r.repicks
            );
            all.push(r);
        }
        let last = all.last().expect("a round");
        println!("writes of the last round by request:");
        for (kind, n) in &last.by_kind {
            println!("  {n:>4}  {kind}");
        }
        let conflicts: Vec<&String> = all.iter().flat_map(|r| &r.conflicts).collect();
        println!(
            "conflicts (409) over {rounds} rounds: {} {conflicts:?}",
            conflicts.len()
        );
        let mut ready: Vec<Duration> = all.iter().map(|r| r.daemons_ready).collect();
        ready.sort();
        println!(
            "target: every channel prepared within 30 s of the pods being bound: median {:.1?} ({})",
            ready[ready.len() / 2],
            if ready.iter().all(|d| *d < Duration::from_secs(30)) { "met" } else { "MISSED" }
        );
        stop.cancel();
        let _ = running.await;
    });
}
