//! The fuzz targets' checks and seed documents, shared by the generated inputs and the
//! regression corpus: each check feeds one input to a parser of outside input and fails when
//! the parser panics (caught by the runner), accepts what it must not, or rejects without
//! saying where.

use gpu_dra::cel::DeviceView;
use gpu_dra::hardware::sim::NodeSpec;
use gpu_dra::kubelet::proto::{dra_v1, dra_v1beta1, pluginregistration};
use gpu_dra::kubelet::{ClaimRef, validate_claims};
use gpu_dra::quantity::Quantity;
use proptest::prelude::*;
use prost::Message;
use serde_json::{Value, json};

pub fn opaque_seeds() -> Vec<Value> {
    vec![
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": {
                   "defaultActiveThreadPercentage": 50,
                   "defaultPinnedDeviceMemoryLimit": "10Gi",
                   "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"}}}}),
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
               "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
        json!({"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi"}}}),
        json!({"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig",
               "sharing": {"strategy": "TimeSlicing"}}),
    ]
}

pub fn check_opaque(doc: &Value, touched: Option<&str>) -> Result<(), TestCaseError> {
    if let Err(error) = gpu_dra::opaque::decode(doc) {
        let text = gpu_dra::kubelet::error_chain(&error);
        prop_assert!(!text.is_empty());
        if let Some(key) = touched {
            // The mutated key, or an enclosing one (a value that is fine alone can break a
            // rule of the object that holds it), or the document's kind when the whole
            // document changed meaning.
            prop_assert!(
                text.contains(key)
                    || [
                        "sharing",
                        "mpsConfig",
                        "timeSlicingConfig",
                        "apiVersion",
                        "kind"
                    ]
                    .iter()
                    .any(|k| text.contains(k)),
                "error does not name the field {key:?}: {text}"
            );
        }
    }
    Ok(())
}

pub fn checkpoint_seed() -> Value {
    json!({"nodeBootId": "boot-1", "claims": {"uid-a": {
        "uid": "uid-a", "namespace": "team-a", "name": "a", "phase": "PrepareCompleted",
        "updatedUnix": 1_700_000_000,
        "devices": [{"requestNames": ["gpu-0"], "pool": "node", "device": "gpu-0-mig-1g10gb-0",
                     "cdiDeviceIds": ["k8s.gpu.nvidia.com/claim=uid-a-gpu-0-mig-1g10gb-0"],
                     "gpuUuid": "GPU-1",
                     "mig": {"parentMinor": 0, "profileId": 19, "profile": "1g.10gb",
                             "placementStart": 0, "placementSize": 1, "giId": 9, "ciId": 0,
                             "uuid": "MIG-1"},
                     "sharing": {"strategy": "MPS", "daemon": "d-1", "ordinal": 0}}]}}})
}

pub fn envelope(payload: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "version": "v1",
        "checksum": gpu_dra::checkpoint::checksum(payload),
        "payload": payload,
    }))
    .expect("json")
}

pub fn check_checkpoint(bytes: &[u8], checksummed: bool) -> Result<(), TestCaseError> {
    match gpu_dra::checkpoint::decode(bytes) {
        Ok(cp) => {
            // Whatever decodes must validate and survive a round trip.
            let again = gpu_dra::checkpoint::encode(&cp).expect("a decoded checkpoint encodes");
            prop_assert_eq!(
                &cp,
                &gpu_dra::checkpoint::decode(&again).expect("round trip")
            );
        }
        Err(error) => {
            let text = gpu_dra::kubelet::error_chain(&error);
            if checksummed {
                prop_assert!(
                    text.contains("field")
                        || text.contains('`')
                        || text.contains("claim")
                        || text.contains("payload"),
                    "a payload error must say where: {text}"
                );
            }
        }
    }
    Ok(())
}

pub const NODE_SEED: &str = "name: fuzz-node\ndriverVersion: 580.95.05\nnumaNodes: 2\ngpus:\n  - model: H100-SXM5-80GB\n    count: 2\n    mig: dynamic\n  - model: A100-SXM4-40GB\n    mig: static\n    migDevices: [3g.20gb, 2g.10gb@4]\n";

pub fn check_node_file(text: &str) -> Result<(), TestCaseError> {
    let result = NodeSpec::parse("fuzz.yaml", text).and_then(|spec| spec.plan("fuzz.yaml", "n"));
    if let Err(error) = result {
        let message = gpu_dra::kubelet::error_chain(&error);
        prop_assert!(
            message.contains("fuzz.yaml"),
            "error names the file: {message}"
        );
    }
    Ok(())
}

pub const CEL_TOKENS: &[&str] = &[
    "device",
    ".",
    "attributes",
    "capacity",
    "driver",
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    ",",
    ":",
    "'gpu.nvidia.com'",
    "profile",
    "memory",
    "==",
    "!=",
    "<",
    ">=",
    "&&",
    "||",
    "!",
    "?",
    "+",
    "-",
    "*",
    "/",
    "%",
    "in",
    "1",
    "-1",
    "0",
    "9223372036854775807",
    "1u",
    "1.5",
    "'x'",
    "true",
    "null",
    "quantity",
    "isQuantity",
    "semver",
    "compareTo",
    "isGreaterThan",
    "add",
    "sub",
    "asInteger",
    "all",
    "exists",
    "map",
    "filter",
    "x",
    "has",
    "size",
    "matches",
    "'[a-'",
    "'10Gi'",
    "'1e400'",
    "'v1.2.3'",
    " ",
];

pub fn cel_device() -> DeviceView {
    let device: k8s_openapi::api::resource::v1::Device = serde_json::from_value(json!({
        "name": "gpu-0",
        "attributes": {"profile": {"string": "1g.10gb"}, "type": {"string": "mig"},
                        "driverVersion": {"version": "580.95.5"}, "index": {"int": 3}},
        "capacity": {"memory": {"value": "10Gi"}}
    }))
    .expect("device");
    DeviceView::from_api("gpu.nvidia.com", &device).expect("valid device")
}

pub fn check_quantity(text: &str) -> Result<(), TestCaseError> {
    match text.parse::<Quantity>() {
        Ok(q) => {
            let shown = q.to_string();
            let again: Quantity = shown
                .parse()
                .map_err(|e| TestCaseError::fail(format!("{text:?} → {shown:?}: {e}")))?;
            prop_assert_eq!(q.as_nanos(), again.as_nanos(), "{:?} → {:?}", text, shown);
        }
        Err(error) => {
            let message = error.to_string();
            prop_assert!(
                message.contains("quantity") || message.contains("range"),
                "{message}"
            );
        }
    }
    Ok(())
}

pub fn check_grpc(bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut claims: Vec<ClaimRef> = Vec::new();
    if let Ok(m) = dra_v1::NodePrepareResourcesRequest::decode(bytes) {
        claims.extend(
            m.claims
                .into_iter()
                .map(|c| claim(c.namespace, c.name, c.uid)),
        );
    }
    if let Ok(m) = dra_v1beta1::NodeUnprepareResourcesRequest::decode(bytes) {
        claims.extend(
            m.claims
                .into_iter()
                .map(|c| claim(c.namespace, c.name, c.uid)),
        );
    }
    let _ = pluginregistration::RegistrationStatus::decode(bytes);
    let _ = pluginregistration::InfoRequest::decode(bytes);
    check_claims(claims)
}

pub fn claim(namespace: String, name: String, uid: String) -> ClaimRef {
    ClaimRef {
        namespace,
        name,
        uid,
    }
}

/// The handler's validation: every UID gets exactly one verdict, a rejection names the
/// field, and what passes can name a CDI spec file and an MPS directory.
pub fn check_claims(claims: Vec<ClaimRef>) -> Result<(), TestCaseError> {
    let uids: std::collections::BTreeSet<String> = claims.iter().map(|c| c.uid.clone()).collect();
    let (valid, invalid) = validate_claims(claims);
    let mut verdicts: std::collections::BTreeSet<String> =
        valid.iter().map(|c| c.uid.clone()).collect();
    prop_assert_eq!(valid.len(), verdicts.len(), "a UID handed over twice");
    verdicts.extend(invalid.keys().cloned());
    prop_assert_eq!(uids, verdicts);
    for error in invalid.values() {
        prop_assert!(error.contains("claim field "), "{error}");
    }
    let naming = gpu_dra::cdi::ClaimNaming::default();
    for c in &valid {
        let file = naming.spec_file_name(&c.uid);
        prop_assert!(
            file.is_ok(),
            "valid UID {:?} cannot name a spec: {:?}",
            c.uid,
            file
        );
        let name = file.unwrap_or_default();
        prop_assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
    }
    Ok(())
}

/// A device file as `gpu-dra cel --device FILE` reads it (YAML or JSON): a failure must name
/// the file or say what in the device is wrong.
pub fn check_device_file(text: &str, expression: &str) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let path = dir.path().join("device.yaml");
    std::fs::write(&path, text).map_err(|e| TestCaseError::fail(e.to_string()))?;
    if let Err(error) = gpu_dra::cel::evaluate_device_file(expression, &path, "gpu.nvidia.com") {
        let message = gpu_dra::kubelet::error_chain(&error);
        prop_assert!(!message.is_empty());
        if matches!(error, gpu_dra::cel::CelError::DecodeDevice { .. }) {
            prop_assert!(message.contains("device.yaml"), "{message}");
        }
    }
    Ok(())
}

/// A device as the API returns it, the seed of device-file inputs.
pub fn device_seed() -> Value {
    json!({
        "name": "gpu-0",
        "attributes": {"profile": {"string": "1g.10gb"}, "type": {"string": "mig"},
                        "driverVersion": {"version": "580.95.5"}, "index": {"int": 3}},
        "capacity": {"memory": {"value": "10Gi"}}
    })
}
