//! The kubelet's prepare/unprepare calls, handed to the claim lifecycle one call (a batch of
//! claims) at a time; each claim's outcome is logged in its own span and counted and timed in
//! [`Metrics`].

use std::sync::Arc;
use std::time::Instant;

use tracing::{info, info_span, warn};

use crate::checkpoint::ClaimPhase;
use crate::claims::{ClaimError, ClaimId, ClaimSource, ClaimsManager};
use crate::errors::error_chain;
use crate::kubelet::{ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults};
use crate::metrics::{Metrics, Operation, Outcome};

use super::usage::UsageTracker;

/// Adapts [`ClaimsManager`] to [`DraHandler`].
pub struct Handler<S> {
    /// The lifecycle.
    pub manager: Arc<ClaimsManager<S>>,
    /// Where calls, latencies, error kinds and the prepared-claims gauge are recorded.
    pub metrics: Metrics,
    /// Usage accounting (`gpu_dra_claim_device_seconds_total`), when enabled.
    pub usage: Option<Arc<UsageTracker>>,
}

fn id(c: &ClaimRef) -> ClaimId {
    ClaimId {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    }
}

impl<S: ClaimSource + 'static> Handler<S> {
    fn record<T>(&self, op: Operation, started: Instant, result: &Result<T, ClaimError>) {
        let outcome = match result {
            Ok(_) => Outcome::Success,
            Err(e) => {
                self.metrics.record_error(e.kind());
                Outcome::Error
            }
        };
        self.metrics.record_call(op, outcome, started.elapsed());
        self.metrics
            .set_prepared_claims(self.manager.prepared_count());
    }
}

impl<S: ClaimSource + 'static> DraHandler for Handler<S> {
    /// Each failure is logged here, at warn, with its kind (`prepare failed`, `unprepare
    /// failed`).
    const LOGS_FAILURES: bool = true;

    /// Reads the claims this instance has not prepared yet (as its checkpoint in memory
    /// says) from the API server before the call waits for the plugin lock; the GETs count
    /// as request-path costs of `prepare`.
    async fn prefetch(&self, claims: &[ClaimRef]) {
        let uids: Vec<&str> = claims.iter().map(|c| c.uid.as_str()).collect();
        let known = self.manager.recorded(&uids);
        let unprepared: Vec<ClaimId> = claims
            .iter()
            .zip(known)
            .filter(|(_, record)| {
                !record
                    .as_ref()
                    .is_some_and(|r| r.phase == ClaimPhase::PrepareCompleted)
            })
            .map(|(c, _)| id(c))
            .collect();
        if unprepared.is_empty() {
            return;
        }
        let ((), cost) = crate::cost::measure(self.manager.source.prefetch(&unprepared)).await;
        self.metrics
            .add_request_path_costs(Operation::Prepare, &cost);
    }

    /// The call's claims go to the lifecycle as one batch; each claim is then counted, timed
    /// (the call's duration: its devices were ready when the call returned) and logged in its
    /// own span.
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let started = Instant::now();
        let _running = super::memory::call_started();
        let ids: Vec<ClaimId> = claims.iter().map(id).collect();
        let (results, cost) = crate::cost::measure(self.manager.prepare_batch(&ids)).await;
        super::inventory_watch::call_ended();
        self.manager.source.forget_prefetched(&ids);
        self.metrics.record_request_path(Operation::Prepare, &cost);
        // Usage accounting takes the records the lifecycle just wrote from memory.
        let records = match &self.usage {
            Some(_) => {
                let uids: Vec<&str> = ids.iter().map(|id| id.uid.as_str()).collect();
                self.manager.recorded(&uids)
            }
            None => Vec::new(),
        };
        let mut out = PrepareResults::new();
        for (i, (c, result)) in claims.into_iter().zip(results).enumerate() {
            let _span = claim_span("prepare", &c).entered();
            self.record(Operation::Prepare, started, &result);
            if let (Ok(_), Some(usage)) = (&result, &self.usage) {
                usage.prepared(&c.uid, records.get(i).and_then(Option::as_ref));
            }
            let answer = match result {
                Ok(devices) => {
                    info!(
                        devices = devices.len(),
                        elapsed_us = started.elapsed().as_micros() as u64,
                        "prepared"
                    );
                    Ok(devices
                        .into_iter()
                        .map(|d| PreparedDevice {
                            request_names: d.request_names,
                            pool_name: d.pool,
                            device_name: d.device,
                            cdi_device_ids: d.cdi_device_ids,
                            share_id: d.share_id,
                        })
                        .collect())
                }
                Err(e) => {
                    let text = error_chain(&e);
                    warn!(error = %text, kind = e.kind(), "prepare failed");
                    Err(text)
                }
            };
            out.insert(c.uid, answer);
        }
        out
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let started = Instant::now();
        let _running = super::memory::call_started();
        let ids: Vec<ClaimId> = claims.iter().map(id).collect();
        let (results, cost) = crate::cost::measure(self.manager.unprepare_batch(&ids)).await;
        super::inventory_watch::call_ended();
        self.metrics
            .record_request_path(Operation::Unprepare, &cost);
        let mut out = UnprepareResults::new();
        for (c, result) in claims.into_iter().zip(results) {
            let _span = claim_span("unprepare", &c).entered();
            self.record(Operation::Unprepare, started, &result);
            if let (Ok(()), Some(usage)) = (&result, &self.usage) {
                usage.unprepared(&c.uid);
            }
            let answer = match result {
                Ok(()) => {
                    info!("unprepared");
                    Ok(())
                }
                Err(e) => {
                    let text = error_chain(&e);
                    warn!(error = %text, kind = e.kind(), "unprepare failed");
                    Err(text)
                }
            };
            out.insert(c.uid, answer);
        }
        out
    }
}

fn claim_span(operation: &'static str, c: &ClaimRef) -> tracing::Span {
    match operation {
        "prepare" => {
            info_span!("prepare", claim.uid = %c.uid, claim.namespace = %c.namespace, claim.name = %c.name)
        }
        _ => {
            info_span!("unprepare", claim.uid = %c.uid, claim.namespace = %c.namespace, claim.name = %c.name)
        }
    }
}
