//! A client that behaves like the kubelet towards a DRA plugin: it reads the registration
//! socket, picks the first offered version it speaks, reports the registration outcome, then
//! prepares, unprepares and watches health over the announced endpoint. Used by tests here and
//! by integration tests of the rest of the driver.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint, Uri};

use super::UnprepareResults;
use super::health::{from_v1, from_v1alpha1};
use super::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration};
use super::registration::{DRA_V1, DRA_V1BETA1, HEALTH_V1, HEALTH_V1ALPHA1, PLUGIN_TYPE};
use super::{ClaimRef, DeviceHealth, KubeletError, PrepareResults, PreparedDevice};
use crate::errors::error_chain;

type RegistrationClient = pluginregistration::registration_client::RegistrationClient<Channel>;
type DraV1Client = dra_v1::dra_plugin_client::DraPluginClient<Channel>;
type DraV1beta1Client = dra_v1beta1::dra_plugin_client::DraPluginClient<Channel>;
type HealthV1Client = health_v1::dra_resource_health_client::DraResourceHealthClient<Channel>;
type HealthV1alpha1Client =
    health_v1alpha1::dra_resource_health_client::DraResourceHealthClient<Channel>;

/// A DRAPlugin version a kubelet may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraApi {
    /// `v1.DRAPlugin`, Kubernetes 1.34 and later.
    V1,
    /// `v1beta1.DRAPlugin`, older kubelets.
    V1beta1,
}

/// A DRAResourceHealth version a kubelet may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthApi {
    /// `v1.DRAResourceHealth`, Kubernetes 1.37 and later.
    V1,
    /// `v1alpha1.DRAResourceHealth`, Kubernetes 1.34 to 1.36.
    V1alpha1,
}

impl DraApi {
    fn registration_name(self) -> &'static str {
        match self {
            DraApi::V1 => DRA_V1,
            DraApi::V1beta1 => DRA_V1BETA1,
        }
    }
}

impl HealthApi {
    fn registration_name(self) -> &'static str {
        match self {
            HealthApi::V1 => HEALTH_V1,
            HealthApi::V1alpha1 => HEALTH_V1ALPHA1,
        }
    }
}

/// The versions the simulated kubelet understands; an older kubelet knows fewer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletVersions {
    /// DRAPlugin versions this kubelet speaks.
    pub dra: Vec<DraApi>,
    /// DRAResourceHealth versions this kubelet speaks; empty for one without the feature.
    pub health: Vec<HealthApi>,
}

impl Default for KubeletVersions {
    /// A current kubelet: every version of both services.
    fn default() -> Self {
        Self {
            dra: vec![DraApi::V1, DraApi::V1beta1],
            health: vec![HealthApi::V1, HealthApi::V1alpha1],
        }
    }
}

/// Opens a gRPC channel over the Unix socket at `path`, connecting eagerly.
pub async fn connect_unix(path: &Path) -> Result<Channel, KubeletError> {
    let socket = path.to_path_buf();
    // The URI is required by the HTTP/2 layer but never resolved: the connector ignores it.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| KubeletError::Connect {
            path: path.to_path_buf(),
            source,
        })
}

enum DraConnection {
    V1(DraV1Client),
    V1beta1(DraV1beta1Client),
}

enum HealthConnection {
    V1(HealthV1Client),
    V1alpha1(HealthV1alpha1Client),
}

/// The kubelet's side of one plugin registration.
pub struct KubeletClient {
    registration: RegistrationClient,
    dra: Option<DraConnection>,
    health: Option<HealthConnection>,
    endpoint: Option<PathBuf>,
}

impl KubeletClient {
    /// Connects to a registration socket without calling anything yet.
    pub async fn connect(registration_socket: &Path) -> Result<Self, KubeletError> {
        let channel = connect_unix(registration_socket).await?;
        Ok(Self {
            registration: RegistrationClient::new(channel),
            dra: None,
            health: None,
            endpoint: None,
        })
    }

    /// Does what the kubelet's plugin watcher does on finding `registration_socket`: GetInfo,
    /// checks the plugin type, picks versions, connects to the endpoint and reports success.
    /// On a mismatch it reports the failure to the plugin, then returns it.
    pub async fn register(
        registration_socket: &Path,
        versions: &KubeletVersions,
    ) -> Result<Self, KubeletError> {
        let mut client = Self::connect(registration_socket).await?;
        let info = client.get_info().await?;
        match client.connect_plugin(&info, versions).await {
            Ok(()) => {
                client.notify(true, "").await?;
                Ok(client)
            }
            Err(error) => {
                client.notify(false, &error_chain(&error)).await?;
                Err(error)
            }
        }
    }

    /// Calls GetInfo.
    pub async fn get_info(&mut self) -> Result<pluginregistration::PluginInfo, KubeletError> {
        let request = pluginregistration::InfoRequest {};
        let response = self.registration.get_info(request).await;
        Ok(response.map_err(rpc("GetInfo"))?.into_inner())
    }

    /// Calls NotifyRegistrationStatus.
    pub async fn notify(&mut self, registered: bool, error: &str) -> Result<(), KubeletError> {
        let status = pluginregistration::RegistrationStatus {
            plugin_registered: registered,
            error: error.to_string(),
        };
        let response = self.registration.notify_registration_status(status).await;
        response.map_err(rpc("NotifyRegistrationStatus"))?;
        Ok(())
    }

    /// Picks, for each service, the first version in `info` that `versions` contains (as the
    /// kubelet does) and connects to the announced endpoint.
    pub async fn connect_plugin(
        &mut self,
        info: &pluginregistration::PluginInfo,
        versions: &KubeletVersions,
    ) -> Result<(), KubeletError> {
        if info.r#type != PLUGIN_TYPE {
            return Err(KubeletError::UnexpectedPluginType {
                want: PLUGIN_TYPE,
                got: info.r#type.clone(),
            });
        }
        let offered = |name: &str| info.supported_versions.iter().position(|v| v == name);
        let dra = versions
            .dra
            .iter()
            .filter_map(|api| offered(api.registration_name()).map(|at| (at, *api)))
            .min_by_key(|(at, _)| *at)
            .map(|(_, api)| api)
            .ok_or_else(|| KubeletError::NoCommonVersion {
                offered: info.supported_versions.clone(),
                supported: versions
                    .dra
                    .iter()
                    .map(|api| api.registration_name())
                    .collect(),
            })?;
        let health = versions
            .health
            .iter()
            .filter_map(|api| offered(api.registration_name()).map(|at| (at, *api)))
            .min_by_key(|(at, _)| *at)
            .map(|(_, api)| api);

        let endpoint = PathBuf::from(&info.endpoint);
        let channel = connect_unix(&endpoint).await?;
        self.dra = Some(match dra {
            DraApi::V1 => DraConnection::V1(DraV1Client::new(channel.clone())),
            DraApi::V1beta1 => DraConnection::V1beta1(DraV1beta1Client::new(channel.clone())),
        });
        self.health = health.map(|api| match api {
            HealthApi::V1 => HealthConnection::V1(HealthV1Client::new(channel.clone())),
            HealthApi::V1alpha1 => {
                HealthConnection::V1alpha1(HealthV1alpha1Client::new(channel.clone()))
            }
        });
        self.endpoint = Some(endpoint);
        Ok(())
    }

    /// The DRA version picked, once connected.
    pub fn dra_api(&self) -> Option<DraApi> {
        self.dra.as_ref().map(|dra| match dra {
            DraConnection::V1(_) => DraApi::V1,
            DraConnection::V1beta1(_) => DraApi::V1beta1,
        })
    }

    /// The health version picked, if the plugin offers one this kubelet speaks.
    pub fn health_api(&self) -> Option<HealthApi> {
        self.health.as_ref().map(|health| match health {
            HealthConnection::V1(_) => HealthApi::V1,
            HealthConnection::V1alpha1(_) => HealthApi::V1alpha1,
        })
    }

    /// The DRA endpoint announced by the plugin, once connected.
    pub fn endpoint(&self) -> Option<&Path> {
        self.endpoint.as_deref()
    }

    /// NodePrepareResources over the picked version; per-claim errors come back as `Err`.
    pub async fn prepare(&mut self, claims: &[ClaimRef]) -> Result<PrepareResults, KubeletError> {
        const CALL: &str = "NodePrepareResources";
        match self.dra.as_mut() {
            None => Err(KubeletError::NotConnected { call: CALL }),
            Some(DraConnection::V1(client)) => {
                let claims = claims.iter().map(claim_v1).collect();
                let request = dra_v1::NodePrepareResourcesRequest { claims };
                let response = client.node_prepare_resources(request).await;
                let response = response.map_err(rpc(CALL))?.into_inner();
                Ok(collect(response.claims, |answer| {
                    outcome(
                        answer.error,
                        answer.devices.into_iter().map(device_v1).collect(),
                    )
                }))
            }
            Some(DraConnection::V1beta1(client)) => {
                let claims = claims.iter().map(claim_v1beta1).collect();
                let request = dra_v1beta1::NodePrepareResourcesRequest { claims };
                let response = client.node_prepare_resources(request).await;
                let response = response.map_err(rpc(CALL))?.into_inner();
                Ok(collect(response.claims, |answer| {
                    let devices = answer.devices.into_iter().map(device_v1beta1).collect();
                    outcome(answer.error, devices)
                }))
            }
        }
    }

    /// NodeUnprepareResources over the picked version; per-claim errors come back as `Err`.
    pub async fn unprepare(
        &mut self,
        claims: &[ClaimRef],
    ) -> Result<UnprepareResults, KubeletError> {
        const CALL: &str = "NodeUnprepareResources";
        match self.dra.as_mut() {
            None => Err(KubeletError::NotConnected { call: CALL }),
            Some(DraConnection::V1(client)) => {
                let claims = claims.iter().map(claim_v1).collect();
                let request = dra_v1::NodeUnprepareResourcesRequest { claims };
                let response = client.node_unprepare_resources(request).await;
                let response = response.map_err(rpc(CALL))?.into_inner();
                Ok(collect(response.claims, |answer| outcome(answer.error, ())))
            }
            Some(DraConnection::V1beta1(client)) => {
                let claims = claims.iter().map(claim_v1beta1).collect();
                let request = dra_v1beta1::NodeUnprepareResourcesRequest { claims };
                let response = client.node_unprepare_resources(request).await;
                let response = response.map_err(rpc(CALL))?.into_inner();
                Ok(collect(response.claims, |answer| outcome(answer.error, ())))
            }
        }
    }

    /// NodeWatchResources over the picked health version.
    pub async fn watch_health(&mut self) -> Result<HealthWatch, KubeletError> {
        const CALL: &str = "NodeWatchResources";
        match self.health.as_mut() {
            None => Err(KubeletError::NotConnected { call: CALL }),
            Some(HealthConnection::V1(client)) => {
                let request = health_v1::NodeWatchResourcesRequest {};
                let stream = client.node_watch_resources(request).await;
                Ok(HealthWatch::V1(stream.map_err(rpc(CALL))?.into_inner()))
            }
            Some(HealthConnection::V1alpha1(client)) => {
                let request = health_v1alpha1::NodeWatchResourcesRequest {};
                let stream = client.node_watch_resources(request).await;
                Ok(HealthWatch::V1alpha1(
                    stream.map_err(rpc(CALL))?.into_inner(),
                ))
            }
        }
    }
}

/// An open NodeWatchResources stream.
pub enum HealthWatch {
    /// Watching over `v1.DRAResourceHealth`.
    V1(Streaming<health_v1::NodeWatchResourcesResponse>),
    /// Watching over `v1alpha1.DRAResourceHealth`.
    V1alpha1(Streaming<health_v1alpha1::NodeWatchResourcesResponse>),
}

impl HealthWatch {
    /// The next full health list; `None` once the plugin ends the stream.
    pub async fn next(&mut self) -> Result<Option<Vec<DeviceHealth>>, KubeletError> {
        let map_err = rpc("NodeWatchResources");
        match self {
            HealthWatch::V1(stream) => Ok(stream.message().await.map_err(map_err)?.map(from_v1)),
            HealthWatch::V1alpha1(stream) => {
                Ok(stream.message().await.map_err(map_err)?.map(from_v1alpha1))
            }
        }
    }
}

fn rpc(call: &'static str) -> impl Fn(tonic::Status) -> KubeletError {
    move |source| KubeletError::Rpc { call, source }
}

fn outcome<T>(error: String, value: T) -> Result<T, String> {
    if error.is_empty() {
        Ok(value)
    } else {
        Err(error)
    }
}

fn collect<W, T>(
    claims: BTreeMap<String, W>,
    convert: impl Fn(W) -> Result<T, String>,
) -> BTreeMap<String, Result<T, String>> {
    claims
        .into_iter()
        .map(|(uid, answer)| (uid, convert(answer)))
        .collect()
}

fn claim_v1(claim: &ClaimRef) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: claim.namespace.clone(),
        uid: claim.uid.clone(),
        name: claim.name.clone(),
    }
}

fn claim_v1beta1(claim: &ClaimRef) -> dra_v1beta1::Claim {
    dra_v1beta1::Claim {
        namespace: claim.namespace.clone(),
        uid: claim.uid.clone(),
        name: claim.name.clone(),
    }
}

fn device_v1(device: dra_v1::Device) -> PreparedDevice {
    PreparedDevice {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: device.share_id,
    }
}

fn device_v1beta1(device: dra_v1beta1::Device) -> PreparedDevice {
    PreparedDevice {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: None,
    }
}
