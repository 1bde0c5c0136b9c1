//! The task that keeps claims' entries in step: a queue of claims to look at, device health
//! changes, and retries with backoff.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kube::api::DynamicObject;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, warn};

use crate::checkpoint::{Checkpoint, ClaimPhase, ClaimRecord};
use crate::errors::error_chain;
use crate::k8s::{Backoff, ClaimRef, ClaimStatusWriter, DeviceStatus, SyncOutcome};
use crate::kubelet::DeviceHealth;
use crate::metrics::{Metrics, Outcome};
use crate::plugin::usage::read_checkpoint;

use super::entries::{HealthIndex, wanted};
use super::{SETTLE, SYNC_TIMEOUT, Update};

/// A claim the worker keeps an eye on.
struct Tracked {
    claim: ClaimRef,
    /// What was last written (or found) for it; `None` before the first success.
    shown: Option<Vec<DeviceStatus>>,
    /// Its checkpoint record when last read or given.
    record: Option<ClaimRecord>,
    /// Whether `record` is known to be current (given with the last update, or read since);
    /// else the next sync reads the checkpoint file.
    record_known: bool,
    /// The claim as last read or written: the next sync starts from it instead of reading
    /// the claim.
    object: Option<DynamicObject>,
    /// Needs a sync.
    dirty: bool,
    /// Failed tries in a row.
    failures: u32,
    /// Not before this instant (backoff).
    not_before: Option<Instant>,
}

/// What [`run`] needs.
pub struct StatusWorker {
    /// The API-server side.
    pub writer: ClaimStatusWriter,
    /// Where the checkpoint is.
    pub state_dir: PathBuf,
    /// The node's boot ID (a checkpoint of another boot is stale).
    pub boot_id: String,
    /// Device health, as streamed to the kubelet.
    pub health: watch::Receiver<Vec<DeviceHealth>>,
    /// `gpu_dra_claim_status_writes_total`.
    pub metrics: Metrics,
    /// Delays between tries of a failed write.
    pub backoff: Backoff,
}

fn now_text() -> String {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    match serde_json::to_value(now) {
        Ok(Value::String(text)) => text,
        _ => String::new(),
    }
}

async fn checkpoint(state_dir: &std::path::Path, boot_id: &str) -> Option<Checkpoint> {
    let (dir, boot) = (state_dir.to_path_buf(), boot_id.to_string());
    tokio::task::spawn_blocking(move || read_checkpoint(&dir, &boot))
        .await
        .ok()
        .flatten()
}

/// Keeps the entries of every claim queued on `queue`, and of every prepared claim in the
/// checkpoint at start, in step with the checkpoint and device health, until the queue's
/// senders are all dropped.
pub async fn run(mut worker: StatusWorker, mut queue: mpsc::UnboundedReceiver<Update>) {
    let mut tracked: BTreeMap<String, Tracked> = BTreeMap::new();
    if let Some(cp) = checkpoint(&worker.state_dir, &worker.boot_id).await {
        for record in cp.claims.values() {
            if record.phase == ClaimPhase::PrepareCompleted {
                let claim = ClaimRef {
                    namespace: record.namespace.clone(),
                    name: record.name.clone(),
                    uid: record.uid.clone(),
                };
                track(&mut tracked, claim, Some(Some(record.clone())), None);
            }
        }
        if !tracked.is_empty() {
            info!(
                claims = tracked.len(),
                "syncing the status.devices of prepared claims"
            );
        }
    }
    let mut health_open = true;
    loop {
        sync_due(&mut worker, &mut tracked).await;
        let wake = tracked
            .values()
            .filter(|t| t.dirty)
            .filter_map(|t| t.not_before)
            .min();
        tokio::select! {
            claim = queue.recv() => match claim {
                Some(update) => {
                    track(&mut tracked, update.claim, update.record, update.object);
                    // Let the call that queued it answer the kubelet first: its answer is
                    // still on its way, and this write's requests and the API server's work
                    // on them would compete with it for the node's CPUs.
                    tokio::time::sleep(SETTLE).await;
                    // Take every update already queued before syncing: a burst of calls
                    // collapses into one sync per claim, and the queue never backs up
                    // behind the API server's write latency.
                    while let Ok(update) = queue.try_recv() {
                        track(&mut tracked, update.claim, update.record, update.object);
                    }
                }
                None => return,
            },
            changed = health_changed(&mut worker.health, health_open) => {
                if changed.is_err() {
                    // No more health reports: keep serving the queue with the last ones.
                    health_open = false;
                    continue;
                }
                // Borrowed, not copied: nothing below awaits while the list is held.
                let list = worker.health.borrow_and_update();
                let health = HealthIndex::new(&list);
                for t in tracked.values_mut() {
                    let want = wanted(t.record.as_ref(), &health);
                    if t.shown.as_ref() != Some(&want) {
                        t.dirty = true;
                    }
                }
            }
            _ = sleep_until(wake) => {}
        }
    }
}

async fn health_changed(
    health: &mut watch::Receiver<Vec<DeviceHealth>>,
    open: bool,
) -> Result<(), watch::error::RecvError> {
    if open {
        health.changed().await
    } else {
        std::future::pending().await
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn track(
    tracked: &mut BTreeMap<String, Tracked>,
    claim: ClaimRef,
    record: Option<Option<ClaimRecord>>,
    object: Option<DynamicObject>,
) {
    let t = tracked.entry(claim.uid.clone()).or_insert_with(|| Tracked {
        claim: claim.clone(),
        shown: None,
        record: None,
        record_known: false,
        object: None,
        dirty: true,
        failures: 0,
        not_before: None,
    });
    t.claim = claim;
    t.dirty = true;
    if object.is_some() {
        t.object = object;
    }
    match record {
        Some(record) => {
            t.record = record;
            t.record_known = true;
        }
        None => t.record_known = false,
    }
    // A new event is news (a prepare or unprepare): try now, whatever the backoff said.
    t.not_before = None;
}

/// Syncs every dirty claim whose backoff has passed, reading the checkpoint once when a
/// claim's record is not known from its update.
async fn sync_due(worker: &mut StatusWorker, tracked: &mut BTreeMap<String, Tracked>) {
    let now = Instant::now();
    let due: Vec<String> = tracked
        .iter()
        .filter(|(_, t)| t.dirty && t.not_before.is_none_or(|at| at <= now))
        .map(|(uid, _)| uid.clone())
        .collect();
    if due.is_empty() {
        return;
    }
    let unknown = due
        .iter()
        .any(|uid| tracked.get(uid).is_some_and(|t| !t.record_known));
    let cp = match unknown {
        true => checkpoint(&worker.state_dir, &worker.boot_id).await,
        false => None,
    };
    for uid in due {
        let Some(t) = tracked.get_mut(&uid) else {
            continue;
        };
        if !t.record_known {
            t.record = cp.as_ref().and_then(|cp| cp.claims.get(&uid)).cloned();
            t.record_known = true;
        }
        // Borrowed per claim, not cloned per pass: the list has an entry per device, and
        // a claim has a few, so they are searched for rather than the list indexed.
        let want = wanted(
            t.record.as_ref(),
            &HealthIndex::scan(&worker.health.borrow()),
        );
        let span = tracing::info_span!(
            "claim_status",
            claim.uid = %t.claim.uid,
            claim.namespace = %t.claim.namespace,
            claim.name = %t.claim.name
        );
        let known = t.object.take();
        let attempt = tokio::time::timeout(
            SYNC_TIMEOUT,
            worker.writer.sync_from(&t.claim, &want, &now_text(), known),
        )
        .instrument(span.clone())
        .await;
        let entered = span.enter();
        let remove = match attempt {
            Ok(Ok((outcome, object))) => {
                t.object = object;
                if outcome == SyncOutcome::Written {
                    worker.metrics.record_claim_status_write(Outcome::Success);
                    // One line per write at debug: the prepare's own line says the claim is
                    // ready; a write that needed tries says so at info.
                    if t.failures > 0 {
                        info!(
                            devices = want.len(),
                            failures_before = t.failures,
                            "wrote status.devices"
                        );
                    } else {
                        debug!(devices = want.len(), "wrote status.devices");
                    }
                } else {
                    debug!(
                        ?outcome,
                        devices = want.len(),
                        "status.devices needs no write"
                    );
                }
                let done = want.is_empty() || outcome == SyncOutcome::ClaimGone;
                t.shown = Some(want);
                t.dirty = false;
                t.failures = 0;
                t.not_before = None;
                done
            }
            Ok(Err(e)) => {
                worker.metrics.record_claim_status_write(Outcome::Error);
                t.failures += 1;
                let text = error_chain(&e);
                if e.is_transient() && worker.backoff.may_retry(t.failures) {
                    let delay = worker.backoff.delay_after(t.failures, e.retry_after());
                    t.not_before = Some(Instant::now() + delay);
                    warn!(error = %text, failures = t.failures, retry_in_ms = delay.as_millis() as u64, "writing status.devices failed; will retry");
                    false
                } else {
                    // Trying again cannot help (e.g. 403, 422): wait for the next change.
                    warn!(error = %text, failures = t.failures, "writing status.devices failed; not retrying until the claim or its health changes");
                    let done = want.is_empty();
                    t.shown = Some(want);
                    t.dirty = false;
                    t.not_before = None;
                    done
                }
            }
            Err(_) => {
                worker.metrics.record_claim_status_write(Outcome::Error);
                t.failures += 1;
                let delay = worker.backoff.delay(t.failures);
                t.not_before = Some(Instant::now() + delay);
                warn!(
                    timeout_s = SYNC_TIMEOUT.as_secs(),
                    failures = t.failures,
                    "writing status.devices timed out; will retry"
                );
                false
            }
        };
        drop(entered);
        if remove {
            tracked.remove(&uid);
        }
    }
}
