//! Shared fixtures for the allocator and explain tests and the explain benchmark: H100
//! nodes published the way gpu-dra publishes them, the example DeviceClasses, and a table
//! selector engine that understands the selectors used in the examples.
#![allow(dead_code)]

use std::collections::BTreeMap;

use gpu_dra::alloc::table::{TableEngine, string_attribute};
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceClass,
    DeviceCounterConsumption, ResourceClaim, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub const DRIVER: &str = "gpu.nvidia.com";
pub const GPU_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";
pub const MIG_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'";

/// One H100-SXM5-80GB MIG profile: memory in MiB, SMs, engines, memory slices and the
/// placements (first memory slice) it may take.
pub struct Profile {
    pub name: &'static str,
    pub memory_mib: u32,
    pub sms: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub jpeg: u32,
    pub ofa: u32,
    pub slices: u32,
    pub starts: &'static [u32],
}

const fn profile(name: &'static str, numbers: [u32; 7], starts: &'static [u32]) -> Profile {
    let [memory_mib, sms, copy_engines, decoders, jpeg, ofa, slices] = numbers;
    Profile {
        name,
        memory_mib,
        sms,
        copy_engines,
        decoders,
        jpeg,
        ofa,
        slices,
        starts,
    }
}

/// From shared/reference/mig-profiles.json.
pub const H100_PROFILES: [Profile; 7] = [
    profile("1g.10gb", [9984, 16, 1, 1, 1, 0, 1], &[0, 1, 2, 3, 4, 5, 6]),
    profile(
        "1g.10gb+me",
        [9984, 16, 1, 1, 1, 1, 1],
        &[0, 1, 2, 3, 4, 5, 6],
    ),
    profile("1g.20gb", [20096, 26, 1, 1, 1, 0, 2], &[0, 2, 4, 6]),
    profile("2g.20gb", [20096, 32, 2, 2, 2, 0, 2], &[0, 2, 4]),
    profile("3g.40gb", [40448, 60, 3, 3, 3, 0, 4], &[0, 4]),
    profile("4g.40gb", [40448, 64, 4, 4, 4, 0, 4], &[0]),
    profile("7g.80gb", [81152, 132, 8, 7, 7, 1, 8], &[0]),
];

pub fn profile_selector(profile: &str) -> String {
    format!("device.attributes['gpu.nvidia.com'].profile == '{profile}'")
}

/// The selectors of the examples, as closures.
pub fn engine() -> TableEngine {
    let mut engine = TableEngine::new()
        .with(GPU_SELECTOR, |driver, d| {
            driver == DRIVER && string_attribute(d, "type") == Some("gpu")
        })
        .with(MIG_SELECTOR, |driver, d| {
            driver == DRIVER && string_attribute(d, "type") == Some("mig")
        });
    for profile in H100_PROFILES {
        let name = profile.name;
        engine = engine.with(&profile_selector(name), move |_, d| {
            string_attribute(d, "profile") == Some(name)
        });
    }
    engine
}

pub fn class(name: &str, selector: &str) -> DeviceClass {
    yaml(&format!(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: {name}}}\n\
         spec: {{selectors: [{{cel: {{expression: \"{selector}\"}}}}]}}\n"
    ))
}

/// `gpu.nvidia.com` (full GPUs) and `mig.nvidia.com` (MIG devices).
pub fn classes() -> Vec<DeviceClass> {
    vec![
        class("gpu.nvidia.com", GPU_SELECTOR),
        class("mig.nvidia.com", MIG_SELECTOR),
    ]
}

pub fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_yaml::from_str(text).expect("fixture YAML is valid")
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_string()),
        ..Default::default()
    }
}

fn int(value: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(value),
        ..Default::default()
    }
}

fn version(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(value.to_string()),
        ..Default::default()
    }
}

fn capacity(value: String) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value),
        request_policy: None,
    }
}

fn counters(pairs: &[(String, String)]) -> BTreeMap<String, Counter> {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Counter {
                    value: Quantity(v.clone()),
                },
            )
        })
        .collect()
}

pub fn gpu_uuid(node: &str, minor: u32) -> String {
    format!("GPU-{node}-{minor:04}")
}

fn common(node: &str, minor: u32) -> BTreeMap<String, DeviceAttribute> {
    BTreeMap::from([
        ("productName".into(), string("NVIDIA H100 80GB HBM3")),
        ("brand".into(), string("Nvidia")),
        ("architecture".into(), string("Hopper")),
        ("index".into(), int(minor.into())),
        ("minor".into(), int(minor.into())),
        ("cudaComputeCapability".into(), version("9.0.0")),
        ("driverVersion".into(), version("550.54.15")),
        ("cudaDriverVersion".into(), version("12.4.0")),
        (
            "resource.kubernetes.io/pciBusID".into(),
            string(&format!("0000:{:02x}:00.0", 0x18 + minor)),
        ),
        ("parentUUID".into(), string(&gpu_uuid(node, minor))),
    ])
}

/// The counters of GPU `minor`, as a full GPU consumes them (everything).
fn full_counters() -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = (0..8)
        .map(|i| (format!("memory-slice-{i}"), "1".to_string()))
        .collect();
    all.extend([
        ("memory".into(), "81559Mi".into()),
        ("multiprocessors".into(), "132".into()),
        ("copy-engines".into(), "8".into()),
        ("decoders".into(), "7".into()),
        ("jpeg-engines".into(), "7".into()),
        ("ofa-engines".into(), "1".into()),
    ]);
    all
}

/// The 26 devices of one H100: the full GPU, then every MIG placement.
pub fn h100_devices(node: &str, minor: u32) -> Vec<Device> {
    let set = format!("gpu-{minor}-counter-set");
    let mut full_attrs = common(node, minor);
    full_attrs.remove("parentUUID");
    full_attrs.insert("type".into(), string("gpu"));
    full_attrs.insert("uuid".into(), string(&gpu_uuid(node, minor)));
    let mut devices = vec![Device {
        name: format!("gpu-{minor}"),
        attributes: Some(full_attrs),
        capacity: Some(BTreeMap::from([(
            "memory".into(),
            capacity("81559Mi".into()),
        )])),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: set.clone(),
            counters: counters(&full_counters()),
            ..Default::default()
        }]),
        ..Default::default()
    }];
    for p in H100_PROFILES {
        let (profile, mem, sms, size) = (p.name, p.memory_mib, p.sms, p.slices);
        let (ce, dec, jpeg, ofa) = (p.copy_engines, p.decoders, p.jpeg, p.ofa);
        for &start in p.starts {
            let mut attrs = common(node, minor);
            attrs.insert("type".into(), string("mig"));
            attrs.insert("profile".into(), string(profile));
            let mut used: Vec<(String, String)> = (start..start + size)
                .map(|i| (format!("memory-slice-{i}"), "1".to_string()))
                .collect();
            used.extend([
                ("memory".into(), format!("{mem}Mi")),
                ("multiprocessors".into(), sms.to_string()),
                ("copy-engines".into(), ce.to_string()),
                ("decoders".into(), dec.to_string()),
                ("jpeg-engines".into(), jpeg.to_string()),
                ("ofa-engines".into(), ofa.to_string()),
            ]);
            let caps = [
                ("memory", format!("{mem}Mi")),
                ("multiprocessors", sms.to_string()),
                ("copyEngines", ce.to_string()),
                ("decoders", dec.to_string()),
                ("encoders", "0".to_string()),
                ("jpegEngines", jpeg.to_string()),
                ("ofaEngines", ofa.to_string()),
            ];
            devices.push(Device {
                name: format!(
                    "gpu-{minor}-mig-{}-{start}",
                    profile.replace('.', "").replace('+', "-")
                ),
                attributes: Some(attrs),
                capacity: Some(
                    caps.into_iter()
                        .map(|(k, v)| (k.to_string(), capacity(v)))
                        .collect(),
                ),
                consumes_counters: Some(vec![DeviceCounterConsumption {
                    counter_set: set.clone(),
                    counters: counters(&used),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        }
    }
    devices
}

fn slice(node: &str, index: usize, count: i64, spec: ResourceSliceSpec) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node}-gpu.nvidia.com-{index}")),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: count,
            },
            ..spec
        },
    }
}

/// The slices of a node with `gpus` H100s: devices in slices of at most 64, then one
/// device-less slice holding a counter set per GPU.
pub fn h100_node(node: &str, gpus: u32) -> Vec<ResourceSlice> {
    let devices: Vec<Device> = (0..gpus).flat_map(|m| h100_devices(node, m)).collect();
    let chunks: Vec<Vec<Device>> = devices.chunks(64).map(|c| c.to_vec()).collect();
    let count = chunks.len() as i64 + 1;
    let mut slices: Vec<ResourceSlice> = chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let spec = ResourceSliceSpec {
                devices: Some(chunk),
                ..Default::default()
            };
            slice(node, i, count, spec)
        })
        .collect();
    let sets = (0..gpus)
        .map(|m| CounterSet {
            name: format!("gpu-{m}-counter-set"),
            counters: counters(&full_counters()),
        })
        .collect();
    let spec = ResourceSliceSpec {
        shared_counters: Some(sets),
        ..Default::default()
    };
    slices.push(slice(node, slices.len(), count, spec));
    slices
}

/// A ResourceClaim `default/<name>` whose `spec.devices` is the given YAML.
pub fn claim(name: &str, devices: &str) -> ResourceClaim {
    let indented: String = devices.lines().map(|l| format!("    {l}\n")).collect();
    yaml(&format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n\
         metadata: {{name: {name}, namespace: default, uid: uid-{name}}}\n\
         spec:\n  devices:\n{indented}"
    ))
}

/// A claim `default/<name>` already allocated with `(request, device)` results on `node`.
pub fn allocated(name: &str, node: &str, results: &[(&str, &str)]) -> ResourceClaim {
    let mut claim = claim(name, "requests: []");
    let results: Vec<String> = results
        .iter()
        .map(|(request, device)| {
            format!("{{request: {request}, driver: {DRIVER}, pool: {node}, device: {device}}}")
        })
        .collect();
    claim.status = Some(yaml(&format!(
        "allocation: {{devices: {{results: [{}]}}}}",
        results.join(", ")
    )));
    claim
}

/// Device names of an outcome's allocation, per claim.
pub fn device_names(outcome: &gpu_dra::alloc::Outcome) -> Vec<Vec<String>> {
    outcome
        .allocations
        .iter()
        .flatten()
        .map(|a| {
            a.devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .map(|r| format!("{}={}", r.request, r.device))
                .collect()
        })
        .collect()
}
