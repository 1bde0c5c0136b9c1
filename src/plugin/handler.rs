//! The kubelet's prepare/unprepare calls, handed to the claim lifecycle one claim at a time,
//! each in its own span.

use std::sync::Arc;

use tracing::{Instrument, info, info_span, warn};

use crate::claims::{ClaimId, ClaimSource, ClaimsManager};
use crate::kubelet::{
    ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults, error_chain,
};

/// Adapts [`ClaimsManager`] to [`DraHandler`].
pub struct Handler<S> {
    /// The lifecycle.
    pub manager: Arc<ClaimsManager<S>>,
}

fn id(c: &ClaimRef) -> ClaimId {
    ClaimId {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    }
}

impl<S: ClaimSource + 'static> DraHandler for Handler<S> {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let mut out = PrepareResults::new();
        for c in claims {
            let span = info_span!("prepare", claim.uid = %c.uid, claim.namespace = %c.namespace, claim.name = %c.name);
            let result = async {
                let started = std::time::Instant::now();
                match self.manager.prepare(&id(&c)).await {
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
                        warn!(error = %text, "prepare failed");
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
                match self.manager.unprepare(&id(&c)).await {
                    Ok(()) => {
                        info!("unprepared");
                        Ok(())
                    }
                    Err(e) => {
                        let text = error_chain(&e);
                        warn!(error = %text, "unprepare failed");
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
