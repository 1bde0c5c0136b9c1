//! The `status.devices` of prepared claims (KEP-4817): one entry per prepared device with a
//! `Ready` condition and what the plugin set up (UUIDs, MIG profile, sharing), kept in step
//! with device health and removed on unprepare — all off the kubelet's request path.
//!
//! [`Reporting`] wraps the kubelet handler: after a call returns, it puts the claims that
//! succeeded on a queue, each with its checkpoint record as the lifecycle holds it in memory,
//! and answers the kubelet without waiting. [`run`] drains the queue: for each claim it takes
//! that record (reading the checkpoint file only when memory could not tell) — the source of
//! truth: a claim is shown as long as its record says `PrepareCompleted` — computes the
//! wanted entries ([`wanted`], pure) and has
//! [`crate::k8s::ClaimStatusWriter::sync`] write them. A failed write is logged, counted in
//! `gpu_dra_claim_status_writes_total{result="error"}` and, when trying again can help, tried
//! again with backoff until it succeeds or the claim goes away; it never fails a prepare or
//! an unprepare. At start every prepared claim in the checkpoint is synced, so entries survive
//! a plugin restart and are repaired if they were lost meanwhile.

mod entries;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use kube::api::DynamicObject;
use tokio::sync::mpsc;

use crate::checkpoint::ClaimRecord;
use crate::k8s::{Backoff, ClaimRef};
use crate::kubelet::{self, DraHandler, PrepareResults};

pub use entries::{
    HealthIndex, REASON_HEALTH_UNKNOWN, REASON_NOT_PUBLISHED, REASON_PREPARED, REASON_UNHEALTHY,
    device_data, readiness, wanted,
};
pub use worker::{StatusWorker, run};

/// A bound on one sync (a read and a write), so a hung connection delays the queue, not
/// stops it.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the worker waits after a call queued claims before writing them: the call's
/// answer to the kubelet goes first, and the calls that follow within it are written with
/// it.
pub const SETTLE: Duration = Duration::from_millis(20);

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
pub struct StatusQueue(mpsc::UnboundedSender<Update>);

/// One claim to look at, with its checkpoint record when the sender knew it.
#[derive(Debug)]
pub struct Update {
    /// The claim.
    pub claim: ClaimRef,
    /// `Some(record)`: the checkpoint's record right after the call (`Some(None)`: the
    /// checkpoint holds none, the claim is unprepared). `None`: unknown, the worker reads the
    /// checkpoint file.
    pub record: Option<Option<ClaimRecord>>,
    /// The claim as the call read it from the API server, when it did: the write starts from
    /// it instead of reading the claim again.
    pub object: Option<DynamicObject>,
}

impl StatusQueue {
    /// A queue and the receiver [`run`] drains.
    pub fn new() -> (StatusQueue, mpsc::UnboundedReceiver<Update>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (StatusQueue(tx), rx)
    }

    /// Asks for `claim`'s entries to be made to match the checkpoint, which the worker reads.
    pub fn sync(&self, claim: ClaimRef) {
        let _ = self.0.send(Update {
            claim,
            record: None,
            object: None,
        });
    }

    /// Asks for `claim`'s entries to be made to match `record`, the checkpoint's record of it
    /// as the caller just saw it in memory (`None`: no record), so the worker reads no file.
    pub fn sync_known(&self, claim: ClaimRef, record: Option<ClaimRecord>) {
        self.sync_read(claim, record, None);
    }

    /// [`StatusQueue::sync_known`] with the claim as the call just read it.
    pub fn sync_read(
        &self,
        claim: ClaimRef,
        record: Option<ClaimRecord>,
        object: Option<DynamicObject>,
    ) {
        let _ = self.0.send(Update {
            claim,
            record: Some(record),
            object,
        });
    }
}

/// The checkpoint records of claims as the lifecycle holds them in memory, `None` when it
/// holds none right now ([`crate::claims::ClaimsManager::recorded_if_cached`]).
pub type RecordLookup =
    Arc<dyn Fn(&[&str]) -> Option<Vec<Option<ClaimRecord>>> + Send + Sync + 'static>;

/// Takes the claims as a call read them from the API server, by UID, `None` for those it did
/// not read (`ClaimReads::take` in `plugin/source.rs`).
pub type ReadLookup = Arc<dyn Fn(&[&str]) -> Vec<Option<DynamicObject>> + Send + Sync + 'static>;

/// A [`DraHandler`] that queues a status sync of every claim its inner handler prepared or
/// unprepared successfully, after the call, without waiting for it.
pub struct Reporting<H> {
    /// The handler that does the work.
    pub inner: H,
    /// Where successful claims go.
    pub queue: StatusQueue,
    /// The records of the claims just handled, from memory, so the worker needs not re-read
    /// and re-parse the checkpoint file per sync; `None` makes the worker read the file.
    pub records: Option<RecordLookup>,
    /// The claims as prepare read them, so the worker need not read them again; `None`: the
    /// worker reads each claim before writing it.
    pub reads: Option<ReadLookup>,
}

fn to_k8s(c: &kubelet::ClaimRef) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    }
}

impl<H: DraHandler> DraHandler for Reporting<H> {
    const LOGS_FAILURES: bool = H::LOGS_FAILURES;

    async fn prefetch(&self, claims: &[kubelet::ClaimRef]) {
        self.inner.prefetch(claims).await;
    }

    async fn prepare(&self, claims: Vec<kubelet::ClaimRef>) -> PrepareResults {
        let refs: Vec<ClaimRef> = claims.iter().map(to_k8s).collect();
        let results = self.inner.prepare(claims).await;
        // Every read of the call is taken, so those of failed claims do not stay behind.
        let uids: Vec<&str> = refs.iter().map(|c| c.uid.as_str()).collect();
        let reads = match &self.reads {
            Some(take) => take(&uids),
            None => Vec::new(),
        };
        let done: Vec<(ClaimRef, Option<DynamicObject>)> = refs
            .into_iter()
            .zip(reads.into_iter().chain(std::iter::repeat_with(|| None)))
            .filter(|(claim, _)| matches!(results.get(&claim.uid), Some(Ok(_))))
            .collect();
        self.queue_read(done);
        results
    }

    async fn unprepare(&self, claims: Vec<kubelet::ClaimRef>) -> kubelet::UnprepareResults {
        let refs: Vec<ClaimRef> = claims.iter().map(to_k8s).collect();
        let results = self.inner.unprepare(claims).await;
        let done: Vec<ClaimRef> = refs
            .into_iter()
            .filter(|claim| matches!(results.get(&claim.uid), Some(Ok(()))))
            .collect();
        self.queue_all(done);
        results
    }
}

impl<H> Reporting<H> {
    /// Queues `claims` with the reads that go with them, and their records from memory when
    /// the lookup knows them.
    fn queue_read(&self, claims: Vec<(ClaimRef, Option<DynamicObject>)>) {
        if claims.is_empty() {
            return;
        }
        let uids: Vec<&str> = claims.iter().map(|(c, _)| c.uid.as_str()).collect();
        let known = self.records.as_ref().and_then(|lookup| lookup(&uids));
        match known {
            Some(records) => {
                for ((claim, object), record) in claims.into_iter().zip(records) {
                    self.queue.sync_read(claim, record, object);
                }
            }
            None => claims
                .into_iter()
                .for_each(|(claim, _)| self.queue.sync(claim)),
        }
    }

    /// Queues `claims`, with their records from memory when the lookup knows them.
    fn queue_all(&self, claims: Vec<ClaimRef>) {
        if claims.is_empty() {
            return;
        }
        let uids: Vec<&str> = claims.iter().map(|c| c.uid.as_str()).collect();
        let known = self.records.as_ref().and_then(|lookup| lookup(&uids));
        match known {
            Some(records) => {
                for (claim, record) in claims.into_iter().zip(records) {
                    self.queue.sync_known(claim, record);
                }
            }
            None => claims.into_iter().for_each(|claim| self.queue.sync(claim)),
        }
    }
}
