//! Start-up recovery: after a crash, bring the hardware, the checkpoint and the CDI directory
//! back in line before serving the kubelet.

use super::{ClaimError, ClaimSource, ClaimsManager};
use crate::checkpoint::{CheckpointStore, ClaimPhase};
use crate::hardware::MigPolicy;

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
