//! The simulated node's vGPU host: the SR-IOV virtual functions and mdev types of its vGPU
//! GPUs in the host tree ([`super::sysfs`]), and the simulated kernel's answers to the
//! writes that create and delete vGPUs, with the errors Linux and NVIDIA's driver give.
//!
//! ```text
//! sys/devices/<root>/<pf>/{sriov_totalvfs,sriov_numvfs,virtfn<N> -> ../<vf>}      (vdev)
//! sys/devices/<root>/<vf>/{physfn -> ../<pf>, iommu_group, driver -> nvidia,
//!                          nvidia/{creatable_vgpu_types,current_vgpu_type,vgpu_params}}
//! sys/devices/<root>/<pf>/mdev_supported_types/nvidia-<id>/{name,description,device_api,
//!                          available_instances,create,devices/}                       (mdev)
//! sys/devices/<root>/<pf>/<uuid>/{mdev_type,iommu_group,remove}
//! sys/bus/mdev/devices/<uuid> -> ../../../devices/<root>/<pf>/<uuid>
//! sys/class/mdev_bus/<pf> -> ../../devices/<root>/<pf>
//! dev/vfio/<group> for every VF and every mdev
//! ```
//!
//! VF `n` of a GPU sits at function `4 + n` of the GPU's bus (`0000:18:00.4` first, as on
//! H100 and L40S). IOMMU groups: the GPUs keep `1..=N`; the VFs of the vGPU GPUs follow in GPU
//! and VF order (fixed, so a VF enabled again gets its group back); mdevs take the lowest free
//! group after those. Without the IOMMU neither gets a group.
//!
//! What the kernel needs beyond the tree (each GPU's model, heterogeneous mode, where its VFs
//! go) and the vGPUs each GPU runs are kept in `<root>/.sim-vgpu.json`, rewritten under
//! `<root>/.sim-vgpu.lock` after every change: the sim backend reads the running types from
//! it for NVML's creatable list, and the simulated NVML library keys its cache on its bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::SimError;
use super::sysfs::{BusGpu, Function, fs_err, lay_out, link, write as put};
use crate::hardware::catalog::GpuModel;
use crate::hardware::passthrough::{NVIDIA_DRIVER, NVIDIA_VENDOR};
use crate::hardware::vgpu::catalog::{self as vcat, ModelVgpu};
use crate::hardware::vgpu::{self, GpuVgpu, VgpuFramework, VgpuType};

/// `vgpu:` of a GPU group in a node file: the host runs NVIDIA's vGPU manager for them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VgpuSpec {
    /// `vdev` (SR-IOV) or `mdev`; default: the model's (H100, A100, L40S vdev; T4 mdev).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<VgpuFramework>,
    /// Heterogeneous mode: types of different sizes may share a GPU (models that support it
    /// only: L40S); default false, one type per GPU.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub heterogeneous: bool,
    /// vdev: the VFs are enabled at power-on (`sriov-manage -e` has run); default true.
    #[serde(default = "yes")]
    pub vfs_enabled: bool,
}

fn yes() -> bool {
    true
}

/// One GPU's vGPU host, resolved against the simulator's vGPU catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedVgpu {
    /// How vGPUs are created on it.
    pub framework: VgpuFramework,
    /// Heterogeneous mode.
    pub heterogeneous: bool,
    /// vdev: VFs enabled at power-on.
    pub vfs_enabled: bool,
    /// The model's vGPU types and limits.
    pub model: ModelVgpu,
}

impl VgpuSpec {
    /// Resolves the section for GPUs of `model`; the error is `(field, what is wrong and the
    /// valid choices)`, the field relative to the group (`vgpu.framework`).
    pub(super) fn plan(&self, model: &GpuModel) -> Result<PlannedVgpu, (&'static str, String)> {
        let Some(vgpu) = vcat::for_product(&model.product_name) else {
            let with: Vec<String> = crate::hardware::catalog::models()
                .map(|all| {
                    all.iter()
                        .filter(|m| vcat::for_product(&m.product_name).is_some())
                        .map(|m| m.key.clone())
                        .collect()
                })
                .unwrap_or_default();
            return Err((
                "vgpu",
                format!(
                    "{} has no vGPU types in the simulator; models with vGPU: {}",
                    model.key,
                    with.join(", ")
                ),
            ));
        };
        let framework = self.framework.unwrap_or(vgpu.framework);
        if framework == VgpuFramework::Vdev && vgpu.total_vfs == 0 {
            return Err((
                "vgpu.framework",
                format!(
                    "{} has no SR-IOV virtual functions; the only valid choice is \"mdev\"",
                    model.key
                ),
            ));
        }
        if self.heterogeneous && !vgpu.heterogeneous_capable {
            return Err((
                "vgpu.heterogeneous",
                format!(
                    "{} does not support heterogeneous vGPU types (one type per GPU); the only valid choice is false",
                    model.key
                ),
            ));
        }
        Ok(PlannedVgpu {
            framework,
            heterogeneous: self.heterogeneous,
            vfs_enabled: self.vfs_enabled,
            model: vgpu,
        })
    }
}

impl PlannedVgpu {
    /// What NVML reports for a GPU running vGPUs of the types `active` (one entry each).
    pub(super) fn info(&self, active: &[u32]) -> GpuVgpu {
        GpuVgpu {
            framework: self.framework,
            heterogeneous: self.heterogeneous,
            supported: self.model.types.clone(),
            creatable: vgpu::creatable(
                &self.model.types,
                self.heterogeneous,
                active,
                self.model.framebuffer_mib,
            ),
        }
    }
}

// ---- pure rules ----

/// `creatable_vgpu_types` as the driver prints it: a header, then `<id>  : <name>`.
fn creatable_text(types: &[VgpuType], ids: &[u32]) -> String {
    let mut text = format!("{:<6}: vGPU Name\n", "ID");
    for t in types.iter().filter(|t| ids.contains(&t.id)) {
        text.push_str(&format!("{:<6}: {}\n", t.id, t.name));
    }
    text
}

/// `available_instances` of every time-sliced type with `active` running: 0 for a type that
/// cannot be created beside them ([`vgpu::creatable`]), else how many more fit by its count
/// and the framebuffer left.
fn available(types: &[VgpuType], heterogeneous: bool, active: &[u32], fb: u64) -> Vec<(u32, u32)> {
    let creatable = vgpu::creatable(types, heterogeneous, active, fb);
    let used: u64 = active
        .iter()
        .filter_map(|id| types.iter().find(|t| t.id == *id))
        .map(|t| t.framebuffer_mib)
        .sum();
    types
        .iter()
        .filter(|t| t.mig_profile.is_none())
        .map(|t| {
            if !creatable.contains(&t.id) {
                return (t.id, 0);
            }
            let count = active.iter().filter(|id| **id == t.id).count() as u64;
            let by_count = u64::from(t.max_instances).saturating_sub(count);
            let by_fb = fb.saturating_sub(used) / t.framebuffer_mib.max(1);
            (t.id, by_count.min(by_fb) as u32)
        })
        .collect()
}

/// Why the kernel refuses one more mdev of `type_id`: `EINVAL` for a type that cannot run
/// beside `active` (or is not the GPU's), `EDQUOT` for one whose instances or framebuffer are
/// used up; `None` when it may be created.
fn mdev_refusal(
    model: &ModelVgpu,
    heterogeneous: bool,
    active: &[u32],
    type_id: u32,
) -> Option<i32> {
    let t = model
        .types
        .iter()
        .find(|t| t.id == type_id && t.mig_profile.is_none());
    let Some(t) = t else {
        return Some(EINVAL);
    };
    let others_ok = active
        .iter()
        .filter_map(|id| model.types.iter().find(|o| o.id == *id))
        .all(|o| vgpu::may_share_gpu(o, t, heterogeneous));
    if !others_ok {
        return Some(EINVAL);
    }
    let left = available(&model.types, heterogeneous, active, model.framebuffer_mib);
    match left.iter().find(|(id, _)| *id == type_id) {
        Some((_, n)) if *n > 0 => None,
        _ => Some(EDQUOT),
    }
}

/// VF `n` of the GPU at `pf` (`0000:18:00.0`): function `4 + n` of its bus.
fn vf_address(pf: &str, n: u32) -> String {
    let bus = pf.rsplit_once(':').map_or(pf, |(bus, _)| bus);
    let devfn = 4 + n;
    format!("{bus}:{:02x}.{}", devfn / 8, devfn % 8)
}

const EINVAL: i32 = 22;
const EBUSY: i32 = 16;
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const ERANGE: i32 = 34;
const EDQUOT: i32 = 122;

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

// ---- the ledger ----

const LEDGER: &str = ".sim-vgpu.json";
const LOCK: &str = ".sim-vgpu.lock";
const LEDGER_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ledger {
    version: u32,
    /// mdevs get the lowest free IOMMU group from here; `None`: the IOMMU is off.
    mdev_group_floor: Option<u32>,
    gpus: Vec<LedgerGpu>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LedgerGpu {
    address: String,
    product: String,
    framework: VgpuFramework,
    heterogeneous: bool,
    pcie_root: String,
    device_id: String,
    numa: i64,
    /// VF `n` is in group `first_vf_group + n`; `None`: the IOMMU is off.
    first_vf_group: Option<u32>,
    /// The type of every vGPU the GPU runs.
    active: Vec<u32>,
}

impl LedgerGpu {
    fn model(&self) -> io::Result<ModelVgpu> {
        vcat::for_product(&self.product).ok_or_else(|| errno(ENODEV))
    }

    fn dir(&self, root: &Path) -> PathBuf {
        root.join("sys/devices")
            .join(&self.pcie_root)
            .join(&self.address)
    }
}

fn read_ledger(root: &Path) -> io::Result<Ledger> {
    let bytes = std::fs::read(root.join(LEDGER))?;
    let ledger: Ledger =
        serde_json::from_slice(&bytes).map_err(|e| io::Error::new(ErrorKind::InvalidData, e))?;
    if ledger.version != LEDGER_VERSION {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            format!(
                "{LEDGER} version {} is not {LEDGER_VERSION}",
                ledger.version
            ),
        ));
    }
    Ok(ledger)
}

fn write_ledger(root: &Path, ledger: &Ledger) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(ledger).map_err(io::Error::other)?;
    bytes.push(b'\n');
    // No fsync: the tree is the simulated node's, rebuilt with its state directory; a
    // killed process must not leave half a file, which the rename ensures.
    crate::fsutil::replace_atomic(&root.join(LEDGER), &bytes, 0o644).map_err(io::Error::other)
}

/// Runs `op` on the ledger under the lock, so two processes' writes never interleave.
fn locked(root: &Path, op: impl FnOnce(&mut Ledger) -> io::Result<()>) -> io::Result<()> {
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(LOCK))?;
    lock.lock()?;
    let mut ledger = read_ledger(root)?;
    op(&mut ledger)
}

/// The type of every vGPU each GPU runs, by GPU address, as the simulated kernel last
/// recorded it; empty without a ledger (no vGPU GPU, or no host tree).
pub(super) fn active_by_gpu(root: &Path) -> BTreeMap<String, Vec<u32>> {
    read_ledger(root)
        .map(|l| l.gpus.into_iter().map(|g| (g.address, g.active)).collect())
        .unwrap_or_default()
}

/// The ledger's bytes: they change with every vGPU created or deleted.
pub(super) fn fingerprint(root: &Path) -> Vec<u8> {
    std::fs::read(root.join(LEDGER)).unwrap_or_default()
}

// ---- building and changing the tree ----

fn io_of(e: SimError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Lays out VFs `0..count` of `gpu` and enables them.
fn enable_vfs(root: &Path, gpu: &LedgerGpu, count: u32) -> Result<(), SimError> {
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
fn disable_vfs(root: &Path, gpu: &LedgerGpu) -> io::Result<()> {
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

fn remove_all(path: &Path) -> io::Result<()> {
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

fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// The VFs of the GPU whose directory is `pf`: `(n, address)` by `n`.
fn vfs_of(pf: &Path) -> io::Result<Vec<(u32, String)>> {
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
fn mdevs_of(pf: &Path) -> io::Result<Vec<(String, u32)>> {
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

fn read_u32(path: &Path) -> io::Result<u32> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|_| errno(EINVAL))
}

/// Reads what GPU `i` runs from the tree, rewrites what it can create (every free VF's
/// `creatable_vgpu_types`, or every mdev type's `available_instances`), and records it.
fn refresh(root: &Path, ledger: &mut Ledger, i: usize) -> io::Result<()> {
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
pub(super) fn build(root: &Path, iommu: bool, gpus: &[BusGpu<'_>]) -> Result<(), SimError> {
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

/// The simulated kernel's answer to a write of `value` to `dir/name` (`dir` resolved), when
/// it is a vGPU attribute: `None` for any other file (and for `sriov_numvfs` of a GPU
/// without vGPU), which the caller handles.
pub(super) fn kernel_write(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn l40s() -> ModelVgpu {
        vcat::for_product("NVIDIA L40S").unwrap()
    }

    #[test]
    fn vfs_follow_the_gpu_from_function_four() {
        let table = [
            ("0000:18:00.0", 0, "0000:18:00.4"),
            ("0000:18:00.0", 3, "0000:18:00.7"),
            ("0000:18:00.0", 4, "0000:18:01.0"),
            ("0000:2a:00.0", 31, "0000:2a:04.3"),
        ];
        for (pf, n, want) in table {
            assert_eq!(vf_address(pf, n), want, "{pf} VF {n}");
        }
    }

    #[test]
    fn available_instances_follow_count_framebuffer_and_homogeneity() {
        let t4 = vcat::for_product("Tesla T4").unwrap();
        let of = |left: Vec<(u32, u32)>, id: u32| left.iter().find(|(i, _)| *i == id).unwrap().1;
        // (heterogeneous, running, type, available)
        let table: &[(bool, &[u32], u32, u32)] = &[
            (false, &[], 232, 4),
            (false, &[232], 232, 3),
            (false, &[232], 233, 0),
            (false, &[234], 234, 0),
            (false, &[230; 15], 230, 1),
        ];
        for (het, running, id, want) in table {
            let left = available(&t4.types, *het, running, t4.framebuffer_mib);
            assert_eq!(of(left, *id), *want, "{id} beside {running:?}");
        }
        // Heterogeneous L40S: 24Q (24 GiB) leaves room for two 12Q, and locks out the B series.
        let m = l40s();
        let left = available(&m.types, true, &[1154], m.framebuffer_mib);
        assert_eq!(of(left.clone(), 1153), 2);
        assert_eq!(of(left.clone(), 1147), 0);
        assert_eq!(of(left, 1155), 0);
    }

    #[test]
    fn an_mdev_the_gpu_cannot_run_is_einval_and_one_it_has_no_room_for_is_edquot() {
        let t4 = vcat::for_product("Tesla T4").unwrap();
        assert_eq!(mdev_refusal(&t4, false, &[], 232), None);
        assert_eq!(mdev_refusal(&t4, false, &[232], 233), Some(EINVAL));
        assert_eq!(mdev_refusal(&t4, false, &[232; 4], 232), Some(EDQUOT));
        assert_eq!(mdev_refusal(&t4, false, &[], 1), Some(EINVAL));
    }

    #[test]
    fn creatable_vgpu_types_reads_back_as_written() {
        let m = l40s();
        let text = creatable_text(&m.types, &[1153, 1154]);
        assert!(
            text.starts_with("ID    : vGPU Name\n1153  : NVIDIA L40S-12Q\n"),
            "{text}"
        );
        let ids: Vec<u32> = vgpu::parse_creatable(&text)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, [1153, 1154]);
    }

    #[test]
    fn a_vgpu_section_on_a_model_without_it_or_asking_too_much_is_refused_naming_the_choices() {
        let model = |key: &str| crate::hardware::catalog::model(key).unwrap();
        let spec = |framework, heterogeneous| VgpuSpec {
            framework,
            heterogeneous,
            vfs_enabled: true,
        };
        let (field, detail) = spec(None, false).plan(model("L4")).unwrap_err();
        assert_eq!(field, "vgpu");
        assert!(
            detail.contains("L4 has no vGPU types") && detail.contains("L40S"),
            "{detail}"
        );
        let (field, detail) = spec(Some(VgpuFramework::Vdev), false)
            .plan(model("T4"))
            .unwrap_err();
        assert_eq!(
            (field, detail.contains("\"mdev\"")),
            ("vgpu.framework", true)
        );
        let (field, _) = spec(None, true).plan(model("H100-SXM5-80GB")).unwrap_err();
        assert_eq!(field, "vgpu.heterogeneous");
        let planned = spec(None, true).plan(model("L40S")).unwrap();
        assert_eq!(planned.framework, VgpuFramework::Vdev);
        assert_eq!(planned.model.total_vfs, 32);
    }
}
