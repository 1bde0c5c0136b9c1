//! ResourceClaim objects as the API server returns them once the scheduler has allocated them,
//! and the kubelet's names for them.

use gpu_dra::kubelet::ClaimRef;
use serde_json::{Value, json};

pub const DRIVER: &str = "gpu.nvidia.com";
pub const NODE: &str = "dgx-h100";
pub const NAMESPACE: &str = "team-a";

/// The claim as the kubelet names it.
pub fn claim_ref(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: NAMESPACE.to_string(),
        uid: uid.to_string(),
        name: name.to_string(),
    }
}

/// An allocated claim whose results are `(driver, pool, device)`, request `gpu-<i>` each.
pub fn allocated(name: &str, uid: &str, results: &[(&str, &str, &str)]) -> Value {
    let requests: Vec<Value> = (0..results.len())
        .map(|i| json!({"name": format!("gpu-{i}"), "exactly": {"deviceClassName": DRIVER}}))
        .collect();
    let results: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, (driver, pool, device))| {
            json!({"request": format!("gpu-{i}"), "driver": driver, "pool": pool,
                   "device": device})
        })
        .collect();
    let mut claim = unallocated(name, uid);
    claim["spec"]["devices"]["requests"] = json!(requests);
    claim["status"] = json!({
        "allocation": {
            "devices": {"results": results, "config": []},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
        },
        "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"),
                         "uid": format!("pod-uid-{uid}")}]
    });
    claim
}

/// An allocated claim of this driver's devices on this node.
pub fn on_node(name: &str, uid: &str, devices: &[&str]) -> Value {
    let results: Vec<(&str, &str, &str)> = devices.iter().map(|d| (DRIVER, NODE, *d)).collect();
    allocated(name, uid, &results)
}

/// [`on_node`] with `parameters` as an opaque config of this driver for every request.
pub fn on_node_with_config(name: &str, uid: &str, devices: &[&str], parameters: Value) -> Value {
    let mut claim = on_node(name, uid, devices);
    claim["status"]["allocation"]["devices"]["config"] = json!([{
        "source": "FromClaim",
        "opaque": {"driver": DRIVER, "parameters": parameters}
    }]);
    claim
}

/// A claim the scheduler has not allocated yet.
pub fn unallocated(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
        "spec": {"devices": {"requests": [
            {"name": "gpu-0", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {}
    })
}

/// Stores one allocated claim per device (`claim-<i>`, UID `uid-claim-<i>`) on `api` and
/// returns them as the kubelet names them, in `devices`' order.
pub fn one_per_device(api: &super::FakeApiServer, devices: &[String]) -> Vec<ClaimRef> {
    devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let (name, uid) = (format!("claim-{i}"), format!("uid-claim-{i}"));
            api.put_claim(on_node(&name, &uid, &[device]));
            claim_ref(&name, &uid)
        })
        .collect()
}

/// A claim as a real API server returns it once kube-controller-manager created it from a
/// pod's ResourceClaimTemplate and kube-scheduler allocated device `device` of this node and
/// reserved it for the pod: generated name, owner reference, annotation, finalizer,
/// `allocationTimestamp`, and the `managedFields` both wrote. Twice the bytes of
/// [`on_node`]'s, as the plugin reads and writes them against a real server.
pub fn as_scheduled(name: &str, uid: &str, device: &str) -> Value {
    let pod = format!("pod-{name}");
    let pod_uid = format!("pod-uid-{uid}");
    let time = "2026-11-28T10:00:00Z";
    let owner_key = format!("k:{{\"uid\":\"{pod_uid}\"}}");
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "generateName": format!("{pod}-gpu-"),
            "namespace": NAMESPACE,
            "uid": uid,
            "generation": 1,
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
            "finalizers": ["resource.kubernetes.io/delete-protection"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                 "uid": pod_uid, "controller": true,
                                 "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update",
                 "apiVersion": "resource.k8s.io/v1", "time": time, "fieldsType": "FieldsV1",
                 "fieldsV1": {
                    "f:metadata": {
                        "f:annotations": {".": {}, "f:resource.kubernetes.io/pod-claim-name": {}},
                        "f:generateName": {},
                        "f:ownerReferences": {".": {}, owner_key: {}}},
                    "f:spec": {"f:devices": {"f:requests": {}}}}},
                {"manager": "kube-scheduler", "operation": "Update",
                 "apiVersion": "resource.k8s.io/v1", "time": time, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:finalizers": {
                    ".": {}, "v:\"resource.kubernetes.io/delete-protection\"": {}}}}},
                {"manager": "kube-scheduler", "operation": "Update",
                 "apiVersion": "resource.k8s.io/v1", "time": time, "fieldsType": "FieldsV1",
                 "subresource": "status",
                 "fieldsV1": {"f:status": {
                    "f:allocation": {".": {}, "f:allocationTimestamp": {},
                                     "f:devices": {".": {}, "f:results": {}},
                                     "f:nodeSelector": {}},
                    "f:reservedFor": {".": {}, format!("k:{{\"uid\":\"{pod_uid}\"}}"): {}}}}}
            ]
        },
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER,
                                        "allocationMode": "ExactCount", "count": 1}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
                "allocationTimestamp": time
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}]
        }
    })
}

/// [`one_per_device`] with claims as a real API server returns them ([`as_scheduled`]).
pub fn one_per_device_as_scheduled(
    api: &super::FakeApiServer,
    devices: &[String],
) -> Vec<ClaimRef> {
    devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let (name, uid) = (format!("claim-{i}"), format!("uid-claim-{i}"));
            api.put_claim(as_scheduled(&name, &uid, device));
            claim_ref(&name, &uid)
        })
        .collect()
}
