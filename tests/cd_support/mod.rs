//! Shared by the ComputeDomain controller tests and `benches/compute_domain.rs`: a fake API
//! server for any resource with watches ([`objserver`]), the paths the controller touches,
//! and what users and IMEX daemons write (a `ComputeDomain`, `ComputeDomainNode` objects,
//! Nodes).
#![allow(dead_code)] // each user takes a different part

pub mod objserver;
pub mod objstore;
#[path = "../plugin_support/tls.rs"]
pub mod tls;

use std::time::{Duration, Instant};

use gpu_dra::compute_domain::api;
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
