//! Pure decisions of prepare: which hardware action each allocated device needs, and whether
//! the claim may have it at all (this node's pool, a published device, nobody else holding it).

use super::{AllocatedDevice, ClaimAllocation, ClaimError, ClaimId};
use std::collections::BTreeMap;

use crate::checkpoint::{Checkpoint, ClaimRecord, DeviceRecord, MigRecord, VfioRecord, VgpuRecord};
use crate::devices::{DeviceKind, DeviceModel};

/// What prepare must do for one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A whole GPU: nothing to create; MIG mode must be off (switched off on a dynamic GPU that
    /// can toggle it).
    FullGpu {
        /// GPU index.
        gpu: u32,
        /// GPU minor.
        minor: u32,
        /// Whether the GPU publishes dynamic MIG (so prepare may switch MIG mode).
        dynamic: bool,
    },
    /// An existing MIG device: nothing to create.
    StaticMig {
        /// GPU minor.
        minor: u32,
        /// GPU instance id.
        gi: u32,
        /// Compute instance id.
        ci: u32,
        /// MIG device UUID.
        uuid: String,
    },
    /// A MIG device to carve at exactly this placement.
    CarveMig {
        /// GPU index.
        gpu: u32,
        /// GPU minor.
        minor: u32,
        /// Profile driver id.
        profile_id: u32,
    },
    /// A whole GPU for a VM: moved from `nvidia` to `vfio-pci`.
    Vfio {
        /// PCI address, `0000:18:00.0`.
        address: String,
        /// GPU minor ([`crate::devices::UNKNOWN_GPU`] when NVML has not seen the GPU).
        minor: u32,
    },
    /// A vGPU for a VM, created on its parent GPU where the intent record says
    /// ([`super::vgpu`]).
    Vgpu {
        /// The parent GPU's index.
        gpu: u32,
        /// The parent GPU's minor.
        minor: u32,
        /// The parent GPU's PCI address, `0000:18:00.0`.
        parent: String,
        /// The type ID.
        type_id: u32,
        /// How vGPUs are created on the parent.
        framework: crate::hardware::vgpu::VgpuFramework,
        /// MIG mode is on (no instance): switched off first. Set by the checks.
        mig_off: bool,
    },
}

/// One device of the claim with its action and the checkpoint record to write first.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedDevice {
    /// The allocation result.
    pub allocated: AllocatedDevice,
    /// What to do.
    pub action: Action,
    /// The intent record (MIG ids filled in once created).
    pub record: DeviceRecord,
    /// A VFIO device's `VfioDeviceConfig` (defaults when the claim has none); `None` for
    /// other devices. Set when the claim's config is resolved.
    pub vfio_settings: Option<crate::opaque::VfioSettings>,
    /// A vGPU's `VgpuDeviceConfig` (the type it must be, its `vgpu_params`), when a config
    /// applies to it; `None` for other devices.
    pub vgpu_settings: Option<crate::opaque::VgpuSettings>,
}

/// The claims a plan is checked against: the checkpoint's, with the records of the claims
/// planned earlier in the same wave in place of theirs. A view, so planning a wave costs
/// the wave's records, not a copy of every record the node holds.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    checkpoint: &'a Checkpoint,
    wave: &'a BTreeMap<String, ClaimRecord>,
}

impl<'a> Held<'a> {
    /// `checkpoint` as it will be once `wave`'s records (by UID) are written into it.
    pub fn new(checkpoint: &'a Checkpoint, wave: &'a BTreeMap<String, ClaimRecord>) -> Self {
        Self { checkpoint, wave }
    }

    /// Every claim record by UID, each UID once (the wave's record where it has one).
    pub fn claims(self) -> impl Iterator<Item = (&'a String, &'a ClaimRecord)> {
        let wave = self.wave;
        self.checkpoint
            .claims
            .iter()
            .filter(move |(uid, _)| !wave.contains_key(*uid))
            .chain(wave.iter())
    }
}

/// Plans a claim's devices against the node's current model and the other prepared claims.
///
/// Fails when a device is in another pool, is not published here, or is held exclusively by
/// another claim (or, for a full GPU, when another claim holds any device of that GPU).
pub fn plan(
    id: &ClaimId,
    allocation: &ClaimAllocation,
    model: &DeviceModel,
    pool: &str,
    held: Held<'_>,
) -> Result<Vec<PlannedDevice>, ClaimError> {
    if allocation.devices.is_empty() {
        return Err(ClaimError::NoDevices {
            claim: id.to_string(),
        });
    }
    let mut planned = Vec::with_capacity(allocation.devices.len());
    for dev in &allocation.devices {
        if dev.pool != pool {
            return Err(ClaimError::WrongPool {
                claim: id.to_string(),
                device: dev.device.clone(),
                pool: dev.pool.clone(),
                expected: pool.to_string(),
            });
        }
        let published = model
            .device(&dev.device)
            .ok_or_else(|| ClaimError::UnknownDevice {
                claim: id.to_string(),
                device: dev.device.clone(),
            })?;
        if !dev.admin_access {
            let full = matches!(published.kind, DeviceKind::Gpu | DeviceKind::Vfio { .. });
            check_exclusive(id, dev, published.gpu_minor, full, model, held)?;
        }
        // Only a dynamic-MIG GPU's full-GPU device consumes counters.
        let dynamic_gpu = published.device.consumes_counters.is_some();
        let vfio = match &published.kind {
            DeviceKind::Vfio { address } => Some(VfioRecord {
                address: address.clone(),
                restore_persistence: false,
            }),
            _ => None,
        };
        // Where the vGPU goes (VF or mdev UUID) is decided by the checks that follow.
        let vgpu = match &published.kind {
            DeviceKind::Vgpu {
                type_id,
                framework,
                parent_address,
                ..
            } => Some(VgpuRecord {
                type_id: *type_id,
                framework: *framework,
                parent: parent_address.clone(),
                vf: None,
                mdev_uuid: None,
            }),
            _ => None,
        };
        let (action, mig) = match &published.kind {
            DeviceKind::Vgpu {
                type_id,
                framework,
                parent_address,
                ..
            } => (
                Action::Vgpu {
                    gpu: published.gpu_index,
                    minor: published.gpu_minor,
                    parent: parent_address.clone(),
                    type_id: *type_id,
                    framework: *framework,
                    mig_off: false,
                },
                None,
            ),
            DeviceKind::Vfio { address } => (
                Action::Vfio {
                    address: address.clone(),
                    minor: published.gpu_minor,
                },
                None,
            ),
            DeviceKind::Gpu => (
                Action::FullGpu {
                    gpu: published.gpu_index,
                    minor: published.gpu_minor,
                    dynamic: dynamic_gpu,
                },
                None,
            ),
            DeviceKind::MigStatic {
                uuid,
                profile_id,
                profile,
                gi_id,
                ci_id,
                placement,
            } => (
                Action::StaticMig {
                    minor: published.gpu_minor,
                    gi: *gi_id,
                    ci: *ci_id,
                    uuid: uuid.clone(),
                },
                Some(MigRecord {
                    parent_minor: published.gpu_minor,
                    profile_id: *profile_id,
                    profile: profile.clone(),
                    placement_start: placement.start,
                    placement_size: placement.size,
                    gi_id: Some(*gi_id),
                    ci_id: Some(*ci_id),
                    uuid: Some(uuid.clone()),
                }),
            ),
            DeviceKind::MigDynamic { .. }
                if let Some(carved) = dev
                    .share_id
                    .as_ref()
                    .and_then(|_| carved_share(id, &dev.device, held)) =>
            {
                // Another share of this device carved it already: use that instance.
                (
                    Action::StaticMig {
                        minor: published.gpu_minor,
                        gi: carved.gi_id.unwrap_or_default(),
                        ci: carved.ci_id.unwrap_or_default(),
                        uuid: carved.uuid.clone().unwrap_or_default(),
                    },
                    Some(carved),
                )
            }
            DeviceKind::MigDynamic {
                profile_id,
                profile,
                placement,
            } => (
                Action::CarveMig {
                    gpu: published.gpu_index,
                    minor: published.gpu_minor,
                    profile_id: *profile_id,
                },
                Some(MigRecord {
                    parent_minor: published.gpu_minor,
                    profile_id: *profile_id,
                    profile: profile.clone(),
                    placement_start: placement.start,
                    placement_size: placement.size,
                    gi_id: None,
                    ci_id: None,
                    uuid: None,
                }),
            ),
        };
        planned.push(PlannedDevice {
            allocated: dev.clone(),
            action,
            record: DeviceRecord {
                request_names: vec![dev.request.clone()],
                pool: dev.pool.clone(),
                device: dev.device.clone(),
                share_id: dev.share_id.clone(),
                cdi_device_ids: Vec::new(),
                gpu_uuid: published.gpu_uuid.clone(),
                mig,
                sharing: None,
                vfio,
                vgpu,
            },
            vfio_settings: None,
            vgpu_settings: None,
        });
    }
    Ok(planned)
}

/// The MIG instance another claim's share of `device` carved (IDs and UUID known).
fn carved_share(id: &ClaimId, device: &str, held: Held<'_>) -> Option<MigRecord> {
    held.claims()
        .map(|(_, c)| c)
        // Only a completed prepare's instance surely exists: a half-done or half-undone
        // record may name one that was already destroyed.
        .filter(|c| c.uid != id.uid && c.phase == crate::checkpoint::ClaimPhase::PrepareCompleted)
        .flat_map(|c| c.devices.iter())
        .filter(|d| d.device == device && d.share_id.is_some())
        .filter_map(|d| d.mig.clone())
        .find(|m| m.gi_id.is_some() && m.ci_id.is_some() && m.uuid.is_some())
}

fn check_exclusive(
    id: &ClaimId,
    dev: &AllocatedDevice,
    gpu_minor: u32,
    full_gpu: bool,
    model: &DeviceModel,
    held: Held<'_>,
) -> Result<(), ClaimError> {
    for (uid, other) in held.claims() {
        if uid == &id.uid {
            continue;
        }
        for held in &other.devices {
            let same_device = held.device == dev.device;
            let shared = same_device && held.share_id.is_some() && dev.share_id.is_some();
            let published = model.device(&held.device);
            let held_gpu = published
                .map(|d| d.gpu_minor)
                .or(held.mig.as_ref().map(|m| m.parent_minor));
            let held_full = published
                .is_some_and(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::Vfio { .. }));
            let gpu_clash = gpu_minor != crate::devices::UNKNOWN_GPU
                && held_gpu == Some(gpu_minor)
                && (full_gpu || held_full)
                && !same_device;
            if (same_device && !shared) || gpu_clash {
                return Err(ClaimError::DeviceBusy {
                    claim: id.to_string(),
                    device: dev.device.clone(),
                    holder: format!("{}/{} ({})", other.namespace, other.name, other.uid),
                    held: held.device.clone(),
                });
            }
        }
    }
    Ok(())
}
