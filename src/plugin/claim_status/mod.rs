//! The `status.devices` of prepared claims (KEP-4817): one entry per prepared device with a
//! `Ready` condition and what the plugin set up (UUIDs, MIG profile, sharing), kept in step
//! with device health and removed on unprepare — all off the kubelet's request path.
//!
//! [`Reporting`] wraps the kubelet handler: after a call returns, it puts the claims that
//! succeeded on a queue and answers the kubelet without waiting. [`run`] drains the queue: for
//! each claim it reads the checkpoint (the source of truth: a claim is shown as long as its
//! record says `PrepareCompleted`), computes the wanted entries ([`wanted`], pure) and has
//! [`crate::k8s::ClaimStatusWriter::sync`] write them. A failed write is logged, counted in
//! `gpu_dra_claim_status_writes_total{result="error"}` and, when trying again can help, tried
//! again with backoff until it succeeds or the claim goes away; it never fails a prepare or
//! an unprepare. At start every prepared claim in the checkpoint is synced, so entries survive
//! a plugin restart and are repaired if they were lost meanwhile.

mod entries;
mod worker;

use std::time::Duration;

use tokio::sync::mpsc;

use crate::k8s::{Backoff, ClaimRef};
use crate::kubelet::{self, DraHandler, PrepareResults};

pub use entries::{
    REASON_HEALTH_UNKNOWN, REASON_NOT_PUBLISHED, REASON_PREPARED, REASON_UNHEALTHY, device_data,
    readiness, wanted,
};
pub use worker::{StatusWorker, run};

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
    async fn prefetch(&self, claims: &[kubelet::ClaimRef]) {
        self.inner.prefetch(claims).await;
    }

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
