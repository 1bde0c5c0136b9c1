//! Decoding edge cases: one parameters object in, a config or an exact message out.

use serde_json::{Value, json};

use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn gpu_config(sharing: Value) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing})
}

fn message(parameters: Value) -> String {
    let err = decode(&parameters).expect_err("the config must be rejected");
    crate::errors::error_chain(&err)
}

fn mps(config: MpsConfig) -> Option<SharingConfig> {
    Some(SharingConfig::Mps(config))
}

/// A device of a claim, for the resolvers.
fn target(device: &str, request: &str, kind: TargetKind) -> Target {
    Target {
        device: device.into(),
        request: request.into(),
        kind,
        uuid: None,
        memory_bytes: 0,
    }
}

/// A config entry naming `requests` (none: every request).
fn entry(from_class: bool, requests: &[&str], parameters: Value) -> Entry {
    Entry {
        from_class,
        requests: requests.iter().map(|r| r.to_string()).collect(),
        parameters,
    }
}

#[test]
fn config_without_sharing_is_exclusive() {
    let want = Config {
        api_version: ApiVersion::ResourceNvidiaV1beta1,
        kind: ConfigKind::GpuConfig,
        sharing: None,
        vfio: None,
        vgpu: None,
    };
    let got = decode(&json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}));
    assert_eq!(Ok(want), got);
}

#[test]
fn null_sharing_counts_as_absent() {
    let got = decode(&gpu_config(Value::Null)).map(|c| c.sharing);
    assert_eq!(Ok(None), got);
}

#[test]
fn seed_talk_api_version_decodes_like_nvidia_one() {
    let got = decode(&json!({
        "apiVersion": "gpu.nvidia.com/v1alpha1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS"},
    }));
    let want = Config {
        api_version: ApiVersion::GpuNvidiaV1alpha1,
        kind: ConfigKind::MigDeviceConfig,
        sharing: mps(MpsConfig::default()),
        vfio: None,
        vgpu: None,
    };
    assert_eq!(Ok(want), got);
}

#[test]
fn time_slicing_without_config_gets_default_interval() {
    let got = decode(&gpu_config(json!({"strategy": "TimeSlicing"}))).map(|c| c.sharing);
    let want = Some(SharingConfig::TimeSlicing {
        interval: TimeSliceInterval::Default,
    });
    assert_eq!(Ok(want), got);
}

#[test]
fn hyphenated_time_slicing_is_accepted_with_its_interval() {
    let got = decode(&gpu_config(json!({
        "strategy": "Time-Slicing",
        "timeSlicingConfig": {"interval": "Long"},
    })))
    .map(|c| c.sharing);
    let want = Some(SharingConfig::TimeSlicing {
        interval: TimeSliceInterval::Long,
    });
    assert_eq!(Ok(want), got);
}

#[test]
fn interval_levels_follow_nvidia_smi() {
    let want = vec![(0, "Default"), (1, "Short"), (2, "Medium"), (3, "Long")];
    let got: Vec<(u8, String)> = TimeSliceInterval::ALL
        .iter()
        .map(|i| (i.level(), i.to_string()))
        .collect();
    let want: Vec<(u8, String)> = want.into_iter().map(|(l, n)| (l, n.to_owned())).collect();
    assert_eq!(want, got);
}

#[test]
fn mps_limits_decode_to_bytes() {
    let got = decode(&gpu_config(json!({
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
            "defaultPerDevicePinnedMemoryLimit": {"1": "4Gi", "0": 2147483648u64},
        },
    })))
    .map(|c| c.sharing);
    let want = mps(MpsConfig {
        active_thread_percentage: Some(50),
        pinned_memory_bytes: Some(10 * GIB),
        per_device_pinned_memory_bytes: vec![("0".into(), 2 * GIB), ("1".into(), 4 * GIB)],
        multi_user: false,
    });
    assert_eq!(Ok(want), got);
}

#[test]
fn multi_user_decodes_true_and_defaults_to_off() {
    let decoded = |block: Value| {
        decode(&gpu_config(json!({"strategy": "MPS", "mpsConfig": block}))).map(|c| c.sharing)
    };
    let on = mps(MpsConfig {
        multi_user: true,
        ..MpsConfig::default()
    });
    let off = mps(MpsConfig::default());
    assert_eq!(
        (
            decoded(json!({"multiUser": true})),
            decoded(json!({"multiUser": null})),
            decoded(json!({"multiUser": false})),
        ),
        (Ok(on), Ok(off.clone()), Ok(off))
    );
}

#[test]
fn decimal_memory_limit_is_rounded_up_to_whole_bytes() {
    let got = decode(&gpu_config(json!({
        "strategy": "MPS",
        "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1048576500m"},
    })))
    .map(|c| c.sharing);
    let want = mps(MpsConfig {
        pinned_memory_bytes: Some(MIB + 1),
        ..MpsConfig::default()
    });
    assert_eq!(Ok(want), got);
}

#[test]
fn whole_float_thread_percentage_is_accepted() {
    let got = decode(&gpu_config(json!({
        "strategy": "MPS",
        "mpsConfig": {"defaultActiveThreadPercentage": 25.0},
    })))
    .map(|c| c.sharing);
    let want = mps(MpsConfig {
        active_thread_percentage: Some(25),
        ..MpsConfig::default()
    });
    assert_eq!(Ok(want), got);
}

#[test]
fn decoding_errors_name_the_field_the_value_and_the_choices() {
    let mps_block = |block: Value| gpu_config(json!({"strategy": "MPS", "mpsConfig": block}));
    let table = [
        (
            json!({"apiVersion": "x/v1", "kind": "GpuConfig"}),
            "apiVersion: \"x/v1\" is not supported; valid: resource.nvidia.com/v1beta1, gpu.nvidia.com/v1alpha1",
        ),
        (
            json!({"kind": "GpuConfig"}),
            "apiVersion: required field is missing; valid: resource.nvidia.com/v1beta1, gpu.nvidia.com/v1alpha1",
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuClaimParameters"}),
            "kind: \"GpuClaimParameters\" is not valid; valid: GpuConfig, MigDeviceConfig, VfioDeviceConfig, VgpuDeviceConfig",
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1beta1"}),
            "kind: required field is missing; valid: GpuConfig, MigDeviceConfig, VfioDeviceConfig, VgpuDeviceConfig",
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": 3}),
            "kind: expected a string, got 3",
        ),
        (
            json!(["GpuConfig"]),
            "parameters: expected an object with apiVersion, kind and sharing, got [\"GpuConfig\"]",
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "shareing": {}}),
            "shareing: unknown field; valid fields: apiVersion, kind, sharing",
        ),
        (
            gpu_config(json!({"strategy": "MPS", "replicas": 2})),
            "sharing.replicas: unknown field; valid fields: strategy, timeSlicingConfig, mpsConfig",
        ),
        (
            gpu_config(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"slice": "Long"}})),
            "sharing.timeSlicingConfig.slice: unknown field; valid fields: interval",
        ),
        (
            mps_block(json!({"threads": 50})),
            "sharing.mpsConfig.threads: unknown field; valid fields: defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit, multiUser",
        ),
        (
            mps_block(json!({"multiUser": "yes"})),
            "sharing.mpsConfig.multiUser: expected true or false, got \"yes\"",
        ),
        (
            mps_block(json!({"multiuser": true})),
            "sharing.mpsConfig.multiuser: unknown field; valid fields: defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit, multiUser",
        ),
        (
            gpu_config(json!({"strategy": "Fast"})),
            "sharing.strategy: \"Fast\" is not valid; valid: TimeSlicing, MPS",
        ),
        (
            gpu_config(json!({"timeSlicingConfig": {}})),
            "sharing.strategy: required field is missing; valid: TimeSlicing, MPS",
        ),
        (
            gpu_config(
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "VeryLong"}}),
            ),
            "sharing.timeSlicingConfig.interval: \"VeryLong\" is not valid; valid: Default, Short, Medium, Long",
        ),
        (
            gpu_config(json!({"strategy": "TimeSlicing", "mpsConfig": {}})),
            "sharing.mpsConfig: not allowed with strategy TimeSlicing; use timeSlicingConfig or drop it",
        ),
        (
            gpu_config(json!({"strategy": "MPS", "timeSlicingConfig": {}})),
            "sharing.timeSlicingConfig: not allowed with strategy MPS; use mpsConfig or drop it",
        ),
        (
            mps_block(json!({"defaultActiveThreadPercentage": 150})),
            "sharing.mpsConfig.defaultActiveThreadPercentage: 150 is outside 0–100",
        ),
        (
            mps_block(json!({"defaultActiveThreadPercentage": -5})),
            "sharing.mpsConfig.defaultActiveThreadPercentage: -5 is outside 0–100",
        ),
        (
            mps_block(json!({"defaultActiveThreadPercentage": 12.5})),
            "sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer from 0 to 100, got 12.5",
        ),
        (
            mps_block(json!({"defaultActiveThreadPercentage": "50"})),
            "sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer from 0 to 100, got \"50\"",
        ),
        (
            mps_block(json!({"defaultPinnedDeviceMemoryLimit": "512Ki"})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 512Ki is outside the valid range of memory limits: at least 1Mi (MPS takes limits in whole MiB) and below 16Ei",
        ),
        (
            mps_block(json!({"defaultPinnedDeviceMemoryLimit": "-1Gi"})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: -1Gi is outside the valid range of memory limits: at least 1Mi (MPS takes limits in whole MiB) and below 16Ei",
        ),
        (
            mps_block(json!({"defaultPinnedDeviceMemoryLimit": true})),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: expected a quantity such as \"10Gi\", got true",
        ),
        (
            mps_block(json!({"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}})),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0: \"lots\" is not a quantity: it does not start with a number",
        ),
        (
            mps_block(json!({"defaultPerDevicePinnedMemoryLimit": ["4Gi"]})),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: expected an object of device key to quantity, got [\"4Gi\"]",
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
                   "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}),
            "sharing.timeSlicingConfig.interval: Short cannot be set on a MIG device (kind MigDeviceConfig): the time-slice is a whole-GPU setting, so only Default is valid (processes on one MIG device already share it by time-slicing); to choose the interval, claim the full GPU with kind GpuConfig",
        ),
    ];
    let want: Vec<String> = table.iter().map(|(_, m)| (*m).to_owned()).collect();
    let got: Vec<String> = table.into_iter().map(|(p, _)| message(p)).collect();
    assert_eq!(want, got);
}

#[test]
fn unparsable_quantity_names_field_and_value_first() {
    let got = message(gpu_config(json!({
        "strategy": "MPS",
        "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "5G1"},
    })));
    let want = "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: \"5G1\" is not a quantity: \
                unknown suffix \"G1\"; valid suffixes are ";
    assert_eq!(want, &got[..want.len().min(got.len())]);
}

#[test]
fn mig_device_config_accepts_default_interval() {
    let got = decode(&json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}},
    }))
    .map(|c| c.sharing);
    let want = Some(SharingConfig::TimeSlicing {
        interval: TimeSliceInterval::Default,
    });
    assert_eq!(Ok(want), got);
}

fn vfio(iommu: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "VfioDeviceConfig",
        "iommu": iommu,
    })
}

#[test]
fn vfio_device_config_decodes_nvidias_fields_and_defaults_to_legacy_without_api_device() {
    use super::{IommuBackend, VfioSettings};
    let got = decode(&vfio(
        json!({"backendPolicy": "PreferIommuFD", "enableAPIDevice": true}),
    ))
    .map(|c| c.vfio);
    assert_eq!(
        Ok(Some(VfioSettings {
            backend: IommuBackend::PreferIommuFd,
            api_device: true
        })),
        got
    );
    let bare =
        decode(&json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}))
            .map(|c| c.vfio);
    assert_eq!(Ok(Some(VfioSettings::default())), bare);
}

#[test]
fn vfio_device_config_errors_name_the_field_the_value_and_the_choices() {
    let got: Vec<String> = [
        vfio(json!({"backendPolicy": "IommuFD"})),
        vfio(json!({"enableAPIDevice": "yes"})),
        vfio(json!({"group": 3})),
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
               "sharing": {"strategy": "MPS"}}),
    ]
    .into_iter()
    .map(message)
    .collect();
    assert_eq!(
        vec![
            "iommu.backendPolicy: \"IommuFD\" is not valid; valid: LegacyOnly, PreferIommuFD",
            "iommu.enableAPIDevice: expected a boolean, got \"yes\"",
            "iommu.group: unknown field; valid fields: backendPolicy, enableAPIDevice",
            "sharing: unknown field; valid fields: apiVersion, kind, iommu",
        ],
        got
    );
}

#[test]
fn vfio_settings_go_to_vfio_devices_only_and_a_config_naming_the_wrong_kind_is_refused() {
    use super::{TargetKind, VfioSettings, resolve_vfio};
    let targets = [
        target("gpu-vfio-0", "vm", TargetKind::Vfio),
        target("gpu-1", "train", TargetKind::FullGpu),
    ];
    let entry = |requests: &[&str], parameters| entry(false, requests, parameters);
    let api = vfio(json!({"enableAPIDevice": true}));
    let got = resolve_vfio(&targets, &[entry(&[], api.clone())]).unwrap();
    assert_eq!(
        vec![
            Some(VfioSettings {
                api_device: true,
                ..VfioSettings::default()
            }),
            None
        ],
        got
    );
    let err = resolve_vfio(&targets, &[entry(&["train"], api)]).unwrap_err();
    assert!(
        crate::errors::error_chain(&err)
            .contains("VfioDeviceConfig names request \"train\", which got a full GPU"),
        "{}",
        crate::errors::error_chain(&err)
    );
    let gpu = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                     "sharing": {"strategy": "TimeSlicing"}});
    let err = resolve_vfio(&targets, &[entry(&["vm"], gpu)]).unwrap_err();
    assert!(
        crate::errors::error_chain(&err)
            .contains("GpuConfig names request \"vm\", which got a VFIO device"),
        "{}",
        crate::errors::error_chain(&err)
    );
}

#[test]
fn a_claim_takes_one_vfio_config_and_a_class_one_as_defaults_beside_it() {
    use super::{TargetKind, resolve_vfio};
    let targets = [
        target("gpu-vfio-0", "a", TargetKind::Vfio),
        target("gpu-vfio-1", "b", TargetKind::Vfio),
    ];
    let api = vfio(json!({"enableAPIDevice": true}));
    let two = [
        entry(false, &["a"], api.clone()),
        entry(false, &["b"], api.clone()),
    ];
    let err = crate::errors::error_chain(&resolve_vfio(&targets, &two).unwrap_err());
    assert!(
        err.contains("opaque config entry 1 of the claim")
            && err.contains("a claim takes at most one; this is its second (the first is entry 0)"),
        "{err}"
    );
    let class_and_claim = [entry(true, &[], api.clone()), entry(false, &["a"], api)];
    assert!(resolve_vfio(&targets, &class_and_claim).is_ok());
}

fn vgpu_config(fields: Value) -> Value {
    let mut v = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VgpuDeviceConfig"});
    for (k, f) in fields.as_object().unwrap() {
        v[k] = f.clone();
    }
    v
}

#[test]
fn vgpu_device_config_decodes_nvidias_fields_and_normalises_params() {
    let got = decode(&vgpu_config(json!({
        "profile": "H100-4C", "typeID": 1056, "params": " frame_rate_limiter=0 , disable_vnc=1"
    })));
    let want = Config {
        api_version: ApiVersion::ResourceNvidiaV1beta1,
        kind: ConfigKind::VgpuDeviceConfig,
        sharing: None,
        vfio: None,
        vgpu: Some(VgpuSettings {
            profile: Some("H100-4C".into()),
            type_id: Some(1056),
            params: Some("frame_rate_limiter=0,disable_vnc=1".into()),
        }),
    };
    assert_eq!(Ok(want), got);
    let empty = decode(&vgpu_config(json!({}))).map(|c| c.vgpu);
    assert_eq!(Ok(Some(VgpuSettings::default())), empty);
}

#[test]
fn vgpu_device_config_errors_name_the_field_the_value_and_what_is_valid() {
    assert_eq!(
        "sharing: unknown field; valid fields: apiVersion, kind, profile, typeID, params",
        message(vgpu_config(json!({"sharing": {"strategy": "MPS"}})))
    );
    assert_eq!(
        "typeID: -3 is outside 1–4294967295 (a vGPU type ID, as nvidia-smi vgpu -s -v lists it)",
        message(vgpu_config(json!({"typeID": -3})))
    );
    assert_eq!(
        "typeID: \"1056\" is outside 1–4294967295 (a vGPU type ID, as nvidia-smi vgpu -s -v lists it)",
        message(vgpu_config(json!({"typeID": "1056"})))
    );
    assert_eq!(
        "profile: expected a string, got 4",
        message(vgpu_config(json!({"profile": 4})))
    );
    assert_eq!(
        "params: \"disable_vnc\" is not valid; valid: key=value pairs separated by commas, such as \"frame_rate_limiter=0,disable_vnc=1\" (\"disable_vnc\" has no '=')",
        message(vgpu_config(json!({"params": "disable_vnc"})))
    );
    assert_eq!(
        "params: \"Frame=1\" is not valid; valid: key=value pairs separated by commas, such as \"frame_rate_limiter=0,disable_vnc=1\" (key \"Frame\" is not lower-case letters, digits and '_')",
        message(vgpu_config(json!({"params": "Frame=1"})))
    );
    assert!(
        message(vgpu_config(json!({"params": "a=1,".repeat(300)})))
            .contains("at most 1024 characters")
    );
    assert!(
        message(json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "Vgpu"}))
            .contains("valid: GpuConfig, MigDeviceConfig, VfioDeviceConfig, VgpuDeviceConfig")
    );
}

#[test]
fn vgpu_settings_go_to_vgpus_only_the_last_entry_wins_and_a_wrong_kind_is_refused() {
    use super::{TargetKind, VfioSettings, resolve_vfio, resolve_vgpu};
    let targets = [
        target("vgpu-0-4c-0", "vm", TargetKind::Vgpu),
        target("gpu-vfio-1", "passthrough", TargetKind::Vfio),
        target("gpu-2", "train", TargetKind::FullGpu),
    ];
    let class = vgpu_config(json!({"params": "disable_vnc=1"}));
    let claim = vgpu_config(json!({"profile": "H100-4C"}));
    // The claim's entry comes first but wins over the class's, whole.
    let entries = [entry(false, &["vm"], claim), entry(true, &[], class)];
    let got = resolve_vgpu(&targets, &entries).unwrap();
    let want = VgpuSettings {
        profile: Some("H100-4C".into()),
        ..VgpuSettings::default()
    };
    assert_eq!(vec![Some(want), None, None], got);
    // A vGPU still gets VFIO defaults, as a VFIO GPU does.
    let vfio = resolve_vfio(&targets, &entries).unwrap();
    assert_eq!(
        vec![
            Some(VfioSettings::default()),
            Some(VfioSettings::default()),
            None
        ],
        vfio
    );
    for (request, got) in [("passthrough", "a VFIO device"), ("train", "a full GPU")] {
        let err = resolve_vgpu(
            &targets,
            &[entry(false, &[request], vgpu_config(json!({})))],
        )
        .unwrap_err();
        let text = crate::errors::error_chain(&err);
        assert!(
            text.contains(&format!(
                "VgpuDeviceConfig names request \"{request}\", which got {got}"
            )),
            "{text}"
        );
    }
    let gpu = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                     "sharing": {"strategy": "TimeSlicing"}});
    let err = resolve_vgpu(&targets, &[entry(false, &["vm"], gpu)]).unwrap_err();
    assert!(
        crate::errors::error_chain(&err)
            .contains("GpuConfig names request \"vm\", which got a vGPU"),
        "{}",
        crate::errors::error_chain(&err)
    );
}
