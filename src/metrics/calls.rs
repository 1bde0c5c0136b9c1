//! The kubelet's claim calls: requests and latency per operation and result, and failures
//! by kind (`gpu_dra_{prepare,unprepare}_requests_total`,
//! `gpu_dra_{prepare,unprepare}_duration_seconds`, `gpu_dra_errors_total`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::text::{self, Family, Kind, Sample};

/// Upper bounds (seconds) of the latency histograms: a prepare takes milliseconds when the
/// hardware is left alone and seconds when MIG devices are carved or MPS daemons started.
pub const DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The kubelet call a measurement belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// NodePrepareResources, one claim.
    Prepare,
    /// NodeUnprepareResources, one claim.
    Unprepare,
}

/// How a claim's call ended: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The claim was (un)prepared.
    Success,
    /// The claim failed; the kubelet got an error.
    Error,
}

impl Outcome {
    /// Every outcome, in the order its series are written.
    pub(super) const ALL: [Outcome; 2] = [Outcome::Success, Outcome::Error];

    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Error => "error",
        }
    }

    /// The outcome's slot in a per-outcome array (the order of [`Outcome::ALL`]).
    pub(super) fn index(self) -> usize {
        match self {
            Outcome::Success => 0,
            Outcome::Error => 1,
        }
    }
}

#[derive(Default)]
struct Histogram {
    /// Non-cumulative counts per bound, plus one for values above the last bound.
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let slot = DURATION_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(DURATION_BUCKETS.len());
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Buckets are read before the count, so a concurrent observation can only make the
    /// count larger than `+Inf`, which is then raised to match: scrapers see consistent data.
    fn samples(&self, result: &'static str, out: &mut Vec<Sample>) {
        let labels = |le: f64| {
            vec![
                ("result", result.to_string()),
                ("le", text::format_value(le)),
            ]
        };
        let mut cumulative = 0u64;
        for (i, bound) in DURATION_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            out.push(bucket(labels(*bound), cumulative));
        }
        cumulative += self.buckets[DURATION_BUCKETS.len()].load(Ordering::Relaxed);
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let count = self.count.load(Ordering::Relaxed).max(cumulative);
        out.push(bucket(labels(f64::INFINITY), count));
        let plain = vec![("result", result.to_string())];
        out.push(Sample {
            suffix: "_sum",
            labels: plain.clone(),
            value: sum,
        });
        out.push(Sample {
            suffix: "_count",
            labels: plain,
            value: count as f64,
        });
    }
}

fn bucket(labels: Vec<(&'static str, String)>, count: u64) -> Sample {
    Sample {
        suffix: "_bucket",
        labels,
        value: count as f64,
    }
}

/// One operation's requests counter and latency histogram.
#[derive(Default)]
struct Calls {
    requests: [AtomicU64; 2],
    durations: [Histogram; 2],
}

impl Calls {
    /// The requests counter and the latency histogram, named `names.0` and `names.1`.
    fn families(
        &self,
        names: (&'static str, &'static str),
        help: (&'static str, &'static str),
    ) -> [Family; 2] {
        let requests = Outcome::ALL
            .iter()
            .map(|o| {
                Sample::new(
                    vec![("result", o.label().to_string())],
                    self.requests[o.index()].load(Ordering::Relaxed) as f64,
                )
            })
            .collect();
        let mut durations = Vec::new();
        for o in Outcome::ALL {
            self.durations[o.index()].samples(o.label(), &mut durations);
        }
        [
            Family {
                name: names.0,
                help: help.0,
                kind: Kind::Counter,
                samples: requests,
            },
            Family {
                name: names.1,
                help: help.1,
                kind: Kind::Histogram,
                samples: durations,
            },
        ]
    }
}

/// Prepare and unprepare calls and failures by kind. Recording a call only touches atomics;
/// recording a failure takes a short lock.
#[derive(Default)]
pub(super) struct ClaimCalls {
    prepare: Calls,
    unprepare: Calls,
    errors: Mutex<BTreeMap<&'static str, u64>>,
}

impl ClaimCalls {
    fn calls(&self, op: Operation) -> &Calls {
        match op {
            Operation::Prepare => &self.prepare,
            Operation::Unprepare => &self.unprepare,
        }
    }

    /// Counts one claim's call and its latency.
    pub(super) fn record_call(&self, op: Operation, outcome: Outcome, elapsed: Duration) {
        let calls = self.calls(op);
        calls.requests[outcome.index()].fetch_add(1, Ordering::Relaxed);
        calls.durations[outcome.index()].observe(elapsed);
    }

    /// Counts one failure of kind `kind`.
    pub(super) fn record_error(&self, kind: &'static str) {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        *errors.entry(kind).or_default() += 1;
    }

    /// Calls of `op` that ended with `outcome` so far.
    pub(super) fn requests(&self, op: Operation, outcome: Outcome) -> u64 {
        self.calls(op).requests[outcome.index()].load(Ordering::Relaxed)
    }

    /// Failures of kind `kind` so far.
    pub(super) fn errors(&self, kind: &str) -> u64 {
        let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        errors.get(kind).copied().unwrap_or(0)
    }

    /// The prepare families, the unprepare families, then `gpu_dra_errors_total`.
    pub(super) fn families(&self) -> Vec<Family> {
        let mut families = Vec::with_capacity(5);
        families.extend(self.prepare.families(
            (
                "gpu_dra_prepare_requests_total",
                "gpu_dra_prepare_duration_seconds",
            ),
            (
                "Claims the kubelet asked to prepare, by result.",
                "Seconds to prepare one claim, by result.",
            ),
        ));
        families.extend(self.unprepare.families(
            (
                "gpu_dra_unprepare_requests_total",
                "gpu_dra_unprepare_duration_seconds",
            ),
            (
                "Claims the kubelet asked to unprepare, by result.",
                "Seconds to unprepare one claim, by result.",
            ),
        ));
        let errors = {
            let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
            errors
                .iter()
                .map(|(kind, n)| Sample::new(vec![("kind", (*kind).to_string())], *n as f64))
                .collect()
        };
        families.push(Family {
            name: "gpu_dra_errors_total",
            help: "Failed prepare/unprepare calls, by the kind of failure.",
            kind: Kind::Counter,
            samples: errors,
        });
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn histogram_buckets_are_cumulative_with_inf_sum_and_count() {
        let calls = ClaimCalls::default();
        for ms in [3, 20, 20, 30_000] {
            calls.record_call(
                Operation::Prepare,
                Outcome::Success,
                Duration::from_millis(ms),
            );
        }
        let text = text::render(&calls.families());
        let want = vec![
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.001"} 0"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.0025"} 0"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.005"} 1"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.01"} 1"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.025"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.05"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.1"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.25"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="0.5"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="1"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="2.5"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="5"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="10"} 3"#,
            r#"gpu_dra_prepare_duration_seconds_bucket{result="success",le="+Inf"} 4"#,
            r#"gpu_dra_prepare_duration_seconds_sum{result="success"} 30.043"#,
            r#"gpu_dra_prepare_duration_seconds_count{result="success"} 4"#,
        ];
        let got: Vec<&str> = lines_of(&text, "gpu_dra_prepare_duration_seconds")
            .into_iter()
            .filter(|l| l.contains(r#"result="success""#))
            .collect();
        assert_eq!(want, got);
    }

    #[test]
    fn a_value_on_a_bound_falls_in_that_bucket() {
        let calls = ClaimCalls::default();
        calls.record_call(
            Operation::Unprepare,
            Outcome::Error,
            Duration::from_millis(100),
        );
        let text = text::render(&calls.families());
        let got = lines_of(
            &text,
            r#"gpu_dra_unprepare_duration_seconds_bucket{result="error",le="0.1"}"#,
        );
        assert_eq!(
            vec![r#"gpu_dra_unprepare_duration_seconds_bucket{result="error",le="0.1"} 1"#],
            got
        );
    }

    #[test]
    fn errors_are_counted_per_kind_and_written_in_kind_order() {
        let calls = ClaimCalls::default();
        for kind in ["hardware", "busy", "hardware"] {
            calls.record_error(kind);
        }
        let text = text::render(&calls.families());
        assert_eq!(
            vec![
                r#"gpu_dra_errors_total{kind="busy"} 1"#,
                r#"gpu_dra_errors_total{kind="hardware"} 2"#,
            ],
            lines_of(&text, "gpu_dra_errors_total{")
        );
        assert_eq!(
            (2, 1, 0),
            (
                calls.errors("hardware"),
                calls.errors("busy"),
                calls.errors("cdi")
            )
        );
    }
}
