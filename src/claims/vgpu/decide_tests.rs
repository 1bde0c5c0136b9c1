use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::hardware::sim::SimBackend;
use crate::hardware::sim::sysfs::SimKernel;
use crate::hardware::vgpu::{VgpuBackend, VgpuHost};
use crate::hardware::{GpuBackend, NodeInventory};

const GPU0: &str = "0000:18:00.0";
const H100_4C: u32 = 1056;
const H100_10C: u32 = 1058;

/// A simulated node of `preset` as the plugin's backend reads it (NVML and sysfs), and its
/// vGPU host, to make vGPUs behind the decisions' back.
fn node(preset: &str) -> (tempfile::TempDir, VgpuBackend, Arc<VgpuHost>) {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimBackend::open(preset, Some(&dir.path().join("sim"))).unwrap();
    let root = sim.host_root().unwrap().to_path_buf();
    let host = Arc::new(VgpuHost::new(&root, Arc::new(SimKernel::new(&root))));
    let backend = VgpuBackend::new(Arc::new(sim), Arc::clone(&host));
    (dir, backend, host)
}

fn parent<'a>(inventory: &'a NodeInventory, index: usize, holders: &'a [String]) -> Parent<'a> {
    let info = &inventory.gpus[index];
    let address = inventory.vgpu_host.as_ref().unwrap().gpus[index]
        .address
        .as_str();
    Parent {
        address,
        host: inventory.vgpu_host.as_ref().unwrap().gpu(address),
        info: Some(info),
        mig_toggles: true,
        holders,
    }
}

fn vdev(vf: &str, type_id: u32) -> VgpuRecord {
    VgpuRecord {
        type_id,
        framework: VgpuFramework::Vdev,
        parent: GPU0.into(),
        vf: Some(vf.into()),
        mdev_uuid: None,
    }
}

fn uuid() -> String {
    "3b1a5e2c-0000-4000-8000-000000000001".into()
}

#[test]
fn a_vdev_vgpu_takes_the_lowest_free_vf_that_no_record_holds() {
    let (_dir, backend, _) = node("hgx-h100-vgpu");
    let inventory = backend.inventory().unwrap();
    let p = parent(&inventory, 0, &[]);
    let placed = place(&p, H100_4C, VgpuFramework::Vdev, &[], uuid).unwrap();
    assert_eq!(
        Placement {
            vf: Some("0000:18:00.4".into()),
            mdev_uuid: None,
            // The preset powers on with MIG mode on (dynamic MIG) and no instance.
            mig_off: inventory.gpus[0].mig.current,
        },
        placed
    );
    // A record of this wave holds VF 0 (not created yet): the next VF, and only the same type
    // beside it on a homogeneous GPU.
    let first = vdev("0000:18:00.4", H100_4C);
    let second = place(&p, H100_4C, VgpuFramework::Vdev, &[&first], uuid).unwrap();
    assert_eq!(Some("0000:18:00.5".to_string()), second.vf);
    let other = place(&p, H100_10C, VgpuFramework::Vdev, &[&first], uuid).unwrap_err();
    assert!(
        other.contains("vGPU type H100-10C cannot be created on GPU 0000:18:00.0 now: it runs 1 × H100-4C (0000:18:00.4)"),
        "{other}"
    );
    // A record on another GPU changes nothing here.
    let elsewhere = VgpuRecord {
        parent: "0000:2a:00.0".into(),
        ..vdev("0000:18:00.4", H100_10C)
    };
    assert_eq!(
        placed,
        place(&p, H100_4C, VgpuFramework::Vdev, &[&elsewhere], uuid).unwrap()
    );
}

#[test]
fn a_vgpu_beside_one_that_exists_follows_what_sysfs_says_the_vfs_can_create() {
    let (_dir, backend, host) = node("hgx-h100-vgpu");
    host.create_vdev("0000:18:00.4", H100_4C).unwrap();
    let inventory = backend.inventory().unwrap();
    let p = parent(&inventory, 0, &[]);
    let mine = vdev("0000:18:00.4", H100_4C);
    // Its record names the VF that holds it: nothing pending, sysfs decides.
    assert_eq!(
        Some("0000:18:00.5".to_string()),
        place(&p, H100_4C, VgpuFramework::Vdev, &[&mine], uuid)
            .unwrap()
            .vf
    );
    let refused = place(&p, H100_10C, VgpuFramework::Vdev, &[], uuid).unwrap_err();
    assert!(
        refused.contains("it runs 1 × H100-4C (0000:18:00.4)"),
        "{refused}"
    );
}

#[test]
fn each_refusal_names_the_cause_and_the_fix() {
    let (_dir, backend, _) = node("hgx-h100-vgpu");
    let inventory = backend.inventory().unwrap();
    let holders = vec![
        "77 (nvidia-persistenced)".to_string(),
        "78 (nvidia-vgpu-mgr)".to_string(),
        "4242 (python3)".to_string(),
    ];
    let held = place(
        &parent(&inventory, 0, &holders),
        H100_4C,
        VgpuFramework::Vdev,
        &[],
        uuid,
    )
    .unwrap_err();
    assert!(
        held.starts_with("processes hold /dev/nvidia0 of GPU 0000:18:00.0: 4242 (python3); "),
        "{held}"
    );
    let daemons_only = &holders[..2];
    assert!(
        place(
            &parent(&inventory, 0, daemons_only),
            H100_4C,
            VgpuFramework::Vdev,
            &[],
            uuid
        )
        .is_ok()
    );

    let mut with_mig = inventory.clone();
    let gpu = &mut with_mig.gpus[0];
    gpu.mig.current = true;
    let profile = gpu.profile_by_name("1g.10gb").unwrap().clone();
    gpu.mig_devices.push(crate::hardware::MigDevice {
        uuid: "MIG-1".into(),
        profile_id: profile.id,
        profile_name: profile.name.clone(),
        gi_id: 9,
        ci_id: 0,
        placement: crate::hardware::Placement { start: 3, size: 1 },
    });
    let mig = place(
        &parent(&with_mig, 0, &[]),
        H100_4C,
        VgpuFramework::Vdev,
        &[],
        uuid,
    )
    .unwrap_err();
    assert!(
        mig.starts_with("GPU 0000:18:00.0 has MIG instances: 1g.10gb@3 (GI 9); a time-sliced vGPU needs the GPU out of MIG mode"),
        "{mig}"
    );
    with_mig.gpus[0].mig_devices.clear();
    let toggled = place(
        &parent(&with_mig, 0, &[]),
        H100_4C,
        VgpuFramework::Vdev,
        &[],
        uuid,
    )
    .unwrap();
    assert!(toggled.mig_off, "MIG mode on, no instance: switched off");
    let mut fixed = parent(&with_mig, 0, &[]);
    fixed.mig_toggles = false;
    let on = place(&fixed, H100_4C, VgpuFramework::Vdev, &[], uuid).unwrap_err();
    assert!(on.contains("nvidia-smi -i 0000:18:00.0 -mig 0"), "{on}");

    let mut disabled = inventory.clone();
    disabled.vgpu_host.as_mut().unwrap().gpus[0].vfs.clear();
    let vfs = place(
        &parent(&disabled, 0, &[]),
        H100_4C,
        VgpuFramework::Vdev,
        &[],
        uuid,
    )
    .unwrap_err();
    assert!(
        vfs.contains("sriov-manage -e 0000:18:00.0"),
        "VFs not enabled: {vfs}"
    );

    let mut gone = parent(&inventory, 0, &[]);
    gone.host = None;
    let missing = place(&gone, H100_4C, VgpuFramework::Vdev, &[], uuid).unwrap_err();
    assert!(missing.contains("--host-root"), "{missing}");
}

#[test]
fn an_mdev_vgpu_gets_the_uuid_it_is_given_while_an_instance_is_available() {
    let (_dir, backend, _) = node("t4-vgpu-mdev");
    let inventory = backend.inventory().unwrap();
    let p = parent(&inventory, 0, &[]);
    let t4 = &inventory.gpus[0].vgpu.as_ref().unwrap().supported;
    let big = t4
        .iter()
        .find(|t| t.short_name() == "T4-16Q")
        .expect("the T4's 16 GiB type")
        .id;
    let placed = place(&p, big, VgpuFramework::Mdev, &[], uuid).unwrap();
    assert_eq!(Some(uuid()), placed.mdev_uuid);
    // One T4-16Q fills the GPU: a second one queued in the same wave is refused.
    let queued = VgpuRecord {
        type_id: big,
        framework: VgpuFramework::Mdev,
        parent: p.address.into(),
        vf: None,
        mdev_uuid: Some(uuid()),
    };
    let full = place(&p, big, VgpuFramework::Mdev, &[&queued], uuid).unwrap_err();
    assert!(full.contains("cannot be created on GPU"), "{full}");
}

#[test]
fn vgpus_no_record_names_on_managed_gpus_are_orphans() {
    let (_dir, _, host) = node("hgx-h100-vgpu");
    host.create_vdev("0000:18:00.4", H100_4C).unwrap();
    host.create_vdev("0000:18:00.5", H100_4C).unwrap();
    let facts = host.scan().unwrap();
    let kept = vdev("0000:18:00.4", H100_4C);
    let managed: BTreeSet<String> = [GPU0.to_string()].into();
    let found: Vec<(&str, Option<&str>)> = orphans(&facts, &managed, &[&kept])
        .into_iter()
        .map(|(gpu, i)| (gpu, i.vf_address.as_deref()))
        .collect();
    assert_eq!(vec![(GPU0, Some("0000:18:00.5"))], found);
    assert!(orphans(&facts, &BTreeSet::new(), &[]).is_empty());
}

#[test]
fn an_mdev_uuid_is_fixed_by_claim_and_device_and_differs_between_them() {
    let a = mdev_uuid("uid-a", "vgpu-0-4q-0");
    assert!(crate::hardware::vgpu::is_uuid(&a), "{a}");
    assert_eq!(a, mdev_uuid("uid-a", "vgpu-0-4q-0"));
    assert_ne!(a, mdev_uuid("uid-b", "vgpu-0-4q-0"));
    assert_ne!(a, mdev_uuid("uid-a", "vgpu-0-4q-1"));
}
