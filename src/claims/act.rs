//! The hardware, sharing and CDI steps of one claim's prepare, after its intent is recorded:
//! MIG mode, carving at the allocated placement, sharing, device metadata, the CDI spec.

use super::metadata::{self, MetadataClaim, MetadataDevice};
use super::plan::{Action, PlannedDevice};
use super::{ClaimError, ClaimId, ClaimSource, ClaimsManager, sharing};
use crate::cdi::{self, ClaimDevice, GpuDeviceRef};
use crate::checkpoint::CheckpointStore;
use crate::hardware::MigModeChange;

impl<S: ClaimSource> ClaimsManager<S> {
    /// The hardware, sharing and CDI steps of a prepare whose intent is recorded; returns
    /// the CDI device IDs of each device, for the completion record: its own, and for the
    /// first device of each request, the one that mounts the request's device metadata file
    /// (written from `metadata`, when the manager writes metadata).
    pub(super) fn act(
        &self,
        store: &mut CheckpointStore,
        id: &ClaimId,
        planned: &[PlannedDevice],
        metadata: &[MetadataDevice],
        pod_claim_name: Option<&str>,
    ) -> Result<Vec<Vec<String>>, ClaimError> {
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
                // Moved to vfio-pci below, after every device that uses an NVML index; vGPUs
                // created below with them.
                Action::Vfio { .. } | Action::Vgpu { .. } => {
                    refs.push(None);
                    continue;
                }
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
            refs.push(Some(gpu_ref));
        }
        // vGPUs first: switching a parent's MIG mode uses its NVML index, which a GPU moved
        // to vfio-pci shifts.
        let mut vfio_devices = Vec::new();
        for p in planned {
            if matches!(p.action, Action::Vgpu { .. }) {
                vfio_devices.push(self.vgpu_prepare(id, p)?);
            }
        }
        for p in planned {
            if matches!(p.action, Action::Vfio { .. }) {
                vfio_devices.push(self.vfio_prepare(id, p)?);
            }
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
            .filter_map(|((p, gpu), (env, mounts))| {
                Some(ClaimDevice {
                    device_name: p.allocated.device.clone(),
                    share_id: p.allocated.share_id.clone(),
                    gpu: gpu.clone()?,
                    env,
                    mounts,
                })
            })
            .collect();
        let cdi_err = |detail: String| ClaimError::Cdi {
            claim: claim.clone(),
            detail,
        };
        let mut spec = if devices.is_empty() {
            // VFIO devices and vGPUs only: nothing of the NVIDIA driver goes into a VM's
            // container.
            cdi::Spec {
                cdi_version: String::new(),
                kind: self.naming.kind(),
                annotations: Default::default(),
                devices: Vec::new(),
                container_edits: Default::default(),
            }
        } else {
            let gpu_refs: Vec<GpuDeviceRef> = refs.iter().flatten().cloned().collect();
            let facts = self.host.facts(&gpu_refs).map_err(cdi_err)?;
            cdi::build_claim_spec(&self.naming, &id.uid, &devices, &facts)
                .map_err(|e| cdi_err(crate::errors::error_chain(&e)))?
        };
        spec.devices.extend(vfio_devices);
        let mut ids: Vec<Vec<String>> = Vec::with_capacity(planned.len());
        for p in planned {
            let one = self
                .naming
                .device_id(
                    &id.uid,
                    &p.allocated.device,
                    p.allocated.share_id.as_deref(),
                )
                .map_err(|e| cdi_err(crate::errors::error_chain(&e)))?;
            ids.push(vec![one]);
        }
        if let Some(writer) = self.metadata.as_ref().filter(|_| !metadata.is_empty()) {
            let about = MetadataClaim {
                namespace: &id.namespace,
                name: &id.name,
                uid: &id.uid,
                pod_claim_name,
            };
            let mounts = writer.write(&about, metadata).map_err(|e| {
                cdi_err(format!(
                    "device metadata: {}",
                    crate::errors::error_chain(&e)
                ))
            })?;
            crate::crashpoint::hit("prepare-metadata-written");
            for (request, mount) in mounts {
                let name = format!("{}-metadata-{request}", id.uid);
                cdi::validate_device_name("device metadata device", &name)
                    .map_err(|e| cdi_err(crate::errors::error_chain(&e)))?;
                // The first device of the request carries it, as Kubernetes' own helper does.
                let first = planned
                    .iter()
                    .position(|p| metadata::base_request(&p.allocated.request) == request);
                if let Some(first) = first {
                    ids[first].push(format!("{}={name}", self.naming.kind()));
                }
                spec.devices.push(cdi::Device {
                    name,
                    annotations: Default::default(),
                    container_edits: cdi::ContainerEdits {
                        mounts: vec![mount],
                        ..Default::default()
                    },
                });
            }
        }
        spec.cdi_version = cdi::minimum_version(&spec).to_string();
        self.cdi
            .write_claim_spec(&id.uid, &spec)
            .map_err(|e| cdi_err(crate::errors::error_chain(&e)))?;
        crate::crashpoint::hit("prepare-cdi-written");
        Ok(ids)
    }

    pub(super) fn ensure_mig_mode(
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
