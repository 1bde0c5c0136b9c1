//! `gpu-dra imex-daemon`: a node's IMEX daemon wrapper, what a ComputeDomain's DaemonSet pod
//! runs.

use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `gpu-dra imex-daemon`; the domain and clique come from the daemon claim's CDI
/// environment (`compute_domain::api::daemon_env`).
#[derive(clap::Args, Debug)]
pub(crate) struct ImexDaemonArgs {
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

/// Runs the IMEX daemon wrapper until it is signalled to stop.
///
/// Fails with the daemon's error (bad configuration, the cluster or `nvidia-imex` failing).
pub(crate) fn run(a: ImexDaemonArgs) -> anyhow::Result<ExitCode> {
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
