//! Shared by the ComputeDomain controller tests and `benches/compute_domain.rs`: a fake API
//! server for any resource with watches ([`objserver`]), the paths the controller touches,
//! and what users and IMEX daemons write (a `ComputeDomain`, `ComputeDomainNode` objects,
//! Nodes).
#![allow(dead_code)] // each user takes a different part

pub mod objserver;
// Each support module stands alone, so a test takes only what it uses; one that takes two
// compiles the store twice, as two unrelated types it never mixes.
#[allow(clippy::duplicate_mod)]
#[path = "../api_support/objstore.rs"]
pub mod objstore;
#[path = "../plugin_support/tls.rs"]
pub mod tls;
#[allow(clippy::duplicate_mod)]
#[path = "../api_support/transport.rs"]
pub mod transport;

use std::time::{Duration, Instant};

use gpu_dra::compute_domain::api;
use gpu_dra::compute_domain::controller::{self, ControllerConfig, Settings, leader};
use serde_json::{Value, json};

pub use objserver::ObjServer;

/// The driver's namespace in these tests.
pub const DRIVER_NS: &str = "gpu-dra";
/// The workload's namespace.
pub const WORKLOAD_NS: &str = "team-a";

pub fn domains_path(ns: &str) -> String {
    format!("/apis/resource.nvidia.com/v1beta1/namespaces/{ns}/computedomains")
}

pub fn domain_path(ns: &str, name: &str) -> String {
    format!("{}/{name}", domains_path(ns))
}

pub fn node_objects_path() -> String {
    format!("/apis/resource.nvidia.com/v1beta1/namespaces/{DRIVER_NS}/computedomainnodes")
}

pub fn templates_path(ns: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates")
}

pub fn daemon_sets_path() -> String {
    format!("/apis/apps/v1/namespaces/{DRIVER_NS}/daemonsets")
}

pub const NODES: &str = "/api/v1/nodes";

/// NVIDIA's example ComputeDomain with `name`, template `<name>-channel`.
pub fn domain(name: &str, num_nodes: u32) -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": WORKLOAD_NS},
        "spec": {"numNodes": num_nodes,
                 "channel": {"resourceClaimTemplate": {"name": format!("{name}-channel")}}}
    })
}

/// A Node, labelled for domain `uid` when given (as the kubelet plugin labels it).
pub fn node(name: &str, domain_uid: Option<&str>) -> Value {
    let labels = match domain_uid {
        Some(uid) => json!({api::NODE_LABEL: uid, "kubernetes.io/hostname": name}),
        None => json!({"kubernetes.io/hostname": name}),
    };
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
}

/// The `ComputeDomainNode` a node's IMEX daemon writes for domain `domain` (the stored
/// ComputeDomain): spec, and status with `index`, `ready`, and an optional reason/message.
pub fn node_object(
    domain: &Value,
    node: &str,
    clique: &str,
    index: u32,
    ready: bool,
    reason: Option<(&str, &str)>,
) -> Value {
    let uid = domain["metadata"]["uid"].as_str().unwrap();
    let mut status = json!({
        "ipAddress": format!("10.0.{}.{}", index / 250, index % 250 + 1),
        "index": index,
        "status": if ready { "Ready" } else { "NotReady" },
    });
    if let Some((reason, message)) = reason {
        status["reason"] = json!(reason);
        status["message"] = json!(message);
    }
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainNode",
        "metadata": {"name": api::compute_domain_node_name(uid, node),
                     "labels": {api::DOMAIN_UID_LABEL: uid}},
        "spec": {"domainUID": uid, "domainNamespace": domain["metadata"]["namespace"],
                 "domainName": domain["metadata"]["name"], "nodeName": node,
                 "cliqueID": clique},
        "status": status,
    })
}

/// Polls `check` every 10 ms until it returns `Some`, for at most `within`; panics naming
/// `what` otherwise.
pub async fn eventually<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn claims_path(ns: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
}

/// A workload's channel claim `name` as the scheduler leaves it in PreBind with binding
/// conditions: allocated `channel-0` of `node` (share `share_id`) for domain `domain_uid`,
/// the result carrying the device's binding conditions (the scheduler copies them from the
/// slice), the allocation's config as the scheduler copies it from the claim, reserved for
/// its pod; `status.devices` holds what other drivers wrote (`other_entries`).
pub fn allocated_channel_claim(
    name: &str,
    node: &str,
    domain_uid: &str,
    share_id: &str,
    other_entries: Value,
) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": WORKLOAD_NS},
        "spec": {"devices": {"requests": [{"name": "channel", "exactly": {
            "deviceClassName": api::CHANNEL_DEVICE_CLASS}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{
                        "request": "channel", "driver": api::DRIVER_NAME, "pool": node,
                        "device": "channel-0", "shareID": share_id,
                        "bindingConditions": ["IMEXDaemonReady"],
                        "bindingFailureConditions": ["IMEXDaemonFailed"],
                    }],
                    "config": [{"source": "FromClaim", "requests": ["channel"], "opaque": {
                        "driver": api::DRIVER_NAME,
                        "parameters": {"apiVersion": api::API_VERSION,
                                       "kind": api::CHANNEL_CONFIG_KIND,
                                       "domainID": domain_uid, "allocationMode": "Single"}}}],
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                "allocationTimestamp": "2026-01-01T00:00:00Z",
            },
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"),
                             "uid": format!("pod-uid-{name}")}],
            "devices": other_entries,
        },
    })
}

/// The condition `kind` of `claim`'s `status.devices[]` entry for `channel-0` of `node`:
/// `(status, reason)`, if set.
pub fn device_condition(claim: &Value, node: &str, kind: &str) -> Option<(String, String)> {
    let entries = claim["status"]["devices"].as_array()?;
    let entry = entries.iter().find(|e| {
        e["driver"] == api::DRIVER_NAME && e["pool"] == node && e["device"] == "channel-0"
    })?;
    let condition = entry["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?;
    Some((
        condition["status"].as_str()?.to_string(),
        condition["reason"].as_str()?.to_string(),
    ))
}

/// The controller as the tests run it: in this process, against the fake API server, with
/// lease timings short enough for a test, binding conditions off.
pub fn controller_config(identity: &str, leader_election: bool) -> ControllerConfig {
    ControllerConfig {
        kubeconfig: None,
        settings: Settings {
            namespace: DRIVER_NS.into(),
            image: "registry.example/gpu-dra:0.1.0".into(),
            daemon_service_account: "gpu-dra-imex-daemon".into(),
            simulated_imex: false,
        },
        leader_election,
        identity: identity.into(),
        timing: leader::Timing {
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(200),
        },
        retry_after: Duration::from_millis(100),
        metrics_addr: None,
        resync_period: controller::RESYNC_PERIOD,
        daemon_stop_wait: controller::DAEMON_STOP_WAIT,
        own_pod: None,
        binding_conditions: false,
        binding_timeout: controller::binding::BINDING_TIMEOUT,
    }
}
