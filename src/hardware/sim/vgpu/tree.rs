//! Laying out and changing the vGPU side of the host tree: VFs enabled and disabled, the
//! lists of what each GPU can create rewritten after every change, and the first build.

use std::io::{self, ErrorKind};
use std::path::Path;

use super::{
    EINVAL, LEDGER, LEDGER_VERSION, Ledger, LedgerGpu, available, creatable_text, errno,
    vf_address, write_ledger,
};
use crate::hardware::passthrough::{NVIDIA_DRIVER, NVIDIA_VENDOR};
use crate::hardware::sim::SimError;
use crate::hardware::sim::sysfs::{BusGpu, Function, fs_err, lay_out, link, write as put};
use crate::hardware::vgpu::{self, VgpuFramework, VgpuType};

pub(super) fn io_of(e: SimError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Lays out VFs `0..count` of `gpu` and enables them.
pub(super) fn enable_vfs(root: &Path, gpu: &LedgerGpu, count: u32) -> Result<(), SimError> {
    let sys = root.join("sys");
    let pf = gpu.dir(root);
    for n in 0..count {
        let address = vf_address(&gpu.address, n);
        let group = gpu.first_vf_group.map(|g| g + n);
        lay_out(
            &sys,
            &Function {
                address: address.clone(),
                root: &gpu.pcie_root,
                vendor: NVIDIA_VENDOR,
                device: &gpu.device_id,
                class: "0x030200",
                driver: NVIDIA_DRIVER,
                numa: gpu.numa,
                group,
                physfn: Some(&gpu.address),
            },
        )?;
        link(&format!("../{address}"), &pf.join(format!("virtfn{n}")))?;
        let dev = sys.join("devices").join(&gpu.pcie_root).join(&address);
        put(&dev.join("nvidia/current_vgpu_type"), "0\n")?;
        put(&dev.join("nvidia/creatable_vgpu_types"), "")?;
        put(&dev.join("nvidia/vgpu_params"), "")?;
        if let Some(group) = group {
            put(&root.join(format!("dev/vfio/{group}")), "")?;
        }
    }
    put(&pf.join("sriov_numvfs"), &format!("{count}\n"))
}

/// Removes every VF of `gpu`.
pub(super) fn disable_vfs(root: &Path, gpu: &LedgerGpu) -> io::Result<()> {
    let pf = gpu.dir(root);
    for (n, address) in vfs_of(&pf)? {
        let dev = pf.with_file_name(&address);
        if let Some(group) = link_name(&dev.join("iommu_group")) {
            remove_all(&root.join("sys/kernel/iommu_groups").join(&group))?;
            remove_all(&root.join("dev/vfio").join(&group))?;
        }
        remove_all(&root.join("sys/bus/pci/devices").join(&address))?;
        remove_all(&pf.join(format!("virtfn{n}")))?;
        remove_all(&dev)?;
    }
    std::fs::write(pf.join("sriov_numvfs"), "0\n")
}

pub(super) fn remove_all(path: &Path) -> io::Result<()> {
    let result = match path.symlink_metadata() {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

pub(super) fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// The VFs of the GPU whose directory is `pf`: `(n, address)` by `n`.
pub(super) fn vfs_of(pf: &Path) -> io::Result<Vec<(u32, String)>> {
    let mut vfs = Vec::new();
    for entry in std::fs::read_dir(pf)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(n) = name.strip_prefix("virtfn").and_then(|n| n.parse().ok())
            && let Some(address) = link_name(&pf.join(&name))
        {
            vfs.push((n, address));
        }
    }
    vfs.sort();
    Ok(vfs)
}

/// The mdevs under the GPU whose directory is `pf`: `(uuid, type)`.
pub(super) fn mdevs_of(pf: &Path) -> io::Result<Vec<(String, u32)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(pf)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !vgpu::is_uuid(&name) {
            continue;
        }
        if let Some(id) = link_name(&pf.join(&name).join("mdev_type"))
            .and_then(|t| t.strip_prefix("nvidia-")?.parse().ok())
        {
            out.push((name, id));
        }
    }
    out.sort();
    Ok(out)
}

pub(super) fn read_u32(path: &Path) -> io::Result<u32> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|_| errno(EINVAL))
}

/// Reads what GPU `i` runs from the tree, rewrites what it can create (every free VF's
/// `creatable_vgpu_types`, or every mdev type's `available_instances`), and records it.
pub(super) fn refresh(root: &Path, ledger: &mut Ledger, i: usize) -> io::Result<()> {
    let gpu = &ledger.gpus[i];
    let model = gpu.model()?;
    let pf = gpu.dir(root);
    let mut active = Vec::new();
    match gpu.framework {
        VgpuFramework::Vdev => {
            let vfs = vfs_of(&pf)?;
            let mut current = Vec::new();
            for (_, address) in &vfs {
                let dev = pf.with_file_name(address);
                let t = read_u32(&dev.join("nvidia/current_vgpu_type"))?;
                current.push((dev, t));
                if t != 0 {
                    active.push(t);
                }
            }
            let free = vgpu::creatable(
                &model.types,
                gpu.heterogeneous,
                &active,
                model.framebuffer_mib,
            );
            for (dev, t) in current {
                let ids = if t == 0 { free.as_slice() } else { &[] };
                std::fs::write(
                    dev.join("nvidia/creatable_vgpu_types"),
                    creatable_text(&model.types, ids),
                )?;
            }
        }
        VgpuFramework::Mdev => {
            active = mdevs_of(&pf)?.into_iter().map(|(_, t)| t).collect();
            let left = available(
                &model.types,
                gpu.heterogeneous,
                &active,
                model.framebuffer_mib,
            );
            for (id, n) in left {
                let file = pf.join(format!(
                    "mdev_supported_types/nvidia-{id}/available_instances"
                ));
                std::fs::write(file, format!("{n}\n"))?;
            }
        }
    }
    active.sort_unstable();
    ledger.gpus[i].active = active;
    write_ledger(root, ledger)
}

/// Lays out the vGPU side of every vGPU GPU of `gpus` (GPU `i` is IOMMU group `i + 1` when
/// `iommu`) and writes the ledger. Part of building the host tree, once per state directory.
pub(in crate::hardware::sim) fn build(
    root: &Path,
    iommu: bool,
    gpus: &[BusGpu<'_>],
) -> Result<(), SimError> {
    if gpus.iter().all(|g| g.vgpu.is_none()) {
        return Ok(());
    }
    let mut next_group = gpus.len() as u32 + 1;
    let mut ledger = Ledger {
        version: LEDGER_VERSION,
        mdev_group_floor: None,
        gpus: Vec::new(),
    };
    for gpu in gpus {
        let Some(planned) = gpu.vgpu else { continue };
        let vfs = match planned.framework {
            VgpuFramework::Vdev => planned.model.total_vfs,
            VgpuFramework::Mdev => 0,
        };
        ledger.gpus.push(LedgerGpu {
            address: gpu.address.to_string(),
            product: planned.model.product_name.to_string(),
            framework: planned.framework,
            heterogeneous: planned.heterogeneous,
            pcie_root: gpu.pcie_root.to_string(),
            device_id: gpu.device_id.clone(),
            numa: gpu.numa,
            first_vf_group: iommu.then_some(next_group),
            active: Vec::new(),
        });
        next_group += vfs;
    }
    ledger.mdev_group_floor = iommu.then_some(next_group);
    let sys = root.join("sys");
    for (gpu, planned) in ledger.gpus.iter().zip(gpus.iter().filter_map(|g| g.vgpu)) {
        let pf = gpu.dir(root);
        match gpu.framework {
            VgpuFramework::Vdev => {
                let total = planned.model.total_vfs;
                put(&pf.join("sriov_totalvfs"), &format!("{total}\n"))?;
                if planned.vfs_enabled {
                    enable_vfs(root, gpu, total)?;
                }
            }
            VgpuFramework::Mdev => {
                link(
                    &format!("../../devices/{}/{}", gpu.pcie_root, gpu.address),
                    &sys.join("class/mdev_bus").join(&gpu.address),
                )?;
                for t in planned
                    .model
                    .types
                    .iter()
                    .filter(|t| t.mig_profile.is_none())
                {
                    let dir = pf.join(format!("mdev_supported_types/nvidia-{}", t.id));
                    put(&dir.join("name"), &format!("{}\n", t.name))?;
                    put(&dir.join("description"), &format!("{}\n", description(t)))?;
                    put(&dir.join("device_api"), "vfio-pci\n")?;
                    put(&dir.join("available_instances"), "0\n")?;
                    put(&dir.join("create"), "")?;
                    std::fs::create_dir_all(dir.join("devices"))
                        .map_err(fs_err(&dir, "creating"))?;
                }
            }
        }
    }
    for i in 0..ledger.gpus.len() {
        refresh(root, &mut ledger, i).map_err(fs_err(&root.join(LEDGER), "writing"))?;
    }
    Ok(())
}

/// An mdev type's `description`, as NVIDIA's driver prints it.
fn description(t: &VgpuType) -> String {
    let (heads, frl, resolution) = match vgpu::short_name(&t.name).chars().last() {
        Some('B') => (4, 45, "5120x2880"),
        Some('C') => (1, 60, "4096x2160"),
        _ => (4, 60, "7680x4320"),
    };
    format!(
        "num_heads={heads}, frl_config={frl}, framebuffer={}M, max_resolution={resolution}, max_instance={}",
        t.framebuffer_mib, t.max_instances
    )
}
