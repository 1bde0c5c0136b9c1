//! The node's life beyond single calls: orphaned claims reclaimed
//! (`gpu_dra_orphaned_claims_reclaimed_total`) and a start-up recovery left unfinished
//! (`gpu_dra_recovery_pending_steps`, `gpu_dra_recovery_retries_total`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::text::{Family, Kind, Sample};

/// The `reason` label values of `gpu_dra_orphaned_claims_reclaimed_total`, each exported from
/// zero so a query never waits for the first orphan to see the series.
pub const ORPHAN_REASONS: [&str; 4] = [
    "claim-deleted",
    "uid-changed",
    "not-allocated",
    "unreserved",
];

/// Orphans reclaimed per reason of [`ORPHAN_REASONS`].
#[derive(Default)]
pub(super) struct Orphans([AtomicU64; ORPHAN_REASONS.len()]);

impl Orphans {
    /// Counts one claim reclaimed for `reason`; an unknown reason is not counted.
    pub(super) fn record(&self, reason: &str) {
        if let Some(i) = ORPHAN_REASONS.iter().position(|r| *r == reason) {
            self.0[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Claims reclaimed for `reason` so far.
    pub(super) fn count(&self, reason: &str) -> u64 {
        ORPHAN_REASONS
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.0[i].load(Ordering::Relaxed))
    }

    /// `gpu_dra_orphaned_claims_reclaimed_total`, one series per reason.
    pub(super) fn family(&self) -> Family {
        Family {
            name: "gpu_dra_orphaned_claims_reclaimed_total",
            help: "Prepared claims the kubelet never unprepared (deleted, re-created, deallocated, or reserved for no pod past --orphan-grace-period), unprepared by the plugin, by reason.",
            kind: Kind::Counter,
            samples: ORPHAN_REASONS
                .iter()
                .map(|r| Sample::new(vec![("reason", r.to_string())], self.count(r) as f64))
                .collect(),
        }
    }
}

/// A start-up recovery that could not finish: steps still undone and retries so far.
#[derive(Default)]
pub(super) struct Recovery {
    pending: AtomicU64,
    retries: AtomicU64,
}

impl Recovery {
    /// Steps the last recovery attempt left undone (0: converged).
    pub(super) fn set_pending(&self, steps: u64) {
        self.pending.store(steps, Ordering::Relaxed);
    }

    /// Counts one retry.
    pub(super) fn record_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// `(pending steps, retries)`.
    pub(super) fn get(&self) -> (u64, u64) {
        (
            self.pending.load(Ordering::Relaxed),
            self.retries.load(Ordering::Relaxed),
        )
    }

    /// `gpu_dra_recovery_pending_steps` and `gpu_dra_recovery_retries_total`.
    pub(super) fn families(&self) -> Vec<Family> {
        let (pending, retries) = self.get();
        vec![
            Family {
                name: "gpu_dra_recovery_pending_steps",
                help: "Undo steps start-up recovery could not finish (a read-only or full CDI or state directory, a failing tool); the plugin serves meanwhile and retries with backoff. 0 once converged.",
                kind: Kind::Gauge,
                samples: vec![Sample::new(vec![], pending as f64)],
            },
            Family {
                name: "gpu_dra_recovery_retries_total",
                help: "Retries of an unfinished start-up recovery.",
                kind: Kind::Counter,
                samples: vec![Sample::new(vec![], retries as f64)],
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_exported_from_zero_and_counted_on_its_own() {
        let orphans = Orphans::default();
        orphans.record("unreserved");
        orphans.record("unreserved");
        orphans.record("claim-deleted");
        orphans.record("no-such-reason");
        let got: Vec<(String, f64)> = orphans
            .family()
            .samples
            .into_iter()
            .map(|s| (s.labels[0].1.clone(), s.value))
            .collect();
        let want = [
            ("claim-deleted", 1.0),
            ("uid-changed", 0.0),
            ("not-allocated", 0.0),
            ("unreserved", 2.0),
        ];
        assert_eq!(
            want.iter()
                .map(|(r, v)| (r.to_string(), *v))
                .collect::<Vec<_>>(),
            got
        );
    }
}
