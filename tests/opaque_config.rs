//! Resolution tables for the opaque config API: which entry wins for which device, how
//! devices are grouped, and the messages users get when a config does not fit their devices.

use gpu_dra::kubelet::error_chain;
use gpu_dra::opaque::{
    Entry, MpsLimits, Sharing, SharingGroup, Target, TargetKind, TimeSliceInterval, resolve,
};
use serde_json::{Value, json};

/// The example claims stay valid.
#[path = "opaque_config/examples.rs"]
mod examples;

const GIB: u64 = 1 << 30;
const V1BETA1: &str = "resource.nvidia.com/v1beta1";

fn gpu(device: &str, request: &str) -> Target {
    Target {
        device: device.to_owned(),
        request: request.to_owned(),
        kind: TargetKind::FullGpu,
        uuid: Some(format!("GPU-{device}")),
        memory_bytes: 80 * GIB,
    }
}

fn mig(device: &str, request: &str, uuid: Option<&str>) -> Target {
    Target {
        device: device.to_owned(),
        request: request.to_owned(),
        kind: TargetKind::Mig,
        uuid: uuid.map(str::to_owned),
        memory_bytes: 10 * GIB,
    }
}

fn params(kind: &str, sharing: Value) -> Value {
    json!({"apiVersion": V1BETA1, "kind": kind, "sharing": sharing})
}

fn time_slicing(interval: &str) -> Value {
    params(
        "GpuConfig",
        json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}),
    )
}

fn mps(kind: &str, config: Value) -> Value {
    params(kind, json!({"strategy": "MPS", "mpsConfig": config}))
}

fn class(requests: &[&str], parameters: Value) -> Entry {
    Entry {
        from_class: true,
        requests: requests.iter().map(|r| (*r).to_owned()).collect(),
        parameters,
    }
}

fn claim(requests: &[&str], parameters: Value) -> Entry {
    Entry {
        from_class: false,
        ..class(requests, parameters)
    }
}

fn sliced(devices: Vec<usize>, interval: TimeSliceInterval) -> SharingGroup {
    SharingGroup {
        devices,
        sharing: Sharing::TimeSlicing { interval },
    }
}

fn mps_group(devices: Vec<usize>, threads: Option<u8>, pinned: Vec<Option<u64>>) -> SharingGroup {
    SharingGroup {
        devices,
        sharing: Sharing::Mps(MpsLimits {
            active_thread_percentage: threads,
            pinned_memory_bytes: pinned,
            multi_user: false,
        }),
    }
}

fn failure(targets: &[Target], entries: &[Entry]) -> String {
    let err = resolve(targets, entries).expect_err("the config must be rejected");
    error_chain(&err)
}

#[test]
fn claim_without_config_leaves_every_device_exclusive() {
    let got = resolve(&[gpu("gpu-0", "gpu"), gpu("gpu-1", "gpu")], &[]);
    assert_eq!(Ok(vec![]), got);
}

#[test]
fn precedence_table_picks_the_winning_entry_per_device() {
    let two_requests = [gpu("gpu-0", "train"), gpu("gpu-1", "serve")];
    let table: Vec<(&str, Vec<Entry>, Vec<SharingGroup>)> = vec![
        (
            "claim entry overrides class entry",
            vec![
                class(&[], time_slicing("Long")),
                claim(&[], mps("GpuConfig", json!({}))),
            ],
            vec![mps_group(vec![0, 1], None, vec![None, None])],
        ),
        (
            "class entry listed after a claim entry still loses",
            vec![
                claim(&[], time_slicing("Short")),
                class(&[], time_slicing("Long")),
            ],
            vec![sliced(vec![0, 1], TimeSliceInterval::Short)],
        ),
        (
            "later claim entry wins over an earlier one",
            vec![
                claim(&[], time_slicing("Short")),
                claim(&[], time_slicing("Medium")),
            ],
            vec![sliced(vec![0, 1], TimeSliceInterval::Medium)],
        ),
        (
            "per-request entries apply only to their request",
            vec![
                claim(&["serve"], time_slicing("Long")),
                claim(
                    &["train"],
                    mps("GpuConfig", json!({"defaultActiveThreadPercentage": 20})),
                ),
            ],
            vec![
                mps_group(vec![0], Some(20), vec![None]),
                sliced(vec![1], TimeSliceInterval::Long),
            ],
        ),
        (
            "an entry for all requests is overridden for one request by a later entry",
            vec![
                class(&[], time_slicing("Short")),
                claim(&["serve"], time_slicing("Long")),
            ],
            vec![
                sliced(vec![0], TimeSliceInterval::Short),
                sliced(vec![1], TimeSliceInterval::Long),
            ],
        ),
        (
            "a later entry without sharing makes the device exclusive again",
            vec![
                class(&[], time_slicing("Long")),
                claim(
                    &["train"],
                    json!({"apiVersion": V1BETA1, "kind": "GpuConfig"}),
                ),
            ],
            vec![sliced(vec![1], TimeSliceInterval::Long)],
        ),
        (
            "an entry naming another request applies to nothing",
            vec![claim(&["other"], time_slicing("Long"))],
            vec![],
        ),
    ];
    for (case, entries, want) in table {
        let got = resolve(&two_requests, &entries);
        assert_eq!(Ok(want), got, "{case}");
    }
}

#[test]
fn subrequest_device_matches_entries_naming_it_or_its_parent() {
    let targets = [
        gpu("gpu-0", "gpu/h100"),
        mig("gpu-1-mig-1g10gb-0", "small/mig", None),
    ];
    let table: Vec<(&str, Entry, Vec<SharingGroup>)> = vec![
        (
            "parent request",
            claim(&["gpu"], time_slicing("Long")),
            vec![sliced(vec![0], TimeSliceInterval::Long)],
        ),
        (
            "exact subrequest",
            claim(&["gpu/h100"], time_slicing("Long")),
            vec![sliced(vec![0], TimeSliceInterval::Long)],
        ),
        (
            "another subrequest of the same parent",
            claim(&["gpu/a100"], time_slicing("Long")),
            vec![],
        ),
    ];
    for (case, entry, want) in table {
        let got = resolve(&targets, &[entry]);
        assert_eq!(Ok(want), got, "{case}");
    }
}

#[test]
fn gpu_config_applies_to_mig_devices_as_the_seed_talk_writes_it() {
    let targets = [
        gpu("gpu-0", "big"),
        mig("gpu-1-mig-1g10gb-0", "small", Some("MIG-a")),
    ];
    let seed = json!({
        "apiVersion": "gpu.nvidia.com/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi"}},
    });
    let got = resolve(&targets, &[claim(&[], seed)]);
    let want = vec![mps_group(
        vec![0, 1],
        None,
        vec![Some(4 * GIB), Some(4 * GIB)],
    )];
    assert_eq!(Ok(want), got);
}

#[test]
fn mig_device_config_without_requests_skips_full_gpus() {
    let targets = [
        gpu("gpu-0", "big"),
        mig("gpu-1-mig-1g10gb-0", "small", None),
    ];
    let entries = [
        class(&[], time_slicing("Long")),
        claim(
            &[],
            mps(
                "MigDeviceConfig",
                json!({"defaultActiveThreadPercentage": 50}),
            ),
        ),
    ];
    let got = resolve(&targets, &entries);
    let want = vec![
        sliced(vec![0], TimeSliceInterval::Long),
        mps_group(vec![1], Some(50), vec![None]),
    ];
    assert_eq!(Ok(want), got);
}

#[test]
fn mig_device_config_naming_a_full_gpu_request_is_rejected() {
    let targets = [
        gpu("gpu-0", "big"),
        mig("gpu-1-mig-1g10gb-0", "small", None),
    ];
    let entries = [claim(&["big"], mps("MigDeviceConfig", json!({})))];
    let want = "opaque config entry 0 of the claim (requests big): kind: MigDeviceConfig applies \
                to MIG devices only, but request \"big\" got the full GPU gpu-0; use kind \
                GpuConfig for full GPUs";
    assert_eq!(want, failure(&targets, &entries));
}

#[test]
fn time_slice_interval_on_a_mig_device_is_rejected() {
    let targets = [gpu("gpu-0", "gpu"), mig("gpu-1-mig-1g10gb-0", "gpu", None)];
    let entries = [class(&[], time_slicing("Long"))];
    let want = "opaque config entry 0 of the device class (all requests): \
                sharing.timeSlicingConfig.interval: Long cannot be set on MIG device \
                gpu-1-mig-1g10gb-0: the time-slice is a whole-GPU setting, so only Default is \
                valid (processes on one MIG device already share it by time-slicing); to choose \
                the interval, claim the full GPU with kind GpuConfig";
    assert_eq!(want, failure(&targets, &entries));
}

#[test]
fn time_slicing_on_a_mig_device_needs_nothing_and_groups_as_default() {
    let targets = [mig("gpu-0-mig-3g40gb-0", "mig", None)];
    let entries = [claim(
        &["mig"],
        params("MigDeviceConfig", json!({"strategy": "TimeSlicing"})),
    )];
    let want = vec![sliced(vec![0], TimeSliceInterval::Default)];
    assert_eq!(Ok(want), resolve(&targets, &entries));
}

#[test]
fn per_device_limits_are_keyed_by_index_uuid_or_device_name() {
    let targets = [
        gpu("gpu-0", "gpu"),
        gpu("gpu-1", "gpu"),
        gpu("gpu-2", "gpu"),
        mig("gpu-3-mig-1g10gb-0", "gpu", None),
    ];
    let config = json!({
        "defaultPinnedDeviceMemoryLimit": "2Gi",
        "defaultPerDevicePinnedMemoryLimit": {
            "1": "16Gi",
            "GPU-gpu-2": "24Gi",
            "gpu-3-mig-1g10gb-0": "8Gi",
        },
    });
    let got = resolve(&targets, &[claim(&[], mps("GpuConfig", config))]);
    let want = vec![mps_group(
        vec![0, 1, 2, 3],
        None,
        vec![Some(2 * GIB), Some(16 * GIB), Some(24 * GIB), Some(8 * GIB)],
    )];
    assert_eq!(Ok(want), got);
}

#[test]
fn per_device_index_counts_within_the_group_not_the_claim() {
    let targets = [gpu("gpu-0", "a"), gpu("gpu-1", "b"), gpu("gpu-2", "b")];
    let config = json!({"defaultPerDevicePinnedMemoryLimit": {"1": "4Gi"}});
    let got = resolve(&targets, &[claim(&["b"], mps("GpuConfig", config))]);
    let want = vec![mps_group(vec![1, 2], None, vec![None, Some(4 * GIB)])];
    assert_eq!(Ok(want), got);
}

#[test]
fn per_device_limit_errors_name_the_key_and_the_valid_keys() {
    let targets = [gpu("gpu-0", "gpu"), mig("gpu-1-mig-1g10gb-0", "gpu", None)];
    let with_keys = |keys: Value| {
        [claim(
            &["gpu"],
            mps(
                "GpuConfig",
                json!({"defaultPerDevicePinnedMemoryLimit": keys}),
            ),
        )]
    };
    let prefix = "opaque config entry 0 of the claim (requests gpu): ";
    let table = [
        (
            json!({"2": "1Gi"}),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.2: no device of this config has \
             that key; valid keys: 0, 1, GPU-gpu-0, gpu-0, gpu-1-mig-1g10gb-0 (index, UUID or \
             device name)",
        ),
        (
            json!({"0": "1Gi", "gpu-0": "2Gi"}),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: keys \"0\" and \"gpu-0\" both \
             name device gpu-0; keep one",
        ),
    ];
    let want: Vec<String> = table.iter().map(|(_, m)| format!("{prefix}{m}")).collect();
    let got: Vec<String> = table
        .into_iter()
        .map(|(keys, _)| failure(&targets, &with_keys(keys)))
        .collect();
    assert_eq!(want, got);
}

#[test]
fn memory_limit_above_the_device_memory_is_rejected_naming_both() {
    let targets = [
        gpu("gpu-0", "gpu"),
        mig("gpu-1-mig-1g10gb-0", "gpu", Some("MIG-x")),
    ];
    let table = [
        (
            json!({"defaultPinnedDeviceMemoryLimit": "12Gi"}),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 12Gi is above the memory of \
             device gpu-1-mig-1g10gb-0 (10Gi)",
        ),
        (
            json!({"defaultPerDevicePinnedMemoryLimit": {"MIG-x": "10241Mi"}}),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.MIG-x: 10241Mi is above the \
             memory of device gpu-1-mig-1g10gb-0 (10Gi)",
        ),
    ];
    let want: Vec<String> = table
        .iter()
        .map(|(_, m)| format!("opaque config entry 0 of the claim (all requests): {m}"))
        .collect();
    let got: Vec<String> = table
        .into_iter()
        .map(|(config, _)| failure(&targets, &[claim(&[], mps("GpuConfig", config))]))
        .collect();
    assert_eq!(want, got);
}

#[test]
fn memory_limit_equal_to_the_device_memory_is_accepted() {
    let targets = [mig("gpu-1-mig-1g10gb-0", "mig", None)];
    let config = json!({"defaultPinnedDeviceMemoryLimit": "10Gi"});
    let got = resolve(&targets, &[claim(&[], mps("MigDeviceConfig", config))]);
    assert_eq!(
        Ok(vec![mps_group(vec![0], None, vec![Some(10 * GIB)])]),
        got
    );
}

#[test]
fn unknown_fields_are_rejected_at_every_level_naming_the_entry() {
    let targets = [gpu("gpu-0", "gpu")];
    let table = [
        (
            json!({"apiVersion": V1BETA1, "kind": "GpuConfig", "metadata": {}}),
            "metadata: unknown field; valid fields: apiVersion, kind, sharing",
        ),
        (
            params("GpuConfig", json!({"strategy": "MPS", "multiUser": true})),
            "sharing.multiUser: unknown field; valid fields: strategy, timeSlicingConfig, \
             mpsConfig",
        ),
        (
            params(
                "GpuConfig",
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}),
            ),
            "sharing.timeSlicingConfig.intervall: unknown field; valid fields: interval",
        ),
        (
            mps("GpuConfig", json!({"threads": 50})),
            "sharing.mpsConfig.threads: unknown field; valid fields: \
             defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, \
             defaultPerDevicePinnedMemoryLimit, multiUser",
        ),
    ];
    let want: Vec<String> = table
        .iter()
        .map(|(_, m)| format!("opaque config entry 1 of the claim (requests gpu): {m}"))
        .collect();
    let got: Vec<String> = table
        .into_iter()
        .map(|(bad, _)| {
            let entries = [
                class(&[], time_slicing("Long")),
                claim(&[], time_slicing("Short")),
                claim(&["gpu"], bad),
            ];
            failure(&targets, &entries)
        })
        .collect();
    assert_eq!(want, got);
}

#[test]
fn an_invalid_entry_fails_even_when_it_applies_to_no_device() {
    let targets = [gpu("gpu-0", "gpu")];
    let entries = [claim(
        &["elsewhere"],
        mps("GpuConfig", json!({"defaultActiveThreadPercentage": 150})),
    )];
    let want = "opaque config entry 0 of the claim (requests elsewhere): \
                sharing.mpsConfig.defaultActiveThreadPercentage: 150 is outside 0–100";
    assert_eq!(want, failure(&targets, &entries));
}

#[test]
fn both_api_versions_resolve_alike() {
    let targets = [gpu("gpu-0", "gpu")];
    let with_version = |version: &str| {
        json!({
            "apiVersion": version,
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}},
        })
    };
    let want = resolve(&targets, &[claim(&[], with_version(V1BETA1))]);
    let got = resolve(
        &targets,
        &[claim(&[], with_version("gpu.nvidia.com/v1alpha1"))],
    );
    assert_eq!(Ok(vec![mps_group(vec![0], Some(10), vec![None])]), want);
    assert_eq!(want, got);
}
