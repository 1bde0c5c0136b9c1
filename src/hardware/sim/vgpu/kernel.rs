//! The simulated kernel's answers to writes to the vGPU files, with the error codes Linux and
//! NVIDIA's driver give: `EINVAL` for a type a VF cannot create or a bad UUID, `EBUSY` for a
//! VF that holds another type (or VFs disabled while vGPUs run), `EEXIST` for a taken UUID,
//! `EDQUOT` for an mdev type used up, `ERANGE` for more VFs than the GPU has.

use std::io;
use std::path::Path;

use super::tree::{
    disable_vfs, enable_vfs, io_of, link_name, mdevs_of, read_u32, refresh, remove_all,
};
use super::{
    EBUSY, EEXIST, EINVAL, ENODEV, ERANGE, Ledger, errno, locked, mdev_refusal, read_ledger,
};
use crate::hardware::sim::SimError;
use crate::hardware::sim::sysfs::{link, write as put};
use crate::hardware::vgpu::{self, VgpuFramework};

/// The simulated kernel's answer to a write of `value` to `dir/name` (`dir` resolved), when
/// it is a vGPU attribute: `None` for any other file (and for `sriov_numvfs` of a GPU
/// without vGPU), which the caller handles.
pub(in crate::hardware::sim) fn kernel_write(
    root: &Path,
    dir: &Path,
    name: &str,
    value: &str,
) -> Option<io::Result<()>> {
    let is_type_dir = dir
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|n| n == "mdev_supported_types");
    match name {
        "current_vgpu_type" => Some(locked(root, |l| write_vdev(root, l, dir, value))),
        "create" if is_type_dir => Some(locked(root, |l| create_mdev(root, l, dir, value))),
        "vgpu_params"
            if dir
                .parent()
                .is_some_and(|m| m.join("mdev_type").symlink_metadata().is_ok()) =>
        {
            Some(write_params(dir, value))
        }
        "remove" if dir.join("mdev_type").symlink_metadata().is_ok() => {
            Some(locked(root, |l| remove_mdev(root, l, dir, value)))
        }
        "sriov_numvfs" => {
            let address = dir.file_name()?.to_string_lossy().into_owned();
            let ledger = read_ledger(root).ok()?;
            ledger
                .gpus
                .iter()
                .any(|g| g.address == address && g.framework == VgpuFramework::Vdev)
                .then(|| locked(root, |l| write_numvfs(root, l, &address, value)))
        }
        _ => None,
    }
}

fn gpu_index(ledger: &Ledger, address: &str) -> io::Result<usize> {
    ledger
        .gpus
        .iter()
        .position(|g| g.address == address)
        .ok_or_else(|| errno(ENODEV))
}

/// `current_vgpu_type` of the VF whose `nvidia/` directory is `dir`.
fn write_vdev(root: &Path, ledger: &mut Ledger, dir: &Path, value: &str) -> io::Result<()> {
    let vf = dir.parent().ok_or_else(|| errno(ENODEV))?;
    let pf = link_name(&vf.join("physfn")).ok_or_else(|| errno(ENODEV))?;
    let i = gpu_index(ledger, &pf)?;
    let want: u32 = value.parse().map_err(|_| errno(EINVAL))?;
    let file = dir.join("current_vgpu_type");
    let current = read_u32(&file)?;
    if want == current {
        return Ok(());
    }
    if want != 0 {
        if current != 0 {
            return Err(errno(EBUSY));
        }
        let text = std::fs::read_to_string(dir.join("creatable_vgpu_types"))?;
        if !vgpu::parse_creatable(&text)
            .iter()
            .any(|(id, _)| *id == want)
        {
            return Err(errno(EINVAL));
        }
    }
    std::fs::write(&file, format!("{want}\n"))?;
    refresh(root, ledger, i)
}

/// `sriov_numvfs` of vdev GPU `address`: 0 disables the VFs (refused while any holds a
/// vGPU), a number up to `sriov_totalvfs` enables that many (refused while others are on).
fn write_numvfs(root: &Path, ledger: &mut Ledger, address: &str, value: &str) -> io::Result<()> {
    let i = gpu_index(ledger, address)?;
    let gpu = ledger.gpus[i].clone();
    let want: u32 = value.parse().map_err(|_| errno(EINVAL))?;
    let pf = gpu.dir(root);
    let current = read_u32(&pf.join("sriov_numvfs"))?;
    if want > gpu.model()?.total_vfs {
        return Err(errno(ERANGE));
    }
    if want == current {
        return Ok(());
    }
    if want == 0 {
        if !gpu.active.is_empty() {
            return Err(errno(EBUSY));
        }
        disable_vfs(root, &gpu)?;
    } else {
        if current != 0 {
            return Err(errno(EBUSY));
        }
        enable_vfs(root, &gpu, want).map_err(io_of)?;
    }
    refresh(root, ledger, i)
}

/// `nvidia/vgpu_params` of an mdev (`dir` is its `nvidia/`): `key=value` pairs separated by
/// commas, or nothing; anything else is `EINVAL`, as NVIDIA's driver answers a malformed
/// list. Which keys the vGPU manager knows is not modelled.
fn write_params(dir: &Path, value: &str) -> io::Result<()> {
    let well_formed = value.is_empty()
        || value.split(',').all(|pair| {
            pair.split_once('=')
                .is_some_and(|(k, v)| !k.trim().is_empty() && !v.trim().is_empty())
        });
    if !well_formed {
        return Err(errno(EINVAL));
    }
    std::fs::write(dir.join("vgpu_params"), format!("{value}\n"))
}

/// `create` of the mdev type directory `dir`.
fn create_mdev(root: &Path, ledger: &mut Ledger, dir: &Path, value: &str) -> io::Result<()> {
    if !vgpu::is_uuid(value) {
        return Err(errno(EINVAL));
    }
    let uuid = value.to_ascii_lowercase();
    let pf = dir
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| errno(ENODEV))?;
    let pcie_root = pf
        .parent()
        .and_then(Path::file_name)
        .ok_or_else(|| errno(ENODEV))?;
    let pcie_root = pcie_root.to_string_lossy().into_owned();
    let address = pf
        .file_name()
        .ok_or_else(|| errno(ENODEV))?
        .to_string_lossy()
        .into_owned();
    let i = gpu_index(ledger, &address)?;
    let type_name = dir
        .file_name()
        .ok_or_else(|| errno(ENODEV))?
        .to_string_lossy()
        .into_owned();
    let type_id: u32 = type_name
        .strip_prefix("nvidia-")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| errno(EINVAL))?;
    let bus_link = root.join("sys/bus/mdev/devices").join(&uuid);
    if bus_link.symlink_metadata().is_ok() {
        return Err(errno(EEXIST));
    }
    let gpu = &ledger.gpus[i];
    let active: Vec<u32> = mdevs_of(pf)?.into_iter().map(|(_, t)| t).collect();
    if let Some(code) = mdev_refusal(&gpu.model()?, gpu.heterogeneous, &active, type_id) {
        return Err(errno(code));
    }
    let group = match ledger.mdev_group_floor {
        Some(floor) => {
            let groups = root.join("sys/kernel/iommu_groups");
            (floor..).find(|g| !groups.join(g.to_string()).exists())
        }
        None => None,
    };
    let dev = pf.join(&uuid);
    let target = format!("../../../devices/{pcie_root}/{address}/{uuid}");
    let made = (|| -> Result<(), SimError> {
        put(&dev.join("remove"), "")?;
        put(&dev.join("nvidia/vgpu_params"), "")?;
        link(
            &format!("../mdev_supported_types/{type_name}"),
            &dev.join("mdev_type"),
        )?;
        link(
            &format!("../../../{uuid}"),
            &dir.join("devices").join(&uuid),
        )?;
        if let Some(group) = group {
            link(
                &format!("../../../../kernel/iommu_groups/{group}"),
                &dev.join("iommu_group"),
            )?;
            link(
                &format!("../{target}"),
                &root.join(format!("sys/kernel/iommu_groups/{group}/devices/{uuid}")),
            )?;
            put(&root.join(format!("dev/vfio/{group}")), "")?;
        }
        link(&target, &bus_link)
    })();
    made.map_err(io_of)?;
    refresh(root, ledger, i)
}

/// `remove` of the mdev whose directory is `dir`: `1` removes it, `0` does nothing.
fn remove_mdev(root: &Path, ledger: &mut Ledger, dir: &Path, value: &str) -> io::Result<()> {
    match value {
        "1" | "y" | "Y" => {}
        "0" | "n" | "N" => return Ok(()),
        _ => return Err(errno(EINVAL)),
    }
    let uuid = dir
        .file_name()
        .ok_or_else(|| errno(ENODEV))?
        .to_string_lossy()
        .into_owned();
    let pf = dir.parent().ok_or_else(|| errno(ENODEV))?;
    let address = pf
        .file_name()
        .ok_or_else(|| errno(ENODEV))?
        .to_string_lossy()
        .into_owned();
    let i = gpu_index(ledger, &address)?;
    if let Some(t) = link_name(&dir.join("mdev_type")) {
        remove_all(
            &pf.join("mdev_supported_types")
                .join(t)
                .join("devices")
                .join(&uuid),
        )?;
    }
    if let Some(group) = link_name(&dir.join("iommu_group")) {
        remove_all(&root.join("sys/kernel/iommu_groups").join(&group))?;
        remove_all(&root.join("dev/vfio").join(&group))?;
    }
    remove_all(&root.join("sys/bus/mdev/devices").join(&uuid))?;
    remove_all(dir)?;
    refresh(root, ledger, i)
}
