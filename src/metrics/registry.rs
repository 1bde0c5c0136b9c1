//! The driver's metrics: the [`Metrics`] handle, one `Arc` over each concern's state
//! (claim calls, node gauges, GPU health, usage, claim-status writes, per-device telemetry).
//! Each concern's module keeps its values (atomics, or a short lock) and builds its own
//! families; the handle delegates the setters and concatenates the families for a scrape.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::calls::{ClaimCalls, Operation, Outcome};
use super::claim_status::ClaimStatusWrites;
use super::gpu_health::GpuHealth;
use super::lifecycle::{Orphans, Recovery};
use super::node::NodeGauges;
use super::request_path::RequestPathCosts;
use super::telemetry::{self, LastSample};
use super::text::{self, Family, Kind, Sample};
use super::usage::ClaimDeviceSeconds;

#[derive(Default)]
struct Inner {
    calls: ClaimCalls,
    node: NodeGauges,
    health: GpuHealth,
    usage: ClaimDeviceSeconds,
    claim_status_writes: ClaimStatusWrites,
    request_path: RequestPathCosts,
    orphans: Orphans,
    recovery: Recovery,
    device_telemetry: LastSample,
}

/// The driver's metrics. Cheap to clone (one `Arc`); every clone updates the same values.
/// Recording never fails and never waits on I/O.
#[derive(Clone, Default)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// All counters at zero, all gauges at zero.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Counts one claim's call and its latency.
    pub fn record_call(&self, op: Operation, outcome: Outcome, elapsed: Duration) {
        self.0.calls.record_call(op, outcome, elapsed);
    }

    /// Counts one failure of kind `kind` (e.g. [`crate::claims::ClaimError::kind`]).
    pub fn record_error(&self, kind: &'static str) {
        self.0.calls.record_error(kind);
    }

    /// Calls of `op` that ended with `outcome` so far.
    pub fn requests(&self, op: Operation, outcome: Outcome) -> u64 {
        self.0.calls.requests(op, outcome)
    }

    /// Failures of kind `kind` so far.
    pub fn errors(&self, kind: &str) -> u64 {
        self.0.calls.errors(kind)
    }

    /// Devices in the ResourceSlices this node publishes.
    pub fn set_published_devices(&self, n: u64) {
        self.0.node.set_published_devices(n);
    }

    /// MIG devices present on the node's GPUs (whoever created them).
    pub fn set_mig_instances(&self, n: u64) {
        self.0.node.set_mig_instances(n);
    }

    /// MPS control daemons the plugin runs.
    pub fn set_mps_daemons(&self, n: u64) {
        self.0.node.set_mps_daemons(n);
    }

    /// Claims prepared on this node (completed in the checkpoint).
    pub fn set_prepared_claims(&self, n: u64) {
        self.0.node.set_prepared_claims(n);
    }

    /// GPUs by health as the backend reports it.
    pub fn set_gpu_health(&self, healthy: u64, unhealthy: u64) {
        self.0.health.set_gpu_health(healthy, unhealthy);
    }

    /// GPUs per health-policy state (`healthy`, `degraded`, `failed`) and devices carrying a
    /// health taint per effect (`NoSchedule`, `NoExecute`, `None`).
    pub fn set_health_gauges(
        &self,
        gpus_by_state: BTreeMap<&'static str, u64>,
        tainted_by_effect: BTreeMap<String, u64>,
    ) {
        self.0
            .health
            .set_health_gauges(gpus_by_state, tainted_by_effect);
    }

    /// Counts one change of a GPU's (or MIG instance's) health state.
    pub fn record_health_transition(&self, from: &'static str, to: &'static str) {
        self.0.health.record_transition(from, to);
    }

    /// Health transitions from `from` to `to` so far.
    pub fn health_transitions(&self, from: &str, to: &str) -> u64 {
        self.0.health.transitions(from, to)
    }

    /// Replaces the samples of `gpu_dra_claim_device_seconds_total`: device-seconds held
    /// by claims per label set (`namespace`, `class`, `profile`, `sharing`). The caller keeps
    /// each series non-decreasing.
    pub fn set_claim_device_seconds(&self, series: Vec<(Vec<(&'static str, String)>, f64)>) {
        self.0.usage.set(series);
    }

    /// Replaces the per-device telemetry (`gpu_dra_device_*`) with the last sample's
    /// readings; the families are built here, once per sample, not per scrape.
    pub fn set_device_telemetry(&self, rows: &[telemetry::DeviceReadings]) {
        self.0.device_telemetry.set(rows);
    }

    /// Counts one try to write a claim's `status.devices`: `Success` when written, `Error`
    /// when the try failed (it may be retried).
    pub fn record_claim_status_write(&self, outcome: Outcome) {
        self.0.claim_status_writes.record(outcome);
    }

    /// Tries to write a claim's `status.devices` that ended with `outcome` so far.
    pub fn claim_status_writes(&self, outcome: Outcome) -> u64 {
        self.0.claim_status_writes.count(outcome)
    }

    /// Adds what one handler call of `op` cost on the request path ([`crate::cost`]).
    pub fn record_request_path(&self, op: Operation, tally: &crate::cost::Tally) {
        self.0.request_path.record(op, tally);
    }

    /// Adds request-path costs of `op` done outside a handler call (reading claims ahead of
    /// the plugin lock) without counting a call.
    pub fn add_request_path_costs(&self, op: Operation, tally: &crate::cost::Tally) {
        self.0.request_path.add(op, tally);
    }

    /// `cost` counted over every handler call of `op` so far.
    pub fn request_path_cost(&self, op: Operation, cost: crate::cost::Cost) -> u64 {
        self.0.request_path.cost(op, cost)
    }

    /// Counts one orphaned claim unprepared by the plugin for `reason` (one of
    /// [`super::ORPHAN_REASONS`]; another is not counted).
    pub fn record_orphan_reclaimed(&self, reason: &str) {
        self.0.orphans.record(reason);
    }

    /// Orphaned claims reclaimed for `reason` so far.
    pub fn orphans_reclaimed(&self, reason: &str) -> u64 {
        self.0.orphans.count(reason)
    }

    /// Undo steps an unfinished start-up recovery still has to do (0: converged).
    pub fn set_recovery_pending(&self, steps: u64) {
        self.0.recovery.set_pending(steps);
    }

    /// Counts one retry of an unfinished start-up recovery.
    pub fn record_recovery_retry(&self) {
        self.0.recovery.record_retry();
    }

    /// `(pending steps, retries)` of start-up recovery.
    pub fn recovery(&self) -> (u64, u64) {
        self.0.recovery.get()
    }

    /// Every family with its current samples.
    pub fn families(&self) -> Vec<Family> {
        let mut families = self.other_families();
        match self.0.device_telemetry.get() {
            Some(device) => families.extend(device.built().families.iter().cloned()),
            None => families.extend(telemetry::families(&[])),
        }
        families
    }

    /// Every family but the per-device telemetry.
    fn other_families(&self) -> Vec<Family> {
        let inner = &self.0;
        let mut families = inner.calls.families();
        families.extend(inner.node.families());
        families.extend(inner.health.families());
        families.push(inner.usage.family());
        families.push(inner.claim_status_writes.family());
        families.extend(inner.request_path.families());
        families.push(inner.orphans.family());
        families.extend(inner.recovery.families());
        families.push(Family {
            name: "gpu_dra_build_info",
            help: "Always 1; the version label says which gpu-dra runs.",
            kind: Kind::Gauge,
            samples: vec![Sample::new(
                vec![("version", env!("CARGO_PKG_VERSION").to_string())],
                1.0,
            )],
        });
        families
    }

    /// The text exposition (format 0.0.4) of every family, sorted by name.
    ///
    /// The per-device telemetry is rendered by the first scrape after it was sampled; later
    /// scrapes of the same sample copy that text into its place in the name order.
    pub fn render(&self) -> String {
        let (before, after): (Vec<Family>, Vec<Family>) = self
            .other_families()
            .into_iter()
            .partition(|f| f.name < telemetry::PREFIX);
        let device = self.0.device_telemetry.get();
        let empty;
        let device_text = match &device {
            Some(d) => d.built().text.as_str(),
            None => {
                empty = text::render(&telemetry::families(&[]));
                empty.as_str()
            }
        };
        let before = text::render(&before);
        let after = text::render(&after);
        let mut out = String::with_capacity(before.len() + device_text.len() + after.len());
        out.push_str(&before);
        out.push_str(device_text);
        out.push_str(&after);
        out
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
