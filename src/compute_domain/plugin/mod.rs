//! `gpu-dra compute-domain-plugin`: the second kubelet plugin, driver
//! `compute-domain.nvidia.com`. It publishes each node's IMEX channel and daemon devices
//! and prepares their claims (see [`handler`] for what prepare and unprepare do).
//!
//! It is a second wiring of the GPU plugin's machinery, not a copy: the same kubelet sockets
//! ([`crate::kubelet::serve`]: registration, DRA v1/v1beta1, the health stream, rebinding
//! after a kubelet restart, the plugin lock), the same slice publisher (which restores
//! slices a restarting kubelet deleted) and the same metrics and probes. What is its own:
//! the devices ([`devices`]), the claim plan ([`plan`]), the IMEX files ([`imex`]), the CDI
//! specs ([`cdi`]), the checkpoint ([`state`]) and the API calls ([`cluster`]).
//!
//! Start-up: read the node's clique, recover under the plugin lock, publish, register.
//! SIGTERM or SIGINT shut down gracefully; slices stay for the next start.
//!
//! Crash points (`GPU_DRA_CRASH_AT`, for tests): `cd-prepare-recorded`,
//! `cd-prepare-before-config`, `cd-prepare-spec-written`.

pub mod cdi;
pub mod cluster;
pub mod config;
pub mod devices;
pub mod handler;
pub mod imex;
pub mod plan;
pub mod state;

use std::sync::Arc;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::cdi::{CdiWriter, ClaimNaming};
use crate::compute_domain::api;
use crate::hardware::GpuBackend;
use crate::kubelet::{self, DeviceHealth, HealthStatus, PluginLock, PluginSockets};
use crate::metrics::{Health, Metrics};
use crate::plugin::BackendChoice;
pub use config::CdPluginConfig;
pub use handler::{CdHandler, CdHandlerParts};

/// Errors that stop the compute-domain plugin from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum CdPluginError {
    /// The GPU backend could not be opened or read (for the node's clique).
    #[error("reading the node's GPUs for their NVLink clique (or pass --clique-id)")]
    Backend(#[source] crate::hardware::HardwareError),
    /// The simulated node could not be built.
    #[error("building the simulated node")]
    Sim(#[source] crate::hardware::sim::SimError),
    /// The node's GPUs disagree about their clique.
    #[error("the node's NVLink clique: {0}")]
    Clique(String),
    /// The driver name cannot name CDI devices (a bug: it is a constant).
    #[error("naming CDI devices")]
    Naming(#[source] crate::cdi::NameError),
    /// The API server could not be reached or configured.
    #[error("connecting to the API server")]
    Kube(#[source] Box<crate::k8s::K8sError>),
    /// The checkpoint could not be read at start-up.
    #[error("start-up recovery")]
    Recovery(#[source] handler::CdClaimError),
    /// The kubelet sockets could not be served.
    #[error("serving the kubelet sockets")]
    Kubelet(#[source] crate::kubelet::KubeletError),
    /// The metrics endpoint could not be served.
    #[error("serving metrics and health probes")]
    Metrics(#[source] crate::metrics::MetricsError),
    /// Waiting for signals failed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// The simulated `nvidia-imex-ctl` could not be installed (host-managed IMEX, sim).
    #[error("installing the simulated nvidia-imex-ctl")]
    ImexTools(#[source] crate::compute_domain::imex::ImexToolError),
    /// Two settings that cannot go together.
    #[error(
        "--binding-conditions cannot be combined with --imex-mode HostManaged: binding conditions \
         wait for a per-domain IMEX daemon to turn Ready, and with the host's nvidia-imex \
         service there is none (every channel claim would fail at --binding-timeout); the \
         host service is checked at prepare instead. Drop one of them (chart: \
         computeDomains.bindingConditions or computeDomains.imex.mode)"
    )]
    BindingConditionsWithHostImex,
}

/// How the host's IMEX service is asked. On a simulated node (`--gpu-backend sim` or
/// `--simulated-host`) in host-managed mode that is the simulated `nvidia-imex-ctl` (this
/// binary, linked under `<state-dir>/sim/imex/`), run directly.
///
/// # Errors
/// [`CdPluginError::ImexTools`] when the simulated tool cannot be linked.
fn host_imex(config: &CdPluginConfig) -> Result<config::HostImex, CdPluginError> {
    if config.imex_mode != config::ImexMode::HostManaged || !config.simulated_devices() {
        return Ok(config.host_imex.clone());
    }
    let exe = std::env::current_exe().map_err(|source| {
        CdPluginError::ImexTools(crate::compute_domain::imex::ImexToolError::Io {
            step: "finding",
            path: std::path::PathBuf::from("/proc/self/exe"),
            source,
        })
    })?;
    let dir = config.state_dir.join("sim").join("imex");
    let (_, ctl) = crate::compute_domain::imex::install_simulated(&exe, &dir)
        .map_err(CdPluginError::ImexTools)?;
    Ok(config::HostImex {
        ctl,
        driver_root: std::path::PathBuf::from("/"),
        ..config.host_imex.clone()
    })
}

/// The node's clique: `--clique-id` when given (empty: none), else what the GPUs report.
///
/// # Errors
/// [`CdPluginError::Backend`] / [`CdPluginError::Sim`] when the GPUs cannot be read,
/// [`CdPluginError::Clique`] when they disagree.
pub fn node_clique(config: &CdPluginConfig) -> Result<Option<String>, CdPluginError> {
    if let Some(clique) = &config.clique_override {
        let clique = clique.trim();
        return Ok((!clique.is_empty()).then(|| clique.to_string()));
    }
    let backend: Box<dyn GpuBackend> = match &config.backend {
        BackendChoice::Sim { sim_node } => Box::new(
            crate::hardware::sim::SimBackend::open(sim_node, None).map_err(CdPluginError::Sim)?,
        ),
        BackendChoice::Nvml { lib } => Box::new(
            crate::hardware::nvml::NvmlBackend::open_with(lib.as_deref())
                .map_err(CdPluginError::Backend)?,
        ),
    };
    let inventory = backend.inventory().map_err(CdPluginError::Backend)?;
    imex::clique_of(&inventory).map_err(CdPluginError::Clique)
}

/// Runs the plugin until SIGTERM/SIGINT. Returns after a graceful shutdown.
///
/// # Errors
/// [`CdPluginError`] for the start-up step that failed.
pub async fn run(config: CdPluginConfig) -> Result<(), CdPluginError> {
    if config.binding_conditions && config.imex_mode == config::ImexMode::HostManaged {
        return Err(CdPluginError::BindingConditionsWithHostImex);
    }
    let metrics = Metrics::new();
    let health = Health::new();
    let _metrics_server = match &config.metrics_addr {
        Some(addr) => Some(
            crate::metrics::serve(addr, metrics.clone(), health.clone())
                .await
                .map_err(CdPluginError::Metrics)?,
        ),
        None => None,
    };
    let clique = node_clique(&config)?;
    let client = crate::k8s::connect(config.kubeconfig.as_deref())
        .await
        .map_err(|e| CdPluginError::Kube(Box::new(e)))?;
    let naming = ClaimNaming::for_driver(api::DRIVER_NAME).map_err(CdPluginError::Naming)?;
    let channels = if config.simulated_devices() {
        cdi::ChannelNodes::Simulated
    } else {
        cdi::ChannelNodes::Host {
            dev_root: config.dev_root.clone(),
        }
    };
    let handler = Arc::new(CdHandler::new(CdHandlerParts {
        cluster: cluster::KubeCluster::new(
            client.clone(),
            config.node_name.clone(),
            config.namespace.clone(),
        ),
        node: config.node_name.clone(),
        namespace: config.namespace.clone(),
        state_dir: config.state_dir.clone(),
        cdi: CdiWriter::with_naming(config.cdi_root.clone(), naming),
        channels,
        clique: clique.clone(),
        max_domains: config.max_domains,
        ready_timeout: config.ready_timeout,
        imex_mode: config.imex_mode,
        host_imex: host_imex(&config)?,
        metrics: metrics.clone(),
        metadata: config.device_metadata.then(|| {
            crate::claims::metadata::MetadataWriter::new(&config.plugin_dir, api::DRIVER_NAME)
        }),
    }));
    let sockets = PluginSockets {
        driver_name: api::DRIVER_NAME.to_string(),
        registry_dir: config.registry_dir.clone(),
        plugin_dir: config.plugin_dir.clone(),
        pod_uid: config.pod_uid.clone(),
    };
    kubelet::create_private_dir(&config.plugin_dir).map_err(CdPluginError::Kubelet)?;
    let paused = PluginLock::new(sockets.lock_file())
        .acquire()
        .await
        .map_err(CdPluginError::Kubelet)?;
    match handler.recover().await {
        Ok(report) => info!(
            rolled_back = ?report.rolled_back,
            stale_specs_removed = ?report.stale_specs_removed,
            stale_configs_removed = ?report.stale_configs_removed,
            "recovered state"
        ),
        Err(e @ handler::CdClaimError::State(_)) => return Err(CdPluginError::Recovery(e)),
        // Files left over are removed by the next unprepare or start; the
        // node's prepared claims must not stay down meanwhile.
        Err(e) => {
            warn!(error = %crate::errors::error_chain(&e), "start-up recovery incomplete; serving anyway")
        }
    }
    drop(paused);
    health.set_recovered();

    let model = devices::model(config.max_domains, config.binding_conditions);
    metrics.set_published_devices(model.devices.len() as u64);
    let (health_tx, health_rx) = watch::channel(device_health(&model, &config.node_name));
    let node = config.node_name.clone();
    let devices_model = model.clone();
    let reporting_health = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(HEALTH_REFRESH);
        loop {
            ticker.tick().await;
            health_tx.send_replace(device_health(&devices_model, &node));
        }
    });
    let (model_tx, model_rx) = watch::channel(model);
    let publisher =
        crate::k8s::SlicePublisher::new(client, api::DRIVER_NAME, config.node_name.clone());
    tokio::spawn(crate::plugin::observe::follow_publisher(
        publisher.status(),
        health.clone(),
    ));
    let publishing = tokio::spawn(async move { publisher.run(model_rx).await });
    let running = kubelet::serve(sockets, handler, Some(health_rx))
        .await
        .map_err(CdPluginError::Kubelet)?;
    tokio::spawn(crate::plugin::observe::follow_registration(
        running.registration_status(),
        health,
        Some(model_tx),
    ));
    info!(
        driver = api::DRIVER_NAME,
        node = %config.node_name,
        clique = clique.as_deref().unwrap_or("none"),
        max_domains = config.max_domains,
        imex_mode = %config.imex_mode,
        dra_socket = %running.dra_socket().display(),
        registration_socket = %running.registration_socket().display(),
        "serving the kubelet"
    );
    crate::plugin::wait_for_shutdown_signal()
        .await
        .map_err(CdPluginError::Signals)?;
    info!("shutting down");
    publishing.abort();
    let stopped = running.shutdown().await.map_err(CdPluginError::Kubelet);
    reporting_health.abort();
    stopped
}

/// How often the (constant) device health is sent again, so the kubelet never sees it
/// outlive [`HEALTH_TIMEOUT_SECONDS`].
const HEALTH_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);
/// How long each health report stays trustworthy for the kubelet.
const HEALTH_TIMEOUT_SECONDS: i64 = 180;

/// Channels and daemons have no hardware state to watch: every published device is
/// reported healthy, so kubelets that ask for device health get a complete list.
fn device_health(model: &crate::devices::DeviceModel, node: &str) -> Vec<DeviceHealth> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    model
        .devices
        .iter()
        .map(|d| DeviceHealth {
            pool_name: node.to_string(),
            device_name: d.name().to_string(),
            status: HealthStatus::Healthy,
            message: String::new(),
            last_updated_unix_seconds: now,
            health_check_timeout_seconds: HEALTH_TIMEOUT_SECONDS,
        })
        .collect()
}
