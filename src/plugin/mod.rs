//! `gpu-dra kubelet-plugin`: the composition of GPU backend, claim lifecycle, CDI, checkpoint,
//! kubelet sockets and API-server publishing into the running driver.
//!
//! Start-up order: open the backend, recover (checkpoint, orphaned MIG devices, stale CDI
//! specs) under the plugin lock, publish the node's ResourceSlices in the background, then
//! register with the kubelet. A watcher re-reads the inventory periodically: a changed device
//! model is re-published, changed health is streamed to the kubelet. SIGTERM or SIGINT shut down
//! gracefully (in-flight calls finish, sockets are removed; slices stay for the next start).
//!
//! With a metrics address, `/metrics`, `/healthz` and `/readyz` are served from the very
//! start; `/readyz` turns ready once recovery finished, the slices were published once and
//! the kubelet registered the plugin.

pub mod claim_status;
pub mod config;
pub mod fabric;
pub mod handler;
pub mod holders;
pub mod inventory_watch;
pub mod memory;
pub mod observe;
pub mod orphans;
pub mod recovery;
pub mod simhost;
mod source;
mod start_checks;
pub mod telemetry;
pub mod usage;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::cdi::{self, CdiWriter, ClaimNaming, DriverOptions, HostLayout};
use crate::claims::sharing::SharingSetup;
use crate::claims::{ClaimsManager, HostFactsSource};
use crate::devices::{DeviceModel, ModelOptions};
use crate::hardware::GpuBackend;
use crate::hardware::nvml::NvmlBackend;
use crate::hardware::sim::SimBackend;
use crate::kubelet::{self, PluginLock, PluginSockets};
use crate::metrics::{Health, Metrics};
use crate::sharing::{MpsManager, MpsOptions, Tools};
pub use config::{BackendChoice, PluginConfig};

/// Errors that stop the plugin from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The GPU backend could not be opened.
    #[error("opening the GPU backend")]
    Backend(#[source] crate::hardware::HardwareError),
    /// The simulated node could not be built.
    #[error("building the simulated node")]
    Sim(#[source] crate::hardware::sim::SimError),
    /// The boot ID could not be read.
    #[error("reading the node's boot ID")]
    BootId(#[source] crate::checkpoint::BootIdError),
    /// The driver name is not usable for CDI names.
    #[error("driver name {driver:?} cannot name CDI devices")]
    Naming {
        /// Driver name.
        driver: String,
        /// Cause.
        #[source]
        source: crate::cdi::NameError,
    },
    /// Start-up recovery failed.
    #[error("start-up recovery")]
    Recovery(#[source] crate::claims::ClaimError),
    /// The API server could not be reached or configured.
    #[error("connecting to the API server")]
    Kube(#[source] crate::k8s::K8sError),
    /// The kubelet sockets could not be served.
    #[error("serving the kubelet sockets")]
    Kubelet(#[source] crate::kubelet::KubeletError),
    /// The metrics endpoint could not be served.
    #[error("serving metrics and health probes")]
    Metrics(#[source] crate::metrics::MetricsError),
    /// The health policy file was refused.
    #[error("loading the health policy")]
    HealthPolicy(#[source] crate::health::PolicyError),
    /// `--passthrough` cannot work on this node (IOMMU off, no host tree).
    #[error("--passthrough")]
    Passthrough(#[source] crate::hardware::passthrough::PassthroughError),
    /// `--passthrough` with a simulated node that simulates no host tree.
    #[error(
        "--passthrough: the simulated node {node:?} simulates no host PCI tree; use a preset with one (hgx-h100-passthrough) or add a `passthrough:` section to the node file"
    )]
    NoSimulatedHost {
        /// The node given.
        node: String,
    },
    /// `--vgpu-types` on a node whose vGPU files cannot be found (a simulated node without a
    /// host tree, or `--simulated-host` without `--host-root`).
    #[error("--vgpu-types: {reason}")]
    NoVgpuHost {
        /// What is missing and what to do.
        reason: String,
    },
    /// `--mig-profiles` names a profile no GPU of the node has.
    #[error("checking --mig-profiles against the node's GPUs")]
    MigProfiles(#[source] crate::devices::MigProfilesError),
    /// `--vgpu-types` names a type the GPUs do not offer, or types that cannot share a GPU.
    #[error("checking --vgpu-types against the node's GPUs")]
    VgpuTypes(#[source] crate::devices::VgpuTypesError),
    /// `--fabric-manager` is on and FM is not usable (fmpm missing, FM unreachable, or its
    /// partition list invalid).
    #[error("Fabric Manager (--fabric-manager)")]
    FabricManager(#[source] crate::fabric_manager::FabricError),
    /// Waiting for signals failed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
}

/// The host's PCI bus when `--passthrough` is on: under `--host-root` (or `/`) written to the
/// real kernel, or the simulated node's tree and its simulated kernel with the sim backend.
///
/// # Errors
/// [`PluginError::Passthrough`] when the IOMMU is off (NVIDIA's driver refuses to start
/// then too); [`PluginError::NoSimulatedHost`] for a simulated node without a host tree.
fn passthrough_host(
    config: &PluginConfig,
    sim_host_root: Option<PathBuf>,
) -> Result<Option<Arc<crate::hardware::passthrough::PciHost>>, Box<PluginError>> {
    use crate::hardware::passthrough::{HostKernel, PciHost, SysfsKernel};
    if !config.passthrough {
        return Ok(None);
    }
    let (root, kernel): (PathBuf, Arc<dyn SysfsKernel>) = match &config.backend {
        BackendChoice::Sim { sim_node } => {
            let Some(root) = config.host_root.clone().or(sim_host_root) else {
                return Err(Box::new(PluginError::NoSimulatedHost {
                    node: sim_node.clone(),
                }));
            };
            let kernel = Arc::new(crate::hardware::sim::sysfs::SimKernel::new(&root));
            (root, kernel)
        }
        // The simulated NVML library keeps the simulated node's host tree in its state dir.
        BackendChoice::Nvml { .. } if config.simulated_host => {
            let Some(root) = config.host_root.clone() else {
                return Err(Box::new(PluginError::NoSimulatedHost {
                    node: "--simulated-host without --host-root (give the simulated node's <GPU_DRA_SIM_STATE_DIR>/host-root)".into(),
                }));
            };
            let kernel = Arc::new(crate::hardware::sim::sysfs::SimKernel::new(&root));
            (root, kernel)
        }
        BackendChoice::Nvml { .. } => (
            config
                .host_root
                .clone()
                .unwrap_or_else(|| PathBuf::from("/")),
            Arc::new(HostKernel),
        ),
    };
    let pci = PciHost::new(root, kernel);
    pci.require_iommu()
        .map_err(|e| Box::new(PluginError::Passthrough(e)))?;
    Ok(Some(Arc::new(pci)))
}

/// The host's vGPU files, and the kernel that acts on their writes.
type VgpuHostParts = (
    Arc<crate::hardware::vgpu::VgpuHost>,
    Arc<dyn crate::hardware::passthrough::SysfsKernel>,
);

/// The host's vGPU files and the kernel that acts on their writes when `--vgpu-types` is on:
/// under `--host-root` (or `/`) on a host, or the simulated node's tree and its simulated
/// kernel (with the sim backend, or `--simulated-host` and the tree given as `--host-root`).
///
/// # Errors
/// [`PluginError::NoVgpuHost`] when a simulated node has no host tree to find them in.
fn vgpu_host(
    config: &PluginConfig,
    sim_host_root: Option<PathBuf>,
) -> Result<Option<VgpuHostParts>, Box<PluginError>> {
    use crate::hardware::passthrough::{HostKernel, SysfsKernel};
    if !config.vgpu_types.is_on() {
        return Ok(None);
    }
    let simulated = |root: Option<PathBuf>, missing: &str| match root {
        Some(root) => {
            let kernel: Arc<dyn SysfsKernel> =
                Arc::new(crate::hardware::sim::sysfs::SimKernel::new(&root));
            Ok((root, kernel))
        }
        None => Err(Box::new(PluginError::NoVgpuHost {
            reason: missing.to_string(),
        })),
    };
    let (root, kernel) = match &config.backend {
        BackendChoice::Sim { sim_node } => simulated(
            config.host_root.clone().or(sim_host_root),
            &format!(
                "the simulated node {sim_node:?} simulates no vGPU host; use a preset with one (hgx-h100-vgpu, l40s-vgpu, t4-vgpu-mdev) or add `vgpu:` to a GPU group of the node file"
            ),
        )?,
        BackendChoice::Nvml { .. } if config.simulated_host => simulated(
            config.host_root.clone(),
            "--simulated-host without --host-root: give the simulated node's <GPU_DRA_SIM_STATE_DIR>/host-root",
        )?,
        BackendChoice::Nvml { .. } => (
            config
                .host_root
                .clone()
                .unwrap_or_else(|| PathBuf::from("/")),
            Arc::new(HostKernel) as Arc<dyn SysfsKernel>,
        ),
    };
    let host = crate::hardware::vgpu::VgpuHost::new(root, Arc::clone(&kernel));
    Ok(Some((Arc::new(host), kernel)))
}

/// Runs the plugin until SIGTERM/SIGINT. Returns after a graceful shutdown.
pub async fn run(config: PluginConfig) -> Result<(), PluginError> {
    let metrics = Metrics::new();
    let health = Health::new();
    let health_policy = match &config.health_policy {
        Some(path) => crate::health::HealthPolicy::load(path).map_err(PluginError::HealthPolicy)?,
        None => crate::health::HealthPolicy::default(),
    };
    let _metrics_server = match &config.metrics_addr {
        Some(addr) => Some(
            crate::metrics::serve(addr, metrics.clone(), health.clone())
                .await
                .map_err(PluginError::Metrics)?,
        ),
        None => None,
    };
    let mut sim_host_root = None;
    let (backend, host, default_policies): (Arc<dyn GpuBackend>, Box<dyn HostFactsSource>, _) =
        match &config.backend {
            BackendChoice::Sim { sim_node } => {
                let state = config.state_dir.join("sim");
                let sim = SimBackend::open(sim_node, Some(&state)).map_err(PluginError::Sim)?;
                let policies = sim.mig_policies();
                sim_host_root = sim.host_root().map(Path::to_path_buf);
                (
                    Arc::new(sim),
                    Box::new(simhost::SimHostFacts),
                    Some(policies),
                )
            }
            BackendChoice::Nvml { lib } => {
                let nvml = NvmlBackend::open_with(lib.as_deref()).map_err(PluginError::Backend)?;
                let host: Box<dyn HostFactsSource> = if config.simulated_host {
                    Box::new(simhost::SimHostFacts)
                } else {
                    let layout = HostLayout {
                        dev_root: config.dev_root.clone(),
                        proc_root: config.proc_root.clone(),
                        driver_root: config.driver_root.clone(),
                        host_driver_root: config.host_driver_root.clone(),
                    };
                    Box::new(cdi::HostMode::Real {
                        layout,
                        driver: DriverOptions::default(),
                    })
                };
                (Arc::new(nvml), host, None)
            }
        };
    let vgpu = vgpu_host(&config, sim_host_root.clone()).map_err(|e| *e)?;
    let pci = passthrough_host(&config, sim_host_root).map_err(|e| *e)?;
    let backend: Arc<dyn GpuBackend> = match &pci {
        Some(pci) => Arc::new(crate::hardware::passthrough::PassthroughBackend::new(
            backend,
            Arc::clone(pci),
        )),
        None => backend,
    };
    let backend: Arc<dyn GpuBackend> = match &vgpu {
        Some((host, _)) => Arc::new(crate::hardware::vgpu::VgpuBackend::new(
            backend,
            Arc::clone(host),
        )),
        None => backend,
    };
    let sharing = sharing_setup(&config);
    let mut model_options = ModelOptions::with_policies(&config.driver_name, &[]);
    match (config.mig_policy, default_policies) {
        (Some(policy), _) => model_options.default_policy = Some(policy),
        (None, Some(per_gpu)) => {
            model_options = ModelOptions::with_policies(&config.driver_name, &per_gpu)
        }
        (None, None) => {}
    }
    model_options
        .policies
        .extend(config.gpu_mig_policies.clone());
    model_options.shared_gpus = config.shared_gpus;
    model_options.mig_profiles = config.mig_profiles.clone();
    model_options.slice_layout = config.slice_layout;
    model_options.mig_attributes = config.mig_attributes;
    model_options.vgpu_types = config.vgpu_types.clone();
    model_options.compatibility_groups = config.compatibility_groups;
    model_options.partitionable_devices_type = config.partitionable_devices_type;
    model_options.passthrough = pci.is_some();
    let fabric = match &config.fabric_manager {
        Some(fm) => {
            // The simulated FM reads the node's state file, written by the first read.
            backend.inventory().map_err(PluginError::Backend)?;
            let fabric = fabric::setup(&config, fm).map_err(PluginError::FabricManager)?;
            model_options.fabric_partitions = Some(Arc::clone(&fabric.table));
            Some(fabric)
        }
        None => None,
    };
    let boot_id = crate::checkpoint::boot_id(&config.proc_root).map_err(PluginError::BootId)?;
    let naming =
        ClaimNaming::for_driver(&config.driver_name).map_err(|source| PluginError::Naming {
            driver: config.driver_name.clone(),
            source,
        })?;
    let client = crate::k8s::connect(config.kubeconfig.as_deref())
        .await
        .map_err(PluginError::Kube)?;
    let usage = Arc::new(usage::UsageTracker::open(
        &config.state_dir,
        metrics.clone(),
    ));
    // Before the first claim is read and the first telemetry sample: the pods of claims
    // prepared by an earlier run.
    let reservations = Arc::new(holders::Reservations::load(&config.state_dir));
    let manager = Arc::new(ClaimsManager {
        backend: backend.clone(),
        source: source::ApiClaims::new(
            crate::k8s::ClaimReader::new(
                client.clone(),
                config.driver_name.clone(),
                config.node_name.clone(),
            ),
            Some(Arc::clone(&usage)),
            Some(Arc::clone(&reservations)),
        ),
        host,
        cdi: CdiWriter::with_naming(config.cdi_root.clone(), naming.clone()),
        naming,
        model_options: model_options.clone(),
        pool: config.node_name.clone(),
        state_dir: config.state_dir.clone(),
        boot_id,
        model_cache: Default::default(),
        checkpoint_cache: Default::default(),
        sharing,
        prepared: Default::default(),
        metadata: config
            .device_metadata
            .then(|| match &config.device_metadata_dir {
                Some(dir) => {
                    crate::claims::metadata::MetadataWriter::in_dir(dir, &config.driver_name)
                }
                None => crate::claims::metadata::MetadataWriter::new(
                    &config.plugin_dir,
                    &config.driver_name,
                ),
            }),
        pci,
        fabric,
        vgpu: vgpu.map(|(host, kernel)| crate::claims::vgpu::VgpuSetup::new(host, kernel)),
    });
    let sockets = PluginSockets {
        driver_name: config.driver_name.clone(),
        registry_dir: config.registry_dir.clone(),
        plugin_dir: config.plugin_dir.clone(),
        pod_uid: config.pod_uid.clone(),
    };
    // During a seamless rolling update the other instance may be half-way through a call;
    // recovering then would undo its work under its feet. Its calls hold the plugin lock.
    kubelet::create_private_dir(&config.plugin_dir).map_err(PluginError::Kubelet)?;
    let calls_paused = PluginLock::new(sockets.lock_file())
        .acquire()
        .await
        .map_err(PluginError::Kubelet)?;
    let report = match manager.recover() {
        Ok(report) => report,
        // Steps that failed (a read-only or full CDI or state directory, a tool that failed)
        // must not keep the node's every other claim down in a crash loop: the unfinished
        // claims stay recorded, their devices stay busy, and supervision retries them every
        // --inventory-interval. Only a checkpoint that cannot be opened stops the start.
        Err(crate::claims::ClaimError::Undo { failures, .. }) => {
            for failure in &failures {
                warn!(
                    error = %crate::errors::error_chain(failure),
                    "undo incomplete at start-up; starting anyway, retried with backoff"
                );
                metrics.record_error(failure.kind());
            }
            crate::claims::RecoveryReport {
                checkpoint: "opened".into(),
                undo_failed: failures
                    .iter()
                    .map(|e| crate::errors::error_chain(e))
                    .collect(),
                ..Default::default()
            }
        }
        Err(e) => return Err(PluginError::Recovery(e)),
    };
    drop(calls_paused);
    health.set_recovered();
    metrics.set_prepared_claims(manager.prepared_count());
    info!(
        checkpoint = %report.checkpoint,
        rolled_back = ?report.rolled_back,
        orphans_destroyed = ?report.orphans_destroyed,
        stale_specs_removed = ?report.stale_specs_removed,
        mps_orphans_stopped = ?report.mps_orphans_stopped,
        mps_restarted = ?report.mps_restarted,
        mps_failed = ?report.mps_failed,
        undo_failed = ?report.undo_failed,
        vfio_reclaimed = ?report.vfio_reclaimed,
        vgpus_deleted = ?report.vgpus_deleted,
        "recovered state"
    );
    // Serve through an unfinished recovery: report it and retry it until it converges.
    let retrying_recovery = (!report.undo_failed.is_empty()).then(|| {
        let unfinished = recovery::Unfinished {
            manager: Arc::clone(&manager),
            lock: PluginLock::new(sockets.lock_file()),
            events: Some(crate::k8s::NodeEvents::new(
                client.clone(),
                config.node_name.clone(),
            )),
            metrics: metrics.clone(),
            backoff: recovery::default_backoff(),
        };
        tokio::spawn(unfinished.run(report.undo_failed.clone()))
    });

    let stamp = backend.inventory_stamp();
    let inventory = backend.inventory().map_err(PluginError::Backend)?;
    // The first kubelet calls plan with this inventory's model unless the hardware changes.
    manager.remember_inventory(inventory.clone(), stamp);
    crate::devices::profiles::check(&model_options.mig_profiles, &inventory)
        .map_err(PluginError::MigProfiles)?;
    crate::devices::vgpu_config::check(
        &model_options.vgpu_types,
        &inventory,
        model_options.compatibility_groups,
    )
    .map_err(PluginError::VgpuTypes)?;
    start_checks::log(&config, &inventory);
    let watcher = inventory_watch::Watcher {
        backend: backend.clone(),
        options: model_options,
        policy: health_policy,
        pool: config.node_name.clone(),
        interval: config.inventory_interval,
        state_dir: manager.state_dir.clone(),
        boot_id: manager.boot_id.clone(),
        metrics: metrics.clone(),
    };
    let (model, first_health) = watcher.first(&inventory);
    usage.set_model(&model);
    usage.reconcile_snapshot(&crate::checkpoint::read_unlocked(
        &manager.state_dir,
        &manager.boot_id,
    ));
    for w in &model.warnings {
        warn!(warning = %w, "device model");
    }
    let (health_tx, health_rx) = watch::channel(first_health);
    let (model_tx, model_rx) = watch::channel(model);
    let accounting = tokio::spawn(account_usage(
        Arc::clone(&usage),
        model_tx.subscribe(),
        manager.state_dir.clone(),
        manager.boot_id.clone(),
        config.inventory_interval,
    ));
    let persisting = tokio::spawn(Arc::clone(&usage).persist());
    let sampling = tokio::spawn(telemetry::sample(
        backend.clone(),
        metrics.clone(),
        reservations,
        manager.state_dir.clone(),
        manager.boot_id.clone(),
        config.telemetry_interval,
        Some(telemetry::HolderRefresh {
            reader: crate::k8s::ClaimReader::new(
                client.clone(),
                config.driver_name.clone(),
                config.node_name.clone(),
            ),
            every: config.holders_refresh_interval,
        }),
    ));
    let (status_queue, status_claims) = claim_status::StatusQueue::new();
    let reporting_status = tokio::spawn(claim_status::run(
        claim_status::StatusWorker {
            writer: crate::k8s::ClaimStatusWriter::new(
                client.clone(),
                config.driver_name.clone(),
                config.node_name.clone(),
            ),
            state_dir: manager.state_dir.clone(),
            boot_id: manager.boot_id.clone(),
            health: health_rx.clone(),
            metrics: metrics.clone(),
            backoff: claim_status::default_backoff(),
        },
        status_claims,
    ));
    let orphan_lookup = crate::k8s::ClaimLookup::new(
        client.clone(),
        config.driver_name.clone(),
        config.node_name.clone(),
    );
    let orphan_boot_id = manager.boot_id.clone();
    let publisher = crate::k8s::SlicePublisher::new(
        client,
        config.driver_name.clone(),
        config.node_name.clone(),
    );
    tokio::spawn(observe::follow_publisher(
        publisher.status(),
        health.clone(),
    ));
    let publishing = tokio::spawn(async move { publisher.run(model_rx).await });
    let republish = model_tx.clone();
    let watching = tokio::spawn(watcher.run(inventory, model_tx, health_tx));

    let supervising = tokio::spawn(supervise_mps(
        Arc::clone(&manager),
        PluginLock::new(sockets.lock_file()),
        config.inventory_interval,
        metrics.clone(),
    ));
    let records: claim_status::RecordLookup = {
        let manager = Arc::clone(&manager);
        Arc::new(move |uids: &[&str]| manager.recorded_if_cached(uids))
    };
    let reads: claim_status::ReadLookup = {
        let reads = manager.source.reads.clone();
        Arc::new(move |uids: &[&str]| reads.take(uids))
    };
    let handler = Arc::new(claim_status::Reporting {
        records: Some(records),
        reads: Some(reads),
        inner: handler::Handler {
            manager,
            metrics: metrics.clone(),
            usage: Some(Arc::clone(&usage)),
        },
        queue: status_queue,
    });
    let reclaiming = (!config.orphan_grace_period.is_zero()).then(|| {
        tokio::spawn(
            orphans::Orphans {
                handler: Arc::clone(&handler),
                lock: PluginLock::new(sockets.lock_file()),
                lookup: orphan_lookup,
                state_dir: config.state_dir.clone(),
                boot_id: orphan_boot_id,
                grace: config.orphan_grace_period,
                metrics: metrics.clone(),
            }
            .run(),
        )
    });
    let releasing = tokio::spawn(memory::release_after_calls(memory::QUIET_AFTER_CALLS));
    let running = kubelet::serve(sockets, handler, Some(health_rx))
        .await
        .map_err(PluginError::Kubelet)?;
    tokio::spawn(observe::follow_registration(
        running.registration_status(),
        health,
        Some(republish),
    ));
    info!(
        driver = %config.driver_name,
        node = %config.node_name,
        dra_socket = %running.dra_socket().display(),
        registration_socket = %running.registration_socket().display(),
        "serving the kubelet"
    );

    wait_for_shutdown_signal()
        .await
        .map_err(PluginError::Signals)?;
    info!("shutting down");
    watching.abort();
    accounting.abort();
    persisting.abort();
    sampling.abort();
    supervising.abort();
    publishing.abort();
    reporting_status.abort();
    releasing.abort();
    for task in [reclaiming, retrying_recovery].into_iter().flatten() {
        task.abort();
    }
    let stopped = running.shutdown().await.map_err(PluginError::Kubelet);
    // In-flight calls are done: what they changed in the ledger is written before exit.
    let _ = tokio::task::spawn_blocking(move || usage.flush()).await;
    stopped
}

/// The sharing tools: simulated ones with the sim backend and the default driver root (so a
/// node without GPUs still runs MPS and time-slicing claims), else the driver root's. Without
/// tools, claims that ask for sharing are refused with the reason; everything else works.
fn sharing_setup(config: &PluginConfig) -> Option<SharingSetup> {
    let simulated = (matches!(config.backend, BackendChoice::Sim { .. }) || config.simulated_host)
        && config.driver_root == std::path::Path::new("/");
    let tools = if simulated {
        std::env::current_exe()
            .map_err(|e| e.to_string())
            .and_then(|exe| {
                Tools::simulated(&exe, &config.state_dir.join("sim").join("tools"))
                    .map_err(|e| crate::errors::error_chain(&e))
            })
    } else {
        Tools::from_driver_root(&config.driver_root).map_err(|e| crate::errors::error_chain(&e))
    };
    match tools {
        Ok(tools) => {
            info!(
                nvidia_smi = %tools.nvidia_smi.display(),
                mps_control = %tools.mps_control.display(),
                simulated,
                mps = config.mps,
                time_slicing = config.time_slicing,
                "sharing tools"
            );
            let options = MpsOptions {
                isolate_shm: !simulated,
                proc_root: config.proc_root.clone(),
                ..MpsOptions::default()
            };
            Some(SharingSetup {
                mps: MpsManager::new(tools, config.plugin_dir.join("mps"), options),
                mps_enabled: config.mps,
                time_slicing_enabled: config.time_slicing,
            })
        }
        Err(error) => {
            warn!(%error, "no sharing tools: claims asking for time-slicing or MPS will be refused");
            None
        }
    }
}

/// Every `interval`, holding the plugin lock so no prepare or unprepare (of this or another
/// instance) runs meanwhile: finishes undos left part-way and restarts MPS daemons of
/// prepared claims that died.
async fn supervise_mps<S: crate::claims::ClaimSource + 'static>(
    manager: Arc<ClaimsManager<S>>,
    lock: PluginLock,
    interval: Duration,
    metrics: Metrics,
) {
    // Without sharing tools there are no daemons to supervise, but undos left part-way (at
    // start-up, or by a failed unprepare) are still finished here.
    let count_daemons = |metrics: &Metrics| {
        if let Some(setup) = &manager.sharing
            && let Ok(daemons) = setup.mps.list()
        {
            metrics.set_mps_daemons(daemons.len() as u64);
        }
    };
    count_daemons(&metrics);
    let mut ticker = crate::ticks::Ticks::every(interval);
    ticker.tick().await; // recovery just checked them
    loop {
        ticker.tick().await;
        let guard = match lock.acquire().await {
            Ok(guard) => guard,
            Err(e) => {
                warn!(error = %crate::errors::error_chain(&e), "MPS supervision: taking the plugin lock");
                continue;
            }
        };
        let m = Arc::clone(&manager);
        // The lock guard goes with the blocking work: if this task is aborted at shutdown,
        // the lock is held until the work is really done.
        let round = tokio::task::spawn_blocking(move || {
            let report = m.supervise_mps();
            drop(guard);
            report
        });
        match round.await {
            Ok(Ok(report)) => {
                if !report.mps_restarted.is_empty() {
                    warn!(daemons = ?report.mps_restarted, "MPS control daemons had died; restarted them");
                }
                if !report.mps_orphans_stopped.is_empty() {
                    warn!(daemons = ?report.mps_orphans_stopped, "stopped MPS control daemons no claim uses");
                }
                for failure in &report.mps_failed {
                    warn!(error = %failure, "MPS supervision");
                }
                if !report.rolled_back.is_empty() {
                    warn!(claims = ?report.rolled_back, "finished undoing claims an earlier undo left part-way");
                }
                for failure in &report.undo_failed {
                    warn!(error = %failure, "undoing a claim left part-way");
                }
            }
            Ok(Err(e)) => warn!(error = %crate::errors::error_chain(&e), "MPS supervision"),
            Err(e) => warn!(error = %e, "MPS supervision task"),
        }
        count_daemons(&metrics);
    }
}

/// Returns at the first SIGTERM or SIGINT.
pub async fn wait_for_shutdown_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Every `interval`: takes device profiles from the latest model, reconciles the usage ledger
/// with the checkpoint (read without opening the store) and refreshes the device-seconds
/// counter, so live claims' seconds show up between calls.
async fn account_usage(
    usage: Arc<usage::UsageTracker>,
    mut models: watch::Receiver<DeviceModel>,
    state_dir: std::path::PathBuf,
    boot_id: String,
    interval: Duration,
) {
    let mut ticker = crate::ticks::Ticks::every(interval);
    loop {
        ticker.tick().await;
        if models.has_changed().unwrap_or(false) {
            usage.set_model(&models.borrow_and_update());
        }
        let usage = Arc::clone(&usage);
        let (dir, boot) = (state_dir.clone(), boot_id.clone());
        let _ = tokio::task::spawn_blocking(move || {
            usage.reconcile_snapshot(&crate::checkpoint::read_unlocked(&dir, &boot));
        })
        .await;
    }
}
