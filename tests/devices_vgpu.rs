//! vGPU devices as the simulated vGPU presets publish them (`--vgpu-types`): names,
//! attributes, capacity, counters and compatibility groups; and a node without vGPU types
//! unchanged by every vGPU flag but the one that says so.

use std::collections::BTreeMap;

use gpu_dra::devices::VgpuTypes;
use gpu_dra::explain_inputs::{SimSliceOptions, sim_slices};
use k8s_openapi::api::resource::v1::{CounterSet, Device, DeviceAttribute, ResourceSlice};

fn options(types: &str, groups: bool) -> SimSliceOptions {
    SimSliceOptions {
        vgpu_types: types.parse::<VgpuTypes>().expect("vgpu types"),
        compatibility_groups: groups,
        ..Default::default()
    }
}

fn slices(node: &str, options: SimSliceOptions) -> Vec<ResourceSlice> {
    sim_slices(node, "gpu.nvidia.com", options).expect("slices")
}

fn devices(slices: &[ResourceSlice]) -> Vec<&Device> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect()
}

fn device<'s>(slices: &'s [ResourceSlice], name: &str) -> &'s Device {
    devices(slices)
        .into_iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("{name} is not published"))
}

fn counter_set<'s>(slices: &'s [ResourceSlice], name: &str) -> &'s CounterSet {
    slices
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{name} is not published"))
}

fn names_of_type<'s>(slices: &'s [ResourceSlice], kind: &str) -> Vec<&'s str> {
    devices(slices)
        .into_iter()
        .filter(|d| attr(d, "type").string.as_deref() == Some(kind))
        .map(|d| d.name.as_str())
        .collect()
}

fn attr<'d>(d: &'d Device, name: &str) -> &'d DeviceAttribute {
    &d.attributes.as_ref().expect("attributes")[name]
}

/// Each consumption of `d` as (set, counters as `name=value`, groups).
fn consumes(d: &Device) -> Vec<(String, Vec<String>, Vec<String>)> {
    d.consumes_counters
        .iter()
        .flatten()
        .map(|c| {
            (
                c.counter_set.clone(),
                c.counters
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.value.0))
                    .collect(),
                c.compatibility_groups.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.to_string()),
        ..Default::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

#[test]
fn an_hgx_h100_offers_one_vgpu_device_per_type_and_slot_with_nvidias_attributes() {
    let slices = slices("hgx-h100-vgpu", options("0-3=H100-4C;4-7=H100-10C", false));
    let vgpus = names_of_type(&slices, "vgpu");
    assert_eq!(vgpus.len(), 4 * 20 + 4 * 8);
    for gpu in 0..4 {
        for slot in 0..20 {
            assert!(vgpus.contains(&format!("vgpu-{gpu}-4c-{slot}").as_str()));
        }
    }
    assert!(vgpus.contains(&"vgpu-7-10c-7"));
    assert!(!vgpus.contains(&"vgpu-7-10c-8"));

    let d = device(&slices, "vgpu-0-4c-12");
    let gpu = device(&slices, "gpu-0");
    let want: BTreeMap<String, DeviceAttribute> = BTreeMap::from([
        ("type".into(), string("vgpu")),
        ("profile".into(), string("H100-4C")),
        ("typeID".into(), int(1056)),
        ("vgpuFramework".into(), string("vdev")),
        ("uuid".into(), attr(gpu, "uuid").clone()),
        ("productName".into(), string("NVIDIA H100 80GB HBM3")),
        (
            "resource.kubernetes.io/pcieRoot".into(),
            attr(gpu, "resource.kubernetes.io/pcieRoot").clone(),
        ),
        ("index".into(), int(0)),
        ("slot".into(), int(12)),
    ]);
    assert_eq!(d.attributes.as_ref(), Some(&want));
    let capacity = d.capacity.as_ref().unwrap();
    assert_eq!(capacity.keys().collect::<Vec<_>>(), ["framebuffer"]);
    assert_eq!(capacity["framebuffer"].value.0, "4Gi");
    assert_eq!(
        consumes(d),
        [(
            "gpu-0-counter-set".into(),
            vec!["framebuffer=4Gi".into()],
            vec![]
        )]
    );
    assert_eq!(
        consumes(device(&slices, "vgpu-5-10c-0"))[0].1,
        ["framebuffer=10Gi"]
    );
}

#[test]
fn a_dynamic_mig_gpu_offering_vgpus_adds_the_framebuffer_to_its_set_and_drops_its_mig_devices() {
    let slices = slices("hgx-h100-vgpu", options("0-3=H100-4C;4-7=H100-10C", false));
    let set = counter_set(&slices, "gpu-0-counter-set");
    assert_eq!(set.counters["framebuffer"].value.0, "80Gi");
    assert!(set.counters.contains_key("memory-slice-7"));
    // The full GPU consumes the whole set, the framebuffer with it.
    let full = consumes(device(&slices, "gpu-0"));
    assert_eq!(full.len(), 1);
    assert!(full[0].1.contains(&"framebuffer=80Gi".to_string()));
    assert!(full[0].1.contains(&"memory-slice-0=1".to_string()));
    // Counters cannot keep MIG devices and vGPUs of one GPU apart: no MIG device without groups.
    assert_eq!(names_of_type(&slices, "mig"), Vec::<&str>::new());
    assert_eq!(names_of_type(&slices, "gpu").len(), 8);
}

#[test]
fn with_compatibility_groups_every_consumption_of_a_vgpu_gpus_set_carries_its_kinds_group() {
    let slices = slices(
        "hgx-h100-vgpu",
        SimSliceOptions {
            passthrough: true,
            ..options("H100-4C,H100-10C", true)
        },
    );
    let groups = |name: &str| consumes(device(&slices, name))[0].2.clone();
    assert_eq!(groups("vgpu-0-4c-0"), ["vgpu-4c"]);
    assert_eq!(groups("vgpu-0-10c-0"), ["vgpu-10c"]);
    assert_eq!(groups("gpu-0"), ["gpu-full"]);
    assert_eq!(groups("gpu-0-mig-1g10gb-0"), ["mig"]);
    // Its GPUs have their SR-IOV VFs on: none can go to a VM whole, so no VFIO device.
    assert_eq!(names_of_type(&slices, "vfio"), Vec::<&str>::new());
    // Every MIG device a GPU without vGPU publishes.
    let without = self::slices("hgx-h100-vgpu", options("", false));
    assert_eq!(
        names_of_type(&slices, "mig").len(),
        names_of_type(&without, "mig").len()
    );
    // On an mdev host (no VFs) the VFIO device is there, in its own group, and consumes the
    // whole set, as the full GPU does.
    let t4 = self::slices(
        "t4-vgpu-mdev",
        SimSliceOptions {
            passthrough: true,
            ..options("T4-4Q", true)
        },
    );
    let t4_groups = |name: &str| consumes(device(&t4, name))[0].2.clone();
    assert_eq!(t4_groups("gpu-vfio-0"), ["vfio"]);
    assert_eq!(
        consumes(device(&t4, "gpu-vfio-0"))[0].1,
        consumes(device(&t4, "gpu-0"))[0].1
    );
    for d in devices(&slices) {
        for (_, _, groups) in consumes(d) {
            assert!(groups.len() <= 2, "{}: {groups:?}", d.name);
        }
    }
}

#[test]
fn an_l40s_in_heterogeneous_mode_offers_types_of_several_sizes_sharing_its_framebuffer() {
    let slices = slices("l40s-vgpu", options("L40S-12Q,L40S-24Q", false));
    for gpu in 0..4 {
        let set = counter_set(&slices, &format!("gpu-{gpu}-counter-set"));
        assert_eq!(
            set.counters
                .iter()
                .map(|(k, v)| format!("{k}={}", v.value.0))
                .collect::<Vec<_>>(),
            ["framebuffer=48Gi"]
        );
        assert_eq!(
            consumes(device(&slices, &format!("gpu-{gpu}"))),
            [(
                format!("gpu-{gpu}-counter-set"),
                vec!["framebuffer=48Gi".into()],
                vec![]
            )]
        );
    }
    assert_eq!(names_of_type(&slices, "vgpu").len(), 4 * (4 + 2));
    assert_eq!(
        attr(device(&slices, "vgpu-3-24q-1"), "profile")
            .string
            .as_deref(),
        Some("L40S-24Q")
    );
    let grouped = self::slices("l40s-vgpu", options("L40S-1B,L40S-12Q,L40S-24Q", true));
    let groups = |name: &str| consumes(device(&grouped, name))[0].2.clone();
    assert_eq!(groups("vgpu-0-12q-0"), ["vgpu-12q", "vgpu-mixed"]);
    assert_eq!(groups("vgpu-0-1b-31"), ["vgpu-1b"]);
}

#[test]
fn a_t4_node_offers_mdev_vgpus_per_gpu_index() {
    let slices = slices("t4-vgpu-mdev", options("0=T4-4Q;1=T4-8Q", false));
    let mut vgpus = names_of_type(&slices, "vgpu");
    vgpus.sort_unstable();
    assert_eq!(
        vgpus,
        [
            "vgpu-0-4q-0",
            "vgpu-0-4q-1",
            "vgpu-0-4q-2",
            "vgpu-0-4q-3",
            "vgpu-1-8q-0",
            "vgpu-1-8q-1"
        ]
    );
    let d = device(&slices, "vgpu-1-8q-1");
    assert_eq!(attr(d, "vgpuFramework").string.as_deref(), Some("mdev"));
    assert_eq!(consumes(d)[0].1, ["framebuffer=8Gi"]);
    assert_eq!(
        counter_set(&slices, "gpu-1-counter-set").counters["framebuffer"]
            .value
            .0,
        "16Gi"
    );
    // GPUs 2 and 3 offer none: no set, and their full GPUs consume nothing.
    assert!(device(&slices, "gpu-2").consumes_counters.is_none());
    assert!(
        slices
            .iter()
            .flat_map(|s| s.spec.shared_counters.iter().flatten())
            .all(|c| c.name != "gpu-2-counter-set")
    );
}

#[test]
fn refused_type_lists_name_the_flag_the_value_and_what_would_do() {
    let refused = |node: &str, types: &str, groups: bool| {
        sim_slices(node, "gpu.nvidia.com", options(types, groups))
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let text = refused("hgx-h100-vgpu", "H100-4C,H100-10C", false);
    assert!(
        text.contains("H100-4C and H100-10C cannot share a GPU (heterogeneous mode off): give them different GPUs, e.g. --vgpu-types '0-3=H100-4C;4-7=H100-10C', or turn on --compatibility-groups (Kubernetes 1.37 DRADeviceCompatibilityGroups)"),
        "{text}"
    );
    let text = refused("l40s-vgpu", "L40S-1B,L40S-12Q", false);
    assert!(
        text.contains("L40S-1B is exclusive") && text.contains("'0-1=L40S-1B;2-3=L40S-12Q'"),
        "{text}"
    );
    let text = refused("hgx-h100-vgpu", "H100-1-10C", true);
    assert!(
        text.contains("MIG-backed") && text.contains("vdev write order of gpu_instance_id is [?]"),
        "{text}"
    );
    let text = refused("t4-vgpu-mdev", "T4-3Q", false);
    assert!(
        text.contains("\"T4-3Q\" is not a vGPU type of any GPU on this node")
            && text.contains("Tesla T4 (GPU 0-3): T4-1B"),
        "{text}"
    );
    let text = refused("t4-vgpu-mdev", "9=T4-4Q", false);
    assert!(
        text.contains("GPU index 9 is not on this node; its GPUs are 0-3"),
        "{text}"
    );
    let text = refused("dgx-h100", "H100-4C", false);
    assert!(
        text.contains("no GPU on this node reports vGPU types"),
        "{text}"
    );
    // Groups keep them apart instead.
    assert!(
        sim_slices(
            "hgx-h100-vgpu",
            "gpu.nvidia.com",
            options("H100-4C,H100-10C", true)
        )
        .is_ok()
    );
}

#[test]
fn a_dgx_h100_publishes_the_same_slices_whatever_the_vgpu_flags_when_no_gpu_offers_vgpu() {
    let default = slices("dgx-h100", SimSliceOptions::default());
    let grouped = slices("dgx-h100", options("", true));
    assert_eq!(default, grouped);
    assert!(names_of_type(&default, "vgpu").is_empty());
    for d in devices(&default) {
        for (_, counters, groups) in consumes(d) {
            assert!(groups.is_empty(), "{}", d.name);
            assert!(
                counters.iter().all(|c| !c.starts_with("framebuffer=")),
                "{}",
                d.name
            );
        }
    }
    assert!(
        default
            .iter()
            .all(|s| s.spec.partition_type_attribute.is_none())
    );
}

#[test]
fn the_partition_type_attribute_goes_on_the_slices_holding_dynamic_mig_devices_only() {
    let slices = slices(
        "dgx-h100",
        SimSliceOptions {
            partitionable_devices_type: true,
            ..Default::default()
        },
    );
    let mut with = 0;
    for s in &slices {
        let mig = s
            .spec
            .devices
            .iter()
            .flatten()
            .any(|d| attr(d, "type").string.as_deref() == Some("mig"));
        let want = mig.then(|| "gpu.nvidia.com/profile".to_string());
        assert_eq!(
            s.spec.partition_type_attribute, want,
            "{:?}",
            s.metadata.name
        );
        with += usize::from(mig);
    }
    assert!(with > 0);
    // A node without dynamic MIG sets none.
    let t4 = self::slices(
        "t4-vgpu-mdev",
        SimSliceOptions {
            partitionable_devices_type: true,
            ..options("T4-4Q", false)
        },
    );
    assert!(t4.iter().all(|s| s.spec.partition_type_attribute.is_none()));
}

#[test]
fn each_built_in_class_selects_its_own_device_type_and_only_the_vgpu_class_selects_vgpus() {
    use gpu_dra::cel::{DeviceView, Selector};
    let slices = slices(
        "hgx-h100-vgpu",
        SimSliceOptions {
            passthrough: true,
            ..options("H100-4C,H100-10C", true)
        },
    );
    let classes = gpu_dra::explain_inputs::builtin_classes().unwrap();
    let mut matched: BTreeMap<(String, String), usize> = BTreeMap::new();
    for class in &classes {
        let expression = class.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression
            .clone();
        let selector = Selector::compile(&expression).unwrap();
        for d in devices(&slices) {
            let view = DeviceView::from_api("gpu.nvidia.com", d).unwrap();
            if matches!(selector.evaluate(&view), Ok(true)) {
                let kind = attr(d, "type").string.clone().unwrap();
                *matched
                    .entry((class.metadata.name.clone().unwrap(), kind))
                    .or_default() += 1;
            }
        }
    }
    let pairs: Vec<(&str, &str)> = matched
        .keys()
        .map(|(c, k)| (c.as_str(), k.as_str()))
        .collect();
    assert_eq!(
        pairs,
        // No VFIO devices: the GPUs' SR-IOV VFs are on (the mdev host below has them).
        [
            ("gpu.nvidia.com", "gpu"),
            ("mig.nvidia.com", "mig"),
            ("vgpu.gpu.nvidia.com", "vgpu"),
        ]
    );
    assert_eq!(
        matched[&("vgpu.gpu.nvidia.com".into(), "vgpu".into())],
        8 * (20 + 8)
    );
}
