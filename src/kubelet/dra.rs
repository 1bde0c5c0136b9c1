//! The DRAPlugin service in both wire versions, translated to the one [`DraHandler`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info_span, warn};

use super::combine::{Answers, Queue};
use super::handler::{complete_results, validate_claims};
use super::proto::{dra_v1 as v1, dra_v1beta1 as v1beta1};
use super::{ClaimRef, DraHandler, PluginLock, PreparedDevice};

/// Shared by both wire versions: validation, reading ahead, the plugin lock with group
/// commit of concurrent calls ([`super::combine`]), the handler call and the per-claim log
/// lines.
pub(crate) struct DraCore<H> {
    handler: Arc<H>,
    lock: PluginLock,
    prepares: Queue<Vec<PreparedDevice>>,
    unprepares: Queue<()>,
}

impl<H: DraHandler> DraCore<H> {
    pub(crate) fn new(handler: Arc<H>, lock: PluginLock) -> Self {
        Self {
            handler,
            lock,
            prepares: Queue::default(),
            unprepares: Queue::default(),
        }
    }

    async fn prepare(
        &self,
        api: &'static str,
        claims: Vec<ClaimRef>,
    ) -> Result<Answers<Vec<PreparedDevice>>, Status> {
        let run = |handler: Arc<H>, claims| async move { handler.prepare(claims).await };
        let call = Call {
            method: "NodePrepareResources",
            api,
            read_ahead: true,
        };
        self.call(call, claims, &self.prepares, run).await
    }

    async fn unprepare(
        &self,
        api: &'static str,
        claims: Vec<ClaimRef>,
    ) -> Result<Answers<()>, Status> {
        let run = |handler: Arc<H>, claims| async move { handler.unprepare(claims).await };
        let call = Call {
            method: "NodeUnprepareResources",
            api,
            read_ahead: false,
        };
        self.call(call, claims, &self.unprepares, run).await
    }

    /// Validates, reads a prepare's claims ahead ([`DraHandler::prefetch`], outside the
    /// lock), queues the call, then either waits for a batch that serves it or, taking the
    /// plugin lock first, serves every call queued by then as one batch in its own task: a
    /// kubelet that hangs up (its 45 s timeout) does not cut the work short, so a retry finds
    /// it done rather than half done, and a panicking handler costs its batch's claims, not
    /// the connection.
    async fn call<T, F, Fut>(
        &self,
        call: Call,
        claims: Vec<ClaimRef>,
        queue: &Queue<T>,
        run: F,
    ) -> Result<Answers<T>, Status>
    where
        T: Clone + Send + 'static,
        F: FnOnce(Arc<H>, Vec<ClaimRef>) -> Fut,
        Fut: Future<Output = Answers<T>> + Send + 'static,
    {
        let span = info_span!(
            "dra_call",
            call = call.method,
            api = call.api,
            claims = claims.len()
        );
        async {
            let (valid, invalid) = validate_claims(claims);
            let mut results = BTreeMap::new();
            if !valid.is_empty() {
                if call.read_ahead {
                    self.handler.prefetch(&valid).await;
                }
                let (_place, mut answers) = queue.join(valid.clone());
                let answered = tokio::select! {
                    biased;
                    answered = &mut answers => answered.ok(),
                    guard = self.lock.acquire() => {
                        let guard = guard.map_err(lock_failed)?;
                        let batch = queue.take_all();
                        if batch.is_empty() {
                            // Served by the batch that held the lock before.
                            drop(guard);
                        } else {
                            let work = run(Arc::clone(&self.handler), batch.claims());
                            tokio::spawn(
                                async move {
                                    let answered = work.await;
                                    drop(guard);
                                    batch.answer(&answered);
                                }
                                .in_current_span(),
                            );
                        }
                        answers.await.ok()
                    }
                };
                let answered = answered.unwrap_or_else(|| {
                    let reason = "the driver failed internally (its batch panicked)".to_string();
                    // The handler logged none of these: say it once, at warn.
                    warn!(claims = valid.len(), "{reason}");
                    valid
                        .iter()
                        .map(|claim| (claim.uid.clone(), Err(reason.clone())))
                        .collect()
                });
                results = complete_results(&valid, answered);
                for claim in &valid {
                    let _claim = claim_span(claim).entered();
                    match results.get(&claim.uid) {
                        // The handler logs each success with its fields ("prepared",
                        // "unprepared"); one line per claim at info is enough.
                        Some(Ok(_)) => debug!("claim done"),
                        Some(Err(error)) if H::LOGS_FAILURES => debug!(%error, "claim failed"),
                        Some(Err(error)) => warn!(%error, "claim failed"),
                        None => {}
                    }
                }
            }
            merge_invalid(&mut results, invalid);
            Ok(results)
        }
        .instrument(span)
        .await
    }
}

/// What kind of kubelet call [`DraCore::call`] serves.
struct Call {
    /// The gRPC method, for the span.
    method: &'static str,
    /// The wire version, for the span.
    api: &'static str,
    /// Whether the handler reads the claims ahead ([`DraHandler::prefetch`]).
    read_ahead: bool,
}

fn claim_span(claim: &ClaimRef) -> tracing::Span {
    info_span!(
        "claim",
        claim.uid = %claim.uid,
        claim.namespace = %claim.namespace,
        claim.name = %claim.name
    )
}

/// Adds the rejected claims; a UID that was also sent valid keeps the handler's answer.
fn merge_invalid<T>(
    results: &mut BTreeMap<String, Result<T, String>>,
    invalid: BTreeMap<String, String>,
) {
    for (uid, error) in invalid {
        warn!(claim.uid = %uid, %error, "rejected malformed claim");
        results.entry(uid).or_insert(Err(error));
    }
}

/// The lock guards every claim of the call, so without it the whole call fails; the kubelet
/// retries.
fn lock_failed(error: super::KubeletError) -> Status {
    let message = crate::errors::error_chain(&error);
    warn!(error = %message, "cannot serialise DRA call");
    Status::unavailable(message)
}

/// DRAPlugin `k8s.io.kubelet.pkg.apis.dra.v1`.
pub(crate) struct DraV1<H>(pub(crate) Arc<DraCore<H>>);

/// DRAPlugin `k8s.io.kubelet.pkg.apis.dra.v1beta1`.
pub(crate) struct DraV1beta1<H>(pub(crate) Arc<DraCore<H>>);

#[tonic::async_trait]
impl<H: DraHandler> v1::dra_plugin_server::DraPlugin for DraV1<H> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(from_v1)
            .collect();
        let results = self.0.prepare("v1", claims).await?;
        let claims = results
            .into_iter()
            .map(|(uid, outcome)| {
                let answer = match outcome {
                    Ok(devices) => v1::NodePrepareResourceResponse {
                        devices: devices.into_iter().map(device_v1).collect(),
                        error: String::new(),
                    },
                    Err(error) => v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    },
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(from_v1)
            .collect();
        let results = self.0.unprepare("v1", claims).await?;
        let claims = results
            .into_iter()
            .map(|(uid, outcome)| {
                let error = outcome.err().unwrap_or_default();
                (uid, v1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl<H: DraHandler> v1beta1::dra_plugin_server::DraPlugin for DraV1beta1<H> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(from_v1beta1)
            .collect();
        let results = self.0.prepare("v1beta1", claims).await?;
        let claims = results
            .into_iter()
            .map(|(uid, outcome)| {
                let answer = match outcome {
                    Ok(devices) => v1beta1::NodePrepareResourceResponse {
                        devices: devices.into_iter().map(device_v1beta1).collect(),
                        error: String::new(),
                    },
                    Err(error) => v1beta1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    },
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(from_v1beta1)
            .collect();
        let results = self.0.unprepare("v1beta1", claims).await?;
        let claims = results
            .into_iter()
            .map(|(uid, outcome)| {
                let error = outcome.err().unwrap_or_default();
                (uid, v1beta1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

fn from_v1(claim: v1::Claim) -> ClaimRef {
    ClaimRef {
        namespace: claim.namespace,
        name: claim.name,
        uid: claim.uid,
    }
}

fn from_v1beta1(claim: v1beta1::Claim) -> ClaimRef {
    ClaimRef {
        namespace: claim.namespace,
        name: claim.name,
        uid: claim.uid,
    }
}

fn device_v1(device: PreparedDevice) -> v1::Device {
    v1::Device {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: device.share_id,
    }
}

/// v1beta1 has no field for the share ID; kubelets speaking it never use shared devices.
fn device_v1beta1(device: PreparedDevice) -> v1beta1::Device {
    v1beta1::Device {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
    }
}
