//! Serving through a start-up recovery that could not finish.
//!
//! A read-only or full CDI or state directory, or a tool that fails, can leave recovery's undo
//! steps undone (a half-done claim's spec, a stale spec no claim names, an orphaned MIG
//! device). Exiting would crash-loop the node: no claim could be unprepared and its pods would
//! stay stuck. So the plugin serves, and this task reports and retries: the whole recovery is
//! run again under the plugin lock (exactly what a restart would do, so it is safe between
//! calls), with exponential backoff, one log line per retry, `gpu_dra_recovery_pending_steps`
//! and `gpu_dra_recovery_retries_total`, and a `RecoveryIncomplete` Warning Event on the Node
//! (and a `RecoveryCompleted` Normal one when it converges). Only what depends on the broken
//! resource is refused meanwhile: a prepare that must write a spec into a read-only CDI
//! directory fails and rolls back, claims already prepared are served as before.

use std::sync::Arc;

use tracing::{info, warn};

use crate::claims::{ClaimError, ClaimSource, ClaimsManager};
use crate::k8s::{Backoff, EventType, NodeEvents};
use crate::kubelet::PluginLock;
use crate::metrics::Metrics;

/// `reason` of the Warning Event posted when start-up recovery could not finish.
pub const REASON_INCOMPLETE: &str = "RecoveryIncomplete";
/// `reason` of the Normal Event posted once a retry finished it.
pub const REASON_COMPLETED: &str = "RecoveryCompleted";

/// Retries of an unfinished recovery: 1 s at first, doubling to 5 minutes at most, forever.
pub fn default_backoff() -> Backoff {
    Backoff {
        initial: std::time::Duration::from_secs(1),
        max: std::time::Duration::from_secs(300),
        attempts: u32::MAX,
    }
}

/// The retrier; [`Unfinished::run`] is its task.
pub struct Unfinished<S> {
    /// The lifecycle whose recovery is retried.
    pub manager: Arc<ClaimsManager<S>>,
    /// The plugin lock every kubelet call takes.
    pub lock: PluginLock,
    /// Where the Events go; `None`: no Events (tests of the library without an API server).
    pub events: Option<NodeEvents>,
    /// Where pending steps and retries are shown.
    pub metrics: Metrics,
    /// Delays between retries.
    pub backoff: Backoff,
}

impl<S: ClaimSource + Send + Sync + 'static> Unfinished<S> {
    /// Reports `failures` (the start-up recovery's), then retries until a recovery finishes.
    pub async fn run(self, failures: Vec<String>) {
        self.metrics.set_recovery_pending(failures.len() as u64);
        self.event(
            EventType::Warning,
            REASON_INCOMPLETE,
            &format!(
                "start-up recovery left {} step(s) undone; the plugin serves and retries: {}",
                failures.len(),
                failures.join("; ")
            ),
        )
        .await;
        let mut retry = 0u32;
        loop {
            retry = retry.saturating_add(1);
            tokio::time::sleep(self.backoff.delay(retry)).await;
            self.metrics.record_recovery_retry();
            match self.attempt().await {
                Ok(()) => {
                    self.metrics.set_recovery_pending(0);
                    info!(retry, "start-up recovery finished");
                    self.event(
                        EventType::Normal,
                        REASON_COMPLETED,
                        &format!("start-up recovery finished after {retry} retry(ies)"),
                    )
                    .await;
                    return;
                }
                Err(failures) => {
                    self.metrics.set_recovery_pending(failures.len() as u64);
                    warn!(
                        retry,
                        pending = failures.len(),
                        failures = %failures.join("; "),
                        "start-up recovery still incomplete; retrying with backoff"
                    );
                }
            }
        }
    }

    /// One recovery under the plugin lock; the steps still failing on error.
    async fn attempt(&self) -> Result<(), Vec<String>> {
        let guard = self
            .lock
            .acquire()
            .await
            .map_err(|e| vec![crate::errors::error_chain(&e)])?;
        let manager = Arc::clone(&self.manager);
        // The guard goes with the blocking work: if this task is aborted at shutdown, the
        // lock is held until the work is really done.
        let done = tokio::task::spawn_blocking(move || {
            let result = manager.recover();
            drop(guard);
            result
        })
        .await;
        match done {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(ClaimError::Undo { failures, .. })) => Err(failures
                .iter()
                .map(|e| crate::errors::error_chain(e))
                .collect()),
            Ok(Err(other)) => Err(vec![crate::errors::error_chain(&other)]),
            Err(join) => Err(vec![format!("recovery task: {join}")]),
        }
    }

    async fn event(&self, kind: EventType, reason: &str, message: &str) {
        let Some(events) = &self.events else { return };
        if let Err(e) = events.post(kind, reason, message).await {
            warn!(error = %crate::errors::error_chain(&e), reason, "posting a node Event");
        }
    }
}
