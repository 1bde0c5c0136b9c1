//! Claims from the API server, in the claim lifecycle's terms.

use crate::claims::{AllocatedDevice, ClaimAllocation, ClaimId, ClaimSource, ConfigEntry};
use crate::k8s::{ClaimReader, ConfigSource};

/// Reads allocations with a [`ClaimReader`].
pub struct ApiClaims(pub ClaimReader);

impl ClaimSource for ApiClaims {
    async fn fetch(&self, id: &ClaimId) -> Result<ClaimAllocation, String> {
        let claim = self
            .0
            .fetch(&id.namespace, &id.name, &id.uid)
            .await
            .map_err(|e| crate::errors::error_chain(&e))?;
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
