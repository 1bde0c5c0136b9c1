//! VFIO devices and the allocator: the real device model of a simulated passthrough node,
//! published as slices and allocated with the real CEL engine. The VFIO device consumes its
//! GPU's whole counter set, so the allocator never hands it out with the full GPU or a MIG
//! device of the same GPU, in either order.

mod alloc_fixtures;

use std::sync::Arc;

use alloc_fixtures::{allocated, claim, device_names};
use gpu_dra::alloc::{Detail, Node, Outcome, allocate_claim};
use gpu_dra::devices::{self, ModelOptions};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::passthrough::{PassthroughBackend, PciHost};
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::sim::sysfs::SimKernel;
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

const NODE: &str = "node-a";

/// One H100 with dynamic MIG, or (with `mig: disabled`) without, on a passthrough host.
fn slices(mig: &str) -> Vec<ResourceSlice> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.yaml");
    std::fs::write(
        &file,
        format!(
            "nodeName: {NODE}\ngpus:\n  - model: H100-SXM5-80GB\n    mig: {mig}\npassthrough:\n  iommu: true\n"
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    let sim = SimBackend::open(file.to_str().unwrap(), Some(&state)).unwrap();
    let root = sim.host_root().unwrap().to_path_buf();
    let policies = sim.mig_policies();
    let pci = Arc::new(PciHost::new(&root, Arc::new(SimKernel::new(&root))));
    let backend = PassthroughBackend::new(Arc::new(sim), pci);
    let mut options = ModelOptions::with_policies("gpu.nvidia.com", &policies);
    options.passthrough = true;
    let model = devices::build(&backend.inventory().unwrap(), &options);
    gpu_dra::slices::build(
        &model,
        &gpu_dra::slices::PoolOptions {
            driver_name: "gpu.nvidia.com".into(),
            node_name: NODE.into(),
            generation: 1,
        },
    )
    .unwrap()
}

fn classes() -> Vec<DeviceClass> {
    gpu_dra::explain_inputs::builtin_classes().unwrap()
}

fn request(class: &str) -> ResourceClaim {
    claim(
        class,
        &format!("requests:\n- name: r\n  exactly:\n    deviceClassName: {class}"),
    )
}

fn run(slices: &[ResourceSlice], held: &[ResourceClaim], class: &str) -> Outcome {
    allocate_claim(
        &CelEngine,
        &classes(),
        slices,
        held,
        &request(class),
        &Node::named(NODE),
        Detail::Full,
    )
    .expect("the claim is valid")
}

#[test]
fn the_vfio_device_is_published_with_nvidias_attributes_and_the_whole_counter_set() {
    let slices = slices("dynamic");
    let devices: Vec<_> = slices
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .collect();
    let vfio = devices.iter().find(|d| d.name == "gpu-vfio-0").unwrap();
    let full = devices.iter().find(|d| d.name == "gpu-0").unwrap();
    let attrs = vfio.attributes.as_ref().unwrap();
    assert_eq!(Some("vfio"), attrs["type"].string.as_deref());
    assert_eq!(Some("0x10de"), attrs["vendorID"].string.as_deref());
    assert_eq!(Some("0x2330"), attrs["deviceID"].string.as_deref());
    assert_eq!(Some(false), attrs["iommuFDEnabled"].bool);
    assert_eq!(
        Some("0000:18:00.0"),
        attrs["resource.kubernetes.io/pciBusID"].string.as_deref()
    );
    assert_eq!(
        Some(gpu_dra::hardware::passthrough::uuid_v5_dns("0000:18:00.0").as_str()),
        attrs["uuid"].string.as_deref()
    );
    assert_eq!(full.consumes_counters, vfio.consumes_counters);
}

#[test]
fn a_held_vfio_device_keeps_the_full_gpu_and_every_mig_device_of_its_gpu_from_the_allocator() {
    let slices = slices("dynamic");
    let vm = allocated("vm", NODE, &[("r", "gpu-vfio-0")]);
    for class in ["gpu.nvidia.com", "mig.nvidia.com"] {
        let got = run(&slices, std::slice::from_ref(&vm), class);
        assert!(
            device_names(&got).is_empty(),
            "{class} allocated beside a VM's GPU: {:?}",
            device_names(&got)
        );
    }
    let got = run(&slices, &[], "vfio.gpu.nvidia.com");
    assert_eq!(vec![vec!["r=gpu-vfio-0".to_string()]], device_names(&got));
}

#[test]
fn a_held_mig_device_or_full_gpu_keeps_the_vfio_device_from_the_allocator() {
    let slices = slices("dynamic");
    for held in ["gpu-0", "gpu-0-mig-1g10gb-0"] {
        let holder = allocated("holder", NODE, &[("r", held)]);
        let got = run(
            &slices,
            std::slice::from_ref(&holder),
            "vfio.gpu.nvidia.com",
        );
        assert!(
            device_names(&got).is_empty(),
            "VFIO allocated beside {held}: {:?}",
            device_names(&got)
        );
    }
}

#[test]
fn without_dynamic_mig_a_one_counter_set_makes_the_full_gpu_and_vfio_device_exclusive() {
    let slices = slices("disabled");
    let vm = allocated("vm", NODE, &[("r", "gpu-vfio-0")]);
    assert!(device_names(&run(&slices, std::slice::from_ref(&vm), "gpu.nvidia.com")).is_empty());
    let pod = allocated("pod", NODE, &[("r", "gpu-0")]);
    assert!(
        device_names(&run(
            &slices,
            std::slice::from_ref(&pod),
            "vfio.gpu.nvidia.com"
        ))
        .is_empty()
    );
    assert_eq!(
        vec![vec!["r=gpu-0".to_string()]],
        device_names(&run(&slices, &[], "gpu.nvidia.com"))
    );
}
