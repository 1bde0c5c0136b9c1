//! Objects the fake API server starts with, and real device models of simulated nodes.

use gpu_dra::devices::{self, DeviceModel, ModelOptions};
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::{GpuBackend, MigPolicy};
use serde_json::{Value, json};

pub const DRIVER: &str = "gpu.nvidia.com";
pub const NODE_UID: &str = "node-uid-1";

/// The device model of a simulated preset, with its node file's MIG policies or `policy` for
/// every GPU; and the node name.
pub fn model(preset: &str, policy: Option<MigPolicy>) -> (String, DeviceModel) {
    let sim = SimBackend::open(preset, None).expect("preset");
    let options = ModelOptions {
        policies: match policy {
            Some(_) => Default::default(),
            None => sim
                .mig_policies()
                .into_iter()
                .enumerate()
                .map(|(i, p)| (i as u32, p))
                .collect(),
        },
        default_policy: policy,
        ..Default::default()
    };
    let model = devices::build(&sim.inventory().expect("inventory"), &options);
    (sim.node_name().to_string(), model)
}

/// The Node object of `name`, with [`NODE_UID`].
pub fn node(name: &str) -> (String, Value) {
    (
        format!("/api/v1/nodes/{name}"),
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": name, "uid": NODE_UID}}),
    )
}

/// A ResourceClaim with this status.
pub fn claim(namespace: &str, name: &str, uid: &str, status: Value) -> (String, Value) {
    (
        format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": namespace, "uid": uid},
               "spec": {"devices": {"requests": []}},
               "status": status}),
    )
}

/// One allocation result.
pub fn result(request: &str, driver: &str, pool: &str, device: &str) -> Value {
    json!({"request": request, "driver": driver, "pool": pool, "device": device})
}

/// One opaque config entry.
pub fn opaque(source: &str, driver: &str, requests: &[&str], parameters: Value) -> Value {
    let mut entry = json!({"source": source,
                           "opaque": {"driver": driver, "parameters": parameters}});
    if !requests.is_empty() {
        entry["requests"] = json!(requests);
    }
    entry
}

/// `model` with only its first `gpus` GPUs, as after losing the others.
pub fn first_gpus(model: &DeviceModel, gpus: u32) -> DeviceModel {
    let devices: Vec<_> = model
        .devices
        .iter()
        .filter(|d| d.gpu_index < gpus)
        .cloned()
        .collect();
    let used: Vec<String> = devices
        .iter()
        .flat_map(|d| d.device.consumes_counters.iter().flatten())
        .map(|c| c.counter_set.clone())
        .collect();
    let whole_gpu_mig = model
        .whole_gpu_mig
        .iter()
        .filter(|name| devices.iter().any(|d| d.name() == name.as_str()))
        .cloned()
        .collect();
    DeviceModel {
        devices,
        counter_sets: model
            .counter_sets
            .iter()
            .filter(|s| used.contains(&s.name))
            .cloned()
            .collect(),
        warnings: model.warnings.clone(),
        slice_layout: model.slice_layout,
        partition_type_attribute: model.partition_type_attribute.clone(),
        whole_gpu_mig,
    }
}
