//! `gpu-dra doctor`: is this node ready for GPU claims, and if not, what to fix.
//!
//! Each check is a pure function of facts (`gpu.rs`, `host.rs`, `runtime.rs`, `smi.rs`,
//! `socket.rs`, `cluster.rs`); [`run`] gathers the facts with the plugin's own settings —
//! GPUs through [`gather::GpuProbe`], files directly, the plugin socket over gRPC, the cluster
//! through kube — and returns a [`Report`] whose [`Report::exit_code`] is 0 when all is ok,
//! 1 on a warning and 2 on a failure. Checks are described in `docs/troubleshooting.md`.
//!
//! With `--passthrough`, [`run`] adds the VFIO checks of [`passthrough`] (IOMMU, vfio-pci,
//! `/dev/vfio/vfio`, each GPU's IOMMU group) right after the node's own, read under the
//! plugin's `--host-root`; they start no process, so `--quick` keeps them.
//!
//! With `--vgpu` (or `--vgpu-types`), the vGPU checks of [`vgpu`] (the vGPU manager, each
//! GPU's VFs or mdev types, the configured types) follow, also in `--quick`; with
//! `--compatibility-groups` the cluster checks add the `DRADeviceCompatibilityGroups` gate,
//! and the `device-classes` check wants `vgpu.<driver>`.
//!
//! `--quick` ([`DoctorConfig::quick`]) runs only the node's own checks that start no process
//! and talk to nobody (no plugin socket, no `nvidia-smi`, no cluster): the plugin logs them at
//! start (`plugin/start_checks.rs` calls [`node_checks`]; nothing here imports the plugin).

pub mod cluster;
pub mod cluster_checks;
pub mod fabric;
pub mod gather;
pub mod gpu;
pub mod host;
pub mod passthrough;
pub mod report;
pub mod runtime;
pub mod smi;
pub mod socket;
pub mod vgpu;

use std::path::{Path, PathBuf};

use crate::cdi::HostLayout;
use crate::hardware::NodeInventory;
pub use gather::{GpuProbe, GpuSource, NodeGpus};
pub use report::{Check, Report, Status};
pub use runtime::RuntimePaths;

/// What `doctor` checks: the plugin's own settings, and where the runtime's configs are.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    /// DRA driver name.
    pub driver_name: String,
    /// The node (for its ResourceSlices); `None`: the simulated node's name, else the host
    /// name.
    pub node_name: Option<String>,
    /// `--kubeconfig`; without it, the in-cluster configuration when running in a pod.
    pub kubeconfig: Option<PathBuf>,
    /// Whether to run the cluster checks: a kubeconfig was given or a pod's service account
    /// is there.
    pub cluster: bool,
    /// Driver root, host driver root, dev root and proc root, as the plugin takes them.
    pub layout: HostLayout,
    /// `--cdi-root`.
    pub cdi_root: PathBuf,
    /// `--plugin-dir`.
    pub plugin_dir: PathBuf,
    /// `--registry-dir`.
    pub registry_dir: PathBuf,
    /// The runtimes' config files.
    pub runtime: RuntimePaths,
    /// Only the quick checks.
    pub quick: bool,
}

/// The doctor could not run at all (its checks' own failures are in the report).
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// The async runtime for the socket and cluster checks could not start.
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
}

/// Runs every check and returns the report. `passthrough`: the host root (`--host-root`) when
/// the plugin runs with `--passthrough`, whose VFIO checks then follow the node's own (and
/// the cluster's `device-classes` check also wants `vfio.<driver>`). `vgpu`: the plugin's
/// vGPU settings and where its vGPU files are, when it runs with `--vgpu-types` (or doctor
/// with `--vgpu`): the vGPU checks follow, and the cluster's want `vgpu.<driver>` and, with
/// compatibility groups, their gate.
///
/// # Errors
/// [`DoctorError::Runtime`] only; everything the checks find is in the report.
pub fn run(
    config: &DoctorConfig,
    gpus: &dyn GpuProbe,
    passthrough: Option<&Path>,
    vgpu: Option<&vgpu::VgpuDoctor>,
) -> Result<Report, DoctorError> {
    let inventory = gpus.inventory();
    let simulated = gpus.simulated();
    let mut report = Report {
        checks: node_checks(config, gpus, &inventory, simulated),
    };
    if let Some(root) = passthrough {
        report
            .checks
            .extend(passthrough::checks(&passthrough::probe(root)));
    }
    if let Some(doctor) = vgpu {
        report.checks.extend(vgpu::checks(
            &doctor.settings,
            &inventory,
            &vgpu::probe(doctor),
        ));
    }
    if config.quick {
        return Ok(report);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DoctorError::Runtime)?;
    let answers = runtime.block_on(socket::probe(&config.registry_dir, &config.driver_name));
    report.checks.push(socket::check(
        &config.registry_dir,
        &config.driver_name,
        &answers,
    ));
    report.checks.push(match &inventory {
        Ok(inv) => smi::check(inv, &gpus.nvidia_smi(&smi::QUERY_ARGS)),
        Err(_) => Check::warn(
            "nvidia-smi",
            "not compared: NVML did not load",
            "Fix the nvml check first",
            "nvidia-smi",
        ),
    });
    report.checks.extend(runtime.block_on(cluster_checks(
        config,
        gpus,
        passthrough.is_some(),
        vgpu.map(|v| &v.settings),
    )));
    Ok(report)
}

/// The checks of this node that need no other process: NVML, GPUs, driver root, device
/// nodes, directories, the runtime's CDI support and the tools. `simulated`: the node's
/// device nodes and driver files are simulated.
pub fn node_checks(
    config: &DoctorConfig,
    gpus: &dyn GpuProbe,
    inventory: &Result<NodeInventory, String>,
    simulated: bool,
) -> Vec<Check> {
    let mut checks = vec![gpu::check_nvml(&gpus.describe(), inventory)];
    if let Ok(inv) = inventory {
        checks.extend(gpu::check_gpus(inv));
    }
    let layout = &config.layout;
    let (driver, dev) = if simulated {
        (host::DriverRootFacts::Simulated, host::DevFacts::Simulated)
    } else {
        let version = inventory.as_ref().ok().map(|i| i.driver_version.as_str());
        let minors: Vec<u32> = inventory
            .as_ref()
            .map(|i| i.gpus.iter().map(|g| g.minor).collect())
            .unwrap_or_default();
        (
            host::probe_driver_root(layout, version),
            host::probe_dev(layout, &minors),
        )
    };
    checks.push(host::check_driver_root(&layout.driver_root, &driver));
    checks.push(host::check_dev(&dev));
    checks.push(host::check_cdi_root(
        &config.cdi_root,
        &host::probe_dir(&config.cdi_root),
    ));
    checks.push(runtime::check(
        &runtime::read_configs(&config.runtime),
        &config.cdi_root,
    ));
    checks.push(host::check_plugin_dir(
        &config.plugin_dir,
        &host::probe_dir(&config.plugin_dir),
    ));
    checks.push(host::check_registry_dir(
        &config.registry_dir,
        &host::probe_dir(&config.registry_dir),
    ));
    checks.push(host::check_tools(&gpus.tools()));
    checks
}

async fn cluster_checks(
    config: &DoctorConfig,
    gpus: &dyn GpuProbe,
    vfio: bool,
    vgpu: Option<&vgpu::VgpuSettings>,
) -> Vec<Check> {
    if !config.cluster {
        return vec![Check::warn(
            "cluster",
            "not checked: no --kubeconfig, and not running in a pod",
            "Pass --kubeconfig (or run doctor in the plugin's pod with kubectl exec) to check the cluster side too",
            "cluster",
        )];
    }
    let client = match crate::k8s::connect(config.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            return vec![Check::fail(
                "cluster",
                crate::errors::error_chain(&e),
                "Pass a working --kubeconfig, or run doctor in the plugin's pod",
                "cluster",
            )];
        }
    };
    let node = node_name(config, gpus);
    let facts = cluster::gather(&client, &config.driver_name, &node).await;
    let classes = cluster_checks::Classes {
        vfio,
        vgpu: vgpu.is_some_and(|v| v.types.is_on()),
    };
    let mut checks = cluster::checks(&config.driver_name, classes, &node, &facts);
    if vgpu.is_some_and(|v| v.compatibility_groups) {
        let gate = vgpu::probe_gate(&client, &config.driver_name, &node).await;
        checks.push(vgpu::check_gate(&gate));
    }
    checks
}

/// `--node-name`, else the simulated node's name, else the host name.
fn node_name(config: &DoctorConfig, gpus: &dyn GpuProbe) -> String {
    if let Some(n) = &config.node_name {
        return n.clone();
    }
    if let Some(name) = gpus.sim_node_name() {
        return name;
    }
    std::fs::read_to_string(Path::new("/proc/sys/kernel/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
