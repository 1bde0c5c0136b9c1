//! The `gpu-dra` binary: flag parsing and the edge where library errors become messages and
//! exit codes (0 success, 1 failure, 2 bad input).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use gpu_dra::devices::{DEFAULT_DRIVER_NAME, ModelOptions, SharedGpus};
use gpu_dra::hardware::sim::{self, SimBackend, presets};
use gpu_dra::hardware::{GpuBackend, MigPolicy, catalog, nvml::NvmlBackend};
use gpu_dra::sharing::simtools;
use gpu_dra::{demo, inventory};

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
    /// The cluster's GPUs per node, GPU and MIG profile: who holds what, and what is free.
    /// Exit 0, or 2 on bad input.
    Capacity(CapacityArgs),
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

#[derive(clap::Args, Debug)]
struct InventoryArgs {
    /// GPU backend; defaults to `sim` when --sim-node is given, else `nvml`.
    #[arg(long, env = "GPU_DRA_GPU_BACKEND", value_enum)]
    gpu_backend: Option<Backend>,
    /// Simulated node: a preset name or a node file (implies --gpu-backend sim).
    #[arg(long, env = "GPU_DRA_SIM_NODE")]
    sim_node: Option<String>,
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

#[derive(clap::Args, Debug)]
struct PluginArgs {
    /// DRA driver name.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
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
    /// MIG policy for every GPU (default: the node file's with sim; with nvml, static for
    /// GPUs with MIG on, disabled otherwise).
    #[arg(long, env = "GPU_DRA_MIG_POLICY", value_enum)]
    mig_policy: Option<Policy>,
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
    /// NVIDIA driver root as this process sees it.
    #[arg(long, env = "GPU_DRA_DRIVER_ROOT", default_value = "/")]
    driver_root: PathBuf,
    /// NVIDIA driver root on the host, when the plugin sees it elsewhere (a container mount).
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
    /// Seconds between inventory checks (health, MIG mode, model changes).
    #[arg(long, env = "GPU_DRA_INVENTORY_INTERVAL", default_value_t = 10)]
    inventory_interval: u64,
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
    /// Log format.
    #[arg(long, env = "GPU_DRA_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log level; GPU_DRA_LOG, when set, overrides it with a full filter
    /// (e.g. `info,gpu_dra::k8s=debug`).
    #[arg(long, env = "GPU_DRA_LOG_LEVEL", value_enum, default_value = "info")]
    log_level: LogLevel,
    /// Address (`host:port`) serving /metrics, /healthz and /readyz; "" or `off` disables it.
    #[arg(long, env = "GPU_DRA_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: String,
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
    if let Some(tool) = argv.next().and_then(|a0| simtools::personality(&a0)) {
        let args = argv.map(|a| a.to_string_lossy().into_owned()).collect();
        return simtools::run(tool, args);
    }
    let cli = Cli::parse();
    let json = matches!(&cli.command, Command::KubeletPlugin(a) if a.log_format == LogFormat::Json);
    let default_level = match &cli.command {
        Command::KubeletPlugin(a) => a.log_level.directive(),
        _ => "warn",
    };
    init_logging(json, default_level);
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

fn init_logging(json: bool, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPU_DRA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

fn run_plugin(args: PluginArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::plugin::{BackendChoice, PluginConfig};
    let backend = match args.gpu_backend {
        Backend::Nvml => BackendChoice::Nvml,
        Backend::Sim => BackendChoice::Sim {
            sim_node: args.sim_node.clone(),
        },
    };
    let node_name = match (args.node_name, &backend) {
        (Some(n), _) => n,
        (None, BackendChoice::Sim { sim_node }) => {
            sim::NodeSource::resolve(sim_node)?.plan()?.node_name
        }
        (None, BackendChoice::Nvml) => {
            bail!("--node-name (or NODE_NAME) is required with --gpu-backend nvml")
        }
    };
    let plugin_dir = args
        .plugin_dir
        .unwrap_or_else(|| PathBuf::from(format!("/var/lib/kubelet/plugins/{}", args.driver_name)));
    let config = PluginConfig {
        driver_name: args.driver_name,
        node_name,
        kubeconfig: args.kubeconfig,
        backend,
        mig_policy: args.mig_policy.map(MigPolicy::from),
        state_dir: args.state_dir.unwrap_or_else(|| plugin_dir.clone()),
        plugin_dir,
        registry_dir: args.registry_dir,
        pod_uid: args.pod_uid,
        cdi_root: args.cdi_root,
        driver_root: args.driver_root,
        host_driver_root: args.host_driver_root,
        dev_root: args.dev_root,
        proc_root: args.proc_root,
        inventory_interval: std::time::Duration::from_secs(args.inventory_interval.max(1)),
        mps: args.mps,
        time_slicing: args.time_slicing,
        shared_gpus: args.shared_gpus,
        metrics_addr: gpu_dra::plugin::config::metrics_addr_flag(&args.metrics_addr),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(gpu_dra::plugin::run(config))?;
    Ok(ExitCode::SUCCESS)
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
        Command::Explain(args) => run_explain(args),
        Command::Capacity(args) => run_capacity(args),
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
        (Some(Backend::Nvml), Some(_)) => {
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
        Backend::Nvml => (Box::new(NvmlBackend::open()?), host_name()),
    };
    let node_name = args.node_name.unwrap_or(default_node);
    let view = inventory::view(backend.as_ref(), &node_name, &options)
        .with_context(|| format!("inventory of node {node_name}"))?;
    match args.output {
        Output::Table => emit(&inventory::render_table(&view))?,
        Output::Yaml => emit(&inventory::slices_yaml(&view.slices)?)?,
        Output::Json => emit(&inventory::slices_json(&view.slices)?)?,
    }
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
                args.shared_gpus,
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
    let input = match &args.slices {
        Some(slices) => match capacity::inputs::from_files(
            slices,
            args.claims.as_deref(),
            args.nodes.as_deref(),
        ) {
            Ok(input) => input,
            Err(e) => return bad_input(e.into()),
        },
        None => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
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
            })?
        }
    };
    let options = CapacityOptions {
        driver: args.driver_name,
        pool_label: args.pool_label,
        node: args.node,
    };
    let report = match capacity::build(&input, &options) {
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
