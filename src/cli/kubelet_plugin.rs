//! `gpu-dra kubelet-plugin`: the DRA kubelet plugin on this node (publishes ResourceSlices,
//! serves prepare/unprepare).

use std::path::PathBuf;
use std::process::ExitCode;

use gpu_dra::devices::SharedGpus;
use gpu_dra::hardware::{MigPolicy, policy_flag};

use super::common::{Threads, block_on};
use super::flags::{
    DriverNameFlag, DriverRootFlag, FabricManagerFlags, GpuMigPoliciesFlag, MigProfilesFlag,
    NodeFlags, Policy, ProcRootFlag, SliceLayoutFlag, VgpuFlags, interval_seconds,
};

/// Flags of `gpu-dra kubelet-plugin`.
#[derive(clap::Args, Debug)]
pub(crate) struct PluginArgs {
    /// `--driver-name`.
    #[command(flatten)]
    driver_name: DriverNameFlag,
    /// The node flags, shared with `compute-domain-plugin` (its log flags are read by `main`).
    #[command(flatten)]
    pub(crate) node: NodeFlags,
    /// `--gpu-mig-policies`.
    #[command(flatten)]
    gpu_mig_policies: GpuMigPoliciesFlag,
    /// MIG policy for every GPU (default: the node file's with sim; with nvml, static for
    /// GPUs with MIG on, disabled otherwise).
    #[arg(long, env = "GPU_DRA_MIG_POLICY", value_enum)]
    mig_policy: Option<Policy>,
    /// `--mig-profiles`.
    #[command(flatten)]
    mig_profiles: MigProfilesFlag,
    /// `--slice-layout`.
    #[command(flatten)]
    slice_layout: SliceLayoutFlag,
    /// `--vgpu-types`, `--compatibility-groups`, `--partitionable-devices-type`.
    #[command(flatten)]
    vgpu: VgpuFlags,
    /// `--driver-root`.
    #[command(flatten)]
    driver_root: DriverRootFlag,
    /// NVIDIA driver root on the host, when the plugin sees it elsewhere (a container mount).
    #[arg(long, env = "GPU_DRA_HOST_DRIVER_ROOT")]
    host_driver_root: Option<PathBuf>,
    /// `--proc-root`.
    #[command(flatten)]
    proc_root: ProcRootFlag,
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
    /// Write each prepared claim's device metadata (Kubernetes KEP-5304: pool, name, PCI bus ID
    /// and attributes of every device, per request) and mount it into the claim's containers
    /// at /var/run/kubernetes.io/dra-device-attributes/…, as KubeVirt and Kubernetes 1.37 read it.
    #[arg(long, env = "GPU_DRA_DEVICE_METADATA", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    device_metadata: bool,
    /// Where the device metadata files are kept on the host (default:
    /// <plugin dir>/dra-device-metadata). The chart puts them on a tmpfs (/var/run/gpu-dra/…):
    /// a new file there costs a tenth of a fresh ext4 inode, and none outlives a reboot,
    /// exactly like the claims they describe.
    #[arg(long, env = "GPU_DRA_DEVICE_METADATA_DIR", value_name = "DIR")]
    device_metadata_dir: Option<PathBuf>,
    /// Publish a VFIO device `gpu-vfio-<i>` per NVIDIA GPU (class vfio.gpu.nvidia.com) and
    /// hand GPUs to VMs by moving them from the nvidia driver to vfio-pci on prepare. Needs the
    /// IOMMU on, and writable host sysfs under --host-root.
    #[arg(long, env = "GPU_DRA_PASSTHROUGH", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false", num_args = 0..=1, default_missing_value = "true")]
    passthrough: bool,
    /// Where the host's sys/, dev/vfio/ and proc/ are found for passthrough (the chart mounts
    /// them under /host-root). Default: / (with --gpu-backend sim: the simulated node's tree,
    /// <state dir>/sim/host-root).
    #[arg(long, env = "GPU_DRA_HOST_ROOT", value_name = "DIR")]
    host_root: Option<PathBuf>,
    /// Address (`host:port`) serving /metrics, /healthz and /readyz; `:port` alone is every
    /// address, IPv6 and IPv4; "" or `off` disables it.
    #[arg(long, env = "GPU_DRA_METRICS_ADDR", default_value = ":8080")]
    metrics_addr: String,
    /// `--fabric-manager` and its endpoint.
    #[command(flatten)]
    fabric_manager: FabricManagerFlags,
}

/// Runs the plugin until it is signalled to stop.
///
/// Fails when the node name cannot be found (see [`NodeFlags::backend_and_name`]),
/// `--gpu-mig-policies` does not parse, the runtime cannot start, or the plugin fails.
pub(crate) fn run(args: PluginArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::plugin::PluginConfig;
    let node = args.node;
    let (backend, node_name) = node.backend_and_name()?;
    let (plugin_dir, state_dir) = node.plugin_and_state_dirs(PathBuf::from(format!(
        "/var/lib/kubelet/plugins/{}",
        args.driver_name.driver_name
    )));
    let config = PluginConfig {
        driver_name: args.driver_name.driver_name,
        node_name,
        kubeconfig: node.kubeconfig.kubeconfig,
        backend,
        mig_policy: args.mig_policy.map(MigPolicy::from),
        gpu_mig_policies: policy_flag::parse_gpu_policies(&args.gpu_mig_policies.gpu_mig_policies)?,
        mig_profiles: args.mig_profiles.mig_profiles,
        slice_layout: args.slice_layout.slice_layout,
        mig_attributes: args.slice_layout.mig_attributes,
        vgpu_types: args.vgpu.vgpu_types,
        compatibility_groups: args.vgpu.compatibility_groups,
        partitionable_devices_type: args.vgpu.partitionable_devices_type,
        simulated_host: node.simulated_host,
        state_dir,
        plugin_dir,
        registry_dir: node.kubelet_dirs.registry_dir,
        pod_uid: node.pod_uid,
        cdi_root: node.cdi_root.cdi_root,
        driver_root: args.driver_root.driver_root,
        host_driver_root: args.host_driver_root,
        dev_root: node.dev_root.dev_root,
        proc_root: args.proc_root.proc_root,
        inventory_interval: std::time::Duration::from_secs(args.inventory_interval.max(1)),
        telemetry_interval: std::time::Duration::from_secs(args.telemetry_interval.max(1)),
        holders_refresh_interval: std::time::Duration::from_secs(
            args.holders_refresh_interval.max(1),
        ),
        orphan_grace_period: args.orphan_grace_period,
        health_policy: args.health_policy,
        mps: args.mps,
        time_slicing: args.time_slicing,
        device_metadata: args.device_metadata,
        device_metadata_dir: args.device_metadata_dir,
        passthrough: args.passthrough,
        host_root: args.host_root,
        shared_gpus: args.shared_gpus,
        metrics_addr: gpu_dra::plugin::config::metrics_addr_flag(&args.metrics_addr),
        fabric_manager: args.fabric_manager.config(),
    };
    block_on(Threads::One, gpu_dra::plugin::run(config))
}
