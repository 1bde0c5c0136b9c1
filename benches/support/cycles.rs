//! What the VM-device benches (`vfio`, `vgpu`) share: one prepare/unprepare cycle of a claim
//! through the kubelet's socket, timed, and the p50/p99 of many.

use std::time::{Duration, Instant};

use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::KubeletClient;

/// Sorted samples' value at quantile `p` (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prepares `claim` (which must succeed), then unprepares it: the two calls' times.
pub async fn cycle(kubelet: &mut KubeletClient, claim: &ClaimRef) -> (Duration, Duration) {
    let t = Instant::now();
    let got = kubelet.prepare(std::slice::from_ref(claim)).await.unwrap();
    let prepared = t.elapsed();
    assert!(got[&claim.uid].is_ok(), "{got:?}");
    let t = Instant::now();
    kubelet
        .unprepare(std::slice::from_ref(claim))
        .await
        .unwrap();
    (prepared, t.elapsed())
}

/// The times of many cycles of one claim.
#[derive(Default)]
pub struct Figures {
    pub prepare: Vec<Duration>,
    pub unprepare: Vec<Duration>,
}

impl Figures {
    /// Adds one cycle's times.
    pub fn push(&mut self, (prepare, unprepare): (Duration, Duration)) {
        self.prepare.push(prepare);
        self.unprepare.push(unprepare);
    }

    /// Sorts the samples; call before reading percentiles.
    pub fn sort(&mut self) {
        self.prepare.sort();
        self.unprepare.sort();
    }

    /// The prepare and unprepare p50 (sorted samples).
    pub fn p50(&self) -> (Duration, Duration) {
        (
            percentile(&self.prepare, 0.5),
            percentile(&self.unprepare, 0.5),
        )
    }

    /// One report line: p50 and p99 of both calls (sorted samples).
    pub fn line(&self, label: &str) -> String {
        format!(
            "{label:34} prepare p50 {:6.3} ms p99 {:6.3} ms | unprepare p50 {:6.3} ms p99 {:6.3} ms",
            ms(percentile(&self.prepare, 0.5)),
            ms(percentile(&self.prepare, 0.99)),
            ms(percentile(&self.unprepare, 0.5)),
            ms(percentile(&self.unprepare, 0.99)),
        )
    }
}

/// The floor: the p50 of `rounds` prepares of a claim that does not exist (one GET → 404).
pub async fn floor(kubelet: &mut KubeletClient, rounds: usize) -> Duration {
    let missing = crate::plugin_support::claims::claim_ref("missing", "uid-missing");
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let got = kubelet
            .prepare(std::slice::from_ref(&missing))
            .await
            .unwrap();
        samples.push(t.elapsed());
        assert!(got[&missing.uid].is_err(), "a claim that does not exist");
    }
    samples.sort();
    percentile(&samples, 0.5)
}
