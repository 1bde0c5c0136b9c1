//! [`ClaimError`]: every way a prepare, unprepare or recovery fails, each naming the claim.

use super::{ClaimId, undo};
use crate::checkpoint;
use crate::hardware::HardwareError;

/// Errors of the claim lifecycle; each names the claim.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The allocation could not be read.
    #[error("claim {claim}: {detail}")]
    Fetch {
        /// Claim.
        claim: String,
        /// What the API server (reader) said.
        detail: String,
    },
    /// The claim has no devices of this driver on this node.
    #[error("claim {claim}: the allocation has no devices of this driver on this node")]
    NoDevices {
        /// Claim.
        claim: String,
    },
    /// A device belongs to another pool.
    #[error("claim {claim}: device {device} is in pool {pool}, not this node's pool {expected}")]
    WrongPool {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node's pool.
        expected: String,
    },
    /// The allocated device is not published by this node now.
    #[error(
        "claim {claim}: device {device} is not published by this node (the allocation is stale or the node changed)"
    )]
    UnknownDevice {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
    },
    /// Another claim holds the device (or the whole GPU).
    #[error("claim {claim}: device {device} is not free: claim {holder} holds {held}")]
    DeviceBusy {
        /// Claim.
        claim: String,
        /// Device wanted.
        device: String,
        /// Holder claim.
        holder: String,
        /// Device the holder has.
        held: String,
    },
    /// A hardware step failed.
    #[error("claim {claim}: {step} for device {device}")]
    Hardware {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// Step.
        step: &'static str,
        /// Cause.
        #[source]
        source: Box<HardwareError>,
    },
    /// A VFIO device cannot go to a VM now; nothing was touched. The reason names the cause
    /// and the fix.
    #[error("claim {claim}: device {device} cannot be handed to a VM: {reason}")]
    NotPassable {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// Why, with the fix.
        reason: String,
    },
    /// A vGPU could not be created or deleted in sysfs.
    #[error("claim {claim}: device {device}: {step}")]
    Vgpu {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// Step.
        step: &'static str,
        /// Cause.
        #[source]
        source: Box<crate::hardware::vgpu::VgpuHostError>,
    },
    /// A step of the driver switch of a VFIO device failed.
    #[error("claim {claim}: device {device}: {step}")]
    Passthrough {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// Step.
        step: &'static str,
        /// Cause.
        #[source]
        source: Box<crate::hardware::passthrough::PassthroughError>,
    },
    /// MIG mode cannot change without a GPU reset.
    #[error(
        "claim {claim}: device {device} needs MIG mode {wanted} on GPU {gpu}, which takes effect only after a GPU reset on this architecture"
    )]
    NeedsReset {
        /// Claim.
        claim: String,
        /// Device.
        device: String,
        /// GPU index.
        gpu: u32,
        /// `on` or `off`.
        wanted: &'static str,
    },
    /// Building or writing the CDI spec failed.
    #[error("claim {claim}: CDI spec: {detail}")]
    Cdi {
        /// Claim.
        claim: String,
        /// What went wrong.
        detail: String,
    },
    /// The checkpoint could not be read or written.
    #[error("claim {claim}: checkpoint")]
    Checkpoint {
        /// Claim (or `startup`).
        claim: String,
        /// Cause.
        #[source]
        source: Box<checkpoint::StoreError>,
    },
    /// The claim's sharing config (opaque config or consumable-capacity share) is invalid
    /// or not allowed on this node; nothing was started.
    #[error("claim {claim}: {detail}")]
    Config {
        /// Claim.
        claim: String,
        /// Entry, field, value and valid choices.
        detail: String,
    },
    /// A sharing step (time-slice, MPS daemon) failed.
    #[error("claim {claim}: {step} for {device}")]
    Sharing {
        /// Claim.
        claim: String,
        /// Device or daemon.
        device: String,
        /// Step.
        step: &'static str,
        /// Cause.
        #[source]
        source: Box<crate::sharing::SharingError>,
    },
    /// A Fabric Manager step failed: the claim's GPUs match no partition, the partition is
    /// busy, or FM is unreachable (the source says which, with the fix).
    #[error("claim {claim}: {step}")]
    Fabric {
        /// Claim.
        claim: String,
        /// Step, naming the partition.
        step: String,
        /// Cause.
        #[source]
        source: Box<crate::fabric_manager::FabricError>,
    },
    /// The inventory could not be read.
    #[error("claim {claim}: reading the GPU inventory")]
    Inventory {
        /// Claim.
        claim: String,
        /// Cause.
        #[source]
        source: Box<HardwareError>,
    },
    /// A step done once for every claim of the call (opening the checkpoint, reading the
    /// inventory, the batch's intent or completion write) failed: each claim reports the
    /// same cause, with the kind of the step's own error.
    #[error("claim {claim}: {detail}")]
    Batch {
        /// Claim.
        claim: String,
        /// The step's error kind (`checkpoint`, `inventory`), as [`ClaimError::kind`] gives it.
        kind: &'static str,
        /// The step and its causes.
        detail: String,
    },
    /// Undoing a claim (unprepare, the rollback of a half-done claim, start-up recovery)
    /// tried every step and these failed. The claim's record stays, so the kubelet's next
    /// call, MPS supervision or start-up recovery repeats what is left.
    #[error(
        "claim {claim}: undo incomplete, {} step(s) failed: {}",
        failures.len(),
        undo::list(failures)
    )]
    Undo {
        /// Claim (or the recovery step).
        claim: String,
        /// Every step that failed, in the order tried.
        failures: Vec<ClaimError>,
    },
    /// A prepare failed, and rolling it back left steps undone (repeated as for
    /// [`ClaimError::Undo`]). The message leads with why the prepare failed.
    #[error(
        "{}; rolling back left {} step(s) undone: {}",
        crate::errors::error_chain(cause.as_ref()),
        failures.len(),
        undo::list(failures)
    )]
    RollbackIncomplete {
        /// Why the prepare failed.
        cause: Box<ClaimError>,
        /// Every rollback step that failed, in the order tried.
        failures: Vec<ClaimError>,
    },
}

impl ClaimError {
    /// This error, as a neighbour of the claim that hit it reports it: same cause and kind,
    /// naming `claim`.
    pub(super) fn for_claim(&self, claim: &ClaimId) -> ClaimError {
        let step = match self {
            ClaimError::Checkpoint { .. } => "checkpoint",
            ClaimError::Inventory { .. } => "reading the GPU inventory",
            ClaimError::Batch { detail, .. } => detail,
            _ => "a step of the batch",
        };
        let detail = match std::error::Error::source(self) {
            Some(cause) => format!("{step}: {}", crate::errors::error_chain(cause)),
            None => step.to_string(),
        };
        ClaimError::Batch {
            claim: claim.to_string(),
            kind: self.kind(),
            detail,
        }
    }
}
