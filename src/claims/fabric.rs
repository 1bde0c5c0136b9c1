//! Fabric Manager partitions in the claim lifecycle (FM nodes only, `--fabric-manager`).
//!
//! Prepare: the GPUs of a claim's devices that carry `gpuModuleID` (full GPUs; VFIO devices
//! once they carry it), admin-access devices aside, must be exactly one partition's, else the claim is refused at planning,
//! before anything is recorded or touched. The partition goes into the claim's intent record,
//! then FM activates it (skipped when it is active already), then the usual steps run.
//! Undo (unprepare, rollback, start-up recovery): the partition is deactivated unless another
//! recorded claim holds it too (a refcount from the checkpoint) or FM has it inactive already,
//! so every interrupted step converges.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::plan::PlannedDevice;
use super::{ClaimError, ClaimId, ClaimSource, ClaimsManager};
use crate::checkpoint::{Checkpoint, ClaimRecord};
use crate::devices::{DeviceKind, DeviceModel};
use crate::fabric_manager::partitions::MODULE_ATTRIBUTE;
use crate::fabric_manager::{FabricError, FmClient, PartitionTable, partition_for};

/// FM as the claim lifecycle uses it: the client and the partition list read at start.
#[derive(Debug, Clone)]
pub struct FabricPartitions {
    /// Runs `fmpm`.
    pub client: FmClient,
    /// FM's partitions as listed at start (IDs and GPU sets are fixed by the baseboard).
    pub table: Arc<PartitionTable>,
}

/// The module IDs of the claim's devices that take part in FM partitioning: every
/// published device carrying `gpuModuleID` (full GPUs, and VFIO devices when they carry it).
/// MIG devices do not take part.
///
/// # Errors
/// [`FabricError::NoModule`] for a full-GPU device without `gpuModuleID` (its GPU is not on
/// FM's fabric, so no partition can hold it).
pub fn claim_modules<'a>(
    devices: impl IntoIterator<Item = &'a str>,
    model: &DeviceModel,
) -> Result<BTreeSet<u32>, FabricError> {
    let mut modules = BTreeSet::new();
    for name in devices {
        let Some(published) = model.device(name) else {
            continue; // planning already refused an unknown device
        };
        let module = published
            .device
            .attributes
            .as_ref()
            .and_then(|a| a.get(MODULE_ATTRIBUTE))
            .and_then(|a| a.int);
        match (module, &published.kind) {
            (Some(m), _) => {
                modules.insert(m as u32);
            }
            (None, DeviceKind::Gpu) => {
                return Err(FabricError::NoModule {
                    device: name.to_string(),
                });
            }
            (None, _) => {}
        }
    }
    Ok(modules)
}

/// How many claims of `checkpoint` other than `uid` hold `partition`.
pub fn holders(partition: u32, checkpoint: &Checkpoint, uid: &str) -> usize {
    checkpoint
        .claims
        .values()
        .filter(|c| c.uid != uid && c.fabric_partition == Some(partition))
        .count()
}

fn fabric_error(claim: &str, step: String, source: FabricError) -> ClaimError {
    ClaimError::Fabric {
        claim: claim.to_string(),
        step,
        source: Box::new(source),
    }
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// The partition the planned claim must activate: `None` on a node without FM or for a
    /// claim without FM GPUs.
    ///
    /// # Errors
    /// [`ClaimError::Fabric`] with [`FabricError::Mismatch`] (the partitions that would fit
    /// and the fix) or [`FabricError::NoModule`].
    pub(super) fn fabric_partition(
        &self,
        id: &ClaimId,
        planned: &[PlannedDevice],
        model: &DeviceModel,
    ) -> Result<Option<u32>, ClaimError> {
        let Some(fm) = &self.fabric else {
            return Ok(None);
        };
        let claim = id.to_string();
        let step = || "matching the claim's GPUs to a Fabric Manager partition".to_string();
        // Admin access watches GPUs (monitoring) without holding them: it must not activate
        // or hold a partition the GPUs' tenant needs.
        let devices = planned
            .iter()
            .filter(|p| !p.allocated.admin_access)
            .map(|p| p.allocated.device.as_str());
        let modules = claim_modules(devices, model).map_err(|e| fabric_error(&claim, step(), e))?;
        if modules.is_empty() {
            return Ok(None);
        }
        partition_for(&modules, &fm.table)
            .map(Some)
            .map_err(|e| fabric_error(&claim, step(), e))
    }

    /// Activates the partition recorded in the claim's intent (success when FM has it
    /// active already).
    ///
    /// # Errors
    /// [`ClaimError::Fabric`]: partition busy, FM unreachable, or another FM failure.
    pub(super) fn activate_fabric(
        &self,
        id: &ClaimId,
        partition: Option<u32>,
    ) -> Result<(), ClaimError> {
        let (Some(fm), Some(partition)) = (&self.fabric, partition) else {
            return Ok(());
        };
        let claim = id.to_string();
        let step = || format!("activating Fabric Manager partition {partition}");
        // One fmpm call in the common case; FM's "in use" answer is checked against its list,
        // so a partition active already (a retry after a crash) counts as activated.
        match fm.client.activate(partition) {
            Ok(()) => {
                crate::crashpoint::hit("prepare-fabric-activated");
                Ok(())
            }
            Err(e @ FabricError::Failed { code, .. })
                if code == crate::fabric_manager::codes::IN_USE =>
            {
                match fm.client.list() {
                    Ok(listed) if listed.get(partition).is_some_and(|p| p.is_active) => Ok(()),
                    _ => Err(fabric_error(&claim, step(), e)),
                }
            }
            Err(e) => Err(fabric_error(&claim, step(), e)),
        }
    }

    /// After [`ClaimsManager::activate_fabric`] failed with `error`: when FM surely did not
    /// activate the partition (unreachable, `fmpm` missing, partition busy), the claim's
    /// intent forgets it, so the rollback does not need FM (which may be unreachable) to
    /// undo what never happened. A failure that may have activated it (a timeout, another
    /// FM error) keeps it recorded, and the rollback deactivates it.
    pub(super) fn activation_failed(
        &self,
        store: &mut crate::checkpoint::CheckpointStore,
        id: &ClaimId,
        error: &ClaimError,
    ) {
        let surely_inactive = matches!(
            error,
            ClaimError::Fabric { source, .. } if matches!(
                source.as_ref(),
                FabricError::Unreachable { .. }
                    | FabricError::ToolNotFound { .. }
                    | FabricError::PartitionBusy { .. }
            )
        );
        if !surely_inactive {
            return;
        }
        let uid = id.uid.clone();
        // Best effort: if this write fails, the rollback still tries FM.
        let _ = self.update(store, &id.to_string(), |cp| {
            if let Some(c) = cp.claims.get_mut(&uid) {
                c.fabric_partition = None;
            }
        });
    }

    /// Deactivates `rec`'s partition unless a claim of `others` other than `rec` holds it
    /// (success too when FM has it inactive already); the failure, if any.
    pub(super) fn release_fabric(
        &self,
        rec: &ClaimRecord,
        others: &Checkpoint,
        claim: &str,
    ) -> Option<ClaimError> {
        let partition = rec.fabric_partition?;
        // A plugin restarted without --fabric-manager cannot deactivate it; refusing the
        // unprepare for that would hold the GPUs forever. The partition stays active for the
        // operator (docs/fabric-manager.md: `fmpm -d`).
        let fm = self.fabric.as_ref()?;
        if holders(partition, others, &rec.uid) > 0 {
            return None;
        }
        let step = || format!("deactivating Fabric Manager partition {partition}");
        // One fmpm call in the common case; a refusal is checked against FM's list, so a
        // partition inactive already (an undo repeated after a crash) counts as deactivated.
        match fm.client.deactivate(partition) {
            Ok(()) => {
                crate::crashpoint::hit("unprepare-fabric-deactivated");
                None
            }
            Err(e @ FabricError::Failed { .. }) => match fm.client.list() {
                Ok(listed) if !listed.get(partition).is_some_and(|p| p.is_active) => None,
                _ => Some(fabric_error(claim, step(), e)),
            },
            Err(e) => Some(fabric_error(claim, step(), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::ClaimPhase;

    fn record(uid: &str, partition: Option<u32>) -> ClaimRecord {
        ClaimRecord {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            phase: ClaimPhase::PrepareCompleted,
            devices: Vec::new(),
            updated_unix: 0,
            fabric_partition: partition,
        }
    }

    #[test]
    fn a_partition_is_held_while_any_other_recorded_claim_names_it() {
        let mut cp = Checkpoint::new("boot");
        for (uid, p) in [("a", Some(3)), ("b", Some(3)), ("c", Some(4)), ("d", None)] {
            cp.claims.insert(uid.into(), record(uid, p));
        }
        assert_eq!(
            [
                holders(3, &cp, "a"),
                holders(3, &cp, "b"),
                holders(4, &cp, "c"),
                holders(3, &cp, "x")
            ],
            [1, 1, 0, 2]
        );
        cp.claims.remove("b");
        assert_eq!(holders(3, &cp, "a"), 0, "the last holder out releases it");
    }

    #[test]
    fn only_devices_carrying_a_module_id_take_part_and_a_full_gpu_without_one_is_refused() {
        use crate::hardware::GpuBackend;
        let sim = crate::hardware::sim::SimBackend::open("hgx-h100-fm", None).unwrap();
        let inventory = sim.inventory().unwrap();
        let table = PartitionTable::new(crate::fabric_manager::partitions::hgx_8gpu_table(
            &[],
            &BTreeSet::new(),
        ))
        .unwrap();
        let mut options =
            crate::devices::ModelOptions::with_policies("gpu.nvidia.com", &sim.mig_policies());
        options.fabric_partitions = Some(Arc::new(table));
        let model = crate::devices::build(&inventory, &options);
        let got = claim_modules(["gpu-0", "gpu-2"], &model).unwrap();
        assert_eq!(got, BTreeSet::from([1, 3]));
        options.fabric_partitions = None;
        let plain = crate::devices::build(&inventory, &options);
        let err = claim_modules(["gpu-0"], &plain).unwrap_err();
        assert!(matches!(err, FabricError::NoModule { .. }), "{err}");
    }
}
