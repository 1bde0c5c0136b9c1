//! The `status.devices` of prepared claims (KEP-4817): one entry per prepared device with a
//! `Ready` condition and what the plugin set up (UUIDs, MIG profile, sharing), kept in step
//! with device health and removed on unprepare — all off the kubelet's request path.
//!
//! [`Reporting`] wraps the kubelet handler: after a call returns, it puts the claims that
//! succeeded on a queue and answers the kubelet without waiting. [`run`] drains the queue: for
//! each claim it reads the checkpoint (the source of truth: a claim is shown as long as its
//! record says `PrepareCompleted`), computes the wanted entries ([`wanted`], pure) and has
//! [`ClaimStatusWriter::sync`] write them. A failed write is logged, counted in
//! `gpu_dra_claim_status_writes_total{result="error"}` and, when trying again can help, tried
//! again with backoff until it succeeds or the claim goes away; it never fails a prepare or
//! an unprepare. At start every prepared claim in the checkpoint is synced, so entries survive
//! a plugin restart and are repaired if they were lost meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, warn};

use crate::checkpoint::{Checkpoint, ClaimPhase, ClaimRecord, DeviceRecord};
use crate::claims::sharing::DeviceSharing;
use crate::errors::error_chain;
use crate::k8s::{
    Backoff, ClaimRef, ClaimStatusWriter, ConditionStatus, DeviceStatus, Readiness, SyncOutcome,
};
use crate::kubelet::{self, DeviceHealth, DraHandler, HealthStatus, PrepareResults};
use crate::metrics::{Metrics, Outcome};

use super::usage::read_checkpoint;

/// Reason of a prepared, healthy device's `Ready=True`.
pub const REASON_PREPARED: &str = "Prepared";
/// Reason of `Ready=False` when the device's GPU is unhealthy.
pub const REASON_UNHEALTHY: &str = "Unhealthy";
/// Reason of `Ready=Unknown` when the health check has no verdict.
pub const REASON_HEALTH_UNKNOWN: &str = "HealthUnknown";
/// Reason of `Ready=Unknown` when the device is no longer published (its GPU is gone).
pub const REASON_NOT_PUBLISHED: &str = "NotPublished";

/// A bound on one sync (a read and a write), so a hung connection delays the queue, not
/// stops it.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// Retries of a failed write: quick at first, then every 30 s at most, for as long as the
/// claim stays prepared.
pub fn default_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(30),
        attempts: u32::MAX,
    }
}

/// Claims whose status needs a look. Cheap to clone; sending never waits and never fails
/// the caller (after shutdown the claim is simply not written).
#[derive(Clone)]
pub struct StatusQueue(mpsc::UnboundedSender<ClaimRef>);

impl StatusQueue {
    /// A queue and the receiver [`run`] drains.
    pub fn new() -> (StatusQueue, mpsc::UnboundedReceiver<ClaimRef>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (StatusQueue(tx), rx)
    }

    /// Asks for `claim`'s entries to be made to match the checkpoint.
    pub fn sync(&self, claim: ClaimRef) {
        let _ = self.0.send(claim);
    }
}

/// A [`DraHandler`] that queues a status sync of every claim its inner handler prepared or
/// unprepared successfully, after the call, without waiting for it.
pub struct Reporting<H> {
    /// The handler that does the work.
    pub inner: H,
    /// Where successful claims go.
    pub queue: StatusQueue,
}

fn to_k8s(c: &kubelet::ClaimRef) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    }
}

impl<H: DraHandler> DraHandler for Reporting<H> {
    async fn prepare(&self, claims: Vec<kubelet::ClaimRef>) -> PrepareResults {
        let refs: Vec<ClaimRef> = claims.iter().map(to_k8s).collect();
        let results = self.inner.prepare(claims).await;
        for claim in refs {
            if matches!(results.get(&claim.uid), Some(Ok(_))) {
                self.queue.sync(claim);
            }
        }
        results
    }

    async fn unprepare(&self, claims: Vec<kubelet::ClaimRef>) -> kubelet::UnprepareResults {
        let refs: Vec<ClaimRef> = claims.iter().map(to_k8s).collect();
        let results = self.inner.unprepare(claims).await;
        for claim in refs {
            if matches!(results.get(&claim.uid), Some(Ok(()))) {
                self.queue.sync(claim);
            }
        }
        results
    }
}

/// The entries `record` should show, given the devices' health (`None`: the claim is not
/// prepared, so it should show none). Pure.
pub fn wanted(record: Option<&ClaimRecord>, health: &[DeviceHealth]) -> Vec<DeviceStatus> {
    let Some(record) = record.filter(|r| r.phase == ClaimPhase::PrepareCompleted) else {
        return Vec::new();
    };
    let by_device: HashMap<(&str, &str), &DeviceHealth> = health
        .iter()
        .map(|h| ((h.pool_name.as_str(), h.device_name.as_str()), h))
        .collect();
    record
        .devices
        .iter()
        .map(|d| DeviceStatus {
            pool: d.pool.clone(),
            device: d.device.clone(),
            share_id: d.share_id.clone(),
            ready: readiness(
                by_device
                    .get(&(d.pool.as_str(), d.device.as_str()))
                    .copied(),
            ),
            data: device_data(d),
        })
        .collect()
}

/// The `Ready` condition of a prepared device with health `health` (`None`: not published).
pub fn readiness(health: Option<&DeviceHealth>) -> Readiness {
    let (status, reason, message) = match health {
        None => (
            ConditionStatus::Unknown,
            REASON_NOT_PUBLISHED,
            "the device is no longer published by this node (its GPU is gone?)".to_string(),
        ),
        Some(h) => match h.status {
            HealthStatus::Healthy => (ConditionStatus::True, REASON_PREPARED, String::new()),
            HealthStatus::Unhealthy => {
                (ConditionStatus::False, REASON_UNHEALTHY, h.message.clone())
            }
            HealthStatus::Unknown => (
                ConditionStatus::Unknown,
                REASON_HEALTH_UNKNOWN,
                h.message.clone(),
            ),
        },
    };
    Readiness {
        status,
        reason: reason.to_string(),
        message,
    }
}

/// The `data` of one entry: what the checkpoint knows about the device. A full GPU gives
/// `type: gpu` and its `uuid`; a MIG device `type: mig`, its `uuid`, `parentUUID`, `profile`
/// and `placement`; a device with a sharing strategy adds `sharing` (`strategy`, and the MPS
/// limits or time-slice level). A few hundred bytes, far below the API's 10 KiB.
pub fn device_data(d: &DeviceRecord) -> Value {
    let mut data = Map::new();
    match &d.mig {
        None => {
            data.insert("type".into(), json!("gpu"));
            data.insert("uuid".into(), json!(d.gpu_uuid));
        }
        Some(mig) => {
            data.insert("type".into(), json!("mig"));
            if let Some(uuid) = &mig.uuid {
                data.insert("uuid".into(), json!(uuid));
            }
            data.insert("parentUUID".into(), json!(d.gpu_uuid));
            data.insert("profile".into(), json!(mig.profile));
            data.insert(
                "placement".into(),
                json!({"start": mig.placement_start, "size": mig.placement_size}),
            );
        }
    }
    if let Ok(Some(sharing)) = DeviceSharing::of(d) {
        data.insert("sharing".into(), sharing_data(&sharing));
    }
    Value::Object(data)
}

fn sharing_data(sharing: &DeviceSharing) -> Value {
    let mut out = Map::new();
    let limits = |out: &mut Map<String, Value>, threads: Option<u8>, pinned: Option<u64>| {
        if let Some(t) = threads {
            out.insert("activeThreadPercentage".into(), json!(t));
        }
        if let Some(p) = pinned {
            out.insert("pinnedMemoryLimitBytes".into(), json!(p));
        }
    };
    match sharing {
        DeviceSharing::TimeSlicing { level } => {
            out.insert("strategy".into(), json!("TimeSlicing"));
            out.insert("timeSliceLevel".into(), json!(level));
        }
        DeviceSharing::Mps {
            active_thread_percentage,
            pinned_memory_bytes,
            ..
        } => {
            out.insert("strategy".into(), json!("MPS"));
            limits(&mut out, *active_thread_percentage, *pinned_memory_bytes);
        }
        DeviceSharing::Share {
            active_thread_percentage,
            pinned_memory_bytes,
            ..
        } => {
            out.insert("strategy".into(), json!("MPS"));
            out.insert("perShare".into(), json!(true));
            limits(
                &mut out,
                Some(*active_thread_percentage),
                *pinned_memory_bytes,
            );
        }
    }
    Value::Object(out)
}

/// A claim the worker keeps an eye on.
struct Tracked {
    claim: ClaimRef,
    /// What was last written (or found) for it; `None` before the first success.
    shown: Option<Vec<DeviceStatus>>,
    /// Its checkpoint record when last read.
    record: Option<ClaimRecord>,
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
pub async fn run(mut worker: StatusWorker, mut queue: mpsc::UnboundedReceiver<ClaimRef>) {
    let mut tracked: BTreeMap<String, Tracked> = BTreeMap::new();
    if let Some(cp) = checkpoint(&worker.state_dir, &worker.boot_id).await {
        for record in cp.claims.values() {
            if record.phase == ClaimPhase::PrepareCompleted {
                let claim = ClaimRef {
                    namespace: record.namespace.clone(),
                    name: record.name.clone(),
                    uid: record.uid.clone(),
                };
                track(&mut tracked, claim);
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
                Some(claim) => track(&mut tracked, claim),
                None => return,
            },
            changed = health_changed(&mut worker.health, health_open) => {
                if changed.is_err() {
                    // No more health reports: keep serving the queue with the last ones.
                    health_open = false;
                    continue;
                }
                let health = worker.health.borrow_and_update().clone();
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

fn track(tracked: &mut BTreeMap<String, Tracked>, claim: ClaimRef) {
    let t = tracked.entry(claim.uid.clone()).or_insert_with(|| Tracked {
        claim: claim.clone(),
        shown: None,
        record: None,
        dirty: true,
        failures: 0,
        not_before: None,
    });
    t.claim = claim;
    t.dirty = true;
    // A new event is news (a prepare or unprepare): try now, whatever the backoff said.
    t.not_before = None;
}

/// Syncs every dirty claim whose backoff has passed, reading the checkpoint once.
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
    let cp = checkpoint(&worker.state_dir, &worker.boot_id).await;
    let health = worker.health.borrow().clone();
    for uid in due {
        let Some(t) = tracked.get_mut(&uid) else {
            continue;
        };
        t.record = cp.as_ref().and_then(|cp| cp.claims.get(&uid)).cloned();
        let want = wanted(t.record.as_ref(), &health);
        let span = tracing::info_span!(
            "claim_status",
            claim.uid = %t.claim.uid,
            claim.namespace = %t.claim.namespace,
            claim.name = %t.claim.name
        );
        let attempt = tokio::time::timeout(
            SYNC_TIMEOUT,
            worker.writer.sync(&t.claim, &want, &now_text()),
        )
        .instrument(span.clone())
        .await;
        let entered = span.enter();
        let remove = match attempt {
            Ok(Ok(outcome)) => {
                if outcome == SyncOutcome::Written {
                    worker.metrics.record_claim_status_write(Outcome::Success);
                    info!(
                        devices = want.len(),
                        failures_before = t.failures,
                        "wrote status.devices"
                    );
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

#[cfg(test)]
#[path = "claim_status_tests.rs"]
mod tests;
