//! The `gpu-dra` binary: flag parsing and the edge where library errors become messages and
//! exit codes (0 success, 1 failure, 2 bad input).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use gpu_dra::devices::{DEFAULT_DRIVER_NAME, MigProfileSet, ModelOptions, SharedGpus};
use gpu_dra::hardware::sim::{self, SimBackend, presets};
use gpu_dra::hardware::{GpuBackend, MigPolicy, catalog, nvml::NvmlBackend, policy_flag};
use gpu_dra::sharing::simtools;
use gpu_dra::{demo, inventory, logging};

/// A Kubernetes DRA driver for NVIDIA GPUs, with a faithful simulated GPU node.
#[derive(Parser, Debug)]
#[command(name = "gpu-dra", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the driver's pipeline on a simulated node, in-process, and explain each step.
    Demo {
        /// Simulated node: a preset name or a node file.
        #[arg(long, env = "GPU_DRA_SIM_NODE", default_value = demo::DEFAULT_PRESET)]
        sim_node: String,
        /// DRA driver name.
        #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
        driver_name: String,
    },
    /// Show what a node has and the ResourceSlices it would publish.
    Inventory(InventoryArgs),
    /// Explain why claims do or do not fit a node: per request, per device, the first reason.
    /// Exit 0 when they fit, 1 when they do not, 2 on bad input.
    Explain(ExplainArgs),
    /// Run the DRA kubelet plugin on this node: publish ResourceSlices, serve prepare/unprepare.
    KubeletPlugin(Box<PluginArgs>),
    /// Run the ComputeDomain kubelet plugin (driver compute-domain.nvidia.com) on this node:
    /// IMEX channel and daemon devices, node labels, IMEX configs.
    ComputeDomainPlugin(Box<CdPluginArgs>),
    /// Inject a fault into a simulated node's shared state (under the simulator's lock): the
    /// sim backend reports it, and the simulated NVML library delivers the matching events.
    SimFault(SimFaultArgs),
    /// The cluster's GPUs per node, GPU and MIG profile: who holds what, and what is free.
    /// Exit 0, or 2 on bad input.
    Capacity(CapacityArgs),
    /// ComputeDomains: run this node's IMEX daemon (what the domain's DaemonSet pod runs):
    /// keep its ComputeDomainNode, the nodes config and `nvidia-imex` up to date.
    ImexDaemon(Box<ImexDaemonArgs>),
    /// Is this node ready for GPU claims, and if not, what to fix: one line per check.
    /// Exit 0 when all are ok, 1 on a warning, 2 on a failure.
    Doctor(Box<DoctorArgs>),
    /// Run the ComputeDomain controller: per domain its claim templates, IMEX DaemonSet and
    /// status (docs/compute-domains.md).
    ComputeDomainController(ComputeDomainControllerArgs),
    /// Evaluate one CEL selector against one device, as the scheduler would: prints `true`
    /// or `false` (exit 0), or `error: …` (exit 2).
    Cel {
        /// The selector, e.g. "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'".
        #[arg(long, short = 'e')]
        expression: String,
        /// A resource.k8s.io/v1 Device (name, attributes, capacity, allowMultipleAllocations)
        /// as YAML or JSON.
        #[arg(long, short = 'd')]
        device: PathBuf,
        /// The driver publishing the device: the domain of unqualified attribute names.
        #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
        driver: String,
    },
}

/// Flags of `gpu-dra imex-daemon`; the domain and clique come from the daemon claim's CDI
/// environment (`compute_domain::api::daemon_env`).
#[derive(clap::Args, Debug)]
struct ImexDaemonArgs {
    /// This node's name.
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node_name: String,
    /// This pod's IP (downward API), what the other nodes' IMEX daemons connect to.
    #[arg(long, env = "POD_IP", default_value = "")]
    pod_ip: String,
    /// Namespace of the ComputeDomainNode objects (the driver's).
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    namespace: String,
    /// Kubeconfig file; without it, the in-cluster configuration.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Directory of the IMEX config the plugin wrote (config.cfg); the nodes config goes
    /// where it says.
    #[arg(long, env = "IMEX_CONFIG_DIR", default_value = "/etc/nvidia-imex")]
    config_dir: PathBuf,
    /// The IMEX daemon to run.
    #[arg(long, default_value = "nvidia-imex")]
    imex_bin: PathBuf,
    /// The IMEX query tool.
    #[arg(long, default_value = "nvidia-imex-ctl")]
    imex_ctl_bin: PathBuf,
    /// Run the simulated nvidia-imex and nvidia-imex-ctl (this binary) instead of
    /// --imex-bin/--imex-ctl-bin: for simulated nodes without the IMEX package.
    #[arg(long, env = "GPU_DRA_SIMULATED_IMEX")]
    simulated_imex: bool,
    /// The ComputeDomain's UID.
    #[arg(long, env = "COMPUTE_DOMAIN_UUID", default_value = "")]
    domain_uid: String,
    /// The ComputeDomain's name.
    #[arg(long, env = "COMPUTE_DOMAIN_NAME", default_value = "")]
    domain_name: String,
    /// The ComputeDomain's namespace.
    #[arg(long, env = "COMPUTE_DOMAIN_NAMESPACE", default_value = "")]
    domain_namespace: String,
    /// `<clusterUuid>.<cliqueId>` of this node's GPUs.
    #[arg(long, env = "CLIQUE_ID", default_value = "")]
    clique: String,
}

/// `--mig-profiles`, on every verb that builds the device model.
#[derive(clap::Args, Debug)]
struct MigProfilesFlag {
    /// MIG profiles a dynamic-MIG GPU publishes (with explain: those of --sim-node), e.g.
    /// 1g.10gb,3g.40gb,7g.80gb; `all` (the default) publishes every profile at every
    /// placement (docs/configuration.md has the scheduling cost of each choice).
    #[arg(
        long,
        env = "GPU_DRA_MIG_PROFILES",
        default_value = "all",
        value_name = "all|PROFILE,..."
    )]
    mig_profiles: MigProfileSet,
}

#[derive(clap::Args, Debug)]
struct InventoryArgs {
    /// GPU backend; defaults to `sim` when --sim-node is given, else `nvml`.
    #[arg(long, env = "GPU_DRA_GPU_BACKEND", value_enum)]
    gpu_backend: Option<Backend>,
    /// Simulated node: a preset name or a node file (implies --gpu-backend sim).
    #[arg(long, env = "GPU_DRA_SIM_NODE")]
    sim_node: Option<String>,
    /// With --gpu-backend nvml: the NVML library to load instead of the system's
    /// libnvidia-ml.so.1, e.g. the simulated one (cargo build: target/debug/libgpu_dra_nvml_sim.so).
    #[arg(long, env = "GPU_DRA_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// MIG policy of single GPUs, over --mig-policy: INDEX=POLICY pairs, e.g. 1=dynamic,3=static.
    #[arg(long, env = "GPU_DRA_GPU_MIG_POLICIES", default_value = "")]
    gpu_mig_policies: String,
    /// Directory holding the simulated hardware state (created MIG devices, MIG mode), shared
    /// with a running plugin that uses the same directory.
    #[arg(long, env = "GPU_DRA_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Node name (and pool name) of the slices; defaults to the node file's, or the host name
    /// with the nvml backend.
    #[arg(long, env = "GPU_DRA_NODE_NAME")]
    node_name: Option<String>,
    /// DRA driver name.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// MIG policy for every GPU with the nvml backend (the sim takes it from the node file):
    /// default `static` for GPUs with MIG on, `disabled` otherwise.
    #[arg(long, env = "GPU_DRA_MIG_POLICY", value_enum)]
    mig_policy: Option<Policy>,
    /// Publish GPUs and MIG devices shareable (consumable capacity): off, memory or N shares.
    #[arg(
        long,
        env = "GPU_DRA_SHARED_GPUS",
        default_value = "off",
        value_name = "off|memory|N"
    )]
    shared_gpus: SharedGpus,
    #[command(flatten)]
    mig_profiles: MigProfilesFlag,
    /// Health policy file (YAML or JSON) the GPUs' faults are judged with, as the plugin's
    /// --health-policy (docs/health.md). Default: the built-in policy.
    #[arg(long, env = "GPU_DRA_HEALTH_POLICY", value_name = "FILE")]
    health_policy: Option<PathBuf>,
    /// Output: a table for people, or ResourceSlice objects for `kubectl create -f -`.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
    /// List the built-in simulated nodes and GPU models, then exit.
    #[arg(long)]
    list_presets: bool,
    /// Print a preset's node file (a starting point for your own), then exit.
    #[arg(long, value_name = "PRESET")]
    print_preset: Option<String>,
}

#[derive(clap::Args, Debug)]
struct SimFaultArgs {
    /// The simulator's state directory (holding sim-gpu-state.json); a plugin's --state-dir
    /// works too (its `sim` subdirectory is used).
    #[arg(long, env = "GPU_DRA_SIM_STATE_DIR")]
    state_dir: PathBuf,
    #[command(subcommand)]
    fault: FaultCommand,
}

#[derive(Subcommand, Debug)]
enum FaultCommand {
    /// An XID error (79: fallen off the bus; 13, 31, 43, 45, 68, 109 are application errors
    /// that leave the GPU healthy).
    Xid {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// The XID.
        #[arg(long)]
        code: u64,
        /// Attribute the XID to this GPU instance (a MIG-scoped XID, as NVML reports for
        /// errors contained in one MIG device); default: the whole GPU.
        #[arg(long, value_name = "GI")]
        gpu_instance: Option<u32>,
    },
    /// An ECC error: corrected (single-bit), or uncorrectable with --double-bit.
    Ecc {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// Uncorrectable: the GPU becomes unhealthy.
        #[arg(long)]
        double_bit: bool,
    },
    /// The GPU falls off the bus (XID 79).
    Lost {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
    },
    /// A GPU reset that clears the fault.
    Recover {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
    },
    /// A GPU is added to the node (next free index, MIG off).
    AddGpu {
        /// GPU model (`gpu-dra inventory --list-presets` lists them).
        #[arg(long)]
        model: String,
    },
    /// A GPU is taken off the node (its index is not reused).
    RemoveGpu {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
    },
    /// Sets the load a GPU and its MIG devices report (power, SM activity, memory,
    /// temperature) through both backends; figures not given follow the load model.
    Load {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// SM activity of the GPU and each of its MIG devices, 0 to 1.
        #[arg(long, value_parser = sm_ratio)]
        sm: Option<f64>,
        /// Board power draw, watts.
        #[arg(long)]
        power: Option<u32>,
        /// Memory in use on a GPU with MIG off, MiB.
        #[arg(long)]
        memory_mib: Option<u64>,
        /// Core temperature, °C.
        #[arg(long)]
        temperature: Option<u32>,
        /// Forget the load set earlier: back to the model.
        #[arg(long, conflicts_with_all = ["sm", "power", "memory_mib", "temperature"])]
        clear: bool,
    },
}

/// `--sm`: a ratio from 0 to 1.
fn sm_ratio(value: &str) -> Result<f64, String> {
    let ratio: f64 = value.parse().map_err(|_| {
        format!("--sm {value:?} is not a number; give a ratio from 0 to 1, e.g. 0.8")
    })?;
    if !(0.0..=1.0).contains(&ratio) {
        return Err(format!(
            "--sm {value} is out of range; give a ratio from 0 to 1, e.g. 0.8"
        ));
    }
    Ok(ratio)
}

/// An interval flag: whole seconds (`30` or `30s`) or minutes (`2m`), at least one second.
fn interval_seconds(value: &str) -> Result<u64, String> {
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

#[derive(clap::Args, Debug)]
struct ExplainArgs {
    /// A ResourceClaim, ResourceClaimTemplate or Pod manifest (with its claims and templates),
    /// YAML or JSON, one or several documents.
    #[arg(long)]
    claim: PathBuf,
    /// Slices of a simulated node (preset or node file).
    #[arg(long, conflicts_with_all = ["slices", "kubeconfig"])]
    sim_node: Option<String>,
    /// With --sim-node: publish its GPUs shareable (consumable capacity), as
    /// `kubelet-plugin --shared-gpus` would: off, memory or N shares.
    #[arg(long, default_value = "off", value_name = "off|memory|N")]
    shared_gpus: SharedGpus,
    #[command(flatten)]
    mig_profiles: MigProfilesFlag,
    /// Slices from a file (e.g. `kubectl get resourceslices -o yaml`).
    #[arg(long, conflicts_with = "kubeconfig")]
    slices: Option<PathBuf>,
    /// DeviceClasses (file or directory); default: the built-in gpu.nvidia.com and
    /// mig.nvidia.com.
    #[arg(long)]
    classes: Option<PathBuf>,
    /// Claims already allocated (file or directory): what they hold is not free.
    #[arg(long)]
    allocated: Option<PathBuf>,
    /// Read classes, slices and allocated claims from this cluster.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Read them from the cluster this pod runs in.
    #[arg(long, conflicts_with = "kubeconfig")]
    in_cluster: bool,
    /// With a cluster: only this node (default: every node).
    #[arg(long)]
    node: Option<String>,
    /// DRA driver name of simulated slices.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Output: reasons for people, or the allocation / reasons as JSON or YAML.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
}

#[derive(clap::Args, Debug)]
struct CapacityArgs {
    /// ResourceSlices from a file or directory (`kubectl get resourceslices -o yaml`);
    /// without it, everything is read from the cluster.
    #[arg(long, conflicts_with = "in_cluster")]
    slices: Option<PathBuf>,
    /// With --slices: ResourceClaims (`kubectl get resourceclaims -A -o yaml`); the allocated
    /// ones hold devices.
    #[arg(long, requires = "slices")]
    claims: Option<PathBuf>,
    /// With --slices: Nodes (`kubectl get nodes -o yaml`), for --pool-label.
    #[arg(long, requires = "slices")]
    nodes: Option<PathBuf>,
    /// Without --slices: read slices, claims and nodes from this cluster.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Without --slices: read them from the cluster this pod runs in.
    #[arg(long, conflicts_with = "kubeconfig")]
    in_cluster: bool,
    /// Only this node (with it, the table shows every GPU in detail).
    #[arg(long)]
    node: Option<String>,
    /// Group nodes into pools by this node label, e.g. `gpu-pool` or `topology.kubernetes.io/zone`.
    #[arg(long)]
    pool_label: Option<String>,
    /// Table: list every allocation and every GPU's layout and free placements.
    #[arg(long)]
    detail: bool,
    /// DRA driver name.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Output: tables for people, or the report as JSON or YAML.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
}

/// The node flags `kubelet-plugin` and `compute-domain-plugin` share.
#[derive(clap::Args, Debug)]
struct NodeFlags {
    /// This node's name (the pool name); in a pod, from the downward API. Defaults to the
    /// simulated node's name with --gpu-backend sim.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Kubeconfig file; in-cluster configuration when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// GPU backend.
    #[arg(long, env = "GPU_DRA_GPU_BACKEND", value_enum, default_value = "nvml")]
    gpu_backend: Backend,
    /// Simulated node (preset or node file) for --gpu-backend sim.
    #[arg(long, env = "GPU_DRA_SIM_NODE", default_value = demo::DEFAULT_PRESET)]
    sim_node: String,
    /// With --gpu-backend nvml: the NVML library to load instead of the system's
    /// libnvidia-ml.so.1, e.g. the simulated one (cargo build: target/debug/libgpu_dra_nvml_sim.so).
    #[arg(long, env = "GPU_DRA_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// The node has no NVIDIA driver files or device nodes (kind, CI): CDI specs name the
    /// simulated device nodes and the sharing tools are the simulated ones (implied by
    /// --gpu-backend sim; use it with --gpu-backend nvml over the simulated library).
    #[arg(long, env = "GPU_DRA_SIMULATED_HOST")]
    simulated_host: bool,
    /// Directory of the DRA socket (default /var/lib/kubelet/plugins/<driver>).
    #[arg(long, env = "GPU_DRA_PLUGIN_DIR")]
    plugin_dir: Option<PathBuf>,
    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(
        long,
        env = "GPU_DRA_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    registry_dir: PathBuf,
    /// This pod's UID, for the kubelet's seamless rolling update (sockets named after it).
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// Where CDI specs are written.
    #[arg(long, env = "GPU_DRA_CDI_ROOT", default_value = "/var/run/cdi")]
    cdi_root: PathBuf,
    /// Root under which /dev is found.
    #[arg(long, env = "GPU_DRA_DEV_ROOT", default_value = "/")]
    dev_root: PathBuf,
    /// Checkpoint and simulated-hardware state (default: the plugin directory).
    #[arg(long, env = "GPU_DRA_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "GPU_DRA_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log level; GPU_DRA_LOG, when set, overrides it with a full filter
    /// (e.g. `info,gpu_dra::k8s=debug`).
    #[arg(long, env = "GPU_DRA_LOG_LEVEL", value_enum, default_value = "info")]
    log_level: LogLevel,
}

#[derive(clap::Args, Debug)]
struct PluginArgs {
    /// DRA driver name.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    #[command(flatten)]
    node: NodeFlags,
    /// MIG policy of single GPUs, over --mig-policy: INDEX=POLICY pairs, e.g. 1=dynamic,3=static.
    #[arg(long, env = "GPU_DRA_GPU_MIG_POLICIES", default_value = "")]
    gpu_mig_policies: String,
    /// MIG policy for every GPU (default: the node file's with sim; with nvml, static for
    /// GPUs with MIG on, disabled otherwise).
    #[arg(long, env = "GPU_DRA_MIG_POLICY", value_enum)]
    mig_policy: Option<Policy>,
    #[command(flatten)]
    mig_profiles: MigProfilesFlag,
    /// NVIDIA driver root as this process sees it.
    #[arg(long, env = "GPU_DRA_DRIVER_ROOT", default_value = "/")]
    driver_root: PathBuf,
    /// NVIDIA driver root on the host, when the plugin sees it elsewhere (a container mount).
    #[arg(long, env = "GPU_DRA_HOST_DRIVER_ROOT")]
    host_driver_root: Option<PathBuf>,
    /// The proc filesystem.
    #[arg(long, env = "GPU_DRA_PROC_ROOT", default_value = "/proc")]
    proc_root: PathBuf,
    /// Time between inventory checks (hot-plugged GPUs, MIG mode, hold-down ends), in seconds
    /// (`10`, `10s`) or minutes (`1m`); health events are acted on within a fraction of a
    /// second regardless.
    #[arg(long, env = "GPU_DRA_INVENTORY_INTERVAL", default_value = "10", value_parser = interval_seconds)]
    inventory_interval: u64,
    /// Time between telemetry samples (power, SM activity, memory, ECC, XID per GPU and MIG
    /// device), in seconds (`10`, `10s`) or minutes (`1m`); /metrics serves the last sample.
    #[arg(long, env = "GPU_DRA_TELEMETRY_INTERVAL", default_value = "10", value_parser = interval_seconds)]
    telemetry_interval: u64,
    /// Time between re-reads of the pods of claims shared by several pods, in seconds (`30`,
    /// `30s`) or minutes (`1m`): a pod that leaves a shared claim leaves its devices'
    /// telemetry labels within this time (the kubelet does not tell the plugin).
    #[arg(long, env = "GPU_DRA_HOLDERS_REFRESH_INTERVAL", default_value = "30", value_parser = interval_seconds)]
    holders_refresh_interval: u64,
    /// How long a prepared claim may be reserved for no pod before the plugin unprepares it
    /// (claims deleted, re-created or deallocated are unprepared at the next check): whole
    /// seconds (`30s`) or minutes (`10m`); `0` turns orphan reconciliation off.
    #[arg(long, env = "GPU_DRA_ORPHAN_GRACE_PERIOD", default_value = "10m", value_parser = gpu_dra::plugin::orphans::grace_period_flag)]
    orphan_grace_period: std::time::Duration,
    /// Health policy file (YAML or JSON): which XIDs and errors degrade or fail a GPU, the
    /// taint key and effects, the hold-down (docs/health.md). Default: built-in policy.
    #[arg(long, env = "GPU_DRA_HEALTH_POLICY", value_name = "FILE")]
    health_policy: Option<PathBuf>,
    /// Publish GPUs and MIG devices shareable by several claims (consumable capacity):
    /// off, memory (claims ask for memory), or N equal shares by default (2..=48).
    #[arg(
        long,
        env = "GPU_DRA_SHARED_GPUS",
        default_value = "off",
        value_name = "off|memory|N"
    )]
    shared_gpus: SharedGpus,
    /// Allow the MPS sharing strategy (opaque config and consumable-capacity shares).
    #[arg(long, env = "GPU_DRA_MPS", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    mps: bool,
    /// Allow the TimeSlicing sharing strategy.
    #[arg(long, env = "GPU_DRA_TIME_SLICING", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    time_slicing: bool,
    /// Address (`host:port`) serving /metrics, /healthz and /readyz; "" or `off` disables it.
    #[arg(long, env = "GPU_DRA_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: String,
}

#[derive(clap::Args, Debug)]
struct CdPluginArgs {
    #[command(flatten)]
    node: NodeFlags,
    /// The node's NVLink clique (`<clusterUuid>.<cliqueId>`), over what the GPUs report
    /// through NVML; "" means none. For nodes whose NVML cannot report the fabric.
    #[arg(long, env = "GPU_DRA_CLIQUE_ID")]
    clique_id: Option<String>,
    /// Namespace of the IMEX daemons' ComputeDomainNode objects (the driver's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = gpu_dra::compute_domain::plugin::config::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Channel and daemon devices published per node (channel-0..N-1, daemon-0..N-1).
    /// channel-0, the default class's, is shared by any number of claims; the others are
    /// for admins' own classes, one claim each (docs/compute-domains-plugin.md).
    #[arg(long, env = "GPU_DRA_MAX_DOMAINS", default_value = "8", value_parser = gpu_dra::compute_domain::plugin::config::max_domains_flag)]
    max_domains: u32,
    /// How long a channel prepare waits for the node's IMEX daemon to turn Ready, in seconds
    /// (`30`, `30s`) or minutes; keep it under the kubelet's 45 s limit.
    #[arg(long, env = "GPU_DRA_DAEMON_READY_TIMEOUT", default_value = "30", value_parser = interval_seconds)]
    daemon_ready_timeout: u64,
    /// Address (`host:port`) serving /metrics, /healthz and /readyz; "" or `off` disables it.
    #[arg(long, env = "GPU_DRA_METRICS_ADDR", default_value = gpu_dra::compute_domain::plugin::config::DEFAULT_METRICS_ADDR)]
    metrics_addr: String,
}

#[derive(clap::Args, Debug)]
struct ComputeDomainControllerArgs {
    /// Kubeconfig file; in-cluster configuration when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The driver's namespace: the Lease, the IMEX daemons' claim templates and DaemonSets,
    /// the ComputeDomainNode objects.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// Image of the IMEX daemon pods (`gpu-dra imex-daemon`), normally the controller's own.
    #[arg(long, env = "GPU_DRA_IMEX_IMAGE")]
    image: String,
    /// Service account of the IMEX daemon pods.
    #[arg(
        long,
        env = "GPU_DRA_IMEX_SERVICE_ACCOUNT",
        default_value = "gpu-dra-imex-daemon"
    )]
    daemon_service_account: String,
    /// The IMEX daemon pods run the binary's own simulated IMEX tools (for simulated nodes,
    /// whose image has no IMEX package): sets `GPU_DRA_SIMULATED_IMEX=true` in them.
    #[arg(long, env = "GPU_DRA_SIMULATED_IMEX")]
    simulated_imex: bool,
    /// Elect a leader with a Lease in --namespace, so several replicas can run.
    #[arg(long, env = "GPU_DRA_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    leader_election: bool,
    /// This replica's identity in the Lease; defaults to the pod's name, else the host name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Address (`host:port`) serving /metrics and /healthz; none when absent.
    #[arg(long, env = "GPU_DRA_METRICS_ADDR")]
    metrics_addr: Option<String>,
}

/// `doctor` takes the plugin's own flags and environment, so it checks exactly that plugin.
#[derive(clap::Args, Debug)]
struct DoctorArgs {
    /// DRA driver name.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// The node whose ResourceSlices are checked; default: the simulated node's name, else the
    /// host name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Kubeconfig for the cluster checks; in a pod, the in-cluster configuration. Without
    /// either, the cluster is not checked.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// GPU backend.
    #[arg(long, env = "GPU_DRA_GPU_BACKEND", value_enum, default_value = "nvml")]
    gpu_backend: Backend,
    /// Simulated node (preset or node file) for --gpu-backend sim.
    #[arg(long, env = "GPU_DRA_SIM_NODE", default_value = demo::DEFAULT_PRESET)]
    sim_node: String,
    /// With --gpu-backend nvml: the NVML library to load instead of the system's.
    #[arg(long, env = "GPU_DRA_NVML_LIB")]
    nvml_lib: Option<PathBuf>,
    /// The node has no NVIDIA driver files or device nodes (kind, CI); implied by
    /// --gpu-backend sim.
    #[arg(long, env = "GPU_DRA_SIMULATED_HOST")]
    simulated_host: bool,
    /// Directory of the DRA socket (default /var/lib/kubelet/plugins/<driver>).
    #[arg(long, env = "GPU_DRA_PLUGIN_DIR")]
    plugin_dir: Option<PathBuf>,
    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(
        long,
        env = "GPU_DRA_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    registry_dir: PathBuf,
    /// Where CDI specs are written.
    #[arg(long, env = "GPU_DRA_CDI_ROOT", default_value = "/var/run/cdi")]
    cdi_root: PathBuf,
    /// NVIDIA driver root as this process sees it.
    #[arg(long, env = "GPU_DRA_DRIVER_ROOT", default_value = "/")]
    driver_root: PathBuf,
    /// NVIDIA driver root on the host, when this process sees it elsewhere.
    #[arg(long, env = "GPU_DRA_HOST_DRIVER_ROOT")]
    host_driver_root: Option<PathBuf>,
    /// Root under which /dev is found.
    #[arg(long, env = "GPU_DRA_DEV_ROOT", default_value = "/")]
    dev_root: PathBuf,
    /// The proc filesystem.
    #[arg(long, env = "GPU_DRA_PROC_ROOT", default_value = "/proc")]
    proc_root: PathBuf,
    /// Checkpoint and simulated-hardware state (default: the plugin directory).
    #[arg(long, env = "GPU_DRA_STATE_DIR")]
    state_dir: Option<PathBuf>,
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
    /// Output: a table for people, or `{"checks": [{name, status, found, fix}]}`.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: DoctorOutput,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum DoctorOutput {
    Table,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    fn directive(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
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

impl Command {
    /// The verb as typed on the command line, for the start-up log line.
    fn verb(&self) -> &'static str {
        match self {
            Command::Demo { .. } => "demo",
            Command::Inventory(_) => "inventory",
            Command::Explain(_) => "explain",
            Command::KubeletPlugin(_) => "kubelet-plugin",
            Command::ComputeDomainPlugin(_) => "compute-domain-plugin",
            Command::Cel { .. } => "cel",
            Command::SimFault(_) => "sim-fault",
            Command::Capacity(_) => "capacity",
            Command::Doctor(_) => "doctor",
            Command::ImexDaemon(_) => "imex-daemon",
            Command::ComputeDomainController(_) => "compute-domain-controller",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sim,
    Nvml,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Table,
    Yaml,
    Json,
}

fn main() -> ExitCode {
    // Run as `nvidia-smi` or `nvidia-cuda-mps-control` (symlinks made by the simulated tools),
    // the binary is that tool.
    let mut argv = std::env::args_os();
    let argv0 = argv.next().unwrap_or_default();
    if let Some(tool) = simtools::personality(&argv0) {
        let args = argv.map(|a| a.to_string_lossy().into_owned()).collect();
        return simtools::run(tool, args);
    }
    // Likewise `nvidia-imex` / `nvidia-imex-ctl` (compute_domain::imex::install_simulated).
    if let Some(tool) = gpu_dra::compute_domain::imex::personality(&argv0) {
        let args = argv.map(|a| a.to_string_lossy().into_owned()).collect();
        return gpu_dra::compute_domain::imex::run(tool, args);
    }
    let cli = Cli::parse();
    let (format, default_level) = match &cli.command {
        Command::KubeletPlugin(a) => (a.node.log_format.into(), a.node.log_level.directive()),
        Command::ComputeDomainPlugin(a) => (a.node.log_format.into(), a.node.log_level.directive()),
        Command::ImexDaemon(_) => (logging::Format::Text, "info"),
        Command::ComputeDomainController(_) => (logging::Format::Text, "info"),
        _ => (logging::Format::Text, "warn"),
    };
    let colour = logging::init(format, default_level);
    tracing::debug!(
        verb = cli.command.verb(),
        version = env!("CARGO_PKG_VERSION"),
        colour,
        "gpu-dra starting"
    );
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::from(1)
        }
    }
}

/// `a: b: c` from an error and its sources, skipping causes already in the message.
fn chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

fn run_plugin(args: PluginArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::plugin::PluginConfig;
    let node = args.node;
    let (backend, node_name) = node.backend_and_name()?;
    let plugin_dir = node
        .plugin_dir
        .unwrap_or_else(|| PathBuf::from(format!("/var/lib/kubelet/plugins/{}", args.driver_name)));
    let config = PluginConfig {
        driver_name: args.driver_name,
        node_name,
        kubeconfig: node.kubeconfig,
        backend,
        mig_policy: args.mig_policy.map(MigPolicy::from),
        gpu_mig_policies: policy_flag::parse_gpu_policies(&args.gpu_mig_policies)?,
        mig_profiles: args.mig_profiles.mig_profiles,
        simulated_host: node.simulated_host,
        state_dir: node.state_dir.unwrap_or_else(|| plugin_dir.clone()),
        plugin_dir,
        registry_dir: node.registry_dir,
        pod_uid: node.pod_uid,
        cdi_root: node.cdi_root,
        driver_root: args.driver_root,
        host_driver_root: args.host_driver_root,
        dev_root: node.dev_root,
        proc_root: args.proc_root,
        inventory_interval: std::time::Duration::from_secs(args.inventory_interval.max(1)),
        telemetry_interval: std::time::Duration::from_secs(args.telemetry_interval.max(1)),
        holders_refresh_interval: std::time::Duration::from_secs(
            args.holders_refresh_interval.max(1),
        ),
        orphan_grace_period: args.orphan_grace_period,
        health_policy: args.health_policy,
        mps: args.mps,
        time_slicing: args.time_slicing,
        shared_gpus: args.shared_gpus,
        metrics_addr: gpu_dra::plugin::config::metrics_addr_flag(&args.metrics_addr),
    };
    block_on(gpu_dra::plugin::run(config))
}

impl NodeFlags {
    /// The backend, and the node name (the simulated node's when not given with sim).
    fn backend_and_name(&self) -> anyhow::Result<(gpu_dra::plugin::BackendChoice, String)> {
        use gpu_dra::plugin::BackendChoice;
        let backend = match self.gpu_backend {
            Backend::Nvml => BackendChoice::Nvml {
                lib: self.nvml_lib.clone(),
            },
            Backend::Sim => BackendChoice::Sim {
                sim_node: self.sim_node.clone(),
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
}

/// Runs a long-running verb on the two-thread runtime the node agents use.
fn block_on<E>(work: impl std::future::Future<Output = Result<(), E>>) -> anyhow::Result<ExitCode>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(work)?;
    Ok(ExitCode::SUCCESS)
}

fn run_compute_domain_plugin(args: CdPluginArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::compute_domain::plugin::{CdPluginConfig, config};
    let node = args.node;
    let (backend, node_name) = node.backend_and_name()?;
    let plugin_dir = node
        .plugin_dir
        .unwrap_or_else(|| PathBuf::from(config::DEFAULT_PLUGIN_DIR));
    block_on(gpu_dra::compute_domain::plugin::run(CdPluginConfig {
        node_name,
        kubeconfig: node.kubeconfig,
        backend,
        clique_override: args.clique_id,
        simulated_host: node.simulated_host,
        state_dir: node.state_dir.unwrap_or_else(|| plugin_dir.clone()),
        plugin_dir,
        registry_dir: node.registry_dir,
        pod_uid: node.pod_uid,
        cdi_root: node.cdi_root,
        dev_root: node.dev_root,
        metrics_addr: gpu_dra::plugin::config::metrics_addr_flag(&args.metrics_addr),
        namespace: args.namespace,
        max_domains: args.max_domains,
        ready_timeout: std::time::Duration::from_secs(args.daemon_ready_timeout),
    }))
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo {
            sim_node,
            driver_name,
        } => {
            emit(&demo::run(&sim_node, &driver_name)?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Inventory(args) => run_inventory(args),
        Command::KubeletPlugin(args) => run_plugin(*args),
        Command::ComputeDomainPlugin(args) => run_compute_domain_plugin(*args),
        Command::ImexDaemon(a) => {
            use gpu_dra::compute_domain::daemon::{self, DaemonConfig};
            daemon::run_until_signal(DaemonConfig {
                node_name: a.node_name,
                pod_ip: a.pod_ip,
                namespace: a.namespace,
                kubeconfig: a.kubeconfig,
                config_dir: a.config_dir,
                imex_bin: a.imex_bin,
                imex_ctl_bin: a.imex_ctl_bin,
                simulated_imex: a.simulated_imex,
                domain_uid: a.domain_uid,
                domain_name: a.domain_name,
                domain_namespace: a.domain_namespace,
                clique: a.clique,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::SimFault(args) => run_sim_fault(args),
        Command::Explain(args) => run_explain(args),
        Command::Capacity(args) => run_capacity(args),
        Command::Doctor(args) => run_doctor(*args),
        Command::ComputeDomainController(args) => run_compute_domain_controller(args),
        Command::Cel {
            expression,
            device,
            driver,
        } => match gpu_dra::cel::evaluate_device_file(&expression, &device, &driver) {
            Ok(matched) => {
                emit(&format!("{matched}\n"))?;
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("error: {}", chain(&anyhow::Error::new(e)));
                Ok(ExitCode::from(2))
            }
        },
    }
}

fn run_compute_domain_controller(args: ComputeDomainControllerArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::compute_domain::controller::{self, ControllerConfig, Settings};
    let identity = args.identity.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| format!("compute-domain-controller-{}", std::process::id()))
    });
    let config = ControllerConfig {
        kubeconfig: args.kubeconfig,
        settings: Settings {
            namespace: args.namespace,
            image: args.image,
            daemon_service_account: args.daemon_service_account,
            simulated_imex: args.simulated_imex,
        },
        leader_election: args.leader_election,
        identity,
        timing: controller::leader::Timing::default(),
        retry_after: std::time::Duration::from_secs(1),
        metrics_addr: args.metrics_addr.filter(|a| !a.is_empty() && a != "off"),
        resync_period: controller::RESYNC_PERIOD,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(controller::run_until_signalled(config))?;
    Ok(ExitCode::SUCCESS)
}

fn run_doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::doctor::{self, DoctorConfig, NodeGpus, RuntimePaths};
    let backend = match args.gpu_backend {
        Backend::Nvml => gpu_dra::plugin::BackendChoice::Nvml { lib: args.nvml_lib },
        Backend::Sim => gpu_dra::plugin::BackendChoice::Sim {
            sim_node: args.sim_node,
        },
    };
    let plugin_dir = args
        .plugin_dir
        .unwrap_or_else(|| PathBuf::from(format!("/var/lib/kubelet/plugins/{}", args.driver_name)));
    let state_dir = args.state_dir.unwrap_or_else(|| plugin_dir.clone());
    let gpus = NodeGpus {
        simulated: args.simulated_host || args.gpu_backend == Backend::Sim,
        backend,
        driver_root: args.driver_root.clone(),
        sim_state: state_dir.join("sim"),
    };
    let config = DoctorConfig {
        cluster: args.kubeconfig.is_some() || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        driver_name: args.driver_name,
        node_name: args.node_name,
        kubeconfig: args.kubeconfig,
        layout: gpu_dra::cdi::HostLayout {
            dev_root: args.dev_root,
            proc_root: args.proc_root,
            driver_root: args.driver_root,
            host_driver_root: args.host_driver_root,
        },
        cdi_root: args.cdi_root,
        plugin_dir,
        registry_dir: args.registry_dir,
        runtime: RuntimePaths {
            containerd: args.containerd_config,
            crio: args.crio_config,
        },
        quick: args.quick,
    };
    let report = doctor::run(&config, &gpus)?;
    match args.output {
        DoctorOutput::Table => emit(&report.render_table())?,
        DoctorOutput::Json => emit(&report.to_json())?,
    }
    Ok(ExitCode::from(report.exit_code()))
}

fn run_inventory(args: InventoryArgs) -> anyhow::Result<ExitCode> {
    if args.list_presets {
        emit(&list_presets()?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(name) = &args.print_preset {
        let Some(p) = presets::preset(name) else {
            bail!(
                "unknown preset {name:?}; presets: {}",
                presets::preset_names()
            );
        };
        emit(&format!(
            "# gpu-dra simulated node: {}\n{}",
            p.summary, p.yaml
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let backend_kind = match (args.gpu_backend, &args.sim_node) {
        // With --nvml-lib, GPU_DRA_SIM_NODE names the simulated library's node.
        (Some(Backend::Nvml), Some(_)) if args.nvml_lib.is_none() => {
            bail!("--sim-node needs --gpu-backend sim (or no --gpu-backend)")
        }
        (Some(b), _) => b,
        (None, Some(_)) => Backend::Sim,
        (None, None) => Backend::Nvml,
    };
    let mut options = ModelOptions {
        driver_name: args.driver_name.clone(),
        policies: Default::default(),
        default_policy: args.mig_policy.map(MigPolicy::from),
        shared_gpus: args.shared_gpus,
        mig_profiles: args.mig_profiles.mig_profiles.clone(),
    };
    let (backend, default_node): (Box<dyn GpuBackend>, String) = match backend_kind {
        Backend::Sim => {
            let node = args.sim_node.as_deref().unwrap_or(demo::DEFAULT_PRESET);
            let sim = SimBackend::open(node, args.state_dir.as_deref())?;
            if args.mig_policy.is_none() {
                options.policies =
                    ModelOptions::with_policies(&args.driver_name, &sim.mig_policies()).policies;
            }
            let name = sim.node_name().to_string();
            (Box::new(sim), name)
        }
        Backend::Nvml => (
            Box::new(NvmlBackend::open_with(args.nvml_lib.as_deref())?),
            host_name(),
        ),
    };
    options
        .policies
        .extend(policy_flag::parse_gpu_policies(&args.gpu_mig_policies)?);
    let node_name = args.node_name.unwrap_or(default_node);
    let policy = match &args.health_policy {
        Some(path) => gpu_dra::health::HealthPolicy::load(path)?,
        None => gpu_dra::health::HealthPolicy::default(),
    };
    let now = gpu_dra::hardware::health::unix_now();
    let view = inventory::view_judged(backend.as_ref(), &node_name, &options, &policy, now)
        .with_context(|| format!("inventory of node {node_name}"))?;
    match args.output {
        Output::Table => emit(&inventory::render_table(&view))?,
        Output::Yaml => emit(&format!(
            "{}{}",
            inventory::clique_comments(&view),
            inventory::slices_yaml(&view.slices)?
        ))?,
        Output::Json => emit(&inventory::slices_json(&view.slices)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn run_sim_fault(args: SimFaultArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::hardware::health;
    use gpu_dra::hardware::sim::faults::Fault;
    let nested = args.state_dir.join("sim");
    let dir = if !args.state_dir.join(sim::STATE_FILE).exists()
        && nested.join(sim::STATE_FILE).exists()
    {
        nested
    } else {
        args.state_dir
    };
    let sim = SimBackend::open_state_dir(&dir)?;
    let (gpu, fault) = match args.fault {
        FaultCommand::AddGpu { model } => {
            let index = sim.add_gpu(&model)?;
            emit(&format!("added GPU {index} ({model})\n"))?;
            return Ok(ExitCode::SUCCESS);
        }
        FaultCommand::RemoveGpu { gpu } => {
            sim.remove_gpu(gpu)?;
            emit(&format!("removed GPU {gpu}\n"))?;
            return Ok(ExitCode::SUCCESS);
        }
        FaultCommand::Load {
            gpu,
            sm,
            power,
            memory_mib,
            temperature,
            clear,
        } => {
            use gpu_dra::hardware::sim::telemetry::SimLoad;
            let load = (!clear).then_some(SimLoad {
                sm_active_percent: sm.map(|r| (r * 100.0).round() as u32),
                power_watts: power,
                memory_used_mib: memory_mib,
                temperature_celsius: temperature,
            });
            sim.set_load(gpu, load)?;
            emit(&match load {
                Some(l) => format!("GPU {gpu}: load set to {l:?}\n"),
                None => format!("GPU {gpu}: load cleared\n"),
            })?;
            return Ok(ExitCode::SUCCESS);
        }
        FaultCommand::Xid {
            gpu,
            code,
            gpu_instance,
        } => (gpu, Fault::Xid { code, gpu_instance }),
        FaultCommand::Ecc { gpu, double_bit } => (gpu, Fault::Ecc { double_bit }),
        FaultCommand::Lost { gpu } => (gpu, Fault::Lost),
        FaultCommand::Recover { gpu } => (gpu, Fault::Recover),
    };
    let events = sim.inject(gpu, fault)?;
    let state = sim.fault_state(gpu)?;
    let mut out = String::new();
    for e in &events {
        let name = match e.event_type {
            health::EVENT_XID_CRITICAL => "XID critical error",
            health::EVENT_SINGLE_BIT_ECC => "single-bit ECC error",
            health::EVENT_DOUBLE_BIT_ECC => "double-bit ECC error",
            health::EVENT_GPU_UNAVAILABLE => "GPU unavailable",
            health::EVENT_GPU_RECOVERY_ACTION => "recovery action",
            _ => "event",
        };
        out.push_str(&format!(
            "GPU {gpu}: {name} (type {:#x}, data {})\n",
            e.event_type, e.data
        ));
    }
    out.push_str(&format!(
        "GPU {gpu} is {}{}\n",
        if state.healthy {
            "healthy"
        } else {
            "unhealthy"
        },
        if state.lost { " (lost)" } else { "" }
    ));
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn run_explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::explain::{self, ExplainInput};
    use gpu_dra::explain_inputs;
    let bad_input = |e: String| -> anyhow::Result<ExitCode> {
        eprintln!("error: {e}");
        Ok(ExitCode::from(2))
    };
    let claims = match explain::load_claims(&args.claim) {
        Ok(c) => c,
        Err(e) => return bad_input(chain(&anyhow::Error::new(e))),
    };
    let mut allocated = match &args.allocated {
        Some(p) => match explain::load_allocated(p) {
            Ok(a) => a,
            Err(e) => return bad_input(chain(&anyhow::Error::new(e))),
        },
        None => Vec::new(),
    };
    let (classes, slices) = if args.kubeconfig.is_some() || args.in_cluster {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let state = runtime.block_on(async {
            let client = gpu_dra::k8s::connect(args.kubeconfig.as_deref()).await?;
            anyhow::Ok(explain_inputs::cluster_state(client, args.node.as_deref()).await?)
        })?;
        allocated.extend(state.allocated);
        let classes = match &args.classes {
            Some(_) => explain_inputs::classes(args.classes.as_deref()),
            None => Ok(state.classes),
        };
        (classes, Ok(state.slices))
    } else {
        let slices = match (&args.slices, &args.sim_node) {
            (Some(path), _) => {
                explain::load_slices(path).map_err(|e| chain(&anyhow::Error::new(e)))
            }
            (None, sim_node) => explain_inputs::sim_slices(
                sim_node.as_deref().unwrap_or(demo::DEFAULT_PRESET),
                &args.driver_name,
                explain_inputs::SimSliceOptions {
                    shared_gpus: args.shared_gpus,
                    mig_profiles: args.mig_profiles.mig_profiles.clone(),
                },
            )
            .map_err(|e| chain(&anyhow::Error::new(e))),
        };
        (explain_inputs::classes(args.classes.as_deref()), slices)
    };
    let (classes, slices) = match (classes, slices) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(e), _) | (_, Err(e)) => return bad_input(e),
    };
    let input = ExplainInput {
        classes,
        slices,
        allocated,
        claims,
    };
    let report = explain::explain(&gpu_dra::selectors::CelEngine, &input);
    match args.output {
        Output::Table => emit(&report.render_human())?,
        Output::Json => emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report.to_json())?
        ))?,
        Output::Yaml => emit(&report.to_yaml())?,
    }
    Ok(if report.input_error().is_some() {
        ExitCode::from(2)
    } else if report.fits() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn run_capacity(args: CapacityArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::capacity::{self, CapacityOptions, TableOptions};
    let bad_input = |e: anyhow::Error| {
        eprintln!("error: {}", chain(&e));
        Ok(ExitCode::from(2))
    };
    let options = CapacityOptions {
        driver: args.driver_name.clone(),
        pool_label: args.pool_label.clone(),
        node: args.node.clone(),
    };
    let report = match &args.slices {
        Some(slices) => capacity::build_from_files(
            capacity::InputFiles {
                slices,
                claims: args.claims.as_deref(),
                nodes: args.nodes.as_deref(),
            },
            &options,
        ),
        None => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let lists = runtime.block_on(async {
                let client = gpu_dra::k8s::connect(args.kubeconfig.as_deref()).await?;
                let with_nodes = args.pool_label.is_some();
                anyhow::Ok(
                    capacity::inputs::from_cluster(
                        client,
                        &args.driver_name,
                        args.node.as_deref(),
                        with_nodes,
                    )
                    .await?,
                )
            })?;
            capacity::build_from_cluster(&lists, &options)
        }
    };
    let report = match report {
        Ok(report) => report,
        Err(e) => return bad_input(e.into()),
    };
    match args.output {
        Output::Table => emit(&capacity::render_table(
            &report,
            &TableOptions {
                detail: args.detail || options.node.is_some(),
                ..TableOptions::default()
            },
        ))?,
        Output::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?,
        Output::Yaml => emit(&serde_yaml::to_string(&report)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn list_presets() -> anyhow::Result<String> {
    let mut out = String::from("Simulated nodes (--sim-node):\n");
    for p in presets::PRESETS {
        out.push_str(&format!("  {:<12} {}\n", p.name, p.summary));
    }
    out.push_str("\nGPU models for node files (gpus[].model):\n");
    for m in catalog::models()? {
        let mig = if m.mig_capable() {
            let names: Vec<&str> = m.profiles.iter().map(|p| p.name.as_str()).collect();
            format!("MIG {}", names.join(" "))
        } else {
            "no MIG".to_string()
        };
        out.push_str(&format!("  {:<15} {:<26} {mig}\n", m.key, m.product_name));
    }
    out.push_str(&format!(
        "\nNode file format: gpu-dra inventory --print-preset mixed; state file: <state-dir>/{}\n",
        sim::STATE_FILE
    ));
    Ok(out)
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}
