//! vGPU devices in the claim lifecycle (`--vgpu-types`): the checks made before anything is
//! recorded or touched, the vGPU created on the parent GPU and deleted again, the CDI device
//! a VM's container gets, and vGPUs no claim names.
//!
//! Order of a prepare, each durable step followed by a crash point:
//! 1. checks ([`decide::place`]): the GPU out of MIG (or MIG mode switched off where the GPU
//!    toggles it), nobody holding `/dev/nvidia<minor>`, and sysfs able to create the type now
//!    (VFs enabled, a free VF that lists it, or an mdev instance available); the intent is
//!    then recorded with where the vGPU goes: the VF (vdev) or a UUID (mdev)
//!    (`prepare-intent-recorded`);
//! 2. the sysfs write: the type ID to the VF's `nvidia/current_vgpu_type`
//!    (`vgpu-vdev-written`), or the UUID to the type's `create` (`vgpu-mdev-created`), each
//!    read back (`prepare-vgpu-created`);
//! 3. device metadata and the CDI spec (`prepare-metadata-written`, `prepare-cdi-written`),
//!    then the completion (`prepare-completed`).
//!
//! Undo (unprepare, rollback, start-up recovery) writes `0` to the VF or `1` to the mdev's
//! `remove` (`unprepare-vgpu-deleted`); both are no-ops when the vGPU is not there, so a
//! create interrupted before, during or after its write is undone alike.

mod decide;

use std::sync::Arc;

use super::plan::{Action, PlannedDevice};
use super::{ClaimError, ClaimId, ClaimSource, ClaimsManager, RecoveryReport, plan::Held};
use crate::cdi;
use crate::checkpoint::{Checkpoint, DeviceRecord, VgpuRecord};
use crate::hardware::passthrough::{PciHost, SysfsKernel};
use crate::hardware::vgpu::{GpuVgpuHost, VgpuFramework, VgpuHost};
pub use decide::{HOST_DAEMONS, Parent, Placement, mdev_uuid, orphans, place};

/// The crash points a vGPU claim passes beyond [`crate::crashpoint::POINTS`]' lifecycle
/// points, in the order a prepare and then an unprepare pass them: the host's own between
/// each write and its read-back ([`crate::hardware::vgpu::sysfs::CRASH_POINTS`]), after the
/// read-back, and after the delete.
pub const CRASH_POINTS: &[&str] = &[
    "vgpu-vdev-written",
    "vgpu-mdev-created",
    "prepare-vgpu-created",
    "vgpu-vdev-deleted",
    "vgpu-mdev-removed",
    "unprepare-vgpu-deleted",
];

/// What the claim lifecycle needs for vGPUs (`--vgpu-types`).
#[derive(Debug)]
pub struct VgpuSetup {
    /// The host's vGPU files, the same the backend scans ([`crate::hardware::vgpu::VgpuBackend`]).
    pub host: Arc<VgpuHost>,
    /// The host's processes (`<root>/proc`), for who holds a parent GPU; read only.
    processes: PciHost,
}

impl VgpuSetup {
    /// vGPUs through `host`, whose root and kernel are `kernel`'s.
    pub fn new(host: Arc<VgpuHost>, kernel: Arc<dyn SysfsKernel>) -> VgpuSetup {
        let processes = PciHost::new(host.root().to_path_buf(), kernel);
        VgpuSetup { host, processes }
    }
}

impl<S: ClaimSource> ClaimsManager<S> {
    fn vgpu_setup(&self, claim: &str, device: &str) -> Result<&VgpuSetup, ClaimError> {
        self.vgpu.as_ref().ok_or_else(|| ClaimError::NotPassable {
            claim: claim.to_string(),
            device: device.to_string(),
            reason: "vGPU is off on this node (kubelet-plugin --vgpu-types)".into(),
        })
    }

    /// Checks every vGPU of a planned claim before anything is recorded or touched, and
    /// writes where each goes into its intent record (the VF, or the mdev UUID). `inventory`
    /// is the one the wave planned with; `held` the records of the node and of the claims
    /// planned before this one in the wave, whose VFs are taken even before their vGPUs
    /// exist.
    ///
    /// # Errors
    /// [`ClaimError::NotPassable`] naming the first vGPU that cannot be created and why, with
    /// the fix ([`decide::place`]).
    pub(super) fn vgpu_preflight(
        &self,
        id: &ClaimId,
        inventory: &crate::hardware::NodeInventory,
        held: Held<'_>,
        planned: &mut [PlannedDevice],
    ) -> Result<(), ClaimError> {
        if !planned
            .iter()
            .any(|p| matches!(p.action, Action::Vgpu { .. }))
        {
            return Ok(());
        }
        let claim = id.to_string();
        // Each parent GPU read once per wave, afresh: the wave's inventory may be as old as
        // the last inventory poll.
        let mut parents: std::collections::BTreeMap<String, Option<GpuVgpuHost>> =
            Default::default();
        let mut claimed: Vec<VgpuRecord> = held
            .claims()
            .filter(|(uid, _)| **uid != id.uid)
            .flat_map(|(_, c)| c.devices.iter())
            .filter_map(|d| d.vgpu.clone())
            .collect();
        for p in planned.iter_mut() {
            let Action::Vgpu {
                minor,
                parent,
                type_id,
                framework,
                mig_off,
                ..
            } = &mut p.action
            else {
                continue;
            };
            let device = p.allocated.device.clone();
            let setup = self.vgpu_setup(&claim, &device)?;
            let info = inventory.gpus.iter().find(|g| g.uuid == p.record.gpu_uuid);
            if let Some(settings) = &p.vgpu_settings {
                let name = info
                    .and_then(|g| g.vgpu.as_ref())
                    .and_then(|v| v.supported.iter().find(|t| t.id == *type_id))
                    .map(|t| t.name.clone());
                check_config(settings, *type_id, name.as_deref(), *framework).map_err(
                    |reason| ClaimError::NotPassable {
                        claim: claim.clone(),
                        device: device.clone(),
                        reason,
                    },
                )?;
            }
            let holders = match *minor {
                crate::devices::UNKNOWN_GPU => Vec::new(),
                minor => setup.processes.holders(minor),
            };
            if !parents.contains_key(parent.as_str()) {
                let read = match setup.host.gpu(parent) {
                    Ok(gpu) => Some(gpu),
                    Err(crate::hardware::vgpu::VgpuHostError::NoSuchGpu { .. }) => None,
                    Err(e) => {
                        return Err(ClaimError::NotPassable {
                            claim: claim.clone(),
                            device: device.clone(),
                            reason: format!(
                                "its parent GPU's vGPU files cannot be read: {}",
                                crate::errors::error_chain(&e)
                            ),
                        });
                    }
                };
                parents.insert(parent.clone(), read);
            }
            let host = &parents[parent.as_str()];
            let state = Parent {
                address: parent,
                host: host.as_ref(),
                info,
                mig_toggles: info.is_some_and(|g| {
                    self.model_options.policy_for(g) == crate::hardware::MigPolicy::Dynamic
                        && !g.architecture.mig_toggle_needs_reset()
                }),
                holders: &holders,
            };
            let others: Vec<&VgpuRecord> = claimed.iter().collect();
            let placed = place(&state, *type_id, *framework, &others, || {
                mdev_uuid(&id.uid, &device)
            })
            .map_err(|reason| ClaimError::NotPassable {
                claim: claim.clone(),
                device: device.clone(),
                reason,
            })?;
            *mig_off = placed.mig_off;
            if let Some(record) = p.record.vgpu.as_mut() {
                record.vf = placed.vf;
                record.mdev_uuid = placed.mdev_uuid;
                claimed.push(record.clone());
            }
        }
        Ok(())
    }

    /// Creates the vGPU of a planned device where its intent record says (MIG mode off
    /// first when the checks said so) and returns the CDI device a VM's container needs for
    /// it.
    ///
    /// # Errors
    /// [`ClaimError::Hardware`] when MIG mode cannot be switched off; [`ClaimError::Vgpu`]
    /// when sysfs refuses or does not read back the vGPU; [`ClaimError::Cdi`] for a vGPU
    /// without an IOMMU group or a CDI name out of grammar. The record stays for the
    /// rollback, which deletes whatever was created.
    pub(super) fn vgpu_prepare(
        &self,
        id: &ClaimId,
        p: &PlannedDevice,
    ) -> Result<cdi::Device, ClaimError> {
        let claim = id.to_string();
        let device = &p.allocated.device;
        let (Action::Vgpu { gpu, mig_off, .. }, Some(record)) = (&p.action, &p.record.vgpu) else {
            return Err(ClaimError::NotPassable {
                claim,
                device: device.clone(),
                reason: "not a vGPU device".into(),
            });
        };
        let setup = self.vgpu_setup(&claim, device)?;
        if *mig_off {
            self.ensure_mig_mode(&claim, device, *gpu, false)?;
        }
        let created = match (record.framework, &record.vf, &record.mdev_uuid) {
            (VgpuFramework::Vdev, Some(vf), _) => setup.host.create_vdev(vf, record.type_id),
            (VgpuFramework::Mdev, _, Some(uuid)) => {
                setup.host.create_mdev(&record.parent, record.type_id, uuid)
            }
            _ => {
                return Err(ClaimError::NotPassable {
                    claim,
                    device: device.clone(),
                    reason: "its intent record names no VF or mdev UUID".into(),
                });
            }
        }
        .map_err(|source| ClaimError::Vgpu {
            claim: claim.clone(),
            device: device.clone(),
            step: "create the vGPU",
            source: Box::new(source),
        })?;
        crate::crashpoint::hit("prepare-vgpu-created");
        if let (Some(params), Some(uuid)) = (
            p.vgpu_settings.as_ref().and_then(|v| v.params.as_deref()),
            created.mdev_uuid.as_deref(),
        ) {
            // Before the VM starts: the vGPU manager reads them when the VM opens the vGPU.
            setup
                .host
                .set_mdev_params(uuid, params)
                .map_err(|source| ClaimError::Vgpu {
                    claim: claim.clone(),
                    device: device.clone(),
                    step: "write the vGPU's vgpu_params",
                    source: Box::new(source),
                })?;
        }
        let cdi_err = |detail: String| ClaimError::Cdi {
            claim: claim.clone(),
            detail,
        };
        let Some(group) = created.iommu_group else {
            return Err(cdi_err(format!(
                "vGPU {} of device {device} has no IOMMU group, so a VM cannot get it through VFIO; enable the IOMMU (intel_iommu=on or amd_iommu=on) and reboot",
                created.vf_address.or(created.mdev_uuid).unwrap_or_default()
            )));
        };
        let name = self
            .naming
            .device_name(&id.uid, device, p.allocated.share_id.as_deref())
            .map_err(|e| cdi_err(crate::errors::error_chain(&e)))?;
        vgpu_cdi_device(name, &group, self.host.as_ref(), setup.host.root()).map_err(cdi_err)
    }

    /// Deletes the vGPU of a claim's device record: writes `0` to its VF, or removes its
    /// mdev. A vGPU already gone (a create that never happened, an earlier undo) is success.
    ///
    /// # Errors
    /// [`ClaimError::Vgpu`] when the kernel refuses (a VM still holds it), or
    /// [`ClaimError::NotPassable`] when vGPU is off on this node now; the caller keeps the
    /// record so the next attempt repeats it.
    pub(super) fn vgpu_undo(&self, claim: &str, d: &DeviceRecord) -> Result<(), ClaimError> {
        let Some(record) = &d.vgpu else {
            return Ok(());
        };
        let setup = self.vgpu.as_ref().ok_or_else(|| ClaimError::NotPassable {
            claim: claim.to_string(),
            device: d.device.clone(),
            reason: format!(
                "its vGPU on GPU {} cannot be deleted: vGPU is off on this node now; start the plugin with --vgpu-types again so it deletes it",
                record.parent
            ),
        })?;
        delete(&setup.host, record).map_err(|source| ClaimError::Vgpu {
            claim: claim.to_string(),
            device: d.device.clone(),
            step: "delete the vGPU",
            source: Box::new(source),
        })
    }

    /// Deletes every vGPU on the GPUs this plugin offers vGPU types on that no claim record
    /// names (start-up recovery): a create interrupted before its intent was recorded, a
    /// claim whose record was lost, or a vGPU made behind the plugin's back must not keep a
    /// VF or the GPU's framebuffer from the node.
    pub(super) fn vgpu_orphans(
        &self,
        checkpoint: &Checkpoint,
        report: &mut RecoveryReport,
        failures: &mut Vec<ClaimError>,
    ) {
        let Some(setup) = &self.vgpu else {
            return;
        };
        let startup = "startup recovery";
        let inventory = match self.backend.inventory() {
            Ok(inventory) => inventory,
            Err(source) => {
                failures.push(ClaimError::Inventory {
                    claim: startup.into(),
                    source: Box::new(source),
                });
                return;
            }
        };
        let Some(facts) = &inventory.vgpu_host else {
            return;
        };
        let managed = inventory
            .gpus
            .iter()
            .filter(|g| {
                crate::devices::vgpu_config::types_for(&self.model_options.vgpu_types, g)
                    .is_ok_and(|types| !types.is_empty())
            })
            .map(|g| crate::hardware::passthrough::normalize_address(&g.pci_bus_id))
            .collect();
        let records: Vec<&VgpuRecord> = checkpoint
            .claims
            .values()
            .flat_map(|c| c.devices.iter())
            .filter_map(|d| d.vgpu.as_ref())
            .collect();
        for (parent, instance) in orphans(facts, &managed, &records) {
            let record = VgpuRecord {
                type_id: instance.type_id,
                framework: if instance.vf_address.is_some() {
                    VgpuFramework::Vdev
                } else {
                    VgpuFramework::Mdev
                },
                parent: parent.to_string(),
                vf: instance.vf_address.clone(),
                mdev_uuid: instance.mdev_uuid.clone(),
            };
            let at = instance
                .vf_address
                .clone()
                .or(instance.mdev_uuid.clone())
                .unwrap_or_default();
            match delete(&setup.host, &record) {
                Ok(()) => report
                    .vgpus_deleted
                    .push(format!("{at} (type {}) on GPU {parent}", instance.type_id)),
                Err(e) => failures.push(ClaimError::Vgpu {
                    claim: startup.into(),
                    device: at,
                    step: "delete an orphaned vGPU",
                    source: Box::new(e),
                }),
            }
        }
    }
}

/// Deletes the vGPU `record` names; one that is not there is success.
fn delete(
    host: &VgpuHost,
    record: &VgpuRecord,
) -> Result<(), crate::hardware::vgpu::VgpuHostError> {
    if let Some(vf) = &record.vf {
        host.delete_vdev(vf)?;
    }
    if let Some(uuid) = &record.mdev_uuid {
        host.remove_mdev(uuid)?;
    }
    Ok(())
}

/// The CDI device of a vGPU: its VFIO group node and the VFIO API device `/dev/vfio/vfio`
/// (libvirt opens both; without the API device it fails "Mediated host device assignment
/// requires VFIO support"), and `NVIDIA_VISIBLE_DEVICES=void` so no NVIDIA hook touches the
/// container. Each node is as `host` describes it ([`super::HostFactsSource::vfio_node`]).
///
/// # Errors
/// A node `host` cannot describe (missing on a real host), as text.
pub fn vgpu_cdi_device(
    name: String,
    iommu_group: &str,
    host: &dyn super::HostFactsSource,
    host_root: &std::path::Path,
) -> Result<cdi::Device, String> {
    let device_nodes = [format!("/dev/vfio/{iommu_group}"), "/dev/vfio/vfio".into()]
        .iter()
        .map(|path| host.vfio_node(path, host_root))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(cdi::Device {
        name,
        annotations: Default::default(),
        container_edits: cdi::ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()],
            device_nodes,
            ..Default::default()
        },
    })
}

/// Checks a vGPU's `VgpuDeviceConfig` against the device the scheduler allocated (type
/// `type_id`, named `name` as NVML names it, on a GPU using `framework`): the `profile` and
/// `typeID` it names must be that type's, and `params` need an mdev vGPU.
///
/// # Errors
/// The reason, naming the field, its value and what would be valid.
fn check_config(
    settings: &crate::opaque::VgpuSettings,
    type_id: u32,
    name: Option<&str>,
    framework: VgpuFramework,
) -> Result<(), String> {
    let label = match name {
        Some(name) => format!(
            "{} (typeID {type_id})",
            crate::hardware::vgpu::short_name(name)
        ),
        None => format!("typeID {type_id}"),
    };
    if let Some(profile) = &settings.profile {
        let same = name.is_some_and(|name| {
            let short = crate::hardware::vgpu::short_name(name);
            profile.eq_ignore_ascii_case(short) || profile.eq_ignore_ascii_case(name)
        });
        if !same {
            return Err(format!(
                "VgpuDeviceConfig profile {profile:?} does not match the allocated vGPU, which is {label}; set profile to {} or select the device by its profile attribute in the request",
                name.map_or_else(
                    || format!("the type of ID {type_id}"),
                    |n| format!("{:?}", crate::hardware::vgpu::short_name(n))
                )
            ));
        }
    }
    if let Some(want) = settings.type_id
        && want != type_id
    {
        return Err(format!(
            "VgpuDeviceConfig typeID {want} does not match the allocated vGPU, which is {label}; set typeID to {type_id} or select the device by its typeID attribute in the request"
        ));
    }
    if settings.params.is_some() && framework == VgpuFramework::Vdev {
        return Err(format!(
            "VgpuDeviceConfig params: the allocated vGPU {label} is an SR-IOV (vdev) vGPU, whose vgpu_params this plugin does not write (NVIDIA has not documented when a VF takes them); remove params, or use an mdev GPU"
        ));
    }
    Ok(())
}
