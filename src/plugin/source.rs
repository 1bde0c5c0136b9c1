//! Claims from the API server, in the claim lifecycle's terms.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::claims::{ClaimAllocation, ClaimId, ClaimSource, ConfigEntry};
use crate::k8s::{ClaimReader, ConfigSource, ReservedPod};
use crate::usage::HeldDevice;
use kube::api::DynamicObject;

use super::holders::{PodRef, Reservations};
use super::usage::UsageTracker;
use tracing::debug;

/// Reads allocations with a [`ClaimReader`] (one GET per claim, counted as a request-path
/// cost); tells the usage tracker, when there is one, each request's DeviceClass and each
/// share's consumed capacity; records, when there are [`Reservations`], the pods each claim
/// read is reserved for (the telemetry's holder labels); and, when a prepared claim is
/// prepared again (another pod of a shared claim), re-reads its pods in the background.
/// Claims read ahead of the plugin lock ([`ClaimSource::prefetch`]) wait in memory for their
/// prepare; each read claim, as the server sent it, waits in [`ClaimReads`] for the write of
/// its status that reports the prepare.
pub struct ApiClaims {
    /// The API server's claims.
    pub reader: ClaimReader,
    /// Usage accounting.
    pub usage: Option<Arc<UsageTracker>>,
    /// The pods each claim is reserved for.
    pub reservations: Option<Arc<Reservations>>,
    /// Claims read ahead, by UID.
    pub prefetched: Mutex<HashMap<String, Result<ClaimAllocation, String>>>,
    /// The claims read, as the server sent them.
    pub reads: ClaimReads,
}

/// The last read of each claim, by UID, as the server sent it: the claim-status worker
/// starts the write that reports a prepare from it instead of reading the claim again.
/// Taken by [`ClaimReads::take`]; at most [`ClaimReads::KEPT`] wait (reads of calls that
/// never reached their prepare are dropped beyond that).
#[derive(Clone, Default)]
pub struct ClaimReads(Arc<Mutex<HashMap<String, DynamicObject>>>);

impl ClaimReads {
    /// The most reads kept for their status write.
    pub const KEPT: usize = 256;

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, DynamicObject>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn put(&self, uid: &str, object: DynamicObject) {
        let mut reads = self.lock();
        if reads.len() >= Self::KEPT {
            reads.clear();
        }
        reads.insert(uid.to_string(), object);
    }

    /// Removes and returns the reads of `uids`, in order (`None`: not read, or already
    /// taken).
    pub fn take(&self, uids: &[&str]) -> Vec<Option<DynamicObject>> {
        let mut reads = self.lock();
        uids.iter().map(|uid| reads.remove(*uid)).collect()
    }
}

impl ApiClaims {
    /// A source with nothing read ahead.
    pub fn new(
        reader: ClaimReader,
        usage: Option<Arc<UsageTracker>>,
        reservations: Option<Arc<Reservations>>,
    ) -> ApiClaims {
        ApiClaims {
            reader,
            usage,
            reservations,
            prefetched: Mutex::new(HashMap::new()),
            reads: ClaimReads::default(),
        }
    }

    fn prefetched(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Result<ClaimAllocation, String>>> {
        self.prefetched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn read(&self, id: &ClaimId) -> Result<ClaimAllocation, String> {
        crate::cost::count(crate::cost::Cost::ApiRequest);
        let (claim, object) = self
            .reader
            .fetch_object(&id.namespace, &id.name, &id.uid)
            .await
            .map_err(|e| crate::errors::error_chain(&e))?;
        self.reads.put(&id.uid, object);
        if let Some(usage) = &self.usage {
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
        if let Some(reservations) = &self.reservations {
            reservations.set(&id.uid, pods_of(claim.reserved_pods));
        }
        Ok(ClaimAllocation {
            pod_claim_name: claim.pod_claim_name,
            devices: claim.devices,
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

impl ClaimSource for ApiClaims {
    fn prepared_again(&self, id: &ClaimId) {
        let Some(reservations) = &self.reservations else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (reader, id, reservations) =
            (self.reader.clone(), id.clone(), Arc::clone(reservations));
        runtime.spawn(async move {
            match reader.fetch(&id.namespace, &id.name, &id.uid).await {
                Ok(claim) => reservations.set(&id.uid, pods_of(claim.reserved_pods)),
                // Telemetry keeps the pods read before; the next repeat tries again.
                Err(e) => debug!(claim = %id, error = %crate::errors::error_chain(&e), "re-reading a prepared claim's pods"),
            }
        });
    }

    async fn fetch(&self, id: &ClaimId) -> Result<ClaimAllocation, String> {
        if let Some(read) = self.prefetched().remove(&id.uid) {
            return read;
        }
        self.read(id).await
    }

    /// Reads the claims concurrently (at most [`crate::claims::FETCH_CONCURRENCY`] GETs at
    /// once) and keeps each answer, success or error, for its fetch.
    async fn prefetch(&self, ids: &[ClaimId]) {
        let reads = ids.iter().map(|id| self.read(id)).collect();
        let answers = crate::claims::join_bounded(reads, crate::claims::FETCH_CONCURRENCY).await;
        let mut prefetched = self.prefetched();
        for (id, answer) in ids.iter().zip(answers) {
            prefetched.insert(id.uid.clone(), answer);
        }
    }

    fn forget_prefetched(&self, ids: &[ClaimId]) {
        let mut prefetched = self.prefetched();
        for id in ids {
            prefetched.remove(&id.uid);
        }
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
