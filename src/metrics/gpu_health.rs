//! The GPUs' health as the backend and the health policy judge it: healthy and unhealthy
//! GPUs, GPUs per policy state, tainted devices per effect, and state transitions.
//!
//! (`health.rs` is the plugin's own readiness for `/readyz`, a different concern.)

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::text::{Family, Kind, Sample, gauge};

/// GPUs per health state, tainted devices per effect, and health transitions.
#[derive(Default)]
struct PolicyGauges {
    gpus_by_state: BTreeMap<&'static str, u64>,
    tainted_by_effect: BTreeMap<String, u64>,
    transitions: BTreeMap<(&'static str, &'static str), u64>,
}

/// The health families' state: two plain gauges (no lock) and the labelled ones under a
/// short lock.
#[derive(Default)]
pub(super) struct GpuHealth {
    healthy_gpus: AtomicU64,
    unhealthy_gpus: AtomicU64,
    policy: Mutex<PolicyGauges>,
}

impl GpuHealth {
    /// GPUs by health as the backend reports it.
    pub(super) fn set_gpu_health(&self, healthy: u64, unhealthy: u64) {
        self.healthy_gpus.store(healthy, Ordering::Relaxed);
        self.unhealthy_gpus.store(unhealthy, Ordering::Relaxed);
    }

    /// Replaces the GPUs per policy state and the tainted devices per effect.
    pub(super) fn set_health_gauges(
        &self,
        gpus_by_state: BTreeMap<&'static str, u64>,
        tainted_by_effect: BTreeMap<String, u64>,
    ) {
        let mut h = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        h.gpus_by_state = gpus_by_state;
        h.tainted_by_effect = tainted_by_effect;
    }

    /// Counts one change of health state.
    pub(super) fn record_transition(&self, from: &'static str, to: &'static str) {
        let mut h = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        *h.transitions.entry((from, to)).or_default() += 1;
    }

    /// Transitions from `from` to `to` so far.
    pub(super) fn transitions(&self, from: &str, to: &str) -> u64 {
        let h = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        h.transitions
            .iter()
            .filter(|((f, t), _)| *f == from && *t == to)
            .map(|(_, n)| *n)
            .sum()
    }

    /// `gpu_dra_healthy_gpus`, `gpu_dra_unhealthy_gpus`, `gpu_dra_gpus`,
    /// `gpu_dra_tainted_devices`, then `gpu_dra_health_transitions_total`.
    pub(super) fn families(&self) -> [Family; 5] {
        let healthy = gauge(
            "gpu_dra_healthy_gpus",
            "GPUs the health policy judges healthy.",
            self.healthy_gpus.load(Ordering::Relaxed) as f64,
        );
        let unhealthy = gauge(
            "gpu_dra_unhealthy_gpus",
            "GPUs the health policy judges degraded or failed (e.g. after a critical XID).",
            self.unhealthy_gpus.load(Ordering::Relaxed) as f64,
        );
        let h = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        [
            healthy,
            unhealthy,
            Family {
                name: "gpu_dra_gpus",
                help: "GPUs on this node by health state under the health policy (healthy, degraded, failed).",
                kind: Kind::Gauge,
                samples: h
                    .gpus_by_state
                    .iter()
                    .map(|(s, n)| Sample::new(vec![("state", (*s).to_string())], *n as f64))
                    .collect(),
            },
            Family {
                name: "gpu_dra_tainted_devices",
                help: "Published devices carrying a health taint, by taint effect.",
                kind: Kind::Gauge,
                samples: h
                    .tainted_by_effect
                    .iter()
                    .map(|(e, n)| Sample::new(vec![("effect", e.clone())], *n as f64))
                    .collect(),
            },
            Family {
                name: "gpu_dra_health_transitions_total",
                help: "Changes of a GPU's or MIG instance's health state, by old and new state.",
                kind: Kind::Counter,
                samples: h
                    .transitions
                    .iter()
                    .map(|((f, t), n)| {
                        Sample::new(
                            vec![("from", (*f).to_string()), ("to", (*t).to_string())],
                            *n as f64,
                        )
                    })
                    .collect(),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::text;

    #[test]
    fn transitions_are_counted_per_pair_and_written_in_state_order() {
        let health = GpuHealth::default();
        health.record_transition("healthy", "degraded");
        health.record_transition("degraded", "failed");
        health.record_transition("healthy", "degraded");
        assert_eq!(
            (2, 1, 0),
            (
                health.transitions("healthy", "degraded"),
                health.transitions("degraded", "failed"),
                health.transitions("failed", "healthy"),
            )
        );
        let text = text::render(&health.families());
        let got: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpu_dra_health_transitions_total{"))
            .collect();
        assert_eq!(
            vec![
                r#"gpu_dra_health_transitions_total{from="degraded",to="failed"} 1"#,
                r#"gpu_dra_health_transitions_total{from="healthy",to="degraded"} 2"#,
            ],
            got
        );
    }

    #[test]
    fn setting_the_policy_gauges_replaces_states_and_effects() {
        let health = GpuHealth::default();
        health.set_health_gauges(
            BTreeMap::from([("healthy", 7), ("failed", 1)]),
            BTreeMap::from([("NoExecute".to_string(), 1)]),
        );
        health.set_health_gauges(
            BTreeMap::from([("healthy", 8)]),
            BTreeMap::from([("NoSchedule".to_string(), 2)]),
        );
        health.set_gpu_health(8, 0);
        let text = text::render(&health.families());
        let got: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            vec![
                r#"gpu_dra_gpus{state="healthy"} 8"#,
                "gpu_dra_healthy_gpus 8",
                r#"gpu_dra_tainted_devices{effect="NoSchedule"} 2"#,
                "gpu_dra_unhealthy_gpus 0",
            ],
            got
        );
    }
}
