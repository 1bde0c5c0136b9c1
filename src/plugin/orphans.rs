//! Orphan reconciliation: claims prepared on this node that the kubelet will never unprepare.
//!
//! A claim is deleted, or its pod force-deleted, and the kubelet never calls
//! `NodeUnprepareResources` (a kubelet state loss, a drain gone wrong, a kubelet bug): its MIG
//! instance, MPS daemon and CDI spec would stay forever. At start and then every
//! [`check_interval`], every claim the checkpoint holds prepared is looked up in the API
//! server, and one that is
//!
//! - gone (a `404` naming it; [`OrphanReason::ClaimDeleted`]),
//! - another object under the same name ([`OrphanReason::UidChanged`]),
//! - no longer allocated to this driver on this node ([`OrphanReason::NotAllocated`]), or
//! - reserved for no pod for longer than `--orphan-grace-period`
//!   ([`OrphanReason::Unreserved`])
//!
//! is unprepared exactly as the kubelet would do it: the same handler call (lifecycle, usage
//! accounting, claim status, metrics), under the same plugin lock, with the same best-effort
//! undo. A late kubelet unprepare of it then finds nothing to do and succeeds.
//!
//! Deciding is cheap, acting is careful: candidates are noticed with a read from the API
//! server's watch cache, and each is confirmed with a quorum read taken *under the plugin
//! lock*, so a pod that reserves the claim meanwhile is either seen (nothing happens) or has
//! its prepare served after the unprepare (which prepares the claim afresh). Any answer but a
//! claim that exists, or a `404` naming it, leaves the claim alone: an API server that cannot
//! be reached, refuses, or does not serve the path never makes a claim an orphan.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, info_span, warn};

use crate::checkpoint::ClaimPhase;
use crate::k8s::{self, ClaimLookup, ClaimState, Freshness};
use crate::kubelet::{ClaimRef, DraHandler, PluginLock, validate_claims};
use crate::metrics::Metrics;

use super::usage::read_checkpoint;

/// A bound on one lookup, so a hung connection delays a round, not stops it.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a prepared claim was found orphaned. The label is the metric's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OrphanReason {
    /// The API server says the claim does not exist.
    ClaimDeleted,
    /// A claim of that name exists with another UID (deleted and re-created).
    UidChanged,
    /// The claim exists but its allocation has no device of this driver on this node.
    NotAllocated,
    /// The claim is reserved for no pod, and has been for longer than the grace period.
    Unreserved,
}

impl OrphanReason {
    /// Every reason, in the metric's order.
    pub const ALL: [OrphanReason; 4] = [
        OrphanReason::ClaimDeleted,
        OrphanReason::UidChanged,
        OrphanReason::NotAllocated,
        OrphanReason::Unreserved,
    ];

    /// `claim-deleted`, `uid-changed`, `not-allocated` or `unreserved`: the metric's
    /// [`crate::metrics::ORPHAN_REASONS`], in the same order.
    pub fn label(self) -> &'static str {
        crate::metrics::ORPHAN_REASONS[self as usize]
    }
}

/// Why the claim prepared as `uid` would be an orphan in `state`, if it would; `None`: in use.
/// [`OrphanReason::Unreserved`] still needs the grace period ([`Unreserved::decide`]). Pure.
pub fn verdict(uid: &str, state: &ClaimState) -> Option<OrphanReason> {
    match state {
        ClaimState::Gone => Some(OrphanReason::ClaimDeleted),
        ClaimState::Found { uid: found, .. } if found != uid => Some(OrphanReason::UidChanged),
        ClaimState::Found {
            allocated_here: false,
            ..
        } => Some(OrphanReason::NotAllocated),
        ClaimState::Found {
            reserved_for_pod: false,
            ..
        } => Some(OrphanReason::Unreserved),
        ClaimState::Found { .. } => None,
    }
}

/// Since when each prepared claim has been seen reserved for no pod (in this process: a
/// restart starts the grace period again, which only ever waits longer).
#[derive(Debug, Default)]
pub struct Unreserved {
    since: HashMap<String, Instant>,
}

impl Unreserved {
    /// The reason to reclaim `uid` now, given what it looked like at `now`: any reason but
    /// [`OrphanReason::Unreserved`] at once; that one once it has lasted `grace`. A claim seen
    /// in use starts its grace period afresh next time.
    pub fn decide(
        &mut self,
        uid: &str,
        reason: Option<OrphanReason>,
        now: Instant,
        grace: Duration,
    ) -> Option<OrphanReason> {
        match reason {
            Some(OrphanReason::Unreserved) => {
                let since = *self.since.entry(uid.to_string()).or_insert(now);
                (now.duration_since(since) >= grace).then_some(OrphanReason::Unreserved)
            }
            None => {
                self.since.remove(uid);
                None
            }
            other => other,
        }
    }

    /// Forgets claims no longer prepared.
    pub fn retain(&mut self, prepared: &BTreeMap<String, ClaimRef>) {
        self.since.retain(|uid, _| prepared.contains_key(uid));
    }
}

/// How often prepared claims are looked up for a grace period of `grace`: a quarter of it,
/// between 250 ms and one minute. At the default 10 minutes that is one cached GET per
/// prepared claim per minute.
pub fn check_interval(grace: Duration) -> Duration {
    (grace / 4).clamp(Duration::from_millis(250), Duration::from_secs(60))
}

/// `--orphan-grace-period`: `0` (off), whole seconds (`30` or `30s`) or minutes (`10m`).
///
/// # Errors
/// A message naming the value and the valid forms.
pub fn grace_period_flag(value: &str) -> Result<Duration, String> {
    let invalid = || {
        format!(
            "{value:?} is not a grace period; give 0 (off), whole seconds (30 or 30s) or \
             minutes (10m)"
        )
    };
    let (number, unit) = match value.trim() {
        v if v.ends_with('s') => (&v[..v.len() - 1], 1),
        v if v.ends_with('m') => (&v[..v.len() - 1], 60),
        v => (v, 1),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .map(Duration::from_secs)
        .ok_or_else(invalid)
}

/// The reconciler; [`Orphans::run`] is its task.
pub struct Orphans<H> {
    /// The kubelet's handler: reclaiming goes through exactly its unprepare.
    pub handler: Arc<H>,
    /// The plugin lock every kubelet call takes.
    pub lock: PluginLock,
    /// Claim lookups in the API server.
    pub lookup: ClaimLookup,
    /// Where the checkpoint is.
    pub state_dir: PathBuf,
    /// This boot (a checkpoint of another boot holds nothing prepared).
    pub boot_id: String,
    /// `--orphan-grace-period` (not zero).
    pub grace: Duration,
    /// Where reclaimed claims are counted.
    pub metrics: Metrics,
}

/// What one round found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Claims looked up.
    pub checked: usize,
    /// Lookups that failed (the claim is kept).
    pub unknown: usize,
    /// Claims unprepared, by UID, with why.
    pub reclaimed: BTreeMap<String, OrphanReason>,
    /// Claims whose unprepare failed, with the error (supervision and the next round retry).
    pub failed: BTreeMap<String, String>,
}

impl<H: DraHandler> Orphans<H> {
    /// Checks at once, then every [`check_interval`], until aborted.
    pub async fn run(self) {
        let mut unreserved = Unreserved::default();
        // On the process's shared grid (`crate::ticks`): its wake-ups are the other timers'.
        let mut ticks = crate::ticks::Ticks::every(check_interval(self.grace));
        loop {
            ticks.tick().await;
            self.round(&mut unreserved).await;
        }
    }

    /// One pass over the prepared claims.
    pub async fn round(&self, unreserved: &mut Unreserved) -> Round {
        let mut round = Round::default();
        let prepared = self.prepared().await;
        unreserved.retain(&prepared);
        let mut candidates = Vec::new();
        for claim in prepared.values() {
            round.checked += 1;
            let Some(state) = self.look_up(claim, Freshness::Cached, &mut round).await else {
                continue;
            };
            let reason = verdict(&claim.uid, &state);
            if unreserved
                .decide(&claim.uid, reason, Instant::now(), self.grace)
                .is_some()
            {
                candidates.push(claim.clone());
            }
        }
        if !candidates.is_empty() {
            self.reclaim(candidates, &mut round).await;
        }
        round
    }

    /// The claims the checkpoint holds prepared, by UID.
    async fn prepared(&self) -> BTreeMap<String, ClaimRef> {
        let (dir, boot) = (self.state_dir.clone(), self.boot_id.clone());
        let checkpoint = tokio::task::spawn_blocking(move || read_checkpoint(&dir, &boot))
            .await
            .ok()
            .flatten();
        checkpoint
            .map(|cp| {
                cp.claims
                    .into_values()
                    .filter(|c| c.phase == ClaimPhase::PrepareCompleted)
                    .map(|c| {
                        let claim = ClaimRef {
                            namespace: c.namespace,
                            name: c.name,
                            uid: c.uid,
                        };
                        (claim.uid.clone(), claim)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn look_up(
        &self,
        claim: &ClaimRef,
        freshness: Freshness,
        round: &mut Round,
    ) -> Option<ClaimState> {
        let wanted = k8s::ClaimRef {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        };
        let error =
            match tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup.state(&wanted, freshness)).await
            {
                Ok(Ok(state)) => return Some(state),
                Ok(Err(e)) => crate::errors::error_chain(&e),
                Err(_) => format!("no answer within {LOOKUP_TIMEOUT:?}"),
            };
        round.unknown += 1;
        debug!(
            claim.uid = %claim.uid, claim.namespace = %claim.namespace, claim.name = %claim.name,
            %error, "orphan check: claim state unknown; kept"
        );
        None
    }

    /// Confirms each candidate with a quorum read under the plugin lock and unprepares the
    /// confirmed ones through the handler, still under that lock.
    async fn reclaim(&self, candidates: Vec<ClaimRef>, round: &mut Round) {
        let guard = match self.lock.acquire().await {
            Ok(guard) => guard,
            Err(e) => {
                warn!(error = %crate::errors::error_chain(&e), "orphan check: taking the plugin lock");
                return;
            }
        };
        // The kubelet may have unprepared some meanwhile.
        let still = self.prepared().await;
        let mut confirmed = Vec::new();
        let mut reasons = BTreeMap::new();
        for claim in candidates {
            if !still.contains_key(&claim.uid) {
                continue;
            }
            let Some(state) = self.look_up(&claim, Freshness::Quorum, round).await else {
                continue;
            };
            if let Some(reason) = verdict(&claim.uid, &state) {
                reasons.insert(claim.uid.clone(), reason);
                confirmed.push(claim);
            }
        }
        if confirmed.is_empty() {
            return;
        }
        let (valid, invalid) = validate_claims(confirmed);
        for (uid, error) in invalid {
            round.failed.insert(uid, error);
        }
        let handler = Arc::clone(&self.handler);
        let claims = valid.clone();
        // As the kubelet's calls: the work runs to its end with the lock, whatever happens to
        // this task.
        let answered = tokio::spawn(async move {
            let answered = handler.unprepare(claims).await;
            drop(guard);
            answered
        })
        .await
        .unwrap_or_default();
        for claim in valid {
            let reason = reasons[&claim.uid];
            let _span = info_span!(
                "orphan", claim.uid = %claim.uid, claim.namespace = %claim.namespace,
                claim.name = %claim.name
            )
            .entered();
            match answered.get(&claim.uid) {
                Some(Ok(())) => {
                    self.metrics.record_orphan_reclaimed(reason.label());
                    info!(
                        reason = reason.label(),
                        grace_s = self.grace.as_secs(),
                        "reclaimed an orphaned claim: unprepared it as the kubelet would"
                    );
                    round.reclaimed.insert(claim.uid.clone(), reason);
                }
                Some(Err(error)) => {
                    warn!(reason = reason.label(), %error, "reclaiming an orphaned claim failed; retried");
                    round.failed.insert(claim.uid.clone(), error.clone());
                }
                None => {
                    warn!(
                        reason = reason.label(),
                        "reclaiming an orphaned claim: no answer; retried"
                    );
                    round
                        .failed
                        .insert(claim.uid.clone(), "no answer from the handler".into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(uid: &str, allocated_here: bool, reserved_for_pod: bool) -> ClaimState {
        ClaimState::Found {
            uid: uid.into(),
            allocated_here,
            reserved_for_pod,
        }
    }

    #[test]
    fn each_state_of_a_prepared_claim_has_its_verdict() {
        let cases = [
            (ClaimState::Gone, Some(OrphanReason::ClaimDeleted)),
            (found("other", true, true), Some(OrphanReason::UidChanged)),
            (found("u", false, true), Some(OrphanReason::NotAllocated)),
            (found("u", false, false), Some(OrphanReason::NotAllocated)),
            (found("u", true, false), Some(OrphanReason::Unreserved)),
            (found("u", true, true), None),
        ];
        for (state, want) in cases {
            assert_eq!(want, verdict("u", &state), "{state:?}");
        }
    }

    #[test]
    fn an_unreserved_claim_is_reclaimed_only_after_the_grace_period_and_reuse_restarts_it() {
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut u = Unreserved::default();
        let unres = Some(OrphanReason::Unreserved);
        let got = [
            u.decide("a", unres, t0, grace),
            u.decide("a", unres, t0 + Duration::from_secs(59), grace),
            u.decide("a", unres, t0 + Duration::from_secs(60), grace),
            // Reserved again: the clock starts over.
            u.decide("a", None, t0 + Duration::from_secs(61), grace),
            u.decide("a", unres, t0 + Duration::from_secs(62), grace),
            u.decide("a", unres, t0 + Duration::from_secs(100), grace),
            // Other reasons need no grace.
            u.decide("b", Some(OrphanReason::ClaimDeleted), t0, grace),
        ];
        assert_eq!(
            [
                None,
                None,
                unres,
                None,
                None,
                None,
                Some(OrphanReason::ClaimDeleted)
            ],
            got
        );
    }

    #[test]
    fn each_reason_is_labelled_as_the_metric_exports_it() {
        let got: Vec<&str> = OrphanReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(
            vec![
                "claim-deleted",
                "uid-changed",
                "not-allocated",
                "unreserved"
            ],
            got
        );
    }

    #[test]
    fn the_check_interval_is_a_quarter_of_the_grace_period_within_bounds() {
        let got: Vec<Duration> = [1, 8, 600, 3600]
            .into_iter()
            .map(|s| check_interval(Duration::from_secs(s)))
            .collect();
        let want = [
            Duration::from_millis(250),
            Duration::from_secs(2),
            Duration::from_secs(60),
            Duration::from_secs(60),
        ];
        assert_eq!(want.to_vec(), got);
    }

    #[test]
    fn the_grace_period_flag_takes_zero_seconds_or_minutes_and_names_the_forms_otherwise() {
        let ok: Vec<Duration> = ["0", "0s", "30", "30s", "10m"]
            .into_iter()
            .map(|v| grace_period_flag(v).unwrap())
            .collect();
        assert_eq!(
            vec![
                Duration::ZERO,
                Duration::ZERO,
                Duration::from_secs(30),
                Duration::from_secs(30),
                Duration::from_secs(600)
            ],
            ok
        );
        for bad in ["1h", "1.5m", "-1", "ten", ""] {
            let err = grace_period_flag(bad).unwrap_err();
            assert!(
                err.contains(&format!("{bad:?}")) && err.contains("0 (off)"),
                "{bad}: {err}"
            );
        }
    }
}
