//! What `--shared-gpus` publishes (policies as documented, within the API server's rules, off
//! unchanged), and how a share becomes MPS limits.

use std::collections::BTreeMap;

use gpu_dra::devices::{self, DeviceKind, DeviceModel, ModelOptions, ShareLimits, SharedGpus};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::slices::{self, PoolOptions};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const OPTIONS: [SharedGpus; 5] = [
    SharedGpus::Off,
    SharedGpus::Memory,
    SharedGpus::Shares(2),
    SharedGpus::Shares(7),
    SharedGpus::Shares(48),
];

fn model(preset: &str, shared: SharedGpus) -> DeviceModel {
    model_with(preset, shared, devices::MigAttributes::Compact)
}

fn model_with(preset: &str, shared: SharedGpus, detail: devices::MigAttributes) -> DeviceModel {
    let sim = SimBackend::open(preset, None).unwrap();
    let mut options =
        ModelOptions::with_policies(devices::DEFAULT_DRIVER_NAME, &sim.mig_policies());
    options.shared_gpus = shared;
    options.mig_attributes = detail;
    devices::build(&sim.inventory().unwrap(), &options)
}

fn publish(model: &DeviceModel) -> Result<Vec<ResourceSlice>, slices::SliceError> {
    let pool = PoolOptions {
        driver_name: devices::DEFAULT_DRIVER_NAME.into(),
        node_name: "node".into(),
        generation: 1,
    };
    slices::build(model, &pool)
}

fn q(text: &str) -> Quantity {
    Quantity(text.to_string())
}

fn range(default: &str, min: &str, max: Option<&str>, step: Option<&str>) -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(q(default)),
        valid_range: Some(CapacityRequestPolicyRange {
            min: q(min),
            max: max.map(q),
            step: step.map(q),
        }),
        valid_values: None,
    }
}

fn policies(device: &Device) -> BTreeMap<String, Option<CapacityRequestPolicy>> {
    device
        .capacity
        .iter()
        .flatten()
        .map(|(k, c)| (k.clone(), c.request_policy.clone()))
        .collect()
}

#[test]
fn every_preset_and_option_publishes_slices_the_api_server_accepts() {
    for preset in ["dgx-h100", "mixed"] {
        for shared in OPTIONS {
            let model = model(preset, shared);
            let got = publish(&model).map(|s| s.len());
            assert!(got.is_ok(), "{preset} {shared}: {got:?}");
            let shareable = model
                .devices
                .iter()
                .filter(|d| d.device.allow_multiple_allocations == Some(true))
                .count();
            let want = if shared.is_on() {
                model.devices.len()
            } else {
                0
            };
            assert_eq!(want, shareable, "{preset} {shared}");
        }
    }
}

#[test]
fn sharing_off_publishes_exactly_what_the_default_options_publish() {
    for preset in ["dgx-h100", "mixed"] {
        let sim = SimBackend::open(preset, None).unwrap();
        let default =
            ModelOptions::with_policies(devices::DEFAULT_DRIVER_NAME, &sim.mig_policies());
        let by_default = devices::build(&sim.inventory().unwrap(), &default);
        let off = model(preset, SharedGpus::Off);
        let want = serde_yaml::to_string(&publish(&by_default).unwrap()).unwrap();
        let got = serde_yaml::to_string(&publish(&off).unwrap()).unwrap();
        assert_eq!(want, got);
        assert!(!got.contains("requestPolicy") && !got.contains("allowMultipleAllocations"));
    }
}

#[test]
fn sharing_changes_no_name_attribute_counter_or_capacity_value() {
    for preset in ["dgx-h100", "mixed"] {
        let off = model(preset, SharedGpus::Off);
        let on = model(preset, SharedGpus::Shares(4));
        assert_eq!(off.counter_sets, on.counter_sets);
        assert_eq!(off.devices.len(), on.devices.len());
        for (a, b) in off.devices.iter().zip(&on.devices) {
            let mut b = b.device.clone();
            b.allow_multiple_allocations = None;
            for c in b.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                c.request_policy = None;
            }
            assert_eq!(a.device, b);
        }
    }
}

#[test]
fn a_full_h100_gets_the_documented_policies() {
    // 81559Mi and 132 SMs.
    let cases = [
        (
            SharedGpus::Shares(4),
            range("20389Mi", "1699Mi", Some("81559Mi"), Some("1Mi")),
            range("33", "0", Some("132"), Some("1")),
        ),
        (
            SharedGpus::Memory,
            range("81559Mi", "1699Mi", Some("81559Mi"), Some("1Mi")),
            range("0", "0", Some("132"), Some("1")),
        ),
    ];
    for (shared, memory, sms) in cases {
        let model = model("dgx-h100", shared);
        let gpu = &model.device("gpu-0").unwrap().device;
        let want: BTreeMap<String, Option<CapacityRequestPolicy>> = [
            ("memory".to_string(), Some(memory)),
            ("multiprocessors".to_string(), Some(sms)),
        ]
        .into();
        assert_eq!(want, policies(gpu), "{shared}");
    }
}

#[test]
fn a_mig_device_shares_memory_and_multiprocessors_and_never_blocks_on_engines() {
    let three_g = |model: &DeviceModel| {
        model
            .devices
            .iter()
            .find(|d| matches!(&d.kind, DeviceKind::MigDynamic { profile, .. } if profile == "3g.40gb"))
            .unwrap()
            .device
            .clone()
    };
    let shares = [
        (
            "memory",
            range("20224Mi", "842Mi", Some("40448Mi"), Some("1Mi")),
        ),
        ("multiprocessors", range("30", "0", Some("60"), Some("1"))),
    ];
    // Compact MIG devices (the default) publish no engine capacity to block on.
    let compact = three_g(&model("dgx-h100", SharedGpus::Shares(2)));
    let want: BTreeMap<String, Option<CapacityRequestPolicy>> = shares
        .iter()
        .map(|(k, p)| (k.to_string(), Some(p.clone())))
        .collect();
    assert_eq!(want, policies(&compact));
    // With every attribute, the engines default to nothing, so they never block a share.
    let mig = three_g(&model_with(
        "dgx-h100",
        SharedGpus::Shares(2),
        devices::MigAttributes::Full,
    ));
    let engines = range("0", "0", None, None);
    let want: BTreeMap<String, Option<CapacityRequestPolicy>> = [
        ("copyEngines", engines.clone()),
        ("decoders", engines.clone()),
        ("encoders", engines.clone()),
        ("jpegEngines", engines.clone()),
        (
            "memory",
            range("20224Mi", "842Mi", Some("40448Mi"), Some("1Mi")),
        ),
        ("multiprocessors", range("30", "0", Some("60"), Some("1"))),
        ("ofaEngines", engines),
    ]
    .into_iter()
    .map(|(k, p)| (k.to_string(), Some(p)))
    .collect();
    assert_eq!(want, policies(&mig));
}

fn device(memory: &str, sms: Option<&str>) -> Device {
    let mut capacity = BTreeMap::new();
    let cap = |v: &str| DeviceCapacity {
        value: q(v),
        request_policy: None,
    };
    capacity.insert("memory".to_string(), cap(memory));
    if let Some(sms) = sms {
        capacity.insert("multiprocessors".to_string(), cap(sms));
    }
    capacity.insert("copyEngines".to_string(), cap("3"));
    Device {
        name: "gpu-0".into(),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// A device, what a share of it consumes, and the limits (or error) wanted.
type Case<'a> = (
    &'a Device,
    Vec<(&'a str, &'a str)>,
    Result<ShareLimits, String>,
);

fn limits(percent: u8, bytes: Option<u64>) -> Result<ShareLimits, String> {
    Ok(ShareLimits {
        active_thread_percentage: percent,
        pinned_memory_bytes: bytes,
    })
}

#[test]
fn share_limits_follow_the_consumed_capacity() {
    let h100 = device("81559Mi", Some("132"));
    let no_sms = device("24Gi", None);
    let gib = 1u64 << 30;
    let cases: Vec<Case> = vec![
        (&h100, vec![("memory", "40Gi"), ("multiprocessors", "66")], limits(50, Some(40 * gib))),
        (&h100, vec![("memory", "20389Mi"), ("multiprocessors", "33")], limits(25, Some(20389 << 20))),
        // Rounded down, but a share with any multiprocessors gets at least 1 %.
        (&h100, vec![("multiprocessors", "1")], limits(1, None)),
        (&h100, vec![("multiprocessors", "131")], limits(99, None)),
        (&h100, vec![("multiprocessors", "132")], limits(100, None)),
        // None consumed: no compute limit. All the memory: nothing to limit.
        (&h100, vec![("memory", "81559Mi"), ("multiprocessors", "0")], limits(100, None)),
        (&h100, vec![], limits(100, None)),
        // Decimal amounts are limited to the whole MiB below them.
        (&h100, vec![("memory", "10G")], limits(100, Some(9536 << 20))),
        (&h100, vec![("gpu.nvidia.com/memory", "1Gi"), ("copyEngines", "0")], limits(100, Some(gib))),
        (&no_sms, vec![("memory", "12Gi")], limits(100, Some(12 * gib))),
        (
            &h100,
            vec![("memory", "90Gi")],
            Err("device gpu-0: consumedCapacity.memory is 90Gi; valid range: 1Mi to 81559Mi".into()),
        ),
        (
            &h100,
            vec![("memory", "512Ki")],
            Err("device gpu-0: consumedCapacity.memory is 512Ki; valid range: 1Mi to 81559Mi".into()),
        ),
        (
            &h100,
            vec![("multiprocessors", "133")],
            Err("device gpu-0: consumedCapacity.multiprocessors is 133; valid range: 0 to 132".into()),
        ),
        (
            &h100,
            vec![("multiprocessors", "1500m")],
            Err("device gpu-0: consumedCapacity.multiprocessors is \"1500m\", which is not a usable quantity".into()),
        ),
        (
            &h100,
            vec![("memory", "lots")],
            Err("device gpu-0: consumedCapacity.memory is \"lots\", which is not a usable quantity".into()),
        ),
        (
            &no_sms,
            vec![("multiprocessors", "4")],
            Err("device gpu-0: consumedCapacity names \"multiprocessors\", which the device does not publish (it publishes: copyEngines, memory)".into()),
        ),
    ];
    for (device, consumed, want) in cases {
        let consumed: BTreeMap<String, String> = consumed
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let got = devices::share_limits(device, &consumed).map_err(|e| e.to_string());
        assert_eq!(want, got, "{consumed:?}");
    }
}

#[test]
fn policies_the_api_server_would_refuse_are_caught_before_publishing() {
    let bad: [(Option<bool>, CapacityRequestPolicy, &str); 7] = [
        (
            None,
            range("1Gi", "1Gi", None, None),
            "gpu-0: capacity[memory].requestPolicy is only allowed with allowMultipleAllocations: true",
        ),
        (
            Some(true),
            range("512Mi", "1Gi", None, None),
            "gpu-0: capacity[memory].requestPolicy.default 512Mi is below min 1Gi",
        ),
        (
            Some(true),
            range("1Gi", "1Gi", Some("100Gi"), None),
            "gpu-0: capacity[memory].requestPolicy.validRange.max 100Gi is outside min 1Gi to the capacity 80Gi",
        ),
        (
            Some(true),
            range("1536Mi", "1Gi", None, Some("1Gi")),
            "gpu-0: capacity[memory].requestPolicy.default 1536Mi is not min 1Gi plus a multiple of step 1Gi",
        ),
        (
            Some(true),
            range("1Gi", "1Gi", None, Some("80Gi")),
            "gpu-0: capacity[memory].requestPolicy.validRange.step 80Gi must be above 0 and min + step at most the capacity 80Gi",
        ),
        (
            Some(true),
            CapacityRequestPolicy {
                default: Some(q("1Gi")),
                valid_range: None,
                valid_values: Some(vec![q("2Gi"), q("1Gi")]),
            },
            "gpu-0: capacity[memory].requestPolicy.validValues[1] values must be unique and in ascending order",
        ),
        (
            Some(true),
            CapacityRequestPolicy {
                default: None,
                valid_range: None,
                valid_values: Some(vec![q("1Gi")]),
            },
            "gpu-0: capacity[memory].requestPolicy.default is required with validValues or validRange",
        ),
    ];
    for (allow, policy, want) in bad {
        let mut d = device("80Gi", None);
        d.allow_multiple_allocations = allow;
        let caps = d.capacity.as_mut().unwrap();
        caps.remove("copyEngines");
        caps.get_mut("memory").unwrap().request_policy = Some(policy);
        let model = DeviceModel {
            devices: vec![devices::PublishedDevice {
                gpu_index: 0,
                gpu_minor: 0,
                gpu_uuid: "GPU-0".into(),
                kind: DeviceKind::Gpu,
                device: d,
            }],
            ..Default::default()
        };
        let got = publish(&model).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(Err(want.to_string()), got);
    }
}
