//! Who holds a claim's devices: the pods of `status.reservedFor`, read from the claim and kept
//! in its checkpoint record; records written before pods were kept still load.

use gpu_dra::checkpoint::{
    Checkpoint, ClaimPhase, ClaimRecord, DeviceRecord, PodRef, decode, encode,
};
use gpu_dra::k8s::ReservedPod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

fn record(pods: Vec<PodRef>) -> Checkpoint {
    let mut cp = Checkpoint::new("boot-1");
    cp.claims.insert(
        "uid-1".into(),
        ClaimRecord {
            uid: "uid-1".into(),
            namespace: "team-a".into(),
            name: "train".into(),
            phase: ClaimPhase::PrepareCompleted,
            devices: vec![DeviceRecord {
                request_names: vec!["gpu".into()],
                pool: "node".into(),
                device: "gpu-0".into(),
                share_id: None,
                cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-1-gpu-0".into()],
                gpu_uuid: "GPU-0".into(),
                mig: None,
                sharing: None,
            }],
            updated_unix: 1,
            pods,
        },
    );
    cp
}

#[test]
fn the_pods_of_a_claim_survive_a_write_and_read_back() {
    let pods = vec![
        PodRef {
            name: "p1".into(),
            uid: "u1".into(),
        },
        PodRef {
            name: "p2".into(),
            uid: "u2".into(),
        },
    ];
    let cp = record(pods);
    let bytes = encode(&cp).unwrap();
    assert_eq!(decode(&bytes).unwrap(), cp);
    let file: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        file["payload"]["claims"]["uid-1"]["pods"],
        json!([{"name": "p1", "uid": "u1"}, {"name": "p2", "uid": "u2"}])
    );
}

#[test]
fn a_record_without_pods_is_written_as_older_plugins_wrote_it_and_still_loads() {
    let bytes = encode(&record(Vec::new())).unwrap();
    let file: Value = serde_json::from_slice(&bytes).unwrap();
    let claim = file["payload"]["claims"]["uid-1"].as_object().unwrap();
    assert!(!claim.contains_key("pods"), "{claim:?}");
    // The file an older plugin wrote (no `pods` key at all) decodes with no pods.
    assert_eq!(decode(&bytes).unwrap().claims["uid-1"].pods, Vec::new());
}

#[test]
fn a_pod_without_a_name_is_refused_naming_the_field() {
    let cp = record(vec![PodRef {
        name: String::new(),
        uid: "u".into(),
    }]);
    let err = encode(&cp).unwrap_err();
    let text = gpu_dra::errors::error_chain(&err);
    assert!(text.contains("pods[].name"), "{text}");
}

#[test]
fn only_pods_of_reserved_for_are_holders() {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "team-a", "uid": "u"},
        "spec": {},
        "status": {"reservedFor": [
            {"resource": "pods", "name": "p1", "uid": "pu1"},
            {"apiGroup": "batch.example.com", "resource": "jobs", "name": "j", "uid": "ju"},
            {"apiGroup": "", "resource": "pods", "name": "p2", "uid": "pu2"}
        ]}
    }))
    .unwrap();
    let got = gpu_dra::k8s::claims::reserved_pods(&claim);
    let want = vec![
        ReservedPod {
            name: "p1".into(),
            uid: "pu1".into(),
        },
        ReservedPod {
            name: "p2".into(),
            uid: "pu2".into(),
        },
    ];
    assert_eq!(got, want);
}
