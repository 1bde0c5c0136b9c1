//! Every kind of spec the driver produces validates against the official CDI JSON schema
//! (copied with provenance into `tests/fixtures/cdi-schema/`).

mod cdi_support;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use cdi_support::{FakeHost, build, full, mig};
use gpu_dra::cdi::{HostMode, Mount, SimulatedHost, Spec};

fn schema_validator() -> jsonschema::Validator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi-schema");
    let schema_text = fs::read_to_string(dir.join("schema.json"))
        .unwrap()
        .replace("defs.json#", "#");
    let mut schema: serde_json::Value = serde_json::from_str(&schema_text).unwrap();
    let defs: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("defs.json")).unwrap()).unwrap();
    schema["definitions"] = defs["definitions"].clone();
    jsonschema::validator_for(&schema).unwrap()
}

fn assert_valid(what: &str, spec: &Spec) {
    let validator = schema_validator();
    let instance = serde_json::to_value(spec).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert_eq!(errors, Vec::<String>::new(), "{what}");
}

#[test]
fn schema_rejects_what_it_should_so_validation_is_meaningful() {
    let validator = schema_validator();
    let missing_devices = serde_json::json!({"cdiVersion": "0.3.0", "kind": "a/b"});
    let bad_node = serde_json::json!({"cdiVersion": "0.3.0", "kind": "a/b",
        "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"hostPath": "/x"}]}}]});
    let got = (
        validator.is_valid(&missing_devices),
        validator.is_valid(&bad_node),
    );
    assert_eq!(got, (false, false));
}

#[test]
fn every_kind_of_spec_we_produce_validates_against_the_official_schema() {
    let host = FakeHost::standard();
    let hook = host.mode(Some("/opt/hook/nvidia-cdi-hook"));
    let mut mps = full("gpu-1", 1, "GPU-ccc");
    mps.share_id = Some("share-1".into());
    mps.env = vec![("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/nvidia-mps".into())];
    mps.mounts = vec![Mount {
        host_path: "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/pipe".into(),
        container_path: "/tmp/nvidia-mps".into(),
        kind: None,
        options: vec!["rw".into(), "nosuid".into(), "nodev".into(), "bind".into()],
    }];
    let sim = HostMode::Simulated(SimulatedHost {
        common_nodes: SimulatedHost::standard_control_nodes(510),
        device_nodes: BTreeMap::from([
            (
                "GPU-aaa".to_string(),
                vec![SimulatedHost::char_node("/dev/nvidia0", 195, 0)],
            ),
            (
                "MIG-bbb".to_string(),
                vec![SimulatedHost::char_node("/dev/nvidia0", 195, 0)],
            ),
        ]),
    });
    let cases = [
        ("full GPU", build(&hook, &[full("gpu-0", 0, "GPU-aaa")])),
        ("MIG", build(&hook, &[mig()])),
        (
            "multiple devices",
            build(
                &hook,
                &[
                    full("gpu-0", 0, "GPU-aaa"),
                    full("gpu-1", 1, "GPU-ccc"),
                    mig(),
                ],
            ),
        ),
        ("MPS share", build(&hook, &[mps])),
        (
            "simulated node",
            build(&sim, &[full("gpu-0", 0, "GPU-aaa"), mig()]),
        ),
    ];
    for (what, spec) in cases {
        assert_valid(what, &spec.unwrap());
    }
}
