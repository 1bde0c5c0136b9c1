//! The hardware, sharing and CDI steps of one claim's prepare, after its intent is recorded:
//! MIG mode, carving at the allocated placement, sharing, the CDI spec.

use super::plan::{Action, PlannedDevice};
use super::{ClaimError, ClaimId, ClaimSource, ClaimsManager, sharing};
use crate::cdi::{self, ClaimDevice, GpuDeviceRef};
use crate::checkpoint::CheckpointStore;
use crate::hardware::MigModeChange;

impl<S: ClaimSource> ClaimsManager<S> {
    /// The hardware, sharing and CDI steps of a prepare whose intent is recorded; returns
    /// the CDI device ID of each device, for the completion record.
    pub(super) fn act(
        &self,
        store: &mut CheckpointStore,
        id: &ClaimId,
        planned: &[PlannedDevice],
    ) -> Result<Vec<String>, ClaimError> {
        let claim = id.to_string();
        let mut refs = Vec::with_capacity(planned.len());
        for (i, p) in planned.iter().enumerate() {
            let hw = |step, source| ClaimError::Hardware {
                claim: claim.clone(),
                device: p.allocated.device.clone(),
                step,
                source: Box::new(source),
            };
            let gpu_ref = match &p.action {
                Action::FullGpu {
                    gpu,
                    minor,
                    dynamic,
                } => {
                    if *dynamic {
                        self.ensure_mig_mode(&claim, &p.allocated.device, *gpu, false)?;
                    }
                    GpuDeviceRef::Full {
                        minor: *minor,
                        uuid: p.record.gpu_uuid.clone(),
                    }
                }
                Action::StaticMig {
                    minor,
                    gi,
                    ci,
                    uuid,
                } => GpuDeviceRef::Mig {
                    parent_minor: *minor,
                    parent_uuid: p.record.gpu_uuid.clone(),
                    gi: *gi,
                    ci: *ci,
                    uuid: uuid.clone(),
                },
                Action::CarveMig {
                    gpu,
                    minor,
                    profile_id,
                } => {
                    self.ensure_mig_mode(&claim, &p.allocated.device, *gpu, true)?;
                    let start = p.record.mig.as_ref().map_or(0, |m| m.placement_start);
                    let created = self
                        .backend
                        .create_mig_device(*gpu, *profile_id, start)
                        .map_err(|e| hw("create MIG device", e))?;
                    let uid = id.uid.clone();
                    let made = created.clone();
                    let recorded = self.update(store, &claim, move |cp| {
                        if let Some(m) = cp
                            .claims
                            .get_mut(&uid)
                            .and_then(|c| c.devices.get_mut(i))
                            .and_then(|d| d.mig.as_mut())
                        {
                            m.gi_id = Some(made.gi_id);
                            m.ci_id = Some(made.ci_id);
                            m.uuid = Some(made.uuid.clone());
                        }
                    });
                    if let Err(e) = recorded {
                        let _ = self
                            .backend
                            .destroy_mig_device(*gpu, created.gi_id, created.ci_id);
                        return Err(e);
                    }
                    crate::crashpoint::hit("prepare-mig-device-created");
                    GpuDeviceRef::Mig {
                        parent_minor: *minor,
                        parent_uuid: p.record.gpu_uuid.clone(),
                        gi: created.gi_id,
                        ci: created.ci_id,
                        uuid: created.uuid,
                    }
                }
            };
            refs.push(gpu_ref);
        }
        let current = store.checkpoint().claims.get(&id.uid).cloned();
        let edits = match &current {
            Some(rec) => sharing::apply(self.sharing.as_ref(), &claim, rec)?,
            None => vec![(Vec::new(), Vec::new()); planned.len()],
        };
        let devices: Vec<ClaimDevice> = planned
            .iter()
            .zip(&refs)
            .zip(edits)
            .map(|((p, gpu), (env, mounts))| ClaimDevice {
                device_name: p.allocated.device.clone(),
                share_id: p.allocated.share_id.clone(),
                gpu: gpu.clone(),
                env,
                mounts,
            })
            .collect();
        let cdi_err = |detail: String| ClaimError::Cdi {
            claim: claim.clone(),
            detail,
        };
        let facts = self.host.facts(&refs).map_err(cdi_err)?;
        let spec = cdi::build_claim_spec(&self.naming, &id.uid, &devices, &facts)
            .map_err(|e| cdi_err(crate::errors::error_chain(&e)))?;
        self.cdi
            .write_claim_spec(&id.uid, &spec)
            .map_err(|e| cdi_err(crate::errors::error_chain(&e)))?;
        crate::crashpoint::hit("prepare-cdi-written");
        cdi::device_ids(&self.naming, &id.uid, &devices)
            .map_err(|e| cdi_err(crate::errors::error_chain(&e)))
    }

    fn ensure_mig_mode(
        &self,
        claim: &str,
        device: &str,
        gpu: u32,
        enabled: bool,
    ) -> Result<(), ClaimError> {
        match self.backend.set_mig_mode(gpu, enabled) {
            Ok(MigModeChange::Unchanged | MigModeChange::Applied) => Ok(()),
            Ok(MigModeChange::PendingReset) => Err(ClaimError::NeedsReset {
                claim: claim.to_string(),
                device: device.to_string(),
                gpu,
                wanted: if enabled { "on" } else { "off" },
            }),
            Err(source) => Err(ClaimError::Hardware {
                claim: claim.to_string(),
                device: device.to_string(),
                step: if enabled {
                    "switch MIG mode on"
                } else {
                    "switch MIG mode off"
                },
                source: Box::new(source),
            }),
        }
    }
}
