//! Property-based fuzzing (proptest, stable Rust) of every parser of outside input: opaque
//! config (both API versions), the checkpoint file, simulated node files, the CEL selector
//! entry points, quantities and the kubelet's gRPC request messages.
//!
//! Each target must never panic, never hang (a generous per-input bound catches a hang, it is
//! not a performance check), and when it rejects an input, say where: the error names the
//! field. Inputs are mutations of valid documents (to get past the first check) and raw
//! noise. `GPU_DRA_FUZZ_CASES` sets the cases per target (CI: the default); each target
//! prints how many inputs it ran. Inputs that once found a bug live in `tests/fuzz_corpus/`
//! and run first, every time.

mod fuzz_support;

use std::time::Duration;

use fuzz_support::{apply, json_value, mutations, run_target};
use gpu_dra::cel::{DeviceView, Selector};
use gpu_dra::hardware::sim::NodeSpec;
use gpu_dra::kubelet::proto::{dra_v1, dra_v1beta1, pluginregistration};
use gpu_dra::kubelet::{ClaimRef, validate_claims};
use gpu_dra::quantity::Quantity;
use proptest::prelude::*;
use prost::Message;
use serde_json::{Value, json};

/// Far above any input's real cost: only a hang or a runaway loop reaches it.
const HANG: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------- opaque config

fn opaque_seeds() -> Vec<Value> {
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

fn check_opaque(doc: &Value, touched: Option<&str>) -> Result<(), TestCaseError> {
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

#[test]
fn opaque_config_of_both_versions_never_panics_and_names_the_field() {
    let seeds = opaque_seeds();
    let strategy = (0..seeds.len(), mutations(json_value()));
    run_target("opaque-config", HANG, strategy, |(seed, muts)| {
        let mut doc = seeds[seed].clone();
        let mut touched = None;
        for m in &muts {
            touched = apply(&mut doc, m);
        }
        check_opaque(&doc, touched.as_deref())
    });
}

// ---------------------------------------------------------------- checkpoint file

fn checkpoint_seed() -> Value {
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

fn envelope(payload: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "version": "v1",
        "checksum": gpu_dra::checkpoint::checksum(payload),
        "payload": payload,
    }))
    .expect("json")
}

#[test]
fn checkpoint_files_never_panic_and_payload_errors_name_the_field() {
    let strategy = prop_oneof![
        // The payload mutated and re-checksummed: reaches the decoder and the validator.
        mutations(json_value()).prop_map(|muts| {
            let mut payload = checkpoint_seed();
            muts.iter().for_each(|m| {
                apply(&mut payload, m);
            });
            (envelope(&payload), true)
        }),
        // Raw bytes, and a valid file with bytes flipped or cut (checksum and JSON errors).
        proptest::collection::vec(any::<u8>(), 0..512).prop_map(|b| (b, false)),
        (any::<usize>(), any::<u8>(), any::<bool>()).prop_map(|(at, byte, cut)| {
            let mut bytes = envelope(&checkpoint_seed());
            let at = at % bytes.len();
            if cut {
                bytes.truncate(at);
            } else {
                bytes[at] = byte;
            }
            (bytes, false)
        }),
    ];
    run_target("checkpoint", HANG, strategy, |(bytes, checksummed)| {
        check_checkpoint(&bytes, checksummed)
    });
}

fn check_checkpoint(bytes: &[u8], checksummed: bool) -> Result<(), TestCaseError> {
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

// ---------------------------------------------------------------- simulated node files

const NODE_SEED: &str = "name: fuzz-node\ndriverVersion: 580.95.05\nnumaNodes: 2\ngpus:\n  - model: H100-SXM5-80GB\n    count: 2\n    mig: dynamic\n  - model: A100-SXM4-40GB\n    mig: static\n    migDevices: [3g.20gb, 2g.10gb@4]\n";

#[test]
fn node_files_never_panic_and_errors_name_the_file() {
    let seed: Value = serde_yaml::from_str(NODE_SEED).expect("seed parses");
    let strategy = prop_oneof![
        mutations(json_value()).prop_map(move |muts| {
            let mut doc = seed.clone();
            muts.iter().for_each(|m| {
                apply(&mut doc, m);
            });
            serde_yaml::to_string(&doc).expect("yaml")
        }),
        "\\PC{0,200}",
        (0..NODE_SEED.len(), "\\PC{0,8}").prop_map(|(at, s)| {
            let mut text = NODE_SEED.to_string();
            let at = (0..=at)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            text.insert_str(at, &s);
            text
        }),
    ];
    run_target("node-file", HANG, strategy, |text| check_node_file(&text));
}

fn check_node_file(text: &str) -> Result<(), TestCaseError> {
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

// ---------------------------------------------------------------- CEL selectors

const CEL_TOKENS: &[&str] = &[
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

fn cel_device() -> DeviceView {
    let device: k8s_openapi::api::resource::v1::Device = serde_json::from_value(json!({
        "name": "gpu-0",
        "attributes": {"profile": {"string": "1g.10gb"}, "type": {"string": "mig"},
                        "driverVersion": {"version": "580.95.5"}, "index": {"int": 3}},
        "capacity": {"memory": {"value": "10Gi"}}
    }))
    .expect("device");
    DeviceView::from_api("gpu.nvidia.com", &device).expect("valid device")
}

#[test]
fn cel_selectors_never_panic_or_hang() {
    let device = cel_device();
    let tokens = proptest::collection::vec(proptest::sample::select(CEL_TOKENS), 0..40)
        .prop_map(|t| t.concat());
    let strategy = prop_oneof![tokens, "\\PC{0,120}"];
    run_target("cel-selector", HANG, strategy, |expression| {
        if let Ok(selector) = Selector::compile(&expression)
            && let Err(error) = selector.evaluate(&device)
        {
            prop_assert!(!error.to_string().is_empty());
        }
        Ok(())
    });
}

// ---------------------------------------------------------------- quantities

#[test]
fn quantities_never_panic_and_what_parses_round_trips() {
    let shaped = "[+-]?[0-9]{0,25}(\\.[0-9]{0,12})?([eE][+-]?[0-9]{1,4})?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?";
    let strategy = prop_oneof![shaped, "\\PC{0,40}"];
    run_target("quantity", HANG, strategy, |text| check_quantity(&text));
}

fn check_quantity(text: &str) -> Result<(), TestCaseError> {
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

// ---------------------------------------------------------------- gRPC request messages

fn check_grpc(bytes: &[u8]) -> Result<(), TestCaseError> {
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

fn claim(namespace: String, name: String, uid: String) -> ClaimRef {
    ClaimRef {
        namespace,
        name,
        uid,
    }
}

/// The handler's validation: every UID gets exactly one verdict, a rejection names the
/// field, and what passes can name a CDI spec file and an MPS directory.
fn check_claims(claims: Vec<ClaimRef>) -> Result<(), TestCaseError> {
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

#[test]
fn grpc_requests_never_panic_and_validation_names_the_field() {
    let text = "[a-z0-9./-]{0,12}|\\PC{0,12}";
    let claims = proptest::collection::vec((text, text, text), 0..6).prop_map(|v| {
        let claims = v
            .into_iter()
            .map(|(namespace, name, uid)| dra_v1::Claim {
                namespace,
                name,
                uid,
            })
            .collect();
        dra_v1::NodePrepareResourcesRequest { claims }.encode_to_vec()
    });
    let strategy = prop_oneof![claims, proptest::collection::vec(any::<u8>(), 0..256)];
    run_target("grpc-request", HANG, strategy, |bytes| check_grpc(&bytes));
}

// ---------------------------------------------------------------- the corpus

/// Every input that once found a bug, as `tests/fuzz_corpus/<target>/<case>`, through the
/// same check as the generated ones.
#[test]
fn the_corpus_of_inputs_that_found_bugs_still_passes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus");
    let mut ran = 0;
    for target in std::fs::read_dir(&root).expect("corpus dir") {
        let target = target.expect("entry").path();
        if !target.is_dir() {
            continue; // the README
        }
        let name = target.file_name().unwrap().to_string_lossy().into_owned();
        for case in std::fs::read_dir(&target).expect("target dir") {
            let case = case.expect("entry").path();
            let bytes = std::fs::read(&case).expect("case");
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let result = match name.as_str() {
                "opaque-config" => {
                    let doc: Value = serde_json::from_slice(&bytes).expect("corpus JSON");
                    check_opaque(&doc, None)
                }
                "checkpoint" => check_checkpoint(&bytes, false),
                "node-file" => check_node_file(&text),
                "quantity" => check_quantity(text.trim_end_matches('\n')),
                "grpc-request" => check_grpc(&bytes),
                other => panic!("unknown corpus target {other}"),
            };
            if let Err(e) = result {
                panic!("{}: {e}", case.display());
            }
            ran += 1;
        }
    }
    assert!(ran > 0, "the corpus is empty");
    eprintln!("corpus: {ran} inputs");
}
