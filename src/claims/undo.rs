//! Undoing a claim — the rollback of a failed or half-done prepare, unprepare, start-up
//! recovery — best effort to the end.
//!
//! A fault that stops one step (a read-only CDI directory, a full disk, a tool that hangs up)
//! must not stop the others: a MIG instance left carved because an unrelated file could not be
//! removed is capacity lost until someone notices. So every step is tried, each failure is
//! collected, and the claim's record is forgotten only when nothing failed; otherwise it stays
//! and the next call, MPS supervision or start-up recovery repeats the steps (each tolerates
//! work already done: a file already gone counts as removed, a MIG device already destroyed as
//! destroyed).

use super::PlanningModel;
use super::{ClaimError, ClaimId, ClaimSource, ClaimsManager, sharing};
use crate::checkpoint::{Checkpoint, CheckpointStore, ClaimRecord};
use crate::devices;
use crate::hardware::{HardwareError, NvmlCode};

/// The failures of an undo, numbered, each with its causes.
pub(super) fn list(failures: &[ClaimError]) -> String {
    failures
        .iter()
        .enumerate()
        .map(|(i, e)| format!("({}) {}", i + 1, crate::errors::error_chain(e)))
        .collect::<Vec<_>>()
        .join("; ")
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// Destroys a MIG device; one already gone (an earlier, interrupted cleanup) is success.
    pub(super) fn destroy_if_present(
        &self,
        index: u32,
        gi: u32,
        ci: u32,
    ) -> Result<(), HardwareError> {
        match self.backend.destroy_mig_device(index, gi, ci) {
            Err(HardwareError::Nvml {
                code: NvmlCode::NotFound,
                ..
            }) => Ok(()),
            other => other,
        }
    }

    /// Rolls back the prepare that failed with `cause` and returns the error the kubelet
    /// gets: `cause` itself when the rollback finished, else
    /// [`ClaimError::RollbackIncomplete`] naming `cause` and every step that failed.
    pub(super) fn fail_prepare(
        &self,
        store: &mut CheckpointStore,
        id: &ClaimId,
        cause: ClaimError,
    ) -> ClaimError {
        let Some(rec) = store.checkpoint().claims.get(&id.uid).cloned() else {
            return cause;
        };
        match self.roll_back(store, &rec) {
            Ok(()) => cause,
            Err(ClaimError::Undo { failures, .. }) => ClaimError::RollbackIncomplete {
                cause: Box::new(cause),
                failures,
            },
            Err(other) => ClaimError::RollbackIncomplete {
                cause: Box::new(cause),
                failures: vec![other],
            },
        }
    }

    /// Undoes whatever of `rec` exists — CDI spec, sharing (MPS daemons, time-slices), carved
    /// MIG devices — and then forgets the record. Every step is tried whatever the others did.
    ///
    /// # Errors
    /// [`ClaimError::Undo`] listing every failed step; the record then stays in the
    /// checkpoint (in the phase it had), so a repeat finishes the work.
    pub(super) fn roll_back(
        &self,
        store: &mut CheckpointStore,
        rec: &ClaimRecord,
    ) -> Result<(), ClaimError> {
        let claim = format!("{}/{} ({})", rec.namespace, rec.name, rec.uid);
        let mut failures = self.undo_steps(rec, store.checkpoint(), &claim, None);
        if failures.is_empty() {
            let uid = rec.uid.clone();
            if let Err(e) = self.update(store, &claim, |cp| {
                cp.claims.remove(&uid);
            }) {
                failures.push(e);
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ClaimError::Undo { claim, failures })
        }
    }

    /// The effects of `rec` undone (CDI spec, sharing, carved MIG devices), its record kept
    /// for the caller to forget (a batch forgets all its claims in one write); `others` is
    /// the checkpoint whose other claims may still share its devices; `planned`, the
    /// inventory and model the call read before undoing anything (an unprepare batch reads
    /// them once for all its claims), else they are read for this claim.
    ///
    /// # Errors
    /// [`ClaimError::Undo`] listing every failed step; every step was tried.
    pub(super) fn undo(
        &self,
        rec: &ClaimRecord,
        others: &Checkpoint,
        planned: Option<&PlanningModel>,
    ) -> Result<(), ClaimError> {
        let claim = format!("{}/{} ({})", rec.namespace, rec.name, rec.uid);
        let failures = self.undo_steps(rec, others, &claim, planned);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ClaimError::Undo { claim, failures })
        }
    }

    /// Tries every undo step of `rec` and returns the ones that failed.
    fn undo_steps(
        &self,
        rec: &ClaimRecord,
        others: &Checkpoint,
        claim: &str,
        planned: Option<&PlanningModel>,
    ) -> Vec<ClaimError> {
        let mut failures = Vec::new();
        if let Err(e) = self.cdi.remove_claim_spec(&rec.uid) {
            failures.push(ClaimError::Cdi {
                claim: claim.to_string(),
                detail: format!("removing the spec: {}", crate::errors::error_chain(&e)),
            });
        }
        if let Err(e) = self.remove_metadata(claim, &rec.uid, Some(rec)) {
            failures.push(e);
        }
        crate::crashpoint::hit("unprepare-cdi-removed");
        failures.extend(sharing::undo(self.sharing.as_ref(), claim, rec, others));
        self.destroy_carved(others, rec, claim, planned, &mut failures);
        crate::crashpoint::hit("unprepare-mig-destroyed");
        for d in rec.devices.iter().filter(|d| d.vfio.is_some()) {
            if let Err(e) = self.vfio_undo(claim, d) {
                failures.push(e);
            }
        }
        if rec.devices.iter().any(|d| d.vgpu.is_some()) {
            for d in &rec.devices {
                if let Err(e) = self.vgpu_undo(claim, d) {
                    failures.push(e);
                }
            }
            crate::crashpoint::hit("unprepare-vgpu-deleted");
        }
        failures.extend(self.release_fabric(rec, others, claim));
        failures
    }

    /// Destroys the MIG devices `rec` carved, except those another claim still holds (a
    /// consumable-capacity share: the last claim out destroys it) and existing (static) ones.
    /// A device whose GI id now belongs to an instance with another UUID was destroyed
    /// earlier and the id reused: it is left alone. That is judged on `planned` when given
    /// (read before this call undid anything: nothing an undo does creates an instance, so
    /// an instance it lists as this claim's still is), else on an inventory read now.
    fn destroy_carved(
        &self,
        others: &Checkpoint,
        rec: &ClaimRecord,
        claim: &str,
        planned: Option<&PlanningModel>,
        failures: &mut Vec<ClaimError>,
    ) {
        if !rec
            .devices
            .iter()
            .any(|d| d.mig.as_ref().is_some_and(|m| m.gi_id.is_some()))
        {
            return;
        }
        // The kubelet call's inventory: MIG devices as they are now (the reuse check below
        // reads them), the rest kept from the last full read where the backend can.
        let (inventory, model) = match planned
            .cloned()
            .map_or_else(|| self.planning_model(claim), Ok)
        {
            Ok(found) => found,
            Err(e) => {
                failures.push(e);
                return;
            }
        };
        let gpus = &inventory.gpus;
        let held_by_others: std::collections::BTreeSet<&str> = others
            .claims
            .values()
            .filter(|c| c.uid != rec.uid)
            .flat_map(|c| c.devices.iter().map(|d| d.device.as_str()))
            .collect();
        for d in &rec.devices {
            let Some(mig) = &d.mig else { continue };
            if matches!(
                model.device(&d.device).map(|p| &p.kind),
                Some(devices::DeviceKind::MigStatic { .. })
            ) || held_by_others.contains(d.device.as_str())
            {
                continue;
            }
            let Some(gpu) = gpus.iter().find(|g| g.minor == mig.parent_minor) else {
                continue; // the GPU is gone, and its instances with it
            };
            let (Some(gi), Some(ci)) = (mig.gi_id, mig.ci_id) else {
                continue;
            };
            let reused = mig.uuid.as_ref().is_some_and(|uuid| {
                gpu.mig_devices
                    .iter()
                    .any(|m| m.gi_id == gi && &m.uuid != uuid)
            });
            if reused {
                continue;
            }
            if let Err(source) = self.destroy_if_present(gpu.index, gi, ci) {
                failures.push(ClaimError::Hardware {
                    claim: claim.to_string(),
                    device: d.device.clone(),
                    step: "destroy MIG device",
                    source: Box::new(source),
                });
            }
        }
    }
}
