//! The CDI writer against a real directory.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;

use gpu_dra::cdi::{
    CdiWriter, ClaimDevice, ClaimNaming, ContainerEdits, Device, GpuDeviceRef, Spec, WriterError,
};

const UID: &str = "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b";

fn spec(kind: &str, uid: &str) -> Spec {
    Spec {
        cdi_version: "0.5.0".into(),
        kind: kind.into(),
        annotations: BTreeMap::new(),
        devices: vec![Device {
            name: format!("{uid}-gpu-0"),
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits {
                env: vec!["DRA_GPU_UUID_GPU_0=GPU-aaa".into()],
                ..ContainerEdits::default()
            },
        }],
        container_edits: ContainerEdits::default(),
    }
}

#[test]
fn written_spec_is_world_readable_json_that_reads_back_equal() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path().join("run/cdi"));
    let want = spec("k8s.gpu.nvidia.com/claim", UID);
    let path = writer.write_claim_spec(UID, &want).unwrap();
    assert_eq!(
        path,
        tmp.path()
            .join(format!("run/cdi/k8s.gpu.nvidia.com-claim_{UID}.json"))
    );
    let got: Spec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(got, want);
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
}

#[test]
fn rewriting_a_spec_replaces_it_and_leaves_only_the_spec_file() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path());
    writer
        .write_claim_spec(UID, &spec("k8s.gpu.nvidia.com/claim", UID))
        .unwrap();
    let mut second = spec("k8s.gpu.nvidia.com/claim", UID);
    second.devices[0].container_edits.env = vec!["X=2".into()];
    let path = writer.write_claim_spec(UID, &second).unwrap();
    let got: Spec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(got, second);
    let files: Vec<String> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, vec![format!("k8s.gpu.nvidia.com-claim_{UID}.json")]);
}

#[test]
fn removing_a_spec_is_idempotent_and_also_drops_a_go_driver_yaml_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path());
    writer
        .write_claim_spec(UID, &spec("k8s.gpu.nvidia.com/claim", UID))
        .unwrap();
    let yaml = tmp
        .path()
        .join(format!("k8s.gpu.nvidia.com-claim_{UID}.yaml"));
    fs::write(&yaml, "---\n").unwrap();
    let got = (
        writer.remove_claim_spec(UID).unwrap(),
        writer.remove_claim_spec(UID).unwrap(),
        yaml.exists(),
    );
    assert_eq!(got, (true, false, false));
}

#[test]
fn listing_finds_only_our_claim_specs() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path());
    for uid in ["bbbb-2", "aaaa-1"] {
        writer
            .write_claim_spec(uid, &spec("k8s.gpu.nvidia.com/claim", uid))
            .unwrap();
    }
    for other in [
        "k8s.gpu.nvidia.com-claim_aaaa-1.yaml".to_string(),
        ".k8s.gpu.nvidia.com-claim_cccc-3.json.tmp-12-0".to_string(),
        "k8s.other.com-claim_dddd-4.json".to_string(),
        "nvidia.yaml".to_string(),
    ] {
        fs::write(tmp.path().join(other), "").unwrap();
    }
    assert_eq!(writer.list_claim_specs().unwrap(), vec!["aaaa-1", "bbbb-2"]);
}

#[test]
fn listing_a_missing_directory_is_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path().join("absent"));
    assert_eq!(writer.list_claim_specs().unwrap(), Vec::<String>::new());
}

#[test]
fn specs_the_runtime_could_not_use_are_refused_before_touching_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path());
    let mut too_old = spec("k8s.gpu.nvidia.com/claim", UID);
    too_old.cdi_version = "0.3.0".into(); // the device name starts with a digit: needs 0.5.0
    let wrong_kind = writer
        .write_claim_spec(UID, &spec("k8s.other.com/claim", UID))
        .unwrap_err();
    let invalid = writer.write_claim_spec(UID, &too_old).unwrap_err();
    let bad_uid = writer
        .write_claim_spec("../x", &spec("k8s.gpu.nvidia.com/claim", UID))
        .unwrap_err();
    assert!(
        matches!(wrong_kind, WriterError::WrongKind { .. }),
        "got {wrong_kind:?}"
    );
    assert!(
        matches!(invalid, WriterError::Invalid { .. }),
        "got {invalid:?}"
    );
    assert!(
        matches!(bad_uid, WriterError::ClaimUid { .. }),
        "got {bad_uid:?}"
    );
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn custom_driver_name_changes_kind_file_and_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::with_naming(
        tmp.path(),
        ClaimNaming::for_driver("gpu.example.com").unwrap(),
    );
    let path = writer
        .write_claim_spec(UID, &spec("k8s.gpu.example.com/claim", UID))
        .unwrap();
    let device = ClaimDevice {
        device_name: "gpu-0".into(),
        share_id: None,
        gpu: GpuDeviceRef::Full {
            minor: 0,
            uuid: "GPU-aaa".into(),
        },
        env: vec![],
        mounts: vec![],
    };
    let got = (
        path.file_name().unwrap().to_string_lossy().into_owned(),
        writer.device_ids(UID, &[device]).unwrap(),
    );
    let want = (
        format!("k8s.gpu.example.com-claim_{UID}.json"),
        vec![format!("k8s.gpu.example.com/claim={UID}-gpu-0")],
    );
    assert_eq!(got, want);
}

#[test]
fn the_start_up_sweep_removes_interrupted_writes_of_every_claim_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path());
    writer
        .write_claim_spec("aaaa-1", &spec("k8s.gpu.nvidia.com/claim", "aaaa-1"))
        .unwrap();
    let ours = [
        ".k8s.gpu.nvidia.com-claim_aaaa-1.json.tmp-12-0",
        ".k8s.gpu.nvidia.com-claim_cccc-3.json.tmp-4242-7",
    ];
    let theirs = [
        ".k8s.other.com-claim_dddd-4.json.tmp-1-0",
        ".nvidia.yaml.tmp-1-0",
        "k8s.gpu.nvidia.com-claim_bbbb-2.json",
    ];
    for name in ours.iter().chain(&theirs) {
        fs::write(tmp.path().join(name), "{").unwrap();
    }
    let removed = writer.remove_interrupted_writes().unwrap();
    let mut want: Vec<_> = ours.iter().map(|n| tmp.path().join(n)).collect();
    want.sort();
    assert_eq!(removed, want);
    for name in theirs {
        assert!(tmp.path().join(name).exists(), "{name} must stay");
    }
    assert!(writer.spec_path("aaaa-1").unwrap().exists());
    assert_eq!(
        writer.remove_interrupted_writes().unwrap(),
        Vec::<std::path::PathBuf>::new()
    );
}

#[test]
fn removing_a_claim_spec_leaves_other_files_in_the_directory_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path());
    writer
        .write_claim_spec("aaaa-1", &spec("k8s.gpu.nvidia.com/claim", "aaaa-1"))
        .unwrap();
    let other = tmp
        .path()
        .join(".k8s.gpu.nvidia.com-claim_bbbb-2.json.tmp-1-0");
    fs::write(&other, "{").unwrap();
    assert!(writer.remove_claim_spec("aaaa-1").unwrap());
    assert!(!writer.remove_claim_spec("aaaa-1").unwrap());
    assert!(other.exists());
}
