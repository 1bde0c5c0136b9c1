//! `gpu-dra doctor`: is this node ready for GPU claims, and if not, what to fix.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;

use super::common::emit;
use super::flags::{
    Backend, BackendFlags, CdiRootFlag, DevRootFlag, DriverNameFlag, DriverRootFlag,
    KubeletDirFlags, ProcRootFlag, StateDirFlag,
};

/// `doctor` takes the plugin's own flags and environment, so it checks exactly that plugin.
/// Where a flag's help says something doctor-specific, it is declared here; the others are
/// the plugin's own definitions.
#[derive(clap::Args, Debug)]
pub(crate) struct DoctorArgs {
    /// `--driver-name`.
    #[command(flatten)]
    driver_name: DriverNameFlag,
    /// The node whose ResourceSlices are checked; default: the simulated node's name, else the
    /// host name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Kubeconfig for the cluster checks; in a pod, the in-cluster configuration. Without
    /// either, the cluster is not checked.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// `--gpu-backend`, `--sim-node`.
    #[command(flatten)]
    backend: BackendFlags,
    /// With --gpu-backend nvml: the NVML library to load instead of the system's.
    #[arg(long, env = "GPU_DRA_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// The node has no NVIDIA driver files or device nodes (kind, CI); implied by
    /// --gpu-backend sim.
    #[arg(long, env = "GPU_DRA_SIMULATED_HOST")]
    simulated_host: bool,
    /// `--plugin-dir`, `--registry-dir`.
    #[command(flatten)]
    kubelet_dirs: KubeletDirFlags,
    /// `--cdi-root`.
    #[command(flatten)]
    cdi_root: CdiRootFlag,
    /// `--driver-root`.
    #[command(flatten)]
    driver_root: DriverRootFlag,
    /// NVIDIA driver root on the host, when this process sees it elsewhere.
    #[arg(long, env = "GPU_DRA_HOST_DRIVER_ROOT")]
    host_driver_root: Option<PathBuf>,
    /// `--dev-root`.
    #[command(flatten)]
    dev_root: DevRootFlag,
    /// `--proc-root`.
    #[command(flatten)]
    proc_root: ProcRootFlag,
    /// `--state-dir`.
    #[command(flatten)]
    state_dir: StateDirFlag,
    /// The plugin runs with `--passthrough`: also check what VFIO passthrough needs (the
    /// IOMMU, vfio-pci, /dev/vfio/vfio, each GPU's IOMMU group).
    #[arg(long, env = "GPU_DRA_PASSTHROUGH", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false", num_args = 0..=1, default_missing_value = "true")]
    passthrough: bool,
    /// Where the host's sys/ and dev/vfio/ are found for --passthrough, as the plugin takes it.
    /// Default: / (simulated node: its tree, <state dir>/sim/host-root).
    #[arg(long, env = "GPU_DRA_HOST_ROOT", value_name = "DIR")]
    host_root: Option<PathBuf>,
    /// containerd's configuration file.
    #[arg(long, default_value = "/etc/containerd/config.toml")]
    containerd_config: PathBuf,
    /// CRI-O's configuration file (its `.d` drop-in directory is read too).
    #[arg(long, default_value = "/etc/crio/crio.conf")]
    crio_config: PathBuf,
    /// Only the node's own checks that start no process and call nobody (no plugin socket,
    /// no nvidia-smi, no cluster).
    #[arg(long)]
    quick: bool,
    /// The plugin runs with --vgpu-types: also check what vGPU needs (the vGPU manager, each
    /// GPU's virtual functions or mdev types under --host-root, the configured types, and with
    /// --compatibility-groups the cluster's DRADeviceCompatibilityGroups gate). Implied by a
    /// non-empty --vgpu-types.
    #[arg(long)]
    vgpu: bool,
    /// `--vgpu-types`, `--compatibility-groups` (and `--partitionable-devices-type`, not
    /// checked), as the plugin takes them.
    #[command(flatten)]
    vgpu_flags: super::flags::VgpuFlags,
    /// `--fabric-manager`: also check Fabric Manager as the plugin would use it.
    #[command(flatten)]
    fabric_manager: super::flags::FabricManagerFlags,
    /// Output: a table for people, or `{"checks": [{name, status, found, fix}]}`.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: DoctorOutput,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum DoctorOutput {
    Table,
    Json,
}

/// Runs the checks and prints one line per check; exit 0 when all are ok, 1 on a warning,
/// 2 on a failure.
///
/// Fails when the checks cannot be run at all, or stdout cannot be written.
pub(crate) fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::doctor::{self, DoctorConfig, GpuSource, NodeGpus, RuntimePaths};
    let backend = match args.backend.gpu_backend {
        Backend::Nvml => GpuSource::Nvml { lib: args.nvml_lib },
        Backend::Sim => GpuSource::Sim {
            sim_node: args.backend.sim_node,
        },
    };
    let plugin_dir = args.kubelet_dirs.plugin_dir.unwrap_or_else(|| {
        PathBuf::from(format!(
            "/var/lib/kubelet/plugins/{}",
            args.driver_name.driver_name
        ))
    });
    let state_dir = args
        .state_dir
        .state_dir
        .unwrap_or_else(|| plugin_dir.clone());
    let simulated = args.simulated_host || args.backend.gpu_backend == Backend::Sim;
    let any_host_root = args.host_root.clone().unwrap_or_else(|| {
        if simulated {
            state_dir.join("sim").join("host-root")
        } else {
            PathBuf::from("/")
        }
    });
    let host_root = args.passthrough.then(|| any_host_root.clone());
    let vgpu =
        (args.vgpu || args.vgpu_flags.vgpu_types.is_on()).then(|| doctor::vgpu::VgpuDoctor {
            settings: doctor::vgpu::VgpuSettings {
                types: args.vgpu_flags.vgpu_types.clone(),
                compatibility_groups: args.vgpu_flags.compatibility_groups,
            },
            root: any_host_root.clone(),
            power_on: match (&backend, args.host_root.is_some()) {
                (GpuSource::Sim { sim_node }, false) => Some(sim_node.clone()),
                _ => None,
            },
        });
    let gpus = NodeGpus {
        simulated,
        backend,
        driver_root: args.driver_root.driver_root.clone(),
        sim_state: state_dir.join("sim"),
    };
    let config = DoctorConfig {
        cluster: args.kubeconfig.is_some() || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        driver_name: args.driver_name.driver_name,
        node_name: args.node_name,
        kubeconfig: args.kubeconfig,
        layout: gpu_dra::cdi::HostLayout {
            dev_root: args.dev_root.dev_root,
            proc_root: args.proc_root.proc_root,
            driver_root: args.driver_root.driver_root,
            host_driver_root: args.host_driver_root,
        },
        cdi_root: args.cdi_root.cdi_root,
        plugin_dir,
        registry_dir: args.kubelet_dirs.registry_dir,
        runtime: RuntimePaths {
            containerd: args.containerd_config,
            crio: args.crio_config,
        },
        quick: args.quick,
    };
    let mut report = doctor::run(&config, &gpus, host_root.as_deref(), vgpu.as_ref())?;
    // `--quick` starts no process; asking FM runs fmpm.
    if let Some(fm) = args.fabric_manager.config().filter(|_| !args.quick) {
        // A check writes nothing of the plugin's: the simulated fmpm is linked in a scratch
        // directory, removed when this is done.
        let tools = gpu_dra::fsutil::ScratchDir::new("doctor-fmpm")?;
        let client = gpu_dra::plugin::fabric::client_for(
            gpus.simulated && config.layout.driver_root == std::path::Path::new("/"),
            &gpus.sim_state,
            tools.path(),
            &config.layout.driver_root,
            &fm,
        );
        let endpoint = client
            .as_ref()
            .map(|c| c.endpoint.to_string())
            .unwrap_or_default();
        let listed = client.and_then(|c| c.list());
        report
            .checks
            .push(doctor::fabric::check(&endpoint, &listed));
    }
    match args.output {
        DoctorOutput::Table => emit(&report.render_table())?,
        DoctorOutput::Json => emit(&report.to_json())?,
    }
    Ok(ExitCode::from(report.exit_code()))
}
