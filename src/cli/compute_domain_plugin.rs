//! `gpu-dra compute-domain-plugin`: the ComputeDomain kubelet plugin (driver
//! compute-domain.nvidia.com) on this node.

use std::path::PathBuf;
use std::process::ExitCode;

use super::common::{Threads, block_on};
use super::flags::{DriverRootFlag, NodeFlags, interval_seconds};

/// Flags of `gpu-dra compute-domain-plugin`.
#[derive(clap::Args, Debug)]
pub(crate) struct CdPluginArgs {
    /// The node flags, shared with `kubelet-plugin` (its log flags are read by `main`).
    #[command(flatten)]
    pub(crate) node: NodeFlags,
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
    /// Who runs the node's IMEX daemon: `DriverManaged` (one daemon per ComputeDomain, the
    /// default) or `HostManaged` (the host's nvidia-imex service; every domain gets channel 0,
    /// handed out only while `nvidia-imex-ctl -q` answers READY).
    #[arg(long, env = "GPU_DRA_IMEX_MODE", default_value = "DriverManaged", value_parser = gpu_dra::compute_domain::plugin::config::imex_mode_flag)]
    imex_mode: gpu_dra::compute_domain::plugin::config::ImexMode,
    /// HostManaged: the host nvidia-imex service's command socket (its
    /// IMEX_CMD_UNIX_DOMAIN_PATH), as the host sees it.
    #[arg(long, env = "GPU_DRA_IMEX_HOST_SOCKET", default_value = gpu_dra::compute_domain::plugin::config::DEFAULT_IMEX_HOST_SOCKET)]
    imex_host_socket: PathBuf,
    /// HostManaged: nvidia-imex-ctl under --driver-root (run with chroot when the root is not /).
    #[arg(long, env = "GPU_DRA_IMEX_CTL_BIN", default_value = gpu_dra::compute_domain::plugin::config::DEFAULT_IMEX_CTL)]
    imex_ctl_bin: PathBuf,
    #[command(flatten)]
    driver_root: DriverRootFlag,
    /// Channel devices carry bindingConditions [IMEXDaemonReady] and bindingFailureConditions
    /// [IMEXDaemonFailed]: pods bind only once the node's IMEX daemon is Ready. Needs the
    /// controller's --binding-conditions (the chart's computeDomains.bindingConditions sets both).
    #[arg(long, env = "GPU_DRA_BINDING_CONDITIONS")]
    binding_conditions: bool,
    /// Address (`host:port`) serving /metrics, /healthz and /readyz; "" or `off` disables it.
    #[arg(long, env = "GPU_DRA_METRICS_ADDR", default_value = gpu_dra::compute_domain::plugin::config::DEFAULT_METRICS_ADDR)]
    metrics_addr: String,
    /// Write each prepared claim's device metadata (Kubernetes KEP-5304: the channel's or
    /// daemon device's pool, name and attributes, per request) and mount it into the claim's
    /// containers at /var/run/kubernetes.io/dra-device-attributes/….
    #[arg(long, env = "GPU_DRA_DEVICE_METADATA", default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    device_metadata: bool,
}

/// Runs the ComputeDomain plugin until it is signalled to stop.
///
/// Fails when the node name cannot be found (see [`NodeFlags::backend_and_name`]), the
/// runtime cannot start, or the plugin fails.
pub(crate) fn run(args: CdPluginArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::compute_domain::plugin::{CdPluginConfig, config};
    let node = args.node;
    let (backend, node_name) = node.backend_and_name()?;
    let (plugin_dir, state_dir) =
        node.plugin_and_state_dirs(PathBuf::from(config::DEFAULT_PLUGIN_DIR));
    block_on(
        Threads::Workers(2),
        gpu_dra::compute_domain::plugin::run(CdPluginConfig {
            node_name,
            kubeconfig: node.kubeconfig.kubeconfig,
            backend,
            clique_override: args.clique_id,
            simulated_host: node.simulated_host,
            state_dir,
            plugin_dir,
            registry_dir: node.kubelet_dirs.registry_dir,
            pod_uid: node.pod_uid,
            cdi_root: node.cdi_root.cdi_root,
            dev_root: node.dev_root.dev_root,
            metrics_addr: gpu_dra::plugin::config::metrics_addr_flag(&args.metrics_addr),
            namespace: args.namespace,
            max_domains: args.max_domains,
            ready_timeout: std::time::Duration::from_secs(args.daemon_ready_timeout),
            imex_mode: args.imex_mode,
            device_metadata: args.device_metadata,
            host_imex: config::HostImex {
                socket: args.imex_host_socket,
                ctl: args.imex_ctl_bin,
                driver_root: args.driver_root.driver_root,
            },
            binding_conditions: args.binding_conditions,
        }),
    )
}
