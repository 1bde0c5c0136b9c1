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

use fuzz_support::checks::{
    CEL_TOKENS, NODE_SEED, cel_device, check_checkpoint, check_device_file, check_grpc,
    check_node_file, check_opaque, check_quantity, checkpoint_seed, device_seed, envelope,
    opaque_seeds,
};
use fuzz_support::{apply, json_value, mutations, run_target};
use gpu_dra::cel::Selector;
use gpu_dra::kubelet::proto::dra_v1;
use proptest::prelude::*;
use prost::Message;
use serde_json::Value;

/// Far above any input's real cost: only a hang or a runaway loop reaches it.
const HANG: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------- opaque config

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

// ---------------------------------------------------------------- simulated node files

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

// ---------------------------------------------------------------- CEL selectors

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

#[test]
fn cel_device_files_never_panic_and_decode_errors_name_the_file() {
    let selectors = [
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('5Gi')) > 0",
        "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('1.0.0'))",
    ];
    let strategy = (
        0..selectors.len(),
        prop_oneof![
            mutations(json_value()).prop_map(|muts| {
                let mut doc = device_seed();
                muts.iter().for_each(|m| {
                    apply(&mut doc, m);
                });
                serde_yaml::to_string(&doc).expect("yaml")
            }),
            "\\PC{0,120}",
        ],
    );
    run_target("cel-device-file", HANG, strategy, |(selector, text)| {
        check_device_file(&text, selectors[selector])
    });
}

// ---------------------------------------------------------------- quantities

#[test]
fn quantities_never_panic_and_what_parses_round_trips() {
    let shaped = "[+-]?[0-9]{0,25}(\\.[0-9]{0,12})?([eE][+-]?[0-9]{1,4})?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?";
    let strategy = prop_oneof![shaped, "\\PC{0,40}"];
    run_target("quantity", HANG, strategy, |text| check_quantity(&text));
}

// ---------------------------------------------------------------- gRPC request messages

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
                "cel-device-file" => check_device_file(&text, "device.driver == 'gpu.nvidia.com'"),
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
