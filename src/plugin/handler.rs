//! The kubelet's prepare/unprepare calls, handed to the claim lifecycle one claim at a time,
//! each in its own span, each counted and timed in [`Metrics`].

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tracing::{Instrument, info, info_span, warn};

use crate::checkpoint::{self, ClaimPhase};
use crate::claims::{ClaimError, ClaimId, ClaimSource, ClaimsManager};
use crate::kubelet::{
    ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults, error_chain,
};
use crate::metrics::{Metrics, Operation, Outcome};

use super::usage::{UsageTracker, read_checkpoint};

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

/// Claims the checkpoint in `state_dir` holds as prepared for boot `boot_id`; `None` when it
/// cannot be read or decoded (the lifecycle reports that itself on its next call).
///
/// Reads the file without opening a [`checkpoint::CheckpointStore`]: opening cleans up temp
/// files, which must not race a prepare in flight. The file is replaced atomically, so a read
/// sees one whole version.
pub fn prepared_claims(state_dir: &Path, boot_id: &str) -> Option<u64> {
    let bytes = match std::fs::read(state_dir.join(checkpoint::CHECKPOINT_FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(0),
        Err(_) => return None,
    };
    let checkpoint = checkpoint::decode(&bytes).ok()?;
    if checkpoint.node_boot_id != boot_id {
        return Some(0);
    }
    let prepared = checkpoint
        .claims
        .values()
        .filter(|c| c.phase == ClaimPhase::PrepareCompleted)
        .count();
    u64::try_from(prepared).ok()
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
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let mut out = PrepareResults::new();
        for c in claims {
            let span = info_span!("prepare", claim.uid = %c.uid, claim.namespace = %c.namespace, claim.name = %c.name);
            let result = async {
                let started = Instant::now();
                let result = self.manager.prepare(&id(&c)).await;
                self.record(Operation::Prepare, started, &result);
                if let (Ok(_), Some(usage)) = (&result, &self.usage) {
                    let checkpoint =
                        read_checkpoint(&self.manager.state_dir, &self.manager.boot_id);
                    usage.prepared(&c.uid, checkpoint.as_ref());
                }
                match result {
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
                }
            }
            .instrument(span)
            .await;
            out.insert(c.uid.clone(), result);
        }
        out
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let mut out = UnprepareResults::new();
        for c in claims {
            let span = info_span!("unprepare", claim.uid = %c.uid, claim.namespace = %c.namespace, claim.name = %c.name);
            let result = async {
                let started = Instant::now();
                let result = self.manager.unprepare(&id(&c)).await;
                self.record(Operation::Unprepare, started, &result);
                if let (Ok(()), Some(usage)) = (&result, &self.usage) {
                    usage.unprepared(&c.uid);
                }
                match result {
                    Ok(()) => {
                        info!("unprepared");
                        Ok(())
                    }
                    Err(e) => {
                        let text = error_chain(&e);
                        warn!(error = %text, kind = e.kind(), "unprepare failed");
                        Err(text)
                    }
                }
            }
            .instrument(span)
            .await;
            out.insert(c.uid.clone(), result);
        }
        out
    }
}
