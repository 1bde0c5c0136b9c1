//! The pure decisions of a vGPU prepare and of start-up recovery: whether the parent GPU can
//! take one more vGPU of a type now and where it goes (the VF, or the mdev UUID), or the
//! refusal naming the cause and the fix; and which vGPUs on the host no record names.

use std::collections::BTreeSet;

use crate::checkpoint::VgpuRecord;
use crate::hardware::GpuInfo;
use crate::hardware::vgpu::sysfs::{TypeNames, check_mdev, check_vdev};
use crate::hardware::vgpu::{self, GpuVgpuHost, VgpuFramework, VgpuHostFacts, VgpuInstance};

/// Processes that hold every GPU's `/dev/nvidia<minor>` on a vGPU host without using the
/// GPU: the persistence daemon and NVIDIA's vGPU manager (`nvidia-vgpud` at start,
/// `nvidia-vgpu-mgr` for the running vGPUs). A VM holds its vGPU's `/dev/vfio/<group>`, not
/// the parent's node.
pub const HOST_DAEMONS: [&str; 3] = ["nvidia-persistenced", "nvidia-vgpud", "nvidia-vgpu-mgr"];

/// What the node says about a vGPU's parent GPU now.
#[derive(Debug, Clone, Copy)]
pub struct Parent<'a> {
    /// Its PCI address (the physical function), `0000:18:00.0`.
    pub address: &'a str,
    /// What sysfs shows of it: VFs, mdev types, vGPUs; `None` when sysfs has no such GPU.
    pub host: Option<&'a GpuVgpuHost>,
    /// NVML's record of it (MIG state, the types' names); `None` when NVML does not list it.
    pub info: Option<&'a GpuInfo>,
    /// Whether prepare may switch MIG mode off itself (a dynamic-MIG GPU that toggles it
    /// without a reset), as it does for a full GPU.
    pub mig_toggles: bool,
    /// Processes holding its `/dev/nvidia<minor>`, as `<pid> (<command>)`.
    pub holders: &'a [String],
}

/// Where a vGPU goes, and what prepare does before creating it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// vdev: the VF that takes it.
    pub vf: Option<String>,
    /// mdev: the UUID it is created with.
    pub mdev_uuid: Option<String>,
    /// MIG mode is on (with no MIG instance): prepare switches it off first.
    pub mig_off: bool,
}

/// Decides where one more vGPU of `type_id` goes on `parent`, before anything is recorded or
/// touched. `claimed` are the vGPUs other records (and earlier devices of the same claim)
/// place on the node: their VFs are taken even while sysfs shows them free (their create is
/// still to come in this wave), and their types count as running. `mdev_uuid` names a new
/// mdev.
///
/// # Errors
/// The refusal, naming the cause and the fix: the GPU not in sysfs; MIG instances on it, or
/// MIG mode on where prepare cannot switch it off; processes holding it; then what
/// [`check_vdev`] / [`check_mdev`] refuse (VFs not enabled, no free VF, the type not
/// creatable beside what runs, with what runs); a VF without an IOMMU group.
pub fn place(
    parent: &Parent<'_>,
    type_id: u32,
    framework: VgpuFramework,
    claimed: &[&VgpuRecord],
    mdev_uuid: impl FnOnce() -> String,
) -> Result<Placement, String> {
    let address = parent.address;
    let Some(host) = parent.host else {
        return Err(format!(
            "the host's sysfs shows no NVIDIA GPU at {address}; check that the plugin sees the host's /sys (--host-root) and that the GPU is still there (lspci -s {address})"
        ));
    };
    let mut mig_off = false;
    if let Some(gpu) = parent.info {
        let instances: Vec<String> = gpu
            .mig_devices
            .iter()
            .map(|m| format!("{}@{} (GI {})", m.profile_name, m.placement.start, m.gi_id))
            .chain(
                gpu.empty_gpu_instances
                    .iter()
                    .map(|e| format!("GI {} without a compute instance", e.gi_id)),
            )
            .collect();
        if !instances.is_empty() {
            return Err(format!(
                "GPU {address} has MIG instances: {}; a time-sliced vGPU needs the GPU out of MIG mode: unprepare the claims using them, or destroy them (nvidia-smi mig -dci && nvidia-smi mig -dgi)",
                instances.join(", ")
            ));
        }
        if gpu.mig.current {
            if !parent.mig_toggles {
                return Err(format!(
                    "GPU {address} has MIG mode on; a time-sliced vGPU needs it off (nvidia-smi -i {address} -mig 0, and a GPU reset on Ampere)"
                ));
            }
            mig_off = true;
        }
    }
    let holders: Vec<&String> = parent
        .holders
        .iter()
        .filter(|h| !HOST_DAEMONS.iter().any(|d| h.ends_with(&format!("({d})"))))
        .collect();
    if !holders.is_empty() {
        let minor = parent.info.map_or(String::new(), |g| g.minor.to_string());
        return Err(format!(
            "processes hold /dev/nvidia{minor} of GPU {address}: {}; a GPU that runs vGPUs runs no other work: stop them first (common holders: an MPS control daemon, a CUDA container given the whole GPU, nvidia-device-plugin, dcgm-exporter)",
            holders
                .iter()
                .map(|h| h.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let names = parent
        .info
        .and_then(|g| g.vgpu.as_ref())
        .map(|v| TypeNames::from_types(&v.supported))
        .unwrap_or_default();
    let ours: Vec<&VgpuRecord> = claimed
        .iter()
        .copied()
        .filter(|r| r.parent == address)
        .collect();
    let adjusted = with_claimed(host, parent.info, &ours);
    match framework {
        VgpuFramework::Vdev => {
            let vf = check_vdev(&adjusted, type_id, &names)
                .map_err(|e| crate::errors::error_chain(&e))?;
            if vf.iommu_group.is_none() {
                return Err(format!(
                    "virtual function {} of GPU {address} has no IOMMU group, so a VM cannot get it through VFIO; enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line) and reboot",
                    vf.address
                ));
            }
            Ok(Placement {
                vf: Some(vf.address.clone()),
                mdev_uuid: None,
                mig_off,
            })
        }
        VgpuFramework::Mdev => {
            check_mdev(&adjusted, type_id, &names).map_err(|e| crate::errors::error_chain(&e))?;
            Ok(Placement {
                vf: None,
                mdev_uuid: Some(mdev_uuid()),
                mig_off,
            })
        }
    }
}

/// `host` as it will be once the vGPUs of `claimed` (all on this GPU) exist: their VFs hold
/// their types, and, where NVML names the GPU's types, every free VF's creatable list and
/// every mdev type's available count allow only what may run beside them all
/// ([`vgpu::creatable`], the framebuffer left to the kernel's own check).
fn with_claimed(
    host: &GpuVgpuHost,
    info: Option<&GpuInfo>,
    claimed: &[&VgpuRecord],
) -> GpuVgpuHost {
    let mut adjusted = host.clone();
    let mut pending: Vec<u32> = Vec::new();
    for record in claimed {
        let exists = adjusted.instances.iter().any(|i| {
            (record.vf.is_some() && i.vf_address == record.vf)
                || (record.mdev_uuid.is_some() && i.mdev_uuid == record.mdev_uuid)
        });
        if exists {
            continue;
        }
        pending.push(record.type_id);
        if let Some(vf) = adjusted
            .vfs
            .iter_mut()
            .find(|vf| Some(&vf.address) == record.vf.as_ref())
        {
            vf.current_type = record.type_id;
            vf.creatable.clear();
        }
        adjusted.instances.push(VgpuInstance {
            type_id: record.type_id,
            vf_address: record.vf.clone(),
            mdev_uuid: record.mdev_uuid.clone(),
            iommu_group: None,
        });
    }
    if pending.is_empty() {
        return adjusted;
    }
    let allowed: Option<BTreeSet<u32>> = info.and_then(|g| g.vgpu.as_ref()).map(|v| {
        let active: Vec<u32> = adjusted.instances.iter().map(|i| i.type_id).collect();
        vgpu::creatable(&v.supported, v.heterogeneous, &active, u64::MAX)
            .into_iter()
            .collect()
    });
    for vf in adjusted.vfs.iter_mut().filter(|vf| vf.current_type == 0) {
        if let Some(allowed) = &allowed {
            vf.creatable.retain(|id| allowed.contains(id));
        }
    }
    for t in &mut adjusted.mdev_types {
        let queued = pending.iter().filter(|id| **id == t.id).count() as u32;
        t.available = t.available.saturating_sub(queued);
        if allowed.as_ref().is_some_and(|a| !a.contains(&t.id)) {
            t.available = 0;
        }
    }
    adjusted
}

/// The vGPUs on the GPUs at `managed` (PCI addresses of the GPUs this plugin offers vGPUs
/// on) that no record of `records` names, by GPU: a create interrupted before its intent was
/// recorded, a checkpoint lost, or a vGPU made behind the plugin's back. vGPUs on other GPUs
/// are the administrator's and are left alone.
pub fn orphans<'f>(
    facts: &'f VgpuHostFacts,
    managed: &BTreeSet<String>,
    records: &[&VgpuRecord],
) -> Vec<(&'f str, &'f VgpuInstance)> {
    let named = |i: &VgpuInstance| {
        records.iter().any(|r| {
            (i.vf_address.is_some() && r.vf == i.vf_address)
                || (i.mdev_uuid.is_some() && r.mdev_uuid == i.mdev_uuid)
        })
    };
    facts
        .gpus
        .iter()
        .filter(|g| managed.contains(&g.address))
        .flat_map(|g| g.instances.iter().map(move |i| (g.address.as_str(), i)))
        .filter(|(_, i)| !named(i))
        .collect()
}

/// The UUID of the mdev of claim `uid`'s device `device`: a name-based (version 5) UUID of
/// both, so no two claims ever name one mdev, and the same claim's retry after an undo names
/// the one it had.
pub fn mdev_uuid(uid: &str, device: &str) -> String {
    crate::hardware::passthrough::uuid_v5_dns(&format!("{device}.{uid}.vgpu.gpu-dra"))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
