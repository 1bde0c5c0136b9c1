//! The ComputeDomain controller's idle memory in a cluster of 1,000 GPU nodes
//! (`cargo bench --bench compute_domain_memory`): the real `gpu-dra compute-domain-controller`
//! binary (release profile, leader election and metrics on, as the chart runs it) against a
//! fake API server over TLS holding `GPU_DRA_BENCH_NODES` (default 1,000) dgx-h100 Node objects
//! as a real cluster shows them (labels, annotations, capacity, conditions, images; about
//! 6 KB of JSON each), then `GPU_DRA_BENCH_DOMAINS` (default 8) ComputeDomains that span every
//! node: one `ComputeDomainNode` per node, Ready, with the managed fields a real API server
//! adds, and each domain's status listing its nodes.
//!
//! It reports the controller's resident set (VmRSS) and peak (VmHWM) from `/proc`: idle with
//! no domain, then idle after every domain turned Ready; and which requests the controller
//! made, by resource, which shows what it reads of a large cluster. Nothing it watches grows
//! with the nodes of the cluster, only with the nodes in a domain: it lists no Node, no
//! ResourceSlice and no ResourceClaim while idle (Nodes only when a domain is deleted or a
//! resync sweeps stale labels, by label and metadata only).
//!
//! Then it stops that controller and starts one with `--binding-conditions`, which also
//! watches every ResourceClaim of the cluster, against the same server holding
//! `GPU_DRA_BENCH_CLAIMS` (default 8,000: 8 per node) allocated ResourceClaims as a real API
//! server shows them (managed fields of the controller-manager and the scheduler, the pod's
//! owner reference, a device request, an allocation of driver `gpu.nvidia.com` with its node
//! selector, reserved for one pod); every `GPU_DRA_BENCH_CHANNEL_EVERY`th (default 16th) is
//! instead an IMEX channel claim of `compute-domain.nvidia.com` whose `IMEXDaemonReady` is
//! already set (its domain is Ready). The list is paged as kube-apiserver pages it (the
//! client's `limit` of 500). It reports the controller's VmRSS and VmHWM idle after that
//! initial list, and its requests.
//!
//! Target (issue 34): the controller idles under 50 MB at 1,000 nodes.

#[path = "../tests/cd_support/mod.rs"]
mod cd_support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cd_support::{DRIVER_NS, NODES, ObjServer, WORKLOAD_NS, domain_path, domains_path};
use gpu_dra::compute_domain::api;
use serde_json::{Value, json};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A DGX H100 node as `kubectl get node -o json` shows one: the labels GPU feature discovery
/// and the cloud provider put there, the annotations of the kubelet and the CNI, capacity,
/// conditions and the cached images. `domain`: the compute-domain label, when it joined one.
fn dgx_node(i: usize, domain: Option<&str>) -> Value {
    let name = format!("dgx-h100-{i:04}");
    let mut labels = json!({
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "dgx-h100",
        "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": format!("us-east-1{}", ["a", "b", "c"][i % 3]),
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.machine": "DGXH100",
        "nvidia.com/cuda.driver.major": "570", "nvidia.com/cuda.driver.minor": "124",
        "nvidia.com/cuda.driver.rev": "06", "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "8", "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/gfd.timestamp": "1764300000",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/kernel-version.full": "6.8.0-1017-nvidia",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/rdma.available": "true",
    });
    if let Some(uid) = domain {
        labels[api::NODE_LABEL] = json!(uid);
    }
    let images: Vec<Value> = (0..20)
        .map(|k| {
            json!({"names": [format!("nvcr.io/nvidia/pytorch@sha256:{:064x}", k * 7919 + 1),
                             format!("nvcr.io/nvidia/pytorch:25.{:02}-py3", k % 12 + 1)],
                   "sizeBytes": 9_000_000_000u64 + k as u64 * 1_000_003})
        })
        .collect();
    let condition = |t: &str, s: &str, reason: &str| {
        json!({"type": t, "status": s, "reason": reason,
               "message": format!("kubelet reports {reason}"),
               "lastHeartbeatTime": "2026-11-28T10:00:00Z",
               "lastTransitionTime": "2026-11-01T10:00:00Z"})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"i-{i:017x}\"}}"),
            "projectcalico.org/IPv4Address": format!("10.{}.{}.{}/16", i / 65536, (i / 256) % 256, i % 256),
        }},
        "spec": {"podCIDR": format!("10.244.{}.0/24", i % 256), "providerID": format!("aws:///us-east-1a/i-{i:017x}")},
        "status": {
            "capacity": {"cpu": "224", "memory": "2113378504Ki", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1855467776Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "223", "memory": "2112276680Ki", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1709990461170", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "conditions": [condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                           condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                           condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                           condition("Ready", "True", "KubeletReady")],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 256, i % 256)},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"kernelVersion": "6.8.0-1017-nvidia", "osImage": "Ubuntu 24.04.1 LTS",
                         "containerRuntimeVersion": "containerd://2.0.2", "kubeletVersion": "v1.36.2",
                         "architecture": "amd64", "operatingSystem": "linux",
                         "machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                         "bootID": format!("{:032x}", i * 31)},
            "images": images,
        }
    })
}

/// What a real API server adds to an object two clients wrote: one managed-fields entry each.
fn managed_fields(manager: &str) -> Value {
    json!([
        {"manager": manager, "operation": "Update", "apiVersion": "resource.nvidia.com/v1beta1",
         "time": "2026-11-28T10:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:resource.nvidia.com/computeDomain.uid": {}},
                                     "f:annotations": {".": {}, "f:resource.nvidia.com/imexIndexConfirmed": {}}},
                      "f:spec": {".": {}, "f:cliqueID": {}, "f:domainName": {}, "f:domainNamespace": {},
                                 "f:domainUID": {}, "f:nodeName": {}},
                      "f:status": {".": {}, "f:index": {}, "f:ipAddress": {}, "f:status": {}}}},
    ])
}

/// VmRSS and VmHWM of `pid`, in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// The requests made since `from` by resource and verb, watches apart.
fn requests_by_kind(server: &ObjServer, from: usize) -> BTreeMap<String, usize> {
    let mut by_kind = BTreeMap::new();
    for r in &server.requests()[from..] {
        let segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
        let resource = segments
            .iter()
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
                    "pods",
                    "resourceslices",
                    "resourceclaims",
                ]
                .contains(s)
            })
            .copied()
            .unwrap_or("other");
        let watch = r
            .query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1");
        let verb = if watch { "WATCH" } else { r.method.as_str() };
        *by_kind.entry(format!("{verb} {resource}")).or_default() += 1;
    }
    by_kind
}

struct Controller(Child);

/// Starts the release binary as the chart runs it (leader election and metrics on), with
/// `extra` arguments.
fn start_controller(binary: &str, kubeconfig: &std::path::Path, extra: &[&str]) -> Controller {
    Controller(
        Command::new(binary)
            .args(["compute-domain-controller", "--namespace", DRIVER_NS])
            .args(["--image", "gpu-dra:bench", "--metrics-addr", "127.0.0.1:0"])
            .args(extra)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("POD_NAME", "gpu-dra-compute-domain-controller-0")
            .env_remove("GPU_DRA_IMEX_IMAGE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the controller"),
    )
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let node_count = env_usize("GPU_DRA_BENCH_NODES", 1000);
    let domain_count = env_usize("GPU_DRA_BENCH_DOMAINS", 8).max(1);
    let idle = Duration::from_secs(env_usize("GPU_DRA_BENCH_IDLE_S", 5) as u64);
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ObjServer::start_tls();
    // The nodes of domain d are node d, d + domains, ... (every node in one domain).
    let domain_of = |i: usize| i % domain_count;
    let mut node_bytes = 0;
    for i in 0..node_count {
        let node = dgx_node(i, None);
        node_bytes += node.to_string().len();
        server.create(NODES, node);
    }
    println!(
        "compute_domain_memory: {node_count} dgx-h100 Nodes ({:.1} KB of JSON each), \
         {domain_count} domains over every node, TLS, leader election and metrics on",
        node_bytes as f64 / node_count as f64 / 1000.0
    );
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig);
    let binary = std::env::var("GPU_DRA_CONTROLLER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpu-dra").to_string());
    let controller = start_controller(&binary, &kubeconfig, &[]);
    let pid = controller.0.id();
    let watching = |resource: &str| {
        server.requests().iter().any(|r| {
            r.path.ends_with(resource) && r.query.get("watch").is_some_and(|w| w == "true")
        })
    };
    let started = Instant::now();
    while !(watching("computedomains") && watching("computedomainnodes")) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the controller never watched"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(idle);
    let (rss_empty, _) = memory(pid);

    // Every node joins a domain: the plugin labels it, its daemon writes its object Ready.
    let from = server.requests().len();
    let mut domains = Vec::new();
    for d in 0..domain_count {
        let mut object = cd_support::domain(&format!("job-{d}"), 0);
        object["metadata"]["annotations"] = json!({
            "kubectl.kubernetes.io/last-applied-configuration": object.to_string(),
        });
        let created = server.create(&domains_path(WORKLOAD_NS), object);
        let real_uid = created["metadata"]["uid"].as_str().unwrap().to_string();
        domains.push((format!("job-{d}"), real_uid, created));
    }
    for i in 0..node_count {
        let (_, uid, created) = &domains[domain_of(i)];
        let name = format!("dgx-h100-{i:04}");
        let (code, _) = server.patch(
            &format!("{NODES}/{name}"),
            json!({"metadata": {"labels": {api::NODE_LABEL: uid}}}),
        );
        assert_eq!(code, 200);
        let clique = format!("6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f.{}", i / 18);
        let mut object = cd_support::node_object(
            created,
            &name,
            &clique,
            (i / domain_count % 18) as u32,
            true,
            None,
        );
        object["metadata"]["annotations"] =
            json!({"resource.nvidia.com/imexIndexConfirmed": "true"});
        object["metadata"]["managedFields"] = managed_fields("gpu-dra");
        server.create(&cd_support::node_objects_path(), object);
    }
    let per_domain = node_count / domain_count;
    let ready_from = Instant::now();
    loop {
        let ready = domains.iter().all(|(name, _, _)| {
            server
                .get(&domain_path(WORKLOAD_NS, name))
                .is_some_and(|d| {
                    d["status"]["status"] == "Ready"
                        && d["status"]["nodes"].as_array().map_or(0, Vec::len) >= per_domain
                })
        });
        if ready {
            break;
        }
        assert!(
            ready_from.elapsed() < Duration::from_secs(120),
            "the domains never turned Ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status_bytes: usize = domains
        .iter()
        .map(|(name, _, _)| {
            server.get(&domain_path(WORKLOAD_NS, name)).unwrap()["status"]
                .to_string()
                .len()
        })
        .sum();
    println!(
        "  every domain Ready with its nodes after {:.1?}; statuses {:.0} KB in all",
        ready_from.elapsed(),
        status_bytes as f64 / 1000.0
    );
    std::thread::sleep(idle);
    let (rss_full, hwm) = memory(pid);
    println!("{:>42} {:>10}", "controller", "MiB");
    println!("{:>42} {:>10.1}", "idle, no domain (VmRSS)", rss_empty);
    println!(
        "{:>42} {:>10.1}",
        format!("idle, {node_count} nodes in {domain_count} domains (VmRSS)"),
        rss_full
    );
    println!("{:>42} {:>10.1}", "peak so far (VmHWM)", hwm);
    println!(
        "target: idle under 50 MB at {node_count} nodes: {}",
        if rss_full * 1.048_576 < 50.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!("requests of the controller while the domains filled (watch events are no requests):");
    for (kind, n) in requests_by_kind(&server, from) {
        println!("  {n:>6}  {kind}");
    }
    let touched_nodes = server.requests()[..]
        .iter()
        .any(|r| r.path.starts_with(NODES) && r.method == "GET");
    println!("  Nodes read at all: {touched_nodes}");
    drop(controller);

    let claim_count = env_usize("GPU_DRA_BENCH_CLAIMS", 8 * node_count);
    let channel_every = env_usize("GPU_DRA_BENCH_CHANNEL_EVERY", 16).max(1);
    binding_phase(BindingPhase {
        server: &server,
        binary: &binary,
        kubeconfig: &kubeconfig,
        node_count,
        domain_uids: domains.iter().map(|(_, uid, _)| uid.clone()).collect(),
        claim_count,
        channel_every,
        idle,
    });
}

/// The namespaces the bench's workloads run in.
const CLAIM_NAMESPACES: usize = 20;

/// Managed fields a real API server keeps on a claim a template made and the scheduler
/// allocated: the controller-manager's create, the scheduler's status update, and for a
/// channel the controller's condition write.
fn claim_managed_fields(channel: bool) -> Value {
    let mut fields = vec![
        json!({"manager": "kube-controller-manager", "operation": "Update",
               "apiVersion": "resource.k8s.io/v1", "time": "2026-11-28T10:00:00Z",
               "fieldsType": "FieldsV1", "fieldsV1": {
                   "f:metadata": {"f:annotations": {".": {}, "f:resource.kubernetes.io/pod-claim-name": {}},
                                  "f:finalizers": {".": {}, "v:\"resource.kubernetes.io/delete-protection\"": {}},
                                  "f:generateName": {},
                                  "f:ownerReferences": {".": {}, "k:{\"uid\":\"…\"}": {}}},
                   "f:spec": {"f:devices": {"f:requests": {}}}}}),
        json!({"manager": "kube-scheduler", "operation": "Update",
               "apiVersion": "resource.k8s.io/v1", "time": "2026-11-28T10:00:01Z",
               "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {
                   "f:status": {"f:allocation": {".": {}, "f:allocationTimestamp": {},
                                                 "f:devices": {".": {}, "f:config": {}, "f:results": {}},
                                                 "f:nodeSelector": {}},
                                "f:reservedFor": {".": {}, "k:{\"uid\":\"…\"}": {}}}}}),
    ];
    if channel {
        fields.push(json!({"manager": "gpu-dra", "operation": "Update",
               "apiVersion": "resource.k8s.io/v1", "time": "2026-11-28T10:00:02Z",
               "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {
                   "f:status": {"f:devices": {}}}}));
    }
    Value::Array(fields)
}

/// Claim `i` of the population, on node `i / 8`: a GPU claim of `gpu.nvidia.com`, or with
/// `channel` (its node's domain UID) an IMEX channel claim whose daemon is Ready.
fn allocated_claim(i: usize, node_count: usize, channel: Option<&str>) -> (String, Value) {
    let node = format!("dgx-h100-{:04}", (i / 8) % node_count.max(1));
    let pod = format!("train-{:05}-worker-{}", i / 8, i % 8);
    let pod_uid = format!("{:08x}-1111-4222-8333-{:012x}", i, i * 7 + 3);
    let (namespace, mut claim) = match channel {
        Some(uid) => {
            let ready = json!([{"driver": api::DRIVER_NAME, "pool": node, "device": "channel-0",
                                "shareID": format!("{:08x}-0000-4000-8000-{:012x}", i, i),
                                "conditions": [{"type": "IMEXDaemonReady", "status": "True",
                                                "reason": "DaemonReady",
                                                "message": format!("the IMEX daemon of ComputeDomain {uid} is Ready on node {node}"),
                                                "lastTransitionTime": "2026-11-28T10:00:02Z"}]}]);
            let share = format!("{:08x}-0000-4000-8000-{:012x}", i, i);
            let claim = cd_support::allocated_channel_claim(
                &format!("{pod}-imex-x7k2p"),
                &node,
                uid,
                &share,
                ready,
            );
            (WORKLOAD_NS.to_string(), claim)
        }
        None => {
            let namespace = format!("team-{:02}", (i / 8) % CLAIM_NAMESPACES);
            let claim = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": format!("{pod}-gpu-q9z4m")},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                    "count": 1,
                    "selectors": [{"cel": {"expression":
                        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"}}]}}]}},
                "status": {
                    "allocation": {
                        "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                                 "pool": node, "device": format!("gpu-{}", i % 8)}]},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                        "allocationTimestamp": "2026-11-28T10:00:01Z",
                    },
                    "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
                },
            });
            (namespace, claim)
        }
    };
    let meta = &mut claim["metadata"];
    meta["namespace"] = json!(namespace);
    meta["generateName"] = json!(format!("{pod}-"));
    meta["annotations"] = json!({"resource.kubernetes.io/pod-claim-name":
                                 if channel.is_some() { "imex-channel" } else { "gpu" }});
    meta["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
    meta["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                      "uid": pod_uid, "controller": true,
                                      "blockOwnerDeletion": true}]);
    meta["managedFields"] = claim_managed_fields(channel.is_some());
    (namespace, claim)
}

/// What the binding-conditions phase runs against.
struct BindingPhase<'a> {
    server: &'a ObjServer,
    binary: &'a str,
    kubeconfig: &'a std::path::Path,
    node_count: usize,
    /// The domains' UIDs; node `i` is in domain `i % len`.
    domain_uids: Vec<String>,
    claim_count: usize,
    channel_every: usize,
    idle: Duration,
}

/// The controller with `--binding-conditions` over the same cluster plus a claim population:
/// its memory idle after the initial list of every claim, and its requests.
fn binding_phase(p: BindingPhase<'_>) {
    let mut claim_bytes = 0;
    let mut channels = 0;
    for i in 0..p.claim_count {
        let node = (i / 8) % p.node_count.max(1);
        let channel = (i % p.channel_every == p.channel_every - 1)
            .then(|| p.domain_uids[node % p.domain_uids.len()].as_str());
        channels += usize::from(channel.is_some());
        let (namespace, claim) = allocated_claim(i, p.node_count, channel);
        let created = p.server.create(&cd_support::claims_path(&namespace), claim);
        claim_bytes += created.to_string().len();
    }
    println!(
        "compute_domain_memory, --binding-conditions: {} allocated ResourceClaims \
         ({:.1} KB of JSON each, {channels} of them IMEX channels, Ready), {:.1} MB in all",
        p.claim_count,
        claim_bytes as f64 / p.claim_count.max(1) as f64 / 1000.0,
        claim_bytes as f64 / 1e6
    );
    // The stopped controller held the Lease; a new replica would wait out its duration.
    p.server.delete(&format!(
        "/apis/coordination.k8s.io/v1/namespaces/{DRIVER_NS}/leases/{}",
        gpu_dra::compute_domain::controller::LEASE_NAME
    ));
    let from = p.server.requests().len();
    let controller = start_controller(p.binary, p.kubeconfig, &["--binding-conditions"]);
    let pid = controller.0.id();
    let started = Instant::now();
    let watched_claims = || {
        p.server.requests()[from..].iter().any(|r| {
            r.path == "/apis/resource.k8s.io/v1/resourceclaims"
                && r.query.get("watch").is_some_and(|w| w == "true")
        })
    };
    while !watched_claims() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the controller never watched ResourceClaims"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let listed_in = started.elapsed();
    let (_, hwm_listed) = memory(pid);
    std::thread::sleep(p.idle);
    let (rss, hwm) = memory(pid);
    println!(
        "  claims listed and watched {:.1?} after the start (peak then {hwm_listed:.1} MiB)",
        listed_in
    );
    println!("{:>42} {:>10}", "controller, --binding-conditions", "MiB");
    println!(
        "{:>42} {:>10.1}",
        format!("idle, {} claims listed (VmRSS)", p.claim_count),
        rss
    );
    println!("{:>42} {:>10.1}", "peak (VmHWM)", hwm);
    println!(
        "target: idle under 50 MB at {} nodes with binding conditions: {}",
        p.node_count,
        if rss * 1.048_576 < 50.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!("requests of the controller from its start (watch events are no requests):");
    for (kind, n) in requests_by_kind(p.server, from) {
        println!("  {n:>6}  {kind}");
    }
    let pages = p.server.requests()[from..]
        .iter()
        .filter(|r| {
            r.path == "/apis/resource.k8s.io/v1/resourceclaims"
                && r.method == "GET"
                && !r.query.contains_key("watch")
        })
        .count();
    println!("  of them list pages of every namespace's claims: {pages}");
    drop(controller);
}
