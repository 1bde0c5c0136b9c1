//! The Registration service the kubelet's plugin watcher talks to.

use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::proto::pluginregistration as wire;

/// The plugin type the kubelet routes to its DRA manager.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// Registration string of the DRAPlugin service, `k8s.io.kubelet.pkg.apis.dra.v1`.
pub const DRA_V1: &str = "v1.DRAPlugin";
/// Registration string of the DRAPlugin service, `k8s.io.kubelet.pkg.apis.dra.v1beta1`.
pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
/// Registration string of the DRAResourceHealth service, package `v1`.
pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
/// Registration string of the DRAResourceHealth service, package `v1alpha1`.
pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";

/// What the kubelet last said about this plugin's registration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RegistrationState {
    /// The kubelet has not reported yet.
    #[default]
    Pending,
    /// The kubelet accepted the plugin and will call it.
    Registered,
    /// The kubelet refused the plugin, with its reason.
    Rejected {
        /// The kubelet's reason, verbatim.
        error: String,
    },
}

/// The services offered on the DRA socket, newest first: the kubelet uses the first one of
/// each kind it understands.
pub fn supported_versions(health: bool) -> Vec<String> {
    let mut versions = vec![DRA_V1, DRA_V1BETA1];
    if health {
        versions.extend([HEALTH_V1, HEALTH_V1ALPHA1]);
    }
    versions.into_iter().map(String::from).collect()
}

pub(crate) struct RegistrationService {
    info: wire::PluginInfo,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    pub(crate) fn new(info: wire::PluginInfo, state: watch::Sender<RegistrationState>) -> Self {
        Self { info, state }
    }
}

#[tonic::async_trait]
impl wire::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<wire::InfoRequest>,
    ) -> Result<Response<wire::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<wire::RegistrationStatus>,
    ) -> Result<Response<wire::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            info!(driver = %self.info.name, "kubelet registered the plugin");
            RegistrationState::Registered
        } else {
            warn!(driver = %self.info.name, error = %status.error, "kubelet rejected the plugin");
            RegistrationState::Rejected {
                error: status.error,
            }
        };
        self.state.send_replace(state);
        Ok(Response::new(wire::RegistrationStatusResponse {}))
    }
}
