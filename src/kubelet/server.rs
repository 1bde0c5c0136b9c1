//! Starting and stopping the two gRPC servers: DRA (plus health) and registration.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tracing::{info, warn};

use super::dra::{DraCore, DraV1, DraV1beta1};
use super::health::HealthService;
use super::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration};
use super::rebind::{Rebound, listen_rebinding};
use super::registration::{PLUGIN_TYPE, RegistrationService, supported_versions};
use super::sockets::create_private_dir;
use super::{DraHandler, HealthSource, KubeletError, PluginLock, PluginSockets, RegistrationState};

type ServerResult = Result<(), tonic::transport::Error>;

/// How long [`RunningPlugin::shutdown`] waits for connections to drain: the kubelet's own
/// timeout for a prepare or unprepare call, after which it has stopped waiting anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(45);

/// The plugin's sockets, being served. Dropping it stops serving at once and removes the
/// sockets; [`RunningPlugin::shutdown`] does the same gracefully.
#[derive(Debug)]
pub struct RunningPlugin {
    sockets: PluginSockets,
    registration: watch::Receiver<RegistrationState>,
    stop: CancellationToken,
    /// Cancelled before the sockets are removed for good, so they are not created again.
    rebinding: CancellationToken,
    dra: (Rebound, Option<JoinHandle<ServerResult>>),
    reg: (Rebound, Option<JoinHandle<ServerResult>>),
}

/// Serves the DRA service (v1 and v1beta1), the health service (v1 and v1alpha1, only with a
/// `health` source) and the registration service on the sockets `config` names, and returns
/// once the kubelet can connect.
///
/// Guarantees:
/// - the DRA socket listens before the registration socket appears, so the kubelet never
///   learns of an endpoint that is not there yet;
/// - stale sockets at either path are replaced; missing directories are created with mode
///   0750 and both sockets get mode 0600;
/// - a socket file deleted while serving (a wiped registry or plugin directory) is created
///   again within a second, so the kubelet registers the plugin again;
/// - prepare and unprepare calls run one at a time under `<plugin-dir>/plugin.lock`, shared
///   with any other instance using the same plugin directory;
/// - one malformed claim never fails a call: it gets its own error entry;
/// - every client's `:authority` is accepted (the socket path the kubelet's plugin watcher
///   sends, grpc-python's percent-encoded path, `localhost`, `host:port`, empty or none), see
///   [`super::authority`]; a client that breaks HTTP/2 loses only its own connection.
///
/// Fails before serving anything on an invalid name or an over-long socket path, when a
/// directory cannot be created, or when something other than a socket sits at a socket path.
/// Must be called within a Tokio runtime.
pub async fn serve<H: DraHandler>(
    config: PluginSockets,
    handler: Arc<H>,
    health: Option<HealthSource>,
) -> Result<RunningPlugin, KubeletError> {
    let sockets = config.validated()?;
    create_private_dir(&sockets.plugin_dir)?;
    let stop = CancellationToken::new();
    let rebinding = CancellationToken::new();

    let core = Arc::new(DraCore::new(handler, PluginLock::new(sockets.lock_file())));
    let health_service = health.map(|source| HealthService::new(source, stop.clone()));
    let serves_health = health_service.is_some();
    let dra_router = Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(DraV1(
            Arc::clone(&core),
        )))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
            DraV1beta1(core),
        ))
        .add_optional_service(
            health_service
                .clone()
                .map(health_v1::dra_resource_health_server::DraResourceHealthServer::new),
        )
        .add_optional_service(
            health_service
                .map(health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new),
        );
    let dra_path = sockets.dra_socket();
    let (incoming, dra_owned) =
        listen_rebinding(&dra_path, stop.clone(), rebinding.clone(), "DRA")?;
    let dra_task = tokio::spawn(
        dra_router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()),
    );

    let info = pluginregistration::PluginInfo {
        r#type: PLUGIN_TYPE.to_string(),
        name: sockets.driver_name.clone(),
        endpoint: dra_path.to_string_lossy().into_owned(),
        supported_versions: supported_versions(serves_health),
    };
    let (state_tx, registration) = watch::channel(RegistrationState::Pending);
    let reg_router = Server::builder().add_service(
        pluginregistration::registration_server::RegistrationServer::new(RegistrationService::new(
            info, state_tx,
        )),
    );
    let reg_path = sockets.registration_socket();
    let (incoming, reg_owned) =
        match listen_rebinding(&reg_path, stop.clone(), rebinding.clone(), "registration") {
            Ok(bound) => bound,
            Err(error) => {
                rebinding.cancel();
                stop.cancel();
                dra_owned.remove();
                return Err(error);
            }
        };
    let reg_task = tokio::spawn(
        reg_router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()),
    );

    info!(
        driver = %sockets.driver_name,
        registration_socket = %reg_path.display(),
        dra_socket = %dra_path.display(),
        health = serves_health,
        "serving kubelet plugin sockets"
    );
    Ok(RunningPlugin {
        sockets,
        registration,
        stop,
        rebinding,
        dra: (dra_owned, Some(dra_task)),
        reg: (reg_owned, Some(reg_task)),
    })
}

impl RunningPlugin {
    /// Follows what the kubelet reports through NotifyRegistrationStatus; starts at
    /// [`RegistrationState::Pending`] and changes on every report.
    pub fn registration_status(&self) -> watch::Receiver<RegistrationState> {
        self.registration.clone()
    }

    /// The configuration being served, with absolute directories.
    pub fn sockets(&self) -> &PluginSockets {
        &self.sockets
    }

    /// The DRA socket, as announced to the kubelet.
    pub fn dra_socket(&self) -> &Path {
        self.dra.0.path()
    }

    /// The registration socket in the kubelet's registry directory.
    pub fn registration_socket(&self) -> &Path {
        self.reg.0.path()
    }

    /// Stops serving gracefully within [`SHUTDOWN_GRACE`]; see
    /// [`RunningPlugin::shutdown_within`].
    pub async fn shutdown(self) -> Result<(), KubeletError> {
        self.shutdown_within(SHUTDOWN_GRACE).await
    }

    /// Stops serving gracefully: removes the registration socket first (the kubelet then
    /// drops the plugin), stops accepting connections, ends health streams, waits for
    /// in-flight prepare/unprepare calls to answer, then removes the DRA socket.
    ///
    /// Connections still open after `grace` (a call that hangs, a peer that never speaks
    /// HTTP/2) are abandoned: they end when the peer hangs up or the process exits. Fails
    /// only if a server ended abnormally; the sockets are removed either way.
    pub async fn shutdown_within(mut self, grace: Duration) -> Result<(), KubeletError> {
        self.rebinding.cancel();
        self.reg.0.remove();
        self.stop.cancel();
        let tasks = [self.reg.1.take(), self.dra.1.take()];
        let aborts: Vec<_> = tasks
            .iter()
            .flatten()
            .map(JoinHandle::abort_handle)
            .collect();
        let [reg_task, dra_task] = tasks;
        let drained = tokio::time::timeout(grace, async {
            let reg = join(self.reg.0.path(), reg_task).await;
            let dra = join(self.dra.0.path(), dra_task).await;
            reg.and(dra)
        })
        .await;
        self.dra.0.remove();
        match drained {
            Ok(result) => {
                info!(driver = %self.sockets.driver_name, "stopped serving kubelet plugin sockets");
                result
            }
            Err(_elapsed) => {
                aborts.iter().for_each(AbortHandle::abort);
                warn!(
                    driver = %self.sockets.driver_name,
                    grace_seconds = grace.as_secs_f64(),
                    "stopped serving kubelet plugin sockets, abandoning connections still open"
                );
                Ok(())
            }
        }
    }
}

async fn join(socket: &Path, task: Option<JoinHandle<ServerResult>>) -> Result<(), KubeletError> {
    let Some(task) = task else { return Ok(()) };
    let socket = PathBuf::from(socket);
    match task.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(KubeletError::Serve { socket, source }),
        Err(source) => Err(KubeletError::ServerTask { socket, source }),
    }
}

impl Drop for RunningPlugin {
    fn drop(&mut self) {
        self.rebinding.cancel();
        self.stop.cancel();
        self.reg.0.remove();
        self.dra.0.remove();
    }
}
