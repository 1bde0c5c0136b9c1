//! Usage accounting for billing: device-seconds held by claims, from prepare to unprepare, by
//! namespace, DeviceClass, profile and sharing mode — the counter
//! `gpu_dra_claim_device_seconds_total`.
//!
//! A [`Ledger`] keeps the running totals of claims that ended and, for each claim prepared
//! now, when it was prepared and what it holds. The counter is the totals plus the time the
//! live claims have held their devices so far, so it keeps counting across plugin restarts
//! (the claims are still held while the plugin is down) as long as the ledger survives: it is
//! stored next to the checkpoint ([`store`]). A shared device is counted per share, weighted
//! by the share's part of the device.
//!
//! Pure apart from [`store`]: the plugin tells the ledger what happened and when.

mod holdings;
pub mod store;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use holdings::{DeviceFacts, HeldDevice, holdings, strategy_label};

/// The `profile` label of a full GPU.
pub const FULL_GPU: &str = "gpu";

/// The label set of one counter series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Labels {
    pub namespace: String,
    /// DeviceClass of the request the device was allocated for ("" when unknown).
    pub class: String,
    /// MIG profile, or `gpu` for a full GPU.
    pub profile: String,
    /// `exclusive`, `time-slicing`, `mps` or `capacity-share`.
    pub sharing: String,
}

/// One device a claim holds, as the counter weighs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Holding {
    #[serde(flatten)]
    pub labels: Labels,
    /// 1 for a whole device; a share's part of the device (0–1) for consumable capacity.
    pub weight: f64,
}

/// A claim prepared now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Live {
    /// When it was prepared (seconds since the Unix epoch).
    pub since_unix: f64,
    pub holdings: Vec<Holding>,
}

/// Running totals and live claims.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    /// Device-seconds of claims that ended, per label set.
    pub finished: BTreeMap<Labels, f64>,
    /// Live claims by UID.
    pub live: BTreeMap<String, Live>,
}

impl Ledger {
    /// Records claim `uid` prepared at `since_unix`. A claim already live keeps its original
    /// start (a repeated prepare is not a new hold). Returns whether the ledger changed.
    pub fn start(&mut self, uid: &str, since_unix: f64, holdings: Vec<Holding>) -> bool {
        if self.live.contains_key(uid) {
            return false;
        }
        self.live.insert(
            uid.to_string(),
            Live {
                since_unix,
                holdings,
            },
        );
        true
    }

    /// Ends claim `uid` at `now_unix`, moving the device-seconds it held into the totals.
    /// Unknown claims are ignored. Returns whether the ledger changed.
    pub fn stop(&mut self, uid: &str, now_unix: f64) -> bool {
        let Some(live) = self.live.remove(uid) else {
            return false;
        };
        let held = (now_unix - live.since_unix).max(0.0);
        for holding in live.holdings {
            *self.finished.entry(holding.labels).or_default() += held * holding.weight;
        }
        true
    }

    /// Makes the live claims those `prepared` lists: ends the others at `now_unix` (they were
    /// unprepared while the ledger could not be written, or the node rebooted), and starts
    /// those missing with the start and holdings given (claims prepared before accounting
    /// began). Returns whether the ledger changed.
    pub fn reconcile(&mut self, prepared: &BTreeMap<String, Live>, now_unix: f64) -> bool {
        let gone: Vec<String> = self
            .live
            .keys()
            .filter(|uid| !prepared.contains_key(*uid))
            .cloned()
            .collect();
        let mut changed = false;
        for uid in gone {
            changed |= self.stop(&uid, now_unix);
        }
        for (uid, live) in prepared {
            changed |= self.start(uid, live.since_unix, live.holdings.clone());
        }
        changed
    }

    /// The counter's value per label set at `now_unix`: ended claims plus the time live ones
    /// have held their devices so far. Never decreases between calls with a later `now_unix`.
    pub fn device_seconds(&self, now_unix: f64) -> BTreeMap<Labels, f64> {
        let mut out = self.finished.clone();
        for live in self.live.values() {
            let held = (now_unix - live.since_unix).max(0.0);
            for holding in &live.holdings {
                *out.entry(holding.labels.clone()).or_default() += held * holding.weight;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(namespace: &str, profile: &str, weight: f64) -> Holding {
        Holding {
            labels: Labels {
                namespace: namespace.into(),
                class: "mig.nvidia.com".into(),
                profile: profile.into(),
                sharing: "exclusive".into(),
            },
            weight,
        }
    }

    #[test]
    fn a_claim_counts_from_prepare_to_unprepare_and_its_seconds_stay_counted() {
        let mut ledger = Ledger::default();
        assert!(ledger.start("u1", 100.0, vec![holding("a", "1g.10gb", 1.0)]));
        assert!(
            !ledger.start("u1", 150.0, vec![]),
            "a repeated prepare keeps the start"
        );
        let at = |l: &Ledger, t| l.device_seconds(t).values().sum::<f64>();
        assert_eq!(at(&ledger, 160.0), 60.0);
        assert!(ledger.stop("u1", 200.0));
        assert_eq!(at(&ledger, 1000.0), 100.0);
        assert!(!ledger.stop("u1", 300.0));
    }

    #[test]
    fn shares_count_by_their_weight_and_labels_sum_separately() {
        let mut ledger = Ledger::default();
        ledger.start(
            "u1",
            0.0,
            vec![holding("a", "gpu", 0.25), holding("a", "gpu", 0.25)],
        );
        ledger.start("u2", 0.0, vec![holding("b", "gpu", 1.0)]);
        let got: Vec<(String, f64)> = ledger
            .device_seconds(10.0)
            .into_iter()
            .map(|(l, v)| (l.namespace, v))
            .collect();
        assert_eq!(got, [("a".to_string(), 5.0), ("b".to_string(), 10.0)]);
    }

    #[test]
    fn reconcile_ends_claims_no_longer_prepared_and_adopts_new_ones() {
        let mut ledger = Ledger::default();
        ledger.start("gone", 0.0, vec![holding("a", "gpu", 1.0)]);
        let prepared = BTreeMap::from([(
            "new".to_string(),
            Live {
                since_unix: 40.0,
                holdings: vec![holding("b", "gpu", 1.0)],
            },
        )]);
        assert!(ledger.reconcile(&prepared, 50.0));
        assert_eq!(ledger.live.keys().collect::<Vec<_>>(), ["new"]);
        let total: f64 = ledger.device_seconds(60.0).values().sum();
        assert_eq!(total, 50.0 + 20.0);
        assert!(!ledger.reconcile(&prepared, 70.0));
    }
}
