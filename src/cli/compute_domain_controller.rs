//! `gpu-dra compute-domain-controller`: per ComputeDomain its claim templates, IMEX DaemonSet
//! and status (docs/compute-domains.md).

use std::process::ExitCode;

use anyhow::Context;

use super::flags::{KubeconfigFlag, interval_seconds};

/// Flags of `gpu-dra compute-domain-controller`.
#[derive(clap::Args, Debug)]
pub(crate) struct ComputeDomainControllerArgs {
    /// `--kubeconfig`.
    #[command(flatten)]
    kubeconfig: KubeconfigFlag,
    /// `--log-format`, `--log-level`.
    #[command(flatten)]
    pub(crate) log: super::flags::LogFlags,
    /// The driver's namespace: the Lease, the IMEX daemons' claim templates and DaemonSets,
    /// the ComputeDomainNode objects.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// Image of the IMEX daemon pods (`gpu-dra imex-daemon`). Default: the image of the
    /// controller's own pod (read through POD_NAME and POD_NAMESPACE: its container
    /// `controller`, else its first).
    #[arg(long, env = "GPU_DRA_IMEX_IMAGE")]
    image: Option<String>,
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
    /// Hold a ComputeDomain's pods in the scheduler's PreBind until their node's IMEX daemon
    /// is Ready (KEP-5007 binding conditions): label the allocated node at allocation, set
    /// IMEXDaemonReady or IMEXDaemonFailed on the claim. Needs the plugin's
    /// --binding-conditions (the chart's computeDomains.bindingConditions sets both).
    #[arg(long, env = "GPU_DRA_BINDING_CONDITIONS")]
    binding_conditions: bool,
    /// How long a pending channel waits for its node's IMEX daemon before the controller sets
    /// IMEXDaemonFailed and the scheduler tries another node: seconds (`300`, `300s`) or
    /// minutes (`5m`).
    #[arg(long, env = "GPU_DRA_BINDING_TIMEOUT", default_value = "5m", value_parser = interval_seconds)]
    binding_timeout: u64,
}

/// Runs the controller until it is signalled to stop.
///
/// Fails when the runtime cannot start ("starting the async runtime") or the controller fails.
pub(crate) fn run(args: ComputeDomainControllerArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::compute_domain::controller::{self, ControllerConfig, Settings};
    let identity = args.identity.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| format!("compute-domain-controller-{}", std::process::id()))
    });
    // The pod's own name and namespace, from the downward API, whatever --identity and
    // --namespace say: that is the pod whose image the daemons run when --image is absent.
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let own_pod = env("POD_NAMESPACE").zip(env("POD_NAME"));
    let config = ControllerConfig {
        kubeconfig: args.kubeconfig.kubeconfig,
        settings: Settings {
            namespace: args.namespace,
            image: args.image.unwrap_or_default(),
            daemon_service_account: args.daemon_service_account,
            simulated_imex: args.simulated_imex,
        },
        leader_election: args.leader_election,
        identity,
        timing: controller::leader::Timing::default(),
        retry_after: std::time::Duration::from_secs(1),
        metrics_addr: args.metrics_addr.filter(|a| !a.is_empty() && a != "off"),
        resync_period: controller::RESYNC_PERIOD,
        daemon_stop_wait: controller::DAEMON_STOP_WAIT,
        own_pod,
        binding_conditions: args.binding_conditions,
        binding_timeout: std::time::Duration::from_secs(args.binding_timeout),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(controller::run_until_signalled(config))?;
    Ok(ExitCode::SUCCESS)
}
