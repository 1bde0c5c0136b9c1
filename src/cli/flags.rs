//! Flags several verbs take, declared once: each group below is flattened (`#[command(flatten)]`)
//! into the verbs that take the flag with the same name, env var, default, value parser and
//! help text. Flags that differ in any of those stay with their verb. The groups are split where
//! the verbs' flag order differs, as `--help` lists flags in declaration order.
//!
//! Also the value types the flags parse into and the interval value parser.

use std::path::PathBuf;

use anyhow::bail;
use clap::ValueEnum;
use gpu_dra::demo;
use gpu_dra::devices::{DEFAULT_DRIVER_NAME, MigProfileSet, VgpuTypes};
use gpu_dra::hardware::MigPolicy;
use gpu_dra::hardware::sim;
use gpu_dra::logging;

/// `--driver-name` with `GPU_DRA_DRIVER_NAME`: `demo`, `inventory`, `kubelet-plugin`, `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct DriverNameFlag {
    /// DRA driver name.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    pub(crate) driver_name: String,
}

/// `--kubeconfig` of the verbs that fall back to the in-cluster configuration:
/// the node plugins and `compute-domain-controller`.
#[derive(clap::Args, Debug)]
pub(crate) struct KubeconfigFlag {
    /// Kubeconfig file; in-cluster configuration when absent.
    #[arg(long, env = "KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
}

/// `--gpu-backend` (default nvml) and `--sim-node`: the node plugins and `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct BackendFlags {
    /// GPU backend.
    #[arg(long, env = "GPU_DRA_GPU_BACKEND", value_enum, default_value = "nvml")]
    pub(crate) gpu_backend: Backend,
    /// Simulated node (preset or node file) for --gpu-backend sim.
    #[arg(long, env = "GPU_DRA_SIM_NODE", default_value = demo::DEFAULT_PRESET)]
    pub(crate) sim_node: String,
}

/// `--nvml-lib`: the node plugins and `inventory`.
#[derive(clap::Args, Debug)]
pub(crate) struct NvmlLibFlag {
    /// With --gpu-backend nvml: the NVML library to load instead of the system's
    /// libnvidia-ml.so.1, e.g. the simulated one (cargo build: target/debug/libgpu_dra_nvml_sim.so).
    #[arg(long, env = "GPU_DRA_NVML_LIB")]
    pub(crate) nvml_lib: Option<PathBuf>,
}

/// `--plugin-dir` and `--registry-dir`, the kubelet's directories: the node plugins and `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct KubeletDirFlags {
    /// Directory of the DRA socket (default /var/lib/kubelet/plugins/<driver>).
    #[arg(long, env = "GPU_DRA_PLUGIN_DIR")]
    pub(crate) plugin_dir: Option<PathBuf>,
    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(
        long,
        env = "GPU_DRA_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub(crate) registry_dir: PathBuf,
}

/// `--cdi-root`: the node plugins and `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct CdiRootFlag {
    /// Where CDI specs are written.
    #[arg(long, env = "GPU_DRA_CDI_ROOT", default_value = "/var/run/cdi")]
    pub(crate) cdi_root: PathBuf,
}

/// `--dev-root`: the node plugins and `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct DevRootFlag {
    /// Root under which /dev is found.
    #[arg(long, env = "GPU_DRA_DEV_ROOT", default_value = "/")]
    pub(crate) dev_root: PathBuf,
}

/// `--state-dir` defaulting to the plugin directory: the node plugins and `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct StateDirFlag {
    /// Checkpoint and simulated-hardware state (default: the plugin directory).
    #[arg(long, env = "GPU_DRA_STATE_DIR")]
    pub(crate) state_dir: Option<PathBuf>,
}

/// `--driver-root`: `kubelet-plugin`, `compute-domain-plugin` and `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct DriverRootFlag {
    /// NVIDIA driver root as this process sees it.
    #[arg(long, env = "GPU_DRA_DRIVER_ROOT", default_value = "/")]
    pub(crate) driver_root: PathBuf,
}

/// `--fabric-manager` and where FM is: `kubelet-plugin` and `doctor` (docs/fabric-manager.md).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct FabricManagerFlags {
    /// Fabric Manager partitions (NVSwitch node, FABRIC_MODE=1): publish gpuModuleID and
    /// partition1/2/4/8, refuse multi-GPU claims that are not one partition, activate the
    /// claim's partition on prepare and deactivate it on unprepare.
    #[arg(long, env = "GPU_DRA_FABRIC_MANAGER", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false", num_args = 0..=1, default_missing_value = "true")]
    pub(crate) fabric_manager: bool,
    /// FM's Unix socket (FM_CMD_UNIX_SOCKET_PATH); default
    /// <driver-root>/run/nvidia-fabricmanager/socket (the simulated node's own with --gpu-backend sim).
    #[arg(long, env = "NVIDIA_FABRICMANAGER_UNIX_SOCKET", value_name = "PATH")]
    pub(crate) fabric_manager_socket: Option<PathBuf>,
    /// FM's TCP address (FM_CMD_BIND_INTERFACE, port 6666); when set it is used instead of
    /// the socket ("" means 127.0.0.1).
    #[arg(long, env = "NVIDIA_FABRICMANAGER_ADDRESS", value_name = "HOST")]
    pub(crate) fabric_manager_address: Option<String>,
    /// The fmpm executable (NVIDIA/Fabric-Manager-Client); default: found under the driver
    /// root (usr/bin, usr/local/bin, usr/sbin, opt/bin, bin, sbin).
    #[arg(long, env = "GPU_DRA_FMPM_PATH", value_name = "PATH")]
    pub(crate) fmpm_path: Option<PathBuf>,
}

impl FabricManagerFlags {
    /// The plugin's FM configuration; `None` when `--fabric-manager` is off.
    pub(crate) fn config(&self) -> Option<gpu_dra::plugin::config::FabricManagerConfig> {
        self.fabric_manager
            .then(|| gpu_dra::plugin::config::FabricManagerConfig {
                socket: self.fabric_manager_socket.clone(),
                address: self.fabric_manager_address.clone(),
                fmpm: self.fmpm_path.clone(),
            })
    }
}

/// `--proc-root`: `kubelet-plugin` and `doctor`.
#[derive(clap::Args, Debug)]
pub(crate) struct ProcRootFlag {
    /// The proc filesystem.
    #[arg(long, env = "GPU_DRA_PROC_ROOT", default_value = "/proc")]
    pub(crate) proc_root: PathBuf,
}

/// `--gpu-mig-policies` (parsed later by `hardware::policy_flag::parse_gpu_policies`):
/// `kubelet-plugin` and `inventory`.
#[derive(clap::Args, Debug)]
pub(crate) struct GpuMigPoliciesFlag {
    /// MIG policy of single GPUs, over --mig-policy: INDEX=POLICY pairs, e.g. 1=dynamic,3=static.
    #[arg(long, env = "GPU_DRA_GPU_MIG_POLICIES", default_value = "")]
    pub(crate) gpu_mig_policies: String,
}

/// `--mig-profiles`, on every verb that builds the device model.
#[derive(clap::Args, Debug)]
pub(crate) struct MigProfilesFlag {
    /// MIG profiles dynamic-MIG GPUs publish (with explain: those of --sim-node): `split`
    /// (the default) shares the profiles out among a node's GPUs, every GPU its full GPU and
    /// whole-GPU profile and one family of the others at every placement, so every profile
    /// stays claimable at a quarter of the devices; `all` publishes every profile at every
    /// placement on every GPU; or a list, e.g. 1g.10gb,3g.40gb,7g.80gb, on every GPU
    /// (docs/configuration.md has the scheduling cost and the capacity of each choice).
    #[arg(
        long,
        env = "GPU_DRA_MIG_PROFILES",
        default_value = "split",
        value_name = "split|all|PROFILE,..."
    )]
    pub(crate) mig_profiles: MigProfileSet,
}

/// `--slice-layout`, on every verb that builds the device model.
#[derive(clap::Args, Debug)]
pub(crate) struct SliceLayoutFlag {
    /// How devices are ordered into ResourceSlices, which kube-scheduler walks first fit in
    /// name order: interleaved (default: the order of gpus-first, with whole GPUs and MIG
    /// devices alternating at the head, so neither kind walks every device of the other),
    /// gpus-first (whole GPUs first from GPU 0 up, then each GPU's MIG devices from the last
    /// GPU down, so full-GPU and MIG claims fill the node from opposite ends), by-gpu (each
    /// GPU's devices together, GPU after GPU: a full-GPU request walks every MIG device of
    /// each busy GPU) or by-profile (whole GPUs, then each MIG profile of every GPU together:
    /// larger profiles walk every smaller one). docs/device-model.md, "Packing order", has the
    /// measured trade.
    #[arg(
        long,
        env = "GPU_DRA_SLICE_LAYOUT",
        default_value = "interleaved",
        value_name = "interleaved|gpus-first|by-gpu|by-profile"
    )]
    pub(crate) slice_layout: gpu_dra::devices::SliceLayout,
    /// What each MIG device carries: compact (default: type, uuid, profile, parentUUID,
    /// productName, cudaComputeCapability, pcieRoot; capacities memory and multiprocessors) or
    /// full (also the parent GPU's other attributes, parentIndex, parentMinor and the engine
    /// capacities, at about twice the bytes per node). docs/configuration.md, "What a node
    /// publishes", has the bytes of each.
    #[arg(
        long,
        env = "GPU_DRA_MIG_ATTRIBUTES",
        default_value = "compact",
        value_name = "compact|full"
    )]
    pub(crate) mig_attributes: gpu_dra::devices::MigAttributes,
}

/// `--vgpu-types`, `--compatibility-groups` and `--partitionable-devices-type`, on every verb
/// that builds the device model (docs/device-model.md, "vGPU").
#[derive(clap::Args, Debug)]
pub(crate) struct VgpuFlags {
    /// NVIDIA vGPU types the GPUs offer as devices (class vgpu.gpu.nvidia.com; with explain:
    /// those of --sim-node): TYPE,... for every GPU that supports them (e.g. H100-4C,H100-10C),
    /// or INDEXES=TYPE,... pairs separated by ';' per GPU index (e.g.
    /// '0-3=H100-4C;4-7=L40S-12Q,L40S-24Q'). Empty (the default): no vGPU devices. Types a
    /// GPU cannot run side by side are refused unless --compatibility-groups is on.
    #[arg(
        long,
        env = "GPU_DRA_VGPU_TYPES",
        default_value = "",
        value_name = "TYPE,...|INDEXES=TYPE,...;..."
    )]
    pub(crate) vgpu_types: VgpuTypes,
    /// Put compatibility groups (Kubernetes 1.37 DRADeviceCompatibilityGroups, alpha) on the
    /// counter consumptions of GPUs offering vGPU types, so such a GPU also offers MIG devices
    /// and vGPU types that may not share it, and the scheduler never allocates them together.
    /// The scheduler skips a pool with groups while its gate is off: turn the gate on first.
    #[arg(long, env = "GPU_DRA_COMPATIBILITY_GROUPS", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false", num_args = 0..=1, default_missing_value = "true")]
    pub(crate) compatibility_groups: bool,
    /// Set partitionTypeAttribute (Kubernetes 1.37 DRAPartitionableDevicesType, alpha) to the
    /// MIG `profile` attribute on slices holding dynamic-MIG devices; read only by the
    /// resource-pool status controller (docs/device-model.md says what it reports for them).
    #[arg(long, env = "GPU_DRA_PARTITIONABLE_DEVICES_TYPE", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false", num_args = 0..=1, default_missing_value = "true")]
    pub(crate) partitionable_devices_type: bool,
}

/// The node flags `kubelet-plugin` and `compute-domain-plugin` share.
#[derive(clap::Args, Debug)]
pub(crate) struct NodeFlags {
    /// This node's name (the pool name); in a pod, from the downward API. Defaults to the
    /// simulated node's name with --gpu-backend sim.
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: Option<String>,
    /// `--kubeconfig`.
    #[command(flatten)]
    pub(crate) kubeconfig: KubeconfigFlag,
    /// `--gpu-backend`, `--sim-node`.
    #[command(flatten)]
    pub(crate) backend: BackendFlags,
    /// `--nvml-lib`.
    #[command(flatten)]
    pub(crate) nvml_lib: NvmlLibFlag,
    /// The node has no NVIDIA driver files or device nodes (kind, CI): CDI specs name the
    /// simulated device nodes and the sharing tools are the simulated ones (implied by
    /// --gpu-backend sim; use it with --gpu-backend nvml over the simulated library).
    #[arg(long, env = "GPU_DRA_SIMULATED_HOST")]
    pub(crate) simulated_host: bool,
    /// `--plugin-dir`, `--registry-dir`.
    #[command(flatten)]
    pub(crate) kubelet_dirs: KubeletDirFlags,
    /// This pod's UID, for the kubelet's seamless rolling update (sockets named after it).
    #[arg(long, env = "POD_UID")]
    pub(crate) pod_uid: Option<String>,
    /// `--cdi-root`.
    #[command(flatten)]
    pub(crate) cdi_root: CdiRootFlag,
    /// `--dev-root`.
    #[command(flatten)]
    pub(crate) dev_root: DevRootFlag,
    /// `--state-dir`.
    #[command(flatten)]
    pub(crate) state_dir: StateDirFlag,
    /// `--log-format`, `--log-level`.
    #[command(flatten)]
    pub(crate) log: LogFlags,
}

/// `--log-format` and `--log-level`, on every long-running verb.
#[derive(clap::Args, Debug)]
pub(crate) struct LogFlags {
    /// Log format.
    #[arg(long, env = "GPU_DRA_LOG_FORMAT", value_enum, default_value = "text")]
    pub(crate) log_format: LogFormat,
    /// Log level; GPU_DRA_LOG, when set, overrides it with a full filter
    /// (e.g. `info,gpu_dra::k8s=debug`).
    #[arg(long, env = "GPU_DRA_LOG_LEVEL", value_enum, default_value = "info")]
    pub(crate) log_level: LogLevel,
}

impl NodeFlags {
    /// The backend, and the node name (the simulated node's when not given with sim).
    ///
    /// Fails when the node name is missing with the nvml backend, or when the simulated node
    /// (preset or node file) cannot be resolved or read.
    pub(crate) fn backend_and_name(
        &self,
    ) -> anyhow::Result<(gpu_dra::plugin::BackendChoice, String)> {
        use gpu_dra::plugin::BackendChoice;
        let backend = match self.backend.gpu_backend {
            Backend::Nvml => BackendChoice::Nvml {
                lib: self.nvml_lib.nvml_lib.clone(),
            },
            Backend::Sim => BackendChoice::Sim {
                sim_node: self.backend.sim_node.clone(),
            },
        };
        let node_name = match (&self.node_name, &backend) {
            (Some(n), _) => n.clone(),
            (None, BackendChoice::Sim { sim_node }) => {
                sim::NodeSource::resolve(sim_node)?.plan()?.node_name
            }
            (None, BackendChoice::Nvml { .. }) => {
                bail!("--node-name (or NODE_NAME) is required with --gpu-backend nvml")
            }
        };
        Ok((backend, node_name))
    }

    /// The plugin directory (`--plugin-dir`, else `default`) and the state directory
    /// (`--state-dir`, else the plugin directory), as both node plugins resolve them.
    pub(crate) fn plugin_and_state_dirs(&self, default: PathBuf) -> (PathBuf, PathBuf) {
        let plugin_dir = self.kubelet_dirs.plugin_dir.clone().unwrap_or(default);
        let state_dir = self
            .state_dir
            .state_dir
            .clone()
            .unwrap_or_else(|| plugin_dir.clone());
        (plugin_dir, state_dir)
    }
}

/// An interval flag: whole seconds (`30` or `30s`) or minutes (`2m`), at least one second.
///
/// Fails (clap prints the message as the flag's error) on anything else, and on zero.
pub(crate) fn interval_seconds(value: &str) -> Result<u64, String> {
    let invalid =
        || format!("{value:?} is not an interval; give whole seconds (30 or 30s) or minutes (2m)");
    let (number, unit) = match value.trim() {
        v if v.ends_with('s') => (&v[..v.len() - 1], 1),
        v if v.ends_with('m') => (&v[..v.len() - 1], 60),
        v => (v, 1),
    };
    let seconds = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(invalid)?;
    if seconds == 0 {
        return Err(format!("{value:?} is zero; give at least 1s"));
    }
    Ok(seconds)
}

/// `--log-level` of the node plugins.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The level as a `tracing` filter directive, e.g. `info`.
    pub(crate) fn directive(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// `--log-format` of the node plugins.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

impl From<LogFormat> for logging::Format {
    fn from(f: LogFormat) -> logging::Format {
        match f {
            LogFormat::Text => logging::Format::Text,
            LogFormat::Json => logging::Format::Json,
        }
    }
}

/// `--gpu-backend`: the simulated node or NVML.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Sim,
    Nvml,
}

/// `--mig-policy`: the MIG policy of every GPU.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    Disabled,
    Static,
    Dynamic,
}

impl From<Policy> for MigPolicy {
    fn from(p: Policy) -> MigPolicy {
        match p {
            Policy::Disabled => MigPolicy::Disabled,
            Policy::Static => MigPolicy::Static,
            Policy::Dynamic => MigPolicy::Dynamic,
        }
    }
}

/// `-o` of `inventory`, `explain` and `capacity`: for people, or as YAML or JSON.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    Table,
    Yaml,
    Json,
}
