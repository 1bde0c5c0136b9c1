use std::collections::BTreeMap;

use super::*;
use crate::cdi::input::GpuDeviceRef;
use crate::cdi::spec::{DeviceNode, Mount};

const UID: &str = "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b";

fn node(path: &str, major: i64, minor: i64) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        host_path: Some(path.into()),
        major: Some(major),
        minor: Some(minor),
        file_mode: Some(438),
        permissions: Some("rwm".into()),
        ..DeviceNode::default()
    }
}

fn full(name: &str, minor: u32, uuid: &str) -> ClaimDevice {
    ClaimDevice {
        device_name: name.into(),
        share_id: None,
        gpu: GpuDeviceRef::Full {
            minor,
            uuid: uuid.into(),
        },
        env: vec![],
        mounts: vec![],
    }
}

fn facts(per_device: &[(&str, ContainerEdits)]) -> HostFacts {
    HostFacts {
        common: ContainerEdits {
            device_nodes: vec![node("/dev/nvidiactl", 195, 255)],
            ..ContainerEdits::default()
        },
        per_device: per_device
            .iter()
            .map(|(u, e)| (u.to_string(), e.clone()))
            .collect(),
    }
}

fn nodes(list: Vec<DeviceNode>) -> ContainerEdits {
    ContainerEdits {
        device_nodes: list,
        ..ContainerEdits::default()
    }
}

#[test]
fn full_gpu_claim_gets_its_node_uuid_env_and_the_shared_edits() {
    let facts = facts(&[("GPU-aaa", nodes(vec![node("/dev/nvidia0", 195, 0)]))]);
    let got = build_claim_spec(
        &ClaimNaming::default(),
        UID,
        &[full("gpu-0", 0, "GPU-aaa")],
        &facts,
    )
    .unwrap();
    let want = Spec {
        cdi_version: "0.5.0".into(),
        kind: "k8s.gpu.nvidia.com/claim".into(),
        annotations: BTreeMap::new(),
        devices: vec![Device {
            name: format!("{UID}-gpu-0"),
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits {
                env: vec!["DRA_GPU_UUID_GPU_0=GPU-aaa".into()],
                device_nodes: vec![node("/dev/nvidia0", 195, 0)],
                ..ContainerEdits::default()
            },
        }],
        container_edits: ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            device_nodes: vec![node("/dev/nvidiactl", 195, 255)],
            ..ContainerEdits::default()
        },
    };
    assert_eq!(got, want);
}

#[test]
fn mig_device_keeps_the_caps_nodes_discovery_found() {
    let cap = |minor| DeviceNode {
        path: format!("/dev/nvidia-caps/nvidia-cap{minor}"),
        kind: Some("c".into()),
        major: Some(508),
        minor: Some(minor),
        file_mode: Some(292),
        ..DeviceNode::default()
    };
    let mig_nodes = vec![node("/dev/nvidia0", 195, 0), cap(84), cap(85)];
    let facts = facts(&[("MIG-bbb", nodes(mig_nodes.clone()))]);
    let device = ClaimDevice {
        device_name: "gpu-0-mig-1g10gb-19-0".into(),
        share_id: None,
        gpu: GpuDeviceRef::Mig {
            parent_minor: 0,
            parent_uuid: "GPU-aaa".into(),
            gi: 9,
            ci: 0,
            uuid: "MIG-bbb".into(),
        },
        env: vec![],
        mounts: vec![],
    };
    let got = build_claim_spec(&ClaimNaming::default(), UID, &[device], &facts).unwrap();
    let want = ContainerEdits {
        env: vec!["DRA_GPU_UUID_GPU_0_MIG_1G10GB_19_0=MIG-bbb".into()],
        device_nodes: mig_nodes,
        ..ContainerEdits::default()
    };
    assert_eq!(got.devices[0].container_edits, want);
}

#[test]
fn shared_devices_with_mps_edits_get_distinct_names_and_their_own_env_and_mounts() {
    let facts = facts(&[("GPU-aaa", nodes(vec![node("/dev/nvidia1", 195, 1)]))]);
    let pipe = Mount {
        host_path: "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/pipe".into(),
        container_path: "/tmp/nvidia-mps".into(),
        kind: None,
        options: vec!["rw".into(), "nosuid".into(), "nodev".into(), "bind".into()],
    };
    let mut a = full("gpu-1", 1, "GPU-aaa");
    a.share_id = Some("s1".into());
    a.env = vec![("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/nvidia-mps".into())];
    a.mounts = vec![pipe.clone()];
    let mut b = a.clone();
    b.share_id = Some("s2".into());
    let got = build_claim_spec(&ClaimNaming::default(), UID, &[a, b], &facts).unwrap();
    let names: Vec<&str> = got.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        vec![format!("{UID}-gpu-1-s1"), format!("{UID}-gpu-1-s2")]
    );
    let want_second = ContainerEdits {
        env: vec![
            "DRA_GPU_UUID_GPU_1_S2=GPU-aaa".into(),
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".into(),
        ],
        device_nodes: vec![node("/dev/nvidia1", 195, 1)],
        mounts: vec![pipe],
        ..ContainerEdits::default()
    };
    assert_eq!(got.devices[1].container_edits, want_second);
    assert_eq!(
        got.container_edits.env,
        vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()]
    );
}

#[test]
fn no_uuid_is_visible_spec_wide_so_each_container_reads_only_its_own_devices() {
    let mut facts = facts(&[("GPU-b", nodes(vec![])), ("GPU-a", nodes(vec![]))]);
    facts.common = ContainerEdits::default();
    let devices = [full("gpu-1", 1, "GPU-b"), full("gpu-0", 0, "GPU-a")];
    let got = build_claim_spec(&ClaimNaming::default(), "claim-1", &devices, &facts).unwrap();
    assert_eq!(
        got.container_edits.env,
        vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()]
    );
    let per_device: Vec<&[String]> = got
        .devices
        .iter()
        .map(|d| d.container_edits.env.as_slice())
        .collect();
    assert_eq!(
        per_device,
        vec![
            &["DRA_GPU_UUID_GPU_1=GPU-b".to_string()][..],
            &["DRA_GPU_UUID_GPU_0=GPU-a".to_string()][..],
        ]
    );
    // Nodes without hostPath and a name starting with a letter need nothing newer.
    assert_eq!(got.cdi_version, "0.3.0");
}

#[test]
fn device_ids_match_the_spec_device_names() {
    let naming = ClaimNaming::default();
    let facts = facts(&[("GPU-aaa", nodes(vec![]))]);
    let devices = [full("gpu-0", 0, "GPU-aaa")];
    let spec = build_claim_spec(&naming, UID, &devices, &facts).unwrap();
    let want: Vec<String> = spec
        .devices
        .iter()
        .map(|d| format!("{}={}", spec.kind, d.name))
        .collect();
    assert_eq!(device_ids(&naming, UID, &devices).unwrap(), want);
}

#[test]
fn bad_inputs_are_rejected_naming_claim_and_device() {
    let naming = ClaimNaming::default();
    let facts = facts(&[("GPU-aaa", nodes(vec![]))]);
    let mut bad_env = full("gpu-0", 0, "GPU-aaa");
    bad_env.env = vec![("A=B".into(), "x".into())];
    let cases = [
        (
            build_claim_spec(&naming, UID, &[], &facts),
            "has no devices",
        ),
        (
            build_claim_spec(&naming, UID, &[full("gpu-1", 1, "GPU-zzz")], &facts),
            "no host facts for device gpu-1 (UUID GPU-zzz)",
        ),
        (
            build_claim_spec(&naming, UID, &[bad_env], &facts),
            "env name \"A=B\" of device gpu-0",
        ),
        (
            build_claim_spec(&naming, UID, &[full("gpu 0", 0, "GPU-aaa")], &facts),
            "naming CDI device",
        ),
    ];
    for (got, want) in cases {
        let err = got.unwrap_err().to_string();
        assert!(err.contains(want), "want {want:?} in {err:?}");
    }
}

#[test]
fn duplicate_devices_fail_validation() {
    let facts = facts(&[("GPU-aaa", nodes(vec![]))]);
    let d = full("gpu-0", 0, "GPU-aaa");
    let err = build_claim_spec(&ClaimNaming::default(), UID, &[d.clone(), d], &facts).unwrap_err();
    assert!(
        matches!(
            err,
            BuildError::Invalid {
                source: SpecError::DuplicateDevice { .. },
                ..
            }
        ),
        "got {err:?}"
    );
}
