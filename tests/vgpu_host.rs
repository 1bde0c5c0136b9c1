//! The production vGPU host code ([`VgpuHost`]) on the simulated vGPU presets, through the
//! simulated kernel: what a scan sees, how creating a vGPU changes what its GPU can create
//! next (homogeneous H100, heterogeneous L40S, mdev T4), that the kernel refuses what the
//! hardware refuses and changes nothing then, and the refusals users see.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::passthrough::SysfsKernel;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::sim::sysfs::SimKernel;
use gpu_dra::hardware::vgpu::sysfs::TypeNames;
use gpu_dra::hardware::vgpu::{VgpuBackend, VgpuHost, VgpuHostError, VgpuHostFacts};

/// A simulated node of `preset` with its own state directory.
struct Node {
    _dir: tempfile::TempDir,
    sim: Arc<SimBackend>,
    root: PathBuf,
    kernel: Arc<SimKernel>,
    host: Arc<VgpuHost>,
}

fn node(preset: &str) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimBackend::open(preset, Some(&dir.path().join("sim"))).unwrap();
    let root = sim
        .host_root()
        .expect("a vGPU node has a host tree")
        .to_path_buf();
    let kernel = Arc::new(SimKernel::new(&root));
    let host = Arc::new(VgpuHost::new(&root, kernel.clone()));
    Node {
        _dir: dir,
        sim: Arc::new(sim),
        root,
        kernel,
        host,
    }
}

impl Node {
    fn scan(&self) -> VgpuHostFacts {
        self.host.scan().unwrap()
    }

    /// NVML's names of GPU 0's types.
    fn names(&self) -> TypeNames {
        let inventory = self.sim.inventory().unwrap();
        TypeNames::from_types(&inventory.gpus[0].vgpu.as_ref().unwrap().supported)
    }

    /// What NVML reports GPU `index` can create now.
    fn nvml_creatable(&self, index: usize) -> Vec<u32> {
        self.sim.inventory().unwrap().gpus[index]
            .vgpu
            .as_ref()
            .unwrap()
            .creatable
            .clone()
    }

    fn vf_file(&self, vf: &str) -> PathBuf {
        self.root
            .join("sys/bus/pci/devices")
            .join(vf)
            .join("nvidia/current_vgpu_type")
    }
}

const GPU0: &str = "0000:18:00.0";
const H100_TIME_SLICED: [u32; 6] = [1056, 1057, 1058, 1059, 1060, 1061];

/// The creatable lists of GPU 0's VFs `from..`, deduplicated.
fn sibling_lists(facts: &VgpuHostFacts, from: usize) -> Vec<Vec<u32>> {
    let mut lists: Vec<Vec<u32>> = facts.gpus[0].vfs[from..]
        .iter()
        .map(|vf| vf.creatable.clone())
        .collect();
    lists.dedup();
    lists
}

#[test]
fn the_h100_preset_shows_32_enabled_vfs_per_gpu_each_with_its_own_group_and_every_time_sliced_type()
{
    let n = node("hgx-h100-vgpu");
    let facts = n.scan();
    assert_eq!(facts.gpus.len(), 8);
    for gpu in &facts.gpus {
        assert_eq!((gpu.total_vfs, gpu.vfs.len()), (32, 32), "{}", gpu.address);
        assert!(gpu.instances.is_empty() && gpu.mdev_types.is_empty());
        assert!(gpu.vfs.iter().all(|vf| vf.creatable == H100_TIME_SLICED));
    }
    // GPUs keep groups 1-8; GPU 0's VFs follow from 9, GPU 1's from 41.
    let vf0 = &facts.gpus[0].vfs[0];
    assert_eq!(
        (vf0.address.as_str(), vf0.iommu_group.as_deref()),
        ("0000:18:00.4", Some("9"))
    );
    assert_eq!(facts.gpus[0].vfs[31].address, "0000:18:04.3");
    assert_eq!(facts.gpus[1].vfs[0].iommu_group.as_deref(), Some("41"));
    assert!(n.root.join("dev/vfio/9").exists() && n.root.join("dev/vfio/264").exists());
    // The VFs stay on nvidia, and the GPUs are still GPUs (a VF is not one).
    assert_eq!(
        std::fs::read_link(n.root.join("sys/bus/pci/devices/0000:18:00.4/driver"))
            .unwrap()
            .file_name()
            .unwrap(),
        "nvidia"
    );
    assert_eq!(n.sim.inventory().unwrap().gpus.len(), 8);
    assert_eq!(n.nvml_creatable(0), H100_TIME_SLICED);
}

#[test]
fn an_h100_vgpu_leaves_its_siblings_only_its_type_and_deleting_it_restores_every_type() {
    let n = node("hgx-h100-vgpu");
    let before = n.scan();
    let fingerprint = n.sim.vgpu_fingerprint();
    let vf = n.host.vf_for(GPU0, 1056, &n.names()).unwrap();
    assert_eq!((vf.number, vf.address.as_str()), (0, "0000:18:00.4"));
    let created = n.host.create_vdev(&vf.address, 1056).unwrap();
    assert_eq!(created.vf_address.as_deref(), Some("0000:18:00.4"));
    assert_eq!(created.iommu_group.as_deref(), Some("9"));

    let after = n.scan();
    assert_eq!(after.gpus[0].vfs[0].current_type, 1056);
    assert!(after.gpus[0].vfs[0].creatable.is_empty());
    assert_eq!(sibling_lists(&after, 1), vec![vec![1056]]);
    assert_eq!(after.gpus[0].instances.len(), 1);
    assert_eq!(after.gpus[1], before.gpus[1], "another GPU is untouched");
    assert_eq!(n.nvml_creatable(0), [1056]);
    assert_eq!(n.nvml_creatable(1), H100_TIME_SLICED);
    assert_ne!(n.sim.vgpu_fingerprint(), fingerprint);
    // The next one goes to the next VF.
    assert_eq!(n.host.vf_for(GPU0, 1056, &n.names()).unwrap().number, 1);

    n.host.delete_vdev("0000:18:00.4").unwrap();
    assert_eq!(n.scan(), before);
    assert_eq!(n.nvml_creatable(0), H100_TIME_SLICED);
    assert_eq!(n.sim.vgpu_fingerprint(), fingerprint);
}

#[test]
fn a_type_the_vf_cannot_create_is_einval_from_the_kernel_and_refused_by_name_before_any_write() {
    let n = node("hgx-h100-vgpu");
    n.host.create_vdev("0000:18:00.4", 1056).unwrap();
    let before = n.scan();
    let err = n
        .kernel
        .write(&n.vf_file("0000:18:00.5"), "1058")
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(22), "{err}");
    assert_eq!(n.scan(), before, "a refused write changes nothing");

    let changes = n.host.change_count();
    // The check before a prepare, with NVML's names.
    let err = n.host.vf_for(GPU0, 1058, &n.names()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "vGPU type H100-10C cannot be created on GPU 0000:18:00.0 now: it runs 1 × H100-4C (0000:18:00.4), and it can create only H100-4C beside that; delete vGPUs of this GPU first, or create H100-10C on another GPU"
    );
    // The write's own guard names types as sysfs does (no list names H100-10C now).
    let err = n.host.create_vdev("0000:18:00.5", 1058).unwrap_err();
    assert!(
        matches!(&err, VgpuHostError::TypeNotCreatable { vf: Some(vf), .. } if vf == "0000:18:00.5"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("it runs 1 × H100-4C (0000:18:00.4)"),
        "{err}"
    );
    assert_eq!(n.host.change_count(), changes, "refused before writing");
    // A busy VF refuses another type; the same type again is a no-op.
    let err = n.kernel.write(&n.vf_file("0000:18:00.4"), "1056");
    assert!(err.is_ok());
    let err = n
        .kernel
        .write(&n.vf_file("0000:18:00.4"), "1057")
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(16));
    assert!(matches!(
        n.host.create_vdev("0000:18:00.4", 1057),
        Err(VgpuHostError::VfBusy { current: 1056, .. })
    ));
    assert_eq!(n.scan(), before);
}

#[test]
fn a_heterogeneous_l40s_mixes_sizes_within_its_framebuffer() {
    let n = node("l40s-vgpu");
    let facts = n.scan();
    assert_eq!(facts.gpus.len(), 4);
    assert_eq!(facts.gpus[0].vfs[0].creatable.len(), 9);
    // 24Q (24 of 48 GiB): every Q type of 24 GiB or less may join; 48Q and the exclusive B
    // types may not.
    n.host.create_vdev("0000:18:00.4", 1154).unwrap();
    assert_eq!(
        sibling_lists(&n.scan(), 1),
        vec![vec![1149, 1150, 1151, 1152, 1153, 1154]]
    );
    // 24Q + 12Q: 12 GiB left.
    let vf = n.host.vf_for(GPU0, 1153, &n.names()).unwrap();
    n.host.create_vdev(&vf.address, 1153).unwrap();
    assert_eq!(
        sibling_lists(&n.scan(), 2),
        vec![vec![1149, 1150, 1151, 1153]]
    );
    assert_eq!(n.nvml_creatable(0), [1149, 1150, 1151, 1153]);
    n.host.delete_vdev("0000:18:00.4").unwrap();
    n.host.delete_vdev(&vf.address).unwrap();
    assert_eq!(n.scan(), facts);
}

#[test]
fn an_exclusive_l40s_1b_locks_every_other_type_out() {
    let n = node("l40s-vgpu");
    n.host.create_vdev("0000:18:00.4", 1147).unwrap();
    assert_eq!(sibling_lists(&n.scan(), 1), vec![vec![1147]]);
    let err = n.host.vf_for(GPU0, 1153, &n.names()).unwrap_err();
    assert!(
        err.to_string()
            .contains("it runs 1 × L40S-1B (0000:18:00.4), and it can create only L40S-1B"),
        "{err}"
    );
}

#[test]
fn with_vfs_disabled_the_refusal_names_sriov_manage_and_enabling_them_brings_them_back() {
    let n = node("l40s-vgpu");
    let before = n.scan();
    let numvfs = n
        .root
        .join("sys/bus/pci/devices")
        .join(GPU0)
        .join("sriov_numvfs");
    // Not while a vGPU runs.
    n.host.create_vdev("0000:18:00.4", 1153).unwrap();
    assert_eq!(
        n.kernel.write(&numvfs, "0").unwrap_err().raw_os_error(),
        Some(16)
    );
    n.host.delete_vdev("0000:18:00.4").unwrap();

    n.kernel.write(&numvfs, "0").unwrap();
    let off = n.scan();
    assert!(off.gpus[0].vfs.is_empty() && off.gpus[0].total_vfs == 32);
    assert!(!n.root.join("sys/bus/pci/devices/0000:18:00.4").exists());
    assert!(!n.root.join("dev/vfio/5").exists());
    let err = n.host.vf_for(GPU0, 1153, &n.names()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GPU 0000:18:00.0 has its SR-IOV virtual functions disabled (sriov_numvfs is 0 of 32), so no vGPU can be created on it; enable them with `/usr/lib/nvidia/sriov-manage -e 0000:18:00.0` (needed again after every reboot)"
    );
    assert_eq!(
        n.kernel.write(&numvfs, "33").unwrap_err().raw_os_error(),
        Some(34)
    );
    n.kernel.write(&numvfs, "32").unwrap();
    assert_eq!(n.scan(), before, "the same VFs in the same groups");
}

#[test]
fn a_node_file_can_start_with_the_vfs_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.yaml");
    std::fs::write(
        &file,
        "gpus:\n  - model: L40S\n    vgpu:\n      vfsEnabled: false\n",
    )
    .unwrap();
    let sim = SimBackend::open(file.to_str().unwrap(), Some(&dir.path().join("sim"))).unwrap();
    let root = sim.host_root().unwrap();
    let host = VgpuHost::new(root, Arc::new(SimKernel::new(root)));
    let gpu = host.gpu(GPU0).unwrap();
    assert_eq!((gpu.total_vfs, gpu.vfs.len()), (32, 0));
    // No passthrough section: the IOMMU is on anyway, GPU 0 in group 1.
    assert!(root.join("sys/kernel/iommu_groups/1").exists());
    let info = sim.inventory().unwrap();
    let vgpu = info.gpus[0].vgpu.as_ref().unwrap();
    assert!(!vgpu.heterogeneous && vgpu.supported.len() == 9);
}

fn available(facts: &VgpuHostFacts, id: u32) -> u32 {
    facts.gpus[0]
        .mdev_types
        .iter()
        .find(|t| t.id == id)
        .unwrap()
        .available
}

fn create_file(root: &Path, id: u32) -> PathBuf {
    root.join(format!(
        "sys/bus/pci/devices/{GPU0}/mdev_supported_types/nvidia-{id}/create"
    ))
}

#[test]
fn mdev_create_and_remove_on_a_t4_update_every_types_available_instances() {
    let n = node("t4-vgpu-mdev");
    let before = n.scan();
    assert_eq!(before.gpus.len(), 4);
    assert_eq!(before.gpus[0].total_vfs, 0);
    assert_eq!(before.gpus[0].mdev_types.len(), 10);
    assert_eq!((available(&before, 232), available(&before, 230)), (4, 16));
    assert!(n.root.join("sys/class/mdev_bus").join(GPU0).exists());

    let uuid = "7d0b3c52-4e1f-4c8a-9d2b-5a6e8f0c1d23";
    let made = n.host.create_mdev(GPU0, 232, uuid).unwrap();
    // GPUs hold groups 1-4; the first mdev gets 5.
    assert_eq!(made.iommu_group.as_deref(), Some("5"));
    assert_eq!(made.mdev_uuid.as_deref(), Some(uuid));
    assert!(n.root.join("dev/vfio/5").exists());
    let after = n.scan();
    assert_eq!(after.gpus[0].instances, vec![made.clone()]);
    assert_eq!((available(&after, 232), available(&after, 230)), (3, 0));
    assert_eq!(after.gpus[1], before.gpus[1]);
    assert_eq!(n.nvml_creatable(0), [232]);
    // Idempotent, and a refusal names what runs.
    assert_eq!(n.host.create_mdev(GPU0, 232, uuid).unwrap(), made);
    let err = n
        .host
        .create_mdev(GPU0, 233, "7d0b3c52-4e1f-4c8a-9d2b-5a6e8f0c1d24")
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("it runs 1 × T4-4Q ({uuid})")),
        "{err}"
    );
    // The kernel itself: EINVAL for another type, a bad UUID or a taken one; EDQUOT when full.
    let other = "7d0b3c52-4e1f-4c8a-9d2b-5a6e8f0c1d25";
    let code = |id, value: &str| {
        n.kernel
            .write(&create_file(&n.root, id), value)
            .unwrap_err()
            .raw_os_error()
    };
    assert_eq!(code(233, other), Some(22));
    assert_eq!(code(232, "not-a-uuid"), Some(22));
    assert_eq!(code(232, uuid), Some(17));
    for i in 0..3 {
        n.host
            .create_mdev(
                GPU0,
                232,
                &format!("7d0b3c52-4e1f-4c8a-9d2b-5a6e8f0c1e0{i}"),
            )
            .unwrap();
    }
    assert_eq!(code(232, other), Some(122));
    assert_eq!(available(&n.scan(), 232), 0);

    for i in 0..3 {
        n.host
            .remove_mdev(&format!("7d0b3c52-4e1f-4c8a-9d2b-5a6e8f0c1e0{i}"))
            .unwrap();
    }
    n.host.remove_mdev(uuid).unwrap();
    n.host.remove_mdev(uuid).unwrap();
    assert!(!n.root.join("dev/vfio/5").exists());
    assert_eq!(n.scan(), before);
    assert_eq!(n.nvml_creatable(0).len(), 10);
}

#[test]
fn the_vgpu_backend_reports_the_host_and_moves_its_generation_with_every_write() {
    let n = node("t4-vgpu-mdev");
    let backend = VgpuBackend::new(n.sim.clone(), n.host.clone());
    let generation = backend.health_generation();
    let inventory = backend.inventory().unwrap();
    assert_eq!(inventory.vgpu_host, Some(n.scan()));
    assert_eq!(inventory.gpus.len(), 4);
    n.host
        .create_mdev(GPU0, 319, "0c4b1a7e-2d3f-4e5a-8b9c-1d2e3f4a5b6c")
        .unwrap();
    assert_ne!(backend.health_generation(), generation);
    let inventory = backend.inventory().unwrap();
    assert_eq!(inventory.vgpu_host.unwrap().gpus[0].instances.len(), 1);
}
