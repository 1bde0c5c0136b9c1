//! Start-up recovery: after a crash, bring the hardware, the checkpoint and the CDI directory
//! back in line before serving the kubelet.

use super::{ClaimError, ClaimSource, ClaimsManager, sharing};
use crate::checkpoint::{CheckpointStore, ClaimPhase};
use crate::hardware::MigPolicy;
use crate::sharing::Ensured;

/// What recovery did, for the start-up log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// How the checkpoint loaded (fresh, loaded, boot changed, corrupt and moved aside).
    pub checkpoint: String,
    /// Claims found half-prepared or half-unprepared and rolled back (the kubelet retries
    /// prepare when it still wants them).
    pub rolled_back: Vec<String>,
    /// MIG devices on dynamic GPUs that no prepared claim owns, destroyed.
    pub orphans_destroyed: Vec<String>,
    /// CDI specs of claims that are not prepared, removed.
    pub stale_specs_removed: Vec<String>,
    /// MPS daemons no prepared claim uses, stopped.
    pub mps_orphans_stopped: Vec<String>,
    /// MPS daemons of prepared claims that had died (with the plugin's pod, say), started again.
    pub mps_restarted: Vec<String>,
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// Reconciles after a (re)start. A corrupt checkpoint is moved aside (never a crash loop);
    /// claims stuck mid-way are rolled back; MIG devices no prepared claim owns are destroyed
    /// on dynamic-MIG GPUs only (static devices belong to the administrator); CDI specs of
    /// claims that are not prepared are removed.
    pub fn recover(&self) -> Result<RecoveryReport, ClaimError> {
        let startup = "startup recovery";
        let (mut store, outcome) =
            CheckpointStore::open(&self.state_dir, &self.boot_id).map_err(|e| {
                ClaimError::Checkpoint {
                    claim: startup.to_string(),
                    source: Box::new(e),
                }
            })?;
        let mut report = RecoveryReport {
            checkpoint: outcome.message(),
            ..Default::default()
        };
        let unfinished: Vec<_> = store
            .checkpoint()
            .claims
            .values()
            .filter(|c| c.phase != ClaimPhase::PrepareCompleted)
            .cloned()
            .collect();
        for rec in unfinished {
            self.roll_back(&mut store, &rec)?;
            report
                .rolled_back
                .push(format!("{}/{} ({})", rec.namespace, rec.name, rec.uid));
        }
        let inventory = self
            .backend
            .inventory()
            .map_err(|source| ClaimError::Inventory {
                claim: startup.to_string(),
                source: Box::new(source),
            })?;
        let owned: Vec<(u32, u32)> = store
            .checkpoint()
            .claims
            .values()
            .flat_map(|c| c.devices.iter())
            .filter_map(|d| d.mig.as_ref())
            .filter_map(|m| m.gi_id.map(|gi| (m.parent_minor, gi)))
            .collect();
        for gpu in &inventory.gpus {
            if self.model_options.policy_for(gpu) != MigPolicy::Dynamic {
                continue;
            }
            let orphans = gpu
                .mig_devices
                .iter()
                .map(|d| (d.gi_id, d.ci_id, d.profile_name.clone(), d.placement.start))
                .chain(gpu.empty_gpu_instances.iter().map(|g| {
                    let name = gpu
                        .profile_by_id(g.profile_id)
                        .map(|p| p.name.clone())
                        .unwrap_or_default();
                    (g.gi_id, 0, name, g.placement.start)
                }))
                .filter(|(gi, ..)| !owned.contains(&(gpu.minor, *gi)));
            for (gi, ci, profile, start) in orphans {
                if let Err(source) = self.destroy_if_present(gpu.index, gi, ci) {
                    return Err(ClaimError::Hardware {
                        claim: startup.to_string(),
                        device: format!("GPU {} GI {gi}", gpu.index),
                        step: "destroy orphaned MIG device",
                        source: Box::new(source),
                    });
                }
                report
                    .orphans_destroyed
                    .push(format!("GPU {} {profile}@{start} (GI {gi})", gpu.index));
            }
        }
        self.reconcile_mps(store.checkpoint(), &mut report, startup)?;
        let specs = self.cdi.list_claim_specs().map_err(|e| ClaimError::Cdi {
            claim: startup.to_string(),
            detail: crate::kubelet::error_chain(&e),
        })?;
        for uid in specs {
            if !store.checkpoint().claims.contains_key(&uid) {
                self.cdi
                    .remove_claim_spec(&uid)
                    .map_err(|e| ClaimError::Cdi {
                        claim: startup.to_string(),
                        detail: crate::kubelet::error_chain(&e),
                    })?;
                report.stale_specs_removed.push(uid);
            }
        }
        Ok(report)
    }
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// Stops MPS daemons no claim in `checkpoint` uses, and makes sure every daemon a
    /// prepared claim uses is running with its limits (restarting dead ones).
    fn reconcile_mps(
        &self,
        checkpoint: &crate::checkpoint::Checkpoint,
        report: &mut RecoveryReport,
        context: &str,
    ) -> Result<(), ClaimError> {
        let Some(setup) = &self.sharing else {
            return Ok(());
        };
        let wanted = sharing::wanted_daemons(checkpoint);
        let sharing_error = |device: &str, step, source| ClaimError::Sharing {
            claim: context.to_string(),
            device: device.to_string(),
            step,
            source: Box::new(source),
        };
        let present = setup
            .mps
            .list()
            .map_err(|e| sharing_error("MPS daemons", "list the MPS daemons", e))?;
        for id in present {
            if !wanted.iter().any(|(_, spec)| spec.id == id) {
                setup
                    .mps
                    .stop(&id, &[])
                    .map_err(|e| sharing_error(&id, "stop an orphaned MPS daemon", e))?;
                report.mps_orphans_stopped.push(id);
            }
        }
        report.mps_restarted = restart_dead(setup, wanted)?;
        Ok(())
    }

    /// One round of MPS supervision: every daemon a prepared claim uses is checked over its
    /// control pipe and restarted (limits re-sent and verified) if it died. Callers hold the
    /// plugin lock, so no prepare or unprepare runs at the same time.
    ///
    /// # Errors
    /// The checkpoint cannot be read, or a daemon could not be restarted.
    pub fn supervise_mps(&self) -> Result<Vec<String>, ClaimError> {
        let context = "MPS supervision";
        let (store, _) = CheckpointStore::open(&self.state_dir, &self.boot_id).map_err(|e| {
            ClaimError::Checkpoint {
                claim: context.to_string(),
                source: Box::new(e),
            }
        })?;
        let mut prepared = store.checkpoint().clone();
        prepared
            .claims
            .retain(|_, c| c.phase == ClaimPhase::PrepareCompleted);
        let Some(setup) = &self.sharing else {
            return Ok(Vec::new());
        };
        restart_dead(setup, sharing::wanted_daemons(&prepared))
    }
}

/// Checks each wanted daemon and restarts the dead ones; returns the ids restarted.
fn restart_dead(
    setup: &sharing::SharingSetup,
    wanted: Vec<(String, crate::sharing::MpsDaemonSpec)>,
) -> Result<Vec<String>, ClaimError> {
    let mut restarted = Vec::new();
    for (claim, spec) in wanted {
        match setup.mps.ensure_running(&spec) {
            Ok(Ensured::Running(_)) => {}
            Ok(Ensured::Restarted(_)) => restarted.push(spec.id.clone()),
            Err(source) => {
                return Err(ClaimError::Sharing {
                    claim,
                    device: spec.id.clone(),
                    step: "restart the MPS control daemon",
                    source: Box::new(source),
                });
            }
        }
    }
    Ok(restarted)
}
