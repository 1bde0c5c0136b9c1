//! The DRAResourceHealth service (v1alpha1 and v1): the full device health list on connect and
//! again on every change of the caller's [`HealthSource`].

use std::pin::Pin;

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::info;

use super::proto::{health_v1 as v1, health_v1alpha1 as v1alpha1};

/// The health of one device as the kubelet understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthStatus {
    /// Not (yet) known, e.g. before the first check or after a failed one.
    #[default]
    Unknown,
    /// Working normally.
    Healthy,
    /// Failed a check; pods using it may be affected.
    Unhealthy,
}

/// One entry of the health list streamed to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceHealth {
    /// The ResourceSlice pool the device is published in.
    pub pool_name: String,
    /// The device's name within its pool.
    pub device_name: String,
    /// The verdict of the last check.
    pub status: HealthStatus,
    /// Detail for humans, e.g. the XID error behind an unhealthy status.
    pub message: String,
    /// When `status` was determined, in Unix seconds.
    pub last_updated_unix_seconds: i64,
    /// How long the report stays trustworthy after `last_updated_unix_seconds`.
    pub health_check_timeout_seconds: i64,
}

/// Where the health list comes from: every value sent on the matching `watch::Sender` is
/// streamed, whole, to every watching kubelet. Dropping the sender ends the streams.
pub type HealthSource = watch::Receiver<Vec<DeviceHealth>>;

/// Serves both health versions from one source; `stop` ends every open stream so that a
/// graceful shutdown does not wait for the kubelet to hang up.
#[derive(Clone)]
pub(crate) struct HealthService {
    source: HealthSource,
    stop: CancellationToken,
}

type WireStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl HealthService {
    pub(crate) fn new(source: HealthSource, stop: CancellationToken) -> Self {
        Self { source, stop }
    }

    /// Forwards the current list, then each change, until the kubelet hangs up, the source's
    /// sender is dropped or the server stops.
    fn watch<T: Send + 'static>(
        &self,
        api: &'static str,
        to_wire: fn(&[DeviceHealth]) -> T,
    ) -> WireStream<T> {
        info!(api, "kubelet started watching device health");
        let mut source = self.source.clone();
        let stop = self.stop.clone();
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let message = to_wire(&source.borrow_and_update());
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = source.changed() => if changed.is_err() { return },
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = WireStream<v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.watch("v1", to_v1)))
    }
}

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = WireStream<v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.watch("v1alpha1", to_v1alpha1)))
    }
}

fn to_v1(devices: &[DeviceHealth]) -> v1::NodeWatchResourcesResponse {
    let devices = devices
        .iter()
        .map(|device| v1::DeviceHealth {
            device: Some(v1::DeviceIdentifier {
                pool_name: device.pool_name.clone(),
                device_name: device.device_name.clone(),
            }),
            health: match device.status {
                HealthStatus::Unknown => v1::HealthStatus::Unknown,
                HealthStatus::Healthy => v1::HealthStatus::Healthy,
                HealthStatus::Unhealthy => v1::HealthStatus::Unhealthy,
            }
            .into(),
            last_updated_time: device.last_updated_unix_seconds,
            health_check_timeout_seconds: device.health_check_timeout_seconds,
            message: device.message.clone(),
        })
        .collect();
    v1::NodeWatchResourcesResponse { devices }
}

fn to_v1alpha1(devices: &[DeviceHealth]) -> v1alpha1::NodeWatchResourcesResponse {
    let devices = devices
        .iter()
        .map(|device| v1alpha1::DeviceHealth {
            device: Some(v1alpha1::DeviceIdentifier {
                pool_name: device.pool_name.clone(),
                device_name: device.device_name.clone(),
            }),
            health: match device.status {
                HealthStatus::Unknown => v1alpha1::HealthStatus::Unknown,
                HealthStatus::Healthy => v1alpha1::HealthStatus::Healthy,
                HealthStatus::Unhealthy => v1alpha1::HealthStatus::Unhealthy,
            }
            .into(),
            last_updated_time: device.last_updated_unix_seconds,
            health_check_timeout_seconds: device.health_check_timeout_seconds,
            message: device.message.clone(),
        })
        .collect();
    v1alpha1::NodeWatchResourcesResponse { devices }
}

/// Reads a v1 health list back into [`DeviceHealth`]; used by the kubelet-like client. An
/// unknown status number reads as [`HealthStatus::Unknown`], as the kubelet treats it.
pub(crate) fn from_v1(response: v1::NodeWatchResourcesResponse) -> Vec<DeviceHealth> {
    response
        .devices
        .into_iter()
        .map(|device| {
            let id = device.device.unwrap_or_default();
            DeviceHealth {
                pool_name: id.pool_name,
                device_name: id.device_name,
                status: match v1::HealthStatus::try_from(device.health) {
                    Ok(v1::HealthStatus::Healthy) => HealthStatus::Healthy,
                    Ok(v1::HealthStatus::Unhealthy) => HealthStatus::Unhealthy,
                    Ok(v1::HealthStatus::Unknown) | Err(_) => HealthStatus::Unknown,
                },
                message: device.message,
                last_updated_unix_seconds: device.last_updated_time,
                health_check_timeout_seconds: device.health_check_timeout_seconds,
            }
        })
        .collect()
}

/// Reads a v1alpha1 health list back into [`DeviceHealth`]; the messages are identical to v1.
pub(crate) fn from_v1alpha1(response: v1alpha1::NodeWatchResourcesResponse) -> Vec<DeviceHealth> {
    let devices = response
        .devices
        .into_iter()
        .map(|device| v1::DeviceHealth {
            device: device.device.map(|id| v1::DeviceIdentifier {
                pool_name: id.pool_name,
                device_name: id.device_name,
            }),
            health: device.health,
            last_updated_time: device.last_updated_time,
            health_check_timeout_seconds: device.health_check_timeout_seconds,
            message: device.message,
        })
        .collect();
    from_v1(v1::NodeWatchResourcesResponse { devices })
}
