//! The claim lifecycle on the node: prepare and unprepare, crash-safe and idempotent.
//!
//! Prepare reads the claim's allocation (through [`ClaimSource`]), plans each device against
//! the node's current device model ([`plan`]), records the intent in the checkpoint, acts on
//! the hardware (carves a dynamic MIG device at exactly the allocated placement, switches MIG
//! mode where the architecture allows), writes one CDI spec, records completion and returns
//! one CDI device ID per device. Unprepare reverses it. The claims of one kubelet call go
//! through these steps together ([`batch`]): one inventory read, one intent write, one
//! completion write. Every durable step is followed by a [`crate::crashpoint`], and
//! [`ClaimsManager::recover`] brings hardware, checkpoint and CDI directory back in line after
//! a crash.
//!
//! The inventory is read from the hardware on every call (the model derived from it is
//! cached, [`ModelCache`]), and the checkpoint kept in memory is used only while the file is
//! still the version this instance read or wrote last ([`CheckpointCache`]), so two plugin
//! instances (a seamless rolling update), serialised by the kubelet-socket lock, never act on
//! stale state.

mod batch;
mod cache;
mod kind;
pub mod plan;
mod recover;
pub mod sharing;
mod undo;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::cdi::{self, CdiWriter, ClaimDevice, GpuDeviceRef, HostFacts};
use crate::checkpoint::{self, CheckpointStore, ClaimPhase, DeviceRecord};
use crate::devices::{DeviceModel, ModelOptions};
use crate::hardware::{GpuBackend, HardwareError, MigModeChange};
pub use cache::{CheckpointCache, ModelCache};
use plan::{Action, PlannedDevice};
pub use recover::RecoveryReport;

/// The claim the kubelet names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimId {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl fmt::Display for ClaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One allocated device of this driver in this node's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// Request name (`<request>/<subrequest>` for firstAvailable).
    pub request: String,
    /// Pool.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// Admin access: may use a device others hold, never changes it.
    pub admin_access: bool,
    /// Share ID of a consumable-capacity allocation.
    pub share_id: Option<String>,
    /// Capacity the share consumes (name → quantity), for consumable-capacity allocations.
    pub consumed_capacity: std::collections::BTreeMap<String, String>,
}

/// One opaque config entry of this driver.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    /// From the DeviceClass (lower precedence) rather than the claim.
    pub from_class: bool,
    /// Requests it applies to; empty = all.
    pub requests: Vec<String>,
    /// The raw parameters object.
    pub parameters: serde_json::Value,
}

/// What the API server says about a claim, already filtered to this driver and node.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAllocation {
    /// Allocated devices in allocation order.
    pub devices: Vec<AllocatedDevice>,
    /// Opaque config entries (class first, then claim).
    pub config: Vec<ConfigEntry>,
}

/// Where allocations come from (the API server in production, a table in tests).
pub trait ClaimSource: Send + Sync {
    /// Reads the claim and checks its UID; the error text names the claim and the cause.
    fn fetch(&self, id: &ClaimId) -> impl Future<Output = Result<ClaimAllocation, String>> + Send;

    /// The kubelet asked to prepare claim `id` again while it is prepared: typically for
    /// another pod of a shared claim. A source may re-read who the claim is reserved for, but
    /// must not make the call wait for it. Default: nothing.
    fn prepared_again(&self, _id: &ClaimId) {}
}

/// Where CDI edits for devices come from: the real host, or a simulated node's device nodes.
pub trait HostFactsSource: Send + Sync {
    /// Facts for these devices; the error text says what is missing.
    fn facts(&self, gpus: &[GpuDeviceRef]) -> Result<HostFacts, String>;
}

impl HostFactsSource for cdi::HostMode {
    fn facts(&self, gpus: &[GpuDeviceRef]) -> Result<HostFacts, String> {
        cdi::HostMode::facts(self, gpus).map_err(|e| crate::errors::error_chain(&e))
    }
}

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
    fn for_claim(&self, claim: &ClaimId) -> ClaimError {
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

/// Everything prepare/unprepare need.
pub struct ClaimsManager<S> {
    /// The GPUs.
    pub backend: Arc<dyn GpuBackend>,
    /// Allocations.
    pub source: S,
    /// CDI edits for devices.
    pub host: Box<dyn HostFactsSource>,
    /// CDI spec writer.
    pub cdi: CdiWriter,
    /// CDI naming.
    pub naming: cdi::ClaimNaming,
    /// How the node publishes its devices (driver name, MIG policies).
    pub model_options: ModelOptions,
    /// This node's pool name.
    pub pool: String,
    /// Directory of the checkpoint.
    pub state_dir: PathBuf,
    /// Current boot ID.
    pub boot_id: String,
    /// The device model of the last inventory (see [`ModelCache`]).
    pub model_cache: ModelCache,
    /// The checkpoint as last read or written (see [`CheckpointCache`]); start from `Default`.
    pub checkpoint_cache: CheckpointCache,
    /// Time-slicing and MPS; `None`: any claim asking for sharing is refused.
    pub sharing: Option<sharing::SharingSetup>,
    /// Claims prepared (see [`ClaimsManager::prepared_count`]); start from `Default`.
    pub prepared: std::sync::atomic::AtomicU64,
}

/// A prepared device as the kubelet gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// Requests it serves.
    pub request_names: Vec<String>,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// CDI device IDs.
    pub cdi_device_ids: Vec<String>,
    /// Share ID.
    pub share_id: Option<String>,
}

fn prepared(records: &[DeviceRecord]) -> Vec<PreparedDevice> {
    records
        .iter()
        .map(|r| PreparedDevice {
            request_names: r.request_names.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            cdi_device_ids: r.cdi_device_ids.clone(),
            share_id: r.share_id.clone(),
        })
        .collect()
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl<S: ClaimSource> ClaimsManager<S> {
    fn model(&self, claim: &str) -> Result<Arc<DeviceModel>, ClaimError> {
        let inventory = self
            .backend
            .inventory()
            .map_err(|source| ClaimError::Inventory {
                claim: claim.to_string(),
                source: Box::new(source),
            })?;
        Ok(self.model_cache.get(inventory, &self.model_options))
    }

    fn update(
        &self,
        store: &mut CheckpointStore,
        claim: &str,
        change: impl FnOnce(&mut checkpoint::Checkpoint),
    ) -> Result<(), ClaimError> {
        store.update(change).map_err(|e| ClaimError::Checkpoint {
            claim: claim.to_string(),
            source: Box::new(e),
        })?;
        self.count_prepared(store.checkpoint());
        Ok(())
    }

    /// Remembers how many claims `checkpoint` holds prepared, for [`ClaimsManager::prepared_count`].
    pub(crate) fn count_prepared(&self, checkpoint: &checkpoint::Checkpoint) {
        let n = checkpoint
            .claims
            .values()
            .filter(|c| c.phase == ClaimPhase::PrepareCompleted)
            .count();
        self.prepared
            .store(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Claims prepared, as of this instance's last checkpoint write or read at recovery (a
    /// gauge: no file is read to answer).
    pub fn prepared_count(&self) -> u64 {
        self.prepared.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Prepares a claim: returns one entry per device with its CDI device IDs.
    ///
    /// Idempotent: a claim already prepared returns its recorded devices without touching the
    /// hardware. On failure everything this call did is undone and the claim is not recorded.
    /// A call of one claim of [`ClaimsManager::prepare_batch`].
    pub async fn prepare(&self, id: &ClaimId) -> Result<Vec<PreparedDevice>, ClaimError> {
        let mut results = self.prepare_batch(std::slice::from_ref(id)).await;
        results.pop().unwrap_or_else(|| {
            Err(ClaimError::NoDevices {
                claim: id.to_string(),
            })
        })
    }

    /// The hardware, sharing and CDI steps of a prepare whose intent is recorded; returns
    /// the CDI device ID of each device, for the completion record.
    fn act(
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

    /// Unprepares a claim: removes its CDI spec, stops its sharing, destroys the MIG devices
    /// it carved, forgets it. Unknown claims succeed (the kubelet may repeat calls).
    ///
    /// # Errors
    /// When the checkpoint cannot record that the unprepare started, nothing is touched (a
    /// record saying "prepared" must never outlive the devices). After that every step is
    /// tried: [`ClaimError::Undo`] lists all that failed, and the claim stays recorded as
    /// unpreparing until a repeat finishes.
    pub async fn unprepare(&self, id: &ClaimId) -> Result<(), ClaimError> {
        let mut results = self.unprepare_batch(std::slice::from_ref(id)).await;
        results.pop().unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::sim::SimBackend;

    #[test]
    fn the_model_cache_rebuilds_only_for_inventories_it_has_not_seen_recently() {
        let sim = SimBackend::open("dgx-h100", None).unwrap();
        let options = ModelOptions::with_policies("gpu.nvidia.com", &sim.mig_policies());
        let cache = ModelCache::default();
        let without = sim.inventory().unwrap();
        let first = cache.get(without.clone(), &options);
        sim.create_mig_device(0, without.gpus[0].mig_profiles[0].id, 0)
            .unwrap();
        let with = sim.inventory().unwrap();
        let second = cache.get(with.clone(), &options);
        assert!(
            !Arc::ptr_eq(&first, &second),
            "a new inventory, a new model"
        );
        assert!(Arc::ptr_eq(&first, &cache.get(without, &options)));
        assert!(Arc::ptr_eq(&second, &cache.get(with, &options)));
    }
}
