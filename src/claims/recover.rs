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
    /// MPS steps that failed (daemon and error); the supervisor retries the restarts.
    pub mps_failed: Vec<String>,
    /// Undo steps of unfinished claims that failed again in a supervision round (each with
    /// its causes); the next round retries them.
    pub undo_failed: Vec<String>,
    /// GPUs found on `vfio-pci` (or on no driver) that no claim holds, given back to
    /// `nvidia`, by PCI address.
    pub vfio_reclaimed: Vec<String>,
    /// vGPUs no claim names on the GPUs that offer vGPU types, deleted: the VF or mdev
    /// UUID, the type and the GPU.
    pub vgpus_deleted: Vec<String>,
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// Reconciles after a (re)start. A corrupt checkpoint is moved aside (never a crash loop);
    /// claims stuck mid-way are rolled back; MIG devices no prepared claim owns are destroyed
    /// on dynamic-MIG GPUs only (static devices belong to the administrator); CDI specs of
    /// claims that are not prepared are removed; MPS daemons are reconciled.
    ///
    /// Best effort to the end: a step that fails does not stop the others.
    ///
    /// # Errors
    /// [`ClaimError::Checkpoint`] when the checkpoint cannot be opened (nothing else is
    /// tried: without it nothing is known to be orphaned); otherwise [`ClaimError::Undo`]
    /// listing every rollback, MIG destruction and spec removal that failed, after all were
    /// tried. MPS failures are not errors: they are in the report and supervision retries.
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
        let mut failures = Vec::new();
        report.rolled_back = self.finish_unfinished(&mut store, &mut failures);
        self.vfio_orphans(store.checkpoint(), &mut report, &mut failures);
        self.vgpu_orphans(store.checkpoint(), &mut report, &mut failures);
        self.destroy_orphans(&store, &mut report, &mut failures);
        if let Err(e) = self.cdi.remove_interrupted_writes() {
            failures.push(ClaimError::Cdi {
                claim: startup.to_string(),
                detail: crate::errors::error_chain(&e),
            });
        }
        match self.cdi.list_claim_specs() {
            Ok(specs) => {
                for uid in specs {
                    if store.checkpoint().claims.contains_key(&uid) {
                        continue;
                    }
                    match self.cdi.remove_claim_spec(&uid) {
                        Ok(_) => report.stale_specs_removed.push(uid),
                        Err(e) => failures.push(ClaimError::Cdi {
                            claim: startup.to_string(),
                            detail: format!(
                                "removing the stale spec of claim {uid}: {}",
                                crate::errors::error_chain(&e)
                            ),
                        }),
                    }
                }
            }
            Err(e) => failures.push(ClaimError::Cdi {
                claim: startup.to_string(),
                detail: crate::errors::error_chain(&e),
            }),
        }
        if let Some(writer) = &self.metadata {
            match writer.files() {
                Ok(files) => {
                    for (uid, request) in files {
                        if store.checkpoint().claims.contains_key(&uid) {
                            continue;
                        }
                        if let Err(e) = writer.remove(&uid, [request.as_str()]) {
                            failures.push(ClaimError::Cdi {
                                claim: startup.to_string(),
                                detail: format!(
                                    "device metadata: {}",
                                    crate::errors::error_chain(&e)
                                ),
                            });
                        }
                    }
                }
                Err(e) => failures.push(ClaimError::Cdi {
                    claim: startup.to_string(),
                    detail: format!("device metadata: {}", crate::errors::error_chain(&e)),
                }),
            }
        }
        self.count_prepared(store.checkpoint());
        // Never fatal: one daemon that cannot start must not keep the plugin (and every other
        // claim) down; it is reported and the supervisor keeps trying.
        self.reconcile_mps(store.checkpoint(), &mut report);
        // The first call after start takes this store from memory, rather than listing the
        // state directory and parsing the checkpoint again on the kubelet's request path.
        self.check_in(store);
        if failures.is_empty() {
            Ok(report)
        } else {
            Err(ClaimError::Undo {
                claim: startup.to_string(),
                failures,
            })
        }
    }

    /// Rolls back every claim not fully prepared (left by a crash, or by an undo that failed
    /// part-way); returns the claims finished, adds the failures of the others.
    fn finish_unfinished(
        &self,
        store: &mut CheckpointStore,
        failures: &mut Vec<ClaimError>,
    ) -> Vec<String> {
        let unfinished: Vec<_> = store
            .checkpoint()
            .claims
            .values()
            .filter(|c| c.phase != ClaimPhase::PrepareCompleted)
            .cloned()
            .collect();
        let mut finished = Vec::new();
        for rec in unfinished {
            match self.roll_back(store, &rec) {
                Ok(()) => finished.push(format!("{}/{} ({})", rec.namespace, rec.name, rec.uid)),
                Err(e) => failures.push(e),
            }
        }
        finished
    }

    /// Destroys the MIG devices of dynamic-MIG GPUs that no claim record owns.
    fn destroy_orphans(
        &self,
        store: &CheckpointStore,
        report: &mut RecoveryReport,
        failures: &mut Vec<ClaimError>,
    ) {
        let startup = "startup recovery";
        let inventory = match self.backend.inventory() {
            Ok(inventory) => inventory,
            Err(source) => {
                failures.push(ClaimError::Inventory {
                    claim: startup.to_string(),
                    source: Box::new(source),
                });
                return;
            }
        };
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
                match self.destroy_if_present(gpu.index, gi, ci) {
                    Ok(()) => report
                        .orphans_destroyed
                        .push(format!("GPU {} {profile}@{start} (GI {gi})", gpu.index)),
                    Err(source) => failures.push(ClaimError::Hardware {
                        claim: startup.to_string(),
                        device: format!("GPU {} GI {gi}", gpu.index),
                        step: "destroy orphaned MIG device",
                        source: Box::new(source),
                    }),
                }
            }
        }
    }
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// Stops MPS daemons no claim in `checkpoint` uses, and makes sure every daemon a
    /// prepared claim uses is running with its limits (restarting dead ones). Failures are
    /// collected in the report, not returned.
    fn reconcile_mps(
        &self,
        checkpoint: &crate::checkpoint::Checkpoint,
        report: &mut RecoveryReport,
    ) {
        let Some(setup) = &self.sharing else {
            return;
        };
        report.mps_orphans_stopped = stop_orphans(setup, checkpoint, &mut report.mps_failed);
        // Only prepared claims with shared devices can want a daemon: copying those alone,
        // not the whole checkpoint every round.
        let prepared = crate::checkpoint::Checkpoint {
            node_boot_id: checkpoint.node_boot_id.clone(),
            claims: checkpoint
                .claims
                .iter()
                .filter(|(_, c)| {
                    c.phase == ClaimPhase::PrepareCompleted
                        && c.devices.iter().any(|d| d.sharing.is_some())
                })
                .map(|(uid, c)| (uid.clone(), c.clone()))
                .collect(),
        };
        report.mps_restarted = restart_dead(setup, &prepared, &mut report.mps_failed);
    }

    /// One round of supervision: claims whose undo failed part-way (a full or read-only
    /// disk, a tool that failed) are rolled back again; every daemon a prepared claim uses is
    /// checked over its control pipe and restarted (limits re-sent and verified) if it died;
    /// daemons no claim record uses are stopped. Callers hold the plugin lock, so no prepare
    /// or unprepare runs at the same time and any unfinished record is a leftover.
    ///
    /// # Errors
    /// Only when the checkpoint cannot be read; per-claim and per-daemon failures are in the
    /// report.
    pub fn supervise_mps(&self) -> Result<RecoveryReport, ClaimError> {
        // The calls' checkpoint, kept between them: one `stat` instead of a parse of the
        // whole file every round while nothing changed it.
        let mut store = self.check_out("MPS supervision")?;
        let mut report = RecoveryReport::default();
        let mut failures = Vec::new();
        report.rolled_back = self.finish_unfinished(&mut store, &mut failures);
        report.undo_failed = failures
            .iter()
            .map(|e| crate::errors::error_chain(e))
            .collect();
        self.reconcile_mps(store.checkpoint(), &mut report);
        self.check_in(store);
        Ok(report)
    }
}

/// Stops daemons on disk that no claim record (in any phase) uses. When a record cannot be
/// read, nothing is stopped: its daemons are unknown and may be in use.
fn stop_orphans(
    setup: &sharing::SharingSetup,
    checkpoint: &crate::checkpoint::Checkpoint,
    failed: &mut Vec<String>,
) -> Vec<String> {
    let wanted = match sharing::wanted_daemons(checkpoint) {
        Ok(wanted) => wanted,
        Err(e) => {
            failed.push(format!("orphaned MPS daemons not checked: {e}"));
            return Vec::new();
        }
    };
    let present = match setup.mps.list() {
        Ok(present) => present,
        Err(e) => {
            failed.push(format!(
                "listing MPS daemons: {}",
                crate::errors::error_chain(&e)
            ));
            return Vec::new();
        }
    };
    let mut stopped = Vec::new();
    for id in present {
        if wanted.iter().any(|(_, spec)| spec.id == id) {
            continue;
        }
        match setup.mps.stop(&id, &[]) {
            Ok(()) => stopped.push(id),
            Err(e) => failed.push(format!(
                "stopping orphaned MPS daemon {id}: {}",
                crate::errors::error_chain(&e)
            )),
        }
    }
    stopped
}

/// Checks each daemon the prepared claims use and restarts the dead ones; returns the ids
/// restarted. A daemon that cannot be restarted is reported and the others still checked.
fn restart_dead(
    setup: &sharing::SharingSetup,
    prepared: &crate::checkpoint::Checkpoint,
    failed: &mut Vec<String>,
) -> Vec<String> {
    let wanted = match sharing::wanted_daemons(prepared) {
        Ok(wanted) => wanted,
        Err(e) => {
            failed.push(format!("MPS daemons not checked: {e}"));
            return Vec::new();
        }
    };
    let mut restarted = Vec::new();
    for (claim, spec) in wanted {
        match setup.mps.ensure_running(&spec) {
            Ok(Ensured::Running(_)) => {}
            Ok(Ensured::Restarted(_)) => restarted.push(spec.id.clone()),
            Err(e) => failed.push(format!(
                "MPS daemon {} of claim {claim}: {}",
                spec.id,
                crate::errors::error_chain(&e)
            )),
        }
    }
    restarted
}
