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

mod kernel;
mod tree;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub(super) use kernel::kernel_write;
pub(super) use tree::build;

use crate::hardware::catalog::GpuModel;
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
