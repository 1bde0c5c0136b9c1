//! What one kubelet call costs on the request path, counted rather than timed.
//!
//! The low-level places that do something costly call [`count`]: [`crate::fsutil`] for every
//! file replaced, removed or fsynced, the checkpoint decoder for every full parse, the CDI
//! writer for every spec written, the simulator for every read of its state file, the claim
//! source and the claim-status writer for every request to the API server. A count lands in
//! a call's tally only when the caller runs inside [`measure`] (a Tokio task-local scope
//! around one call's work), so background tasks — the usage ledger's writer, telemetry, the
//! claim-status worker — never show up in a call's tally. What they do is counted in the
//! process-wide [`background`] tally instead, so the work one claim causes after its call
//! answered is counted too.
//!
//! The plugin exports the tallies as `gpu_dra_request_path_costs_total{operation,cost}` and
//! `gpu_dra_background_costs_total{cost}`, and
//! the test suite asserts them exactly for 1- and 10-claim calls: a change that puts an fsync,
//! a re-read or an extra write on the kubelet's path fails CI naming the cost it added. Counts
//! do not flake on a busy machine the way timings do.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One kind of cost on the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cost {
    /// An `fsync` of a file or a directory.
    Fsync,
    /// A file replaced atomically (temp file and rename): checkpoint, CDI spec, ledger, …
    FileWrite,
    /// A file removed.
    FileRemove,
    /// A CDI spec written (also counted as a [`Cost::FileWrite`]).
    CdiSpecWrite,
    /// The checkpoint file read and fully parsed and verified.
    CheckpointParse,
    /// The simulated hardware's state file read and parsed.
    HardwareStateRead,
    /// A request to the API server (reading a claim).
    ApiRequest,
    /// A directory listed (e.g. the CDI directory scanned for leftovers, a GPU's sysfs
    /// directory read for its virtual functions): its cost grows with what the directory
    /// holds.
    DirectoryList,
    /// The node's hardware inventory read for a kubelet call (every GPU, its MIG state and
    /// health: NVML calls on a real node, a walk of the simulator's state on the simulated
    /// one): to plan, where the model the last call planned with could not be kept, or for
    /// a fresh record of one GPU (a VFIO switch).
    InventoryRead,
    /// A write to a kernel attribute in sysfs (a VFIO driver switch's `driver_override`,
    /// `unbind` and `bind`; a vGPU's `current_vgpu_type`, mdev `create` or `remove`): the
    /// kernel acts on each.
    SysfsWrite,
}

impl Cost {
    /// Every cost, in the order tallies list them.
    pub const ALL: [Cost; 10] = [
        Cost::Fsync,
        Cost::FileWrite,
        Cost::FileRemove,
        Cost::CdiSpecWrite,
        Cost::CheckpointParse,
        Cost::HardwareStateRead,
        Cost::ApiRequest,
        Cost::DirectoryList,
        Cost::InventoryRead,
        Cost::SysfsWrite,
    ];

    /// The `cost` label value.
    pub fn label(self) -> &'static str {
        match self {
            Cost::Fsync => "fsync",
            Cost::FileWrite => "file_write",
            Cost::FileRemove => "file_remove",
            Cost::CdiSpecWrite => "cdi_spec_write",
            Cost::CheckpointParse => "checkpoint_parse",
            Cost::HardwareStateRead => "hardware_state_read",
            Cost::ApiRequest => "api_request",
            Cost::DirectoryList => "directory_list",
            Cost::InventoryRead => "inventory_read",
            Cost::SysfsWrite => "sysfs_write",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Costs counted in one scope, one slot per [`Cost`].
#[derive(Debug, Default)]
pub struct Tally([AtomicU64; Cost::ALL.len()]);

impl Tally {
    /// How many of `cost` were counted.
    pub fn get(&self, cost: Cost) -> u64 {
        self.0[cost.index()].load(Ordering::Relaxed)
    }

    /// Every cost with its count, in [`Cost::ALL`] order.
    pub fn counts(&self) -> [(Cost, u64); Cost::ALL.len()] {
        Cost::ALL.map(|c| (c, self.get(c)))
    }

    /// An empty tally, usable in a `static`.
    pub const fn new() -> Self {
        Tally([const { AtomicU64::new(0) }; Cost::ALL.len()])
    }

    fn add(&self, cost: Cost) {
        self.0[cost.index()].fetch_add(1, Ordering::Relaxed);
    }
}

tokio::task_local! {
    static SCOPE: Arc<Tally>;
}

/// Everything counted outside any [`measure`] scope since the process started.
static BACKGROUND: Tally = Tally::new();

/// Counts one `cost` in the enclosing [`measure`] scope; outside any scope, in the
/// [`background`] tally. Costs one task-local lookup and one relaxed atomic add.
pub fn count(cost: Cost) {
    if SCOPE.try_with(|tally| tally.add(cost)).is_err() {
        BACKGROUND.add(cost);
    }
}

/// The costs counted outside every call's scope since the process started: start-up
/// recovery, the claim-status worker, the usage ledger's writer, telemetry, republishing.
/// Only grows.
pub fn background() -> &'static Tally {
    &BACKGROUND
}

/// Runs `work` and returns its output with every cost it counted while it ran on this task.
///
/// Work that `work` hands to other tasks or blocking threads is not counted: the request
/// path is what the call itself waits on while it runs on its task, which is where the
/// lifecycle does its file and hardware I/O.
pub async fn measure<F: Future>(work: F) -> (F::Output, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let output = SCOPE.scope(Arc::clone(&tally), work).await;
    (output, tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn costs_count_inside_the_scope_only_and_not_in_spawned_tasks() {
        let background_before = background().get(Cost::CheckpointParse);
        count(Cost::Fsync);
        let ((), tally) = measure(async {
            count(Cost::Fsync);
            count(Cost::FileWrite);
            count(Cost::FileWrite);
            tokio::spawn(async { count(Cost::CheckpointParse) })
                .await
                .unwrap();
        })
        .await;
        let got: Vec<(Cost, u64)> = tally.counts().into_iter().filter(|(_, n)| *n > 0).collect();
        assert_eq!(got, [(Cost::Fsync, 1), (Cost::FileWrite, 2)]);
        // The spawned task's parse landed in the background tally (other tests of this
        // process may add theirs, never take any away).
        assert!(background().get(Cost::CheckpointParse) > background_before);
    }

    #[test]
    fn every_cost_has_a_distinct_label_and_slot() {
        let labels: std::collections::BTreeSet<_> = Cost::ALL.iter().map(|c| c.label()).collect();
        let slots: Vec<usize> = Cost::ALL.iter().map(|c| c.index()).collect();
        assert_eq!(
            (labels.len(), slots),
            (Cost::ALL.len(), (0..Cost::ALL.len()).collect::<Vec<_>>())
        );
    }
}
