//! The in-memory checkpoint: what the plugin has promised the kubelet, claim by claim.
//!
//! Kept separate from the on-disk (`v1`) types so the code can evolve without changing the
//! file format by accident; [`Checkpoint::validate`] guards both directions.

use std::collections::BTreeMap;

/// Everything the plugin must remember across restarts of itself (not of the node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Boot ID of the node when these records were made. Hardware state (MIG devices, MPS
    /// daemons) does not survive a reboot, so records of another boot are stale.
    pub node_boot_id: String,
    /// Claims by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
}

/// One claim the plugin is preparing, has prepared or is unpreparing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub phase: ClaimPhase,
    pub devices: Vec<DeviceRecord>,
    /// When the record last changed (seconds since the Unix epoch), for operators.
    pub updated_unix: i64,
    /// The Fabric Manager partition the claim activated (or is activating), on FM nodes.
    pub fabric_partition: Option<u32>,
}

/// Where a claim is in its life on this node. Recorded *before* acting, so after a crash
/// the plugin knows which half-done work to finish or undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimPhase {
    /// Prepare began; hardware may be partly set up.
    PrepareStarted,
    /// Prepare finished; the CDI spec exists and IDs were returned to the kubelet.
    PrepareCompleted,
    /// Unprepare began; hardware may be partly torn down.
    UnprepareStarted,
}

/// One allocated device of a claim and what was set up for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRecord {
    /// The claim requests this device satisfies.
    pub request_names: Vec<String>,
    pub pool: String,
    /// DRA device name, e.g. `gpu-0`.
    pub device: String,
    pub share_id: Option<String>,
    pub cdi_device_ids: Vec<String>,
    /// UUID of the physical GPU (the parent for a MIG device).
    pub gpu_uuid: String,
    /// Set for MIG devices created (or being created) for this claim.
    pub mig: Option<MigRecord>,
    /// Sharing-strategy state, owned and interpreted by the sharing module. `Some(Null)` is
    /// stored as absent.
    pub sharing: Option<serde_json::Value>,
    /// Set for a GPU moved (or being moved) to `vfio-pci` for this claim: recorded before
    /// the switch, so a crash at any step is undone on restart.
    pub vfio: Option<VfioRecord>,
    /// Set for a vGPU created (or being created) for this claim: recorded before the sysfs
    /// write, so a crash at any step is undone on restart.
    pub vgpu: Option<VgpuRecord>,
}

/// A vGPU a claim hands to a VM: where it is, so undoing it deletes exactly that one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuRecord {
    /// Its type ID (`current_vgpu_type`, `nvidia-<id>`).
    pub type_id: u32,
    /// How it is created: a VF's `current_vgpu_type` (vdev) or an mdev.
    pub framework: crate::hardware::vgpu::VgpuFramework,
    /// The parent GPU's PCI address (the physical function), `0000:18:00.0`.
    pub parent: String,
    /// vdev: the virtual function picked for it, `0000:18:00.4`.
    pub vf: Option<String>,
    /// mdev: the UUID picked for it (lower case).
    pub mdev_uuid: Option<String>,
}

/// A GPU a claim hands to a VM: what undoing it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioRecord {
    /// PCI address, `0000:18:00.0`.
    pub address: String,
    /// Persistence mode was on before the switch: turn it on again after the GPU is back on
    /// `nvidia`.
    pub restore_persistence: bool,
}

/// A MIG device carved for a claim: the request (profile and placement) always, the
/// resulting IDs once the hardware reported them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigRecord {
    pub parent_minor: u32,
    pub profile_id: u32,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    pub placement_start: u32,
    pub placement_size: u32,
    pub gi_id: Option<u32>,
    pub ci_id: Option<u32>,
    /// `MIG-…` UUID.
    pub uuid: Option<String>,
}

/// A checkpoint breaks an invariant; names the claim (if any), the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint {location}: {field} {value:?} is invalid: {expected}")]
pub struct InvalidCheckpoint {
    pub location: String,
    pub field: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl Checkpoint {
    /// An empty checkpoint for the given boot.
    pub fn new(node_boot_id: impl Into<String>) -> Self {
        Checkpoint {
            node_boot_id: node_boot_id.into(),
            claims: BTreeMap::new(),
        }
    }

    /// Checks the invariants every stored checkpoint keeps: non-empty boot ID, claims keyed
    /// by their own UID, non-empty identifying fields, CDI IDs of the form `kind=name`, and
    /// MIG placements of positive size.
    ///
    /// # Errors
    /// The first [`InvalidCheckpoint`] found.
    pub fn validate(&self) -> Result<(), InvalidCheckpoint> {
        non_empty(&|| "node".to_string(), "nodeBootId", &self.node_boot_id)?;
        for (key, claim) in &self.claims {
            // Named only when something is wrong: no string per record on every write.
            let location = || format!("claim {key}");
            if key != &claim.uid {
                return Err(invalid(
                    &location,
                    "uid",
                    &claim.uid,
                    "equal to the claim's key",
                ));
            }
            non_empty(&location, "uid", &claim.uid)?;
            non_empty(&location, "namespace", &claim.namespace)?;
            non_empty(&location, "name", &claim.name)?;
            for device in &claim.devices {
                let location = || format!("claim {key} device {}", device.device);
                non_empty(&location, "device", &device.device)?;
                non_empty(&location, "pool", &device.pool)?;
                non_empty(&location, "gpuUuid", &device.gpu_uuid)?;
                for id in &device.cdi_device_ids {
                    if !id
                        .split_once('=')
                        .is_some_and(|(k, n)| k.contains('/') && !n.is_empty())
                    {
                        return Err(invalid(
                            &location,
                            "cdiDeviceIds",
                            id,
                            "<vendor>/<class>=<name>",
                        ));
                    }
                }
                if let Some(vgpu) = &device.vgpu {
                    validate_vgpu(&location, vgpu)?;
                }
                if let Some(mig) = &device.mig {
                    non_empty(&location, "mig.profile", &mig.profile)?;
                    if mig.placement_size == 0 {
                        return Err(invalid(
                            &location,
                            "mig.placementSize",
                            "0",
                            "a positive size",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes the in-memory form equal to what a write and read-back yield.
    pub(crate) fn normalize(&mut self) {
        for claim in self.claims.values_mut() {
            for device in &mut claim.devices {
                if device.sharing == Some(serde_json::Value::Null) {
                    device.sharing = None;
                }
            }
        }
    }
}

/// A vGPU record names the PCI addresses and the instance its framework needs: undo would
/// otherwise not know what to delete.
fn validate_vgpu(
    location: &dyn Fn() -> String,
    vgpu: &VgpuRecord,
) -> Result<(), InvalidCheckpoint> {
    use crate::hardware::vgpu::VgpuFramework;
    non_empty(location, "vgpu.parent", &vgpu.parent)?;
    if vgpu.type_id == 0 {
        return Err(invalid(
            location,
            "vgpu.typeId",
            "0",
            "a vGPU type ID (0 means none)",
        ));
    }
    match vgpu.framework {
        VgpuFramework::Vdev => {
            let vf = vgpu.vf.as_deref().unwrap_or_default();
            non_empty(location, "vgpu.vf", vf)?;
        }
        VgpuFramework::Mdev => {
            let uuid = vgpu.mdev_uuid.as_deref().unwrap_or_default();
            if !crate::hardware::vgpu::is_uuid(uuid) {
                return Err(invalid(
                    location,
                    "vgpu.mdevUuid",
                    uuid,
                    "an mdev UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                ));
            }
        }
    }
    Ok(())
}

fn invalid(
    location: &dyn Fn() -> String,
    field: &'static str,
    value: &str,
    expected: &'static str,
) -> InvalidCheckpoint {
    InvalidCheckpoint {
        location: location(),
        field,
        value: value.to_string(),
        expected,
    }
}

fn non_empty(
    location: &dyn Fn() -> String,
    field: &'static str,
    value: &str,
) -> Result<(), InvalidCheckpoint> {
    if value.is_empty() {
        return Err(invalid(location, field, value, "non-empty"));
    }
    Ok(())
}
