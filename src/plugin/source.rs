//! Claims from the API server, in the claim lifecycle's terms.

use std::sync::Arc;

use crate::claims::{AllocatedDevice, ClaimAllocation, ClaimId, ClaimSource, ConfigEntry};
use crate::k8s::{ClaimReader, ConfigSource, ReservedPod};
use crate::usage::HeldDevice;

use super::holders::{PodRef, Reservations};
use super::usage::UsageTracker;
use tracing::debug;

/// Reads allocations with a [`ClaimReader`]; tells the usage tracker, when there is one, each
/// request's DeviceClass and each share's consumed capacity; records, when there are
/// [`Reservations`], the pods each claim read is reserved for (the telemetry's holder labels);
/// and, when a prepared claim is prepared again (another pod of a shared claim), re-reads its
/// pods in the background.
pub struct ApiClaims(
    pub ClaimReader,
    pub Option<Arc<UsageTracker>>,
    pub Option<Arc<Reservations>>,
);

impl ClaimSource for ApiClaims {
    fn prepared_again(&self, id: &ClaimId) {
        let Some(reservations) = &self.2 else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (reader, id, reservations) = (self.0.clone(), id.clone(), Arc::clone(reservations));
        runtime.spawn(async move {
            match reader.fetch(&id.namespace, &id.name, &id.uid).await {
                Ok(claim) => reservations.set(&id.uid, pods_of(claim.reserved_pods)),
                // Telemetry keeps the pods read before; the next repeat tries again.
                Err(e) => debug!(claim = %id, error = %crate::errors::error_chain(&e), "re-reading a prepared claim's pods"),
            }
        });
    }

    async fn fetch(&self, id: &ClaimId) -> Result<ClaimAllocation, String> {
        let claim = self
            .0
            .fetch(&id.namespace, &id.name, &id.uid)
            .await
            .map_err(|e| crate::errors::error_chain(&e))?;
        if let Some(usage) = &self.1 {
            let held = claim
                .devices
                .iter()
                .map(|d| HeldDevice {
                    request: d.request.clone(),
                    device: d.device.clone(),
                    share_id: d.share_id.clone(),
                    consumed: d.consumed_capacity.clone(),
                    strategy: None,
                })
                .collect();
            usage.fetched(&id.uid, claim.classes.clone(), held);
        }
        if let Some(reservations) = &self.2 {
            reservations.set(&id.uid, pods_of(claim.reserved_pods));
        }
        Ok(ClaimAllocation {
            devices: claim
                .devices
                .into_iter()
                .map(|d| AllocatedDevice {
                    request: d.request,
                    pool: d.pool,
                    device: d.device,
                    admin_access: d.admin_access,
                    share_id: d.share_id,
                    consumed_capacity: d.consumed_capacity,
                })
                .collect(),
            config: claim
                .config
                .into_iter()
                .map(|c| ConfigEntry {
                    from_class: c.source == ConfigSource::FromClass,
                    requests: c.requests,
                    parameters: c.parameters,
                })
                .collect(),
        })
    }
}

/// The pods a claim is reserved for, as the holders keep them.
pub(super) fn pods_of(reserved: Vec<ReservedPod>) -> Vec<PodRef> {
    reserved
        .into_iter()
        .map(|p| PodRef {
            name: p.name,
            uid: p.uid,
        })
        .collect()
}
