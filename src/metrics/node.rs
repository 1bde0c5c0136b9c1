//! What the node has and runs, as gauges the plugin overwrites when it learns a new figure:
//! published devices, MIG instances, MPS daemons and prepared claims.

use std::sync::atomic::{AtomicU64, Ordering};

use super::text::{Family, gauge};

/// The node's gauges; each setter replaces one value (no lock).
#[derive(Default)]
pub(super) struct NodeGauges {
    published_devices: AtomicU64,
    mig_instances: AtomicU64,
    mps_daemons: AtomicU64,
    prepared_claims: AtomicU64,
}

impl NodeGauges {
    /// Devices in the ResourceSlices this node publishes.
    pub(super) fn set_published_devices(&self, n: u64) {
        self.published_devices.store(n, Ordering::Relaxed);
    }

    /// MIG devices present on the node's GPUs.
    pub(super) fn set_mig_instances(&self, n: u64) {
        self.mig_instances.store(n, Ordering::Relaxed);
    }

    /// MPS control daemons the plugin runs.
    pub(super) fn set_mps_daemons(&self, n: u64) {
        self.mps_daemons.store(n, Ordering::Relaxed);
    }

    /// Claims prepared on this node.
    pub(super) fn set_prepared_claims(&self, n: u64) {
        self.prepared_claims.store(n, Ordering::Relaxed);
    }

    /// One unlabelled gauge family per figure, in the order the setters above are listed.
    pub(super) fn families(&self) -> [Family; 4] {
        [
            gauge(
                "gpu_dra_published_devices",
                "Devices in this node's ResourceSlices.",
                self.published_devices.load(Ordering::Relaxed) as f64,
            ),
            gauge(
                "gpu_dra_mig_instances",
                "MIG devices present on this node's GPUs.",
                self.mig_instances.load(Ordering::Relaxed) as f64,
            ),
            gauge(
                "gpu_dra_mps_daemons",
                "MPS control daemons run by the plugin.",
                self.mps_daemons.load(Ordering::Relaxed) as f64,
            ),
            gauge(
                "gpu_dra_prepared_claims",
                "Claims prepared on this node.",
                self.prepared_claims.load(Ordering::Relaxed) as f64,
            ),
        ]
    }
}
