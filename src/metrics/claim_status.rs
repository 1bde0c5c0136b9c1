//! Writes of a prepared claim's `status.devices`, by result
//! (`gpu_dra_claim_status_writes_total`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::calls::Outcome;
use super::text::{Family, Kind, Sample};

/// Tries per [`Outcome`], counted with atomics.
#[derive(Default)]
pub(super) struct ClaimStatusWrites([AtomicU64; 2]);

impl ClaimStatusWrites {
    /// Counts one try that ended with `outcome`.
    pub(super) fn record(&self, outcome: Outcome) {
        self.0[outcome.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Tries that ended with `outcome` so far.
    pub(super) fn count(&self, outcome: Outcome) -> u64 {
        self.0[outcome.index()].load(Ordering::Relaxed)
    }

    /// `gpu_dra_claim_status_writes_total`, one series per outcome.
    pub(super) fn family(&self) -> Family {
        Family {
            name: "gpu_dra_claim_status_writes_total",
            help: "Tries to write a prepared claim's status.devices, by result; a failed try is retried with backoff and never fails the prepare.",
            kind: Kind::Counter,
            samples: Outcome::ALL
                .iter()
                .map(|o| {
                    Sample::new(
                        vec![("result", o.label().to_string())],
                        self.count(*o) as f64,
                    )
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_counted_per_outcome_success_first() {
        let writes = ClaimStatusWrites::default();
        writes.record(Outcome::Error);
        writes.record(Outcome::Success);
        writes.record(Outcome::Error);
        let got: Vec<(String, f64)> = writes
            .family()
            .samples
            .into_iter()
            .map(|s| (s.labels[0].1.clone(), s.value))
            .collect();
        assert_eq!(
            vec![("success".to_string(), 1.0), ("error".to_string(), 2.0)],
            got
        );
        assert_eq!(2, writes.count(Outcome::Error));
    }
}
