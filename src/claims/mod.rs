//! The claim lifecycle on the node: prepare and unprepare, crash-safe and idempotent.
//!
//! Prepare reads the claim's allocation (through [`ClaimSource`]), plans each device against
//! the node's current device model ([`plan`]), records the intent in the checkpoint, acts on
//! the hardware (carves a dynamic MIG device at exactly the allocated placement, switches MIG
//! mode where the architecture allows), writes one CDI spec, records completion and returns
//! one CDI device ID per device. Unprepare reverses it. The claims of one kubelet call go
//! through these steps together (`batch`): one inventory read, one intent write, one
//! completion write. Every durable step is followed by a [`crate::crashpoint`], and
//! [`ClaimsManager::recover`] brings hardware, checkpoint and CDI directory back in line after
//! a crash.
//!
//! The inventory is read from the hardware on every call (the model derived from it is
//! cached, [`ModelCache`]), and the checkpoint kept in memory is used only while the file is
//! still the version this instance read or wrote last ([`CheckpointCache`]), so two plugin
//! instances (a seamless rolling update), serialised by the kubelet-socket lock, never act on
//! stale state.

mod act;
mod batch;
mod cache;
mod error;
pub mod fabric;
mod inputs;
mod kind;
pub mod metadata;
pub mod plan;
mod recover;
pub mod sharing;
mod undo;
pub mod vfio;
pub mod vgpu;

use std::path::PathBuf;
use std::sync::Arc;

use crate::cdi::{self, CdiWriter};
use crate::checkpoint::{self, CheckpointStore, ClaimPhase, DeviceRecord};
use crate::devices::{DeviceModel, ModelOptions};
use crate::hardware::GpuBackend;
pub use batch::{FETCH_CONCURRENCY, join_bounded};
pub use cache::{CheckpointCache, ModelCache};
pub use error::ClaimError;
pub use inputs::{
    AllocatedDevice, ClaimAllocation, ClaimId, ClaimSource, ConfigEntry, HostFactsSource,
};
pub use recover::RecoveryReport;

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
    /// Device metadata files (KEP-5304) for every prepared claim; `None`: none written.
    pub metadata: Option<metadata::MetadataWriter>,
    /// The host's PCI bus for VFIO passthrough; `None`: passthrough is off and a VFIO device
    /// is refused.
    pub pci: Option<Arc<crate::hardware::passthrough::PciHost>>,
    /// Fabric Manager partitions (`--fabric-manager`); `None`: no partition is activated.
    pub fabric: Option<fabric::FabricPartitions>,
    /// The host's vGPUs (`--vgpu-types`); `None`: vGPU is off and a vGPU device is refused.
    pub vgpu: Option<vgpu::VgpuSetup>,
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

/// The inventory a call plans with and its device model
/// ([`ClaimsManager::planning_model`]).
pub(crate) type PlanningModel = (Arc<crate::hardware::NodeInventory>, Arc<DeviceModel>);

/// What one prepare wave plans with: one inventory read, its device model, and the GPUs' PCI
/// bus IDs by UUID (filled only when device metadata is written).
struct WaveModel {
    model: Arc<DeviceModel>,
    buses: std::collections::BTreeMap<String, String>,
    inventory: Arc<crate::hardware::NodeInventory>,
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// The model a prepare wave plans with ([`ClaimsManager::planning_model`]), with each
    /// GPU's PCI bus ID by UUID (for device metadata), and the inventory it was built from
    /// (VFIO's checks read it: one inventory per wave).
    fn model_and_buses(&self, claim: &str) -> Result<WaveModel, ClaimError> {
        let (inventory, model) = self.planning_model(claim)?;
        // Only device metadata reads the bus IDs.
        let buses = match &self.metadata {
            Some(_) => inventory
                .gpus
                .iter()
                .map(|g| (g.uuid.clone(), g.pci_bus_id.clone()))
                .collect(),
            None => Default::default(),
        };
        Ok(WaveModel {
            model,
            buses,
            inventory,
        })
    }

    /// Builds the device model of `inventory` (read under `stamp`) ahead of the kubelet
    /// calls that will plan with it: the plugin's last read before it serves, so its first
    /// call does not build the model (nor, when the backend stamps its inventory, read it).
    pub fn remember_inventory(
        &self,
        inventory: crate::hardware::NodeInventory,
        stamp: Option<crate::hardware::InventoryStamp>,
    ) {
        self.model_cache
            .get_read_under(inventory, &self.model_options, stamp);
    }

    /// The inventory a kubelet call plans with ([`crate::hardware::GpuBackend::request_inventory`])
    /// and its device model: kept from an earlier call while the backend's stamp of its
    /// inventory is unchanged, else read (counted as [`crate::cost::Cost::InventoryRead`])
    /// and looked up in the model cache.
    ///
    /// Fails with [`ClaimError::Inventory`] naming `claim` when the read fails.
    pub(super) fn planning_model(&self, claim: &str) -> Result<PlanningModel, ClaimError> {
        let stamp = self.backend.inventory_stamp();
        if let Some(kept) = stamp.as_ref().and_then(|s| self.model_cache.get_stamped(s)) {
            return Ok(kept);
        }
        crate::cost::count(crate::cost::Cost::InventoryRead);
        let inventory =
            self.backend
                .request_inventory()
                .map_err(|source| ClaimError::Inventory {
                    claim: claim.to_string(),
                    source: Box::new(source),
                })?;
        Ok(self
            .model_cache
            .get_read_under(inventory, &self.model_options, stamp))
    }

    /// Removes claim `uid`'s device metadata files, if any are written: those of the requests
    /// `record` names (one `unlink` each), or, without a record, whatever the directory holds
    /// for `uid`.
    fn remove_metadata(
        &self,
        claim: &str,
        uid: &str,
        record: Option<&checkpoint::ClaimRecord>,
    ) -> Result<(), ClaimError> {
        let Some(writer) = &self.metadata else {
            return Ok(());
        };
        let removed = match record {
            Some(rec) => writer.remove(
                uid,
                rec.devices
                    .iter()
                    .flat_map(|d| d.request_names.iter().map(String::as_str)),
            ),
            None => writer.remove_all(uid),
        };
        removed.map(|_| ()).map_err(|e| ClaimError::Cdi {
            claim: claim.to_string(),
            detail: format!("device metadata: {}", crate::errors::error_chain(&e)),
        })
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
        let get = |inventory| cache.get_read_under(inventory, &options, None).1;
        let without = sim.inventory().unwrap();
        let first = get(without.clone());
        sim.create_mig_device(0, without.gpus[0].mig_profiles[0].id, 0)
            .unwrap();
        let with = sim.inventory().unwrap();
        let second = get(with.clone());
        assert!(
            !Arc::ptr_eq(&first, &second),
            "a new inventory, a new model"
        );
        assert!(Arc::ptr_eq(&first, &get(without)));
        assert!(Arc::ptr_eq(&second, &get(with)));
    }
}
