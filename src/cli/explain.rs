//! `gpu-dra explain`: why claims do or do not fit a node, per request, per device, the first
//! reason; from files, a simulated node or a live cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use gpu_dra::demo;
use gpu_dra::devices::{DEFAULT_DRIVER_NAME, SharedGpus};

use super::common::{chain, emit};
use super::flags::{MigProfilesFlag, Output, SliceLayoutFlag, VgpuFlags};

/// Flags of `gpu-dra explain`.
#[derive(clap::Args, Debug)]
pub(crate) struct ExplainArgs {
    /// A ResourceClaim, ResourceClaimTemplate or Pod manifest (with its claims and templates),
    /// YAML or JSON, one or several documents.
    #[arg(long)]
    claim: PathBuf,
    /// Slices of a simulated node (preset or node file).
    #[arg(long, conflicts_with_all = ["slices", "kubeconfig"])]
    sim_node: Option<String>,
    /// With --sim-node: the node also publishes its VFIO devices (gpu-vfio-<i>), as the plugin
    /// does with --passthrough; the node must simulate a host tree (hgx-h100-passthrough).
    #[arg(long, conflicts_with_all = ["slices", "kubeconfig"])]
    passthrough: bool,
    /// With --sim-node: publish Fabric Manager's partition attributes (gpuModuleID,
    /// partition1/2/4/8) on full GPUs and VFIO devices, as the plugin does with
    /// --fabric-manager; the node must be in shared NVSwitch mode (hgx-h100-fm,
    /// hgx-h100-passthrough).
    #[arg(long, conflicts_with_all = ["slices", "kubeconfig"])]
    fabric_manager: bool,
    /// With --sim-node: publish its GPUs shareable (consumable capacity), as
    /// `kubelet-plugin --shared-gpus` would: off, memory or N shares.
    #[arg(long, default_value = "off", value_name = "off|memory|N")]
    shared_gpus: SharedGpus,
    /// `--mig-profiles`.
    #[command(flatten)]
    mig_profiles: MigProfilesFlag,
    /// `--slice-layout`.
    #[command(flatten)]
    slice_layout: SliceLayoutFlag,
    /// `--vgpu-types`, `--compatibility-groups`, `--partitionable-devices-type` (with
    /// --sim-node).
    #[command(flatten)]
    vgpu: VgpuFlags,
    /// Slices from a file (e.g. `kubectl get resourceslices -o yaml`).
    #[arg(long, conflicts_with = "kubeconfig")]
    slices: Option<PathBuf>,
    /// DeviceClasses (file or directory); default: the built-in gpu.nvidia.com,
    /// mig.nvidia.com, vfio.gpu.nvidia.com and vgpu.gpu.nvidia.com.
    #[arg(long)]
    classes: Option<PathBuf>,
    /// Claims already allocated (file or directory): what they hold is not free.
    #[arg(long)]
    allocated: Option<PathBuf>,
    /// Read classes, slices and allocated claims from this cluster. Without any source of
    /// slices (--sim-node, --slices, --in-cluster and this), a KUBECONFIG in the environment
    /// is read as this; with --sim-node or --slices, KUBECONFIG is left alone.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Read them from the cluster this pod runs in.
    #[arg(long, conflicts_with_all = ["kubeconfig", "slices", "sim_node"])]
    in_cluster: bool,
    /// With a cluster: only this node (default: every node).
    #[arg(long)]
    node: Option<String>,
    /// DRA driver name of simulated slices.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// How the allocator undoes a device a claim constraint refuses after reserving its
    /// shared counters: released (Kubernetes with kubernetes#140431) or leaked (kube-scheduler
    /// 1.34 to 1.36 without it: the device stays unusable for the rest of the node's search,
    /// which refuses partition claims that fit; docs/fabric-manager.md).
    #[arg(long, value_enum, default_value = "released")]
    counter_rollback: CounterRollbackFlag,
    /// Output: reasons for people, or the allocation / reasons as JSON or YAML.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
}

/// `--counter-rollback`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CounterRollbackFlag {
    /// Released, as Kubernetes does with kubernetes#140431.
    Released,
    /// Kept for the rest of the node's search, as kube-scheduler 1.34 to 1.36 without it.
    Leaked,
}

impl From<CounterRollbackFlag> for gpu_dra::alloc::CounterRollback {
    fn from(flag: CounterRollbackFlag) -> Self {
        match flag {
            CounterRollbackFlag::Released => gpu_dra::alloc::CounterRollback::Released,
            CounterRollbackFlag::Leaked => gpu_dra::alloc::CounterRollback::Leaked,
        }
    }
}

/// The note for claims asking for the vGPU class of a simulated node whose GPUs support
/// vGPU, explained without `--vgpu-types`: such a node publishes no vGPU devices without it.
/// `None` when no claim asks for `vgpu.<driver>` or the node has no vGPU.
fn vgpu_note(
    sim_node: &str,
    driver: &str,
    claims: &[k8s_openapi::api::resource::v1::ResourceClaim],
) -> Option<String> {
    let class = format!("vgpu.{driver}");
    let asks = claims.iter().any(|c| {
        c.spec
            .iter()
            .flat_map(|spec| &spec.devices)
            .flat_map(|d| d.requests.iter().flatten())
            .any(|r| {
                r.exactly
                    .as_ref()
                    .is_some_and(|e| e.device_class_name == class)
                    || r.first_available
                        .iter()
                        .flatten()
                        .any(|s| s.device_class_name == class)
            })
    });
    let vgpu = gpu_dra::hardware::sim::NodeSource::resolve(sim_node)
        .and_then(|s| s.plan())
        .is_ok_and(|plan| plan.gpus.iter().any(|g| g.vgpu.is_some()));
    (asks && vgpu).then(|| {
        format!(
            "the simulated node's GPUs support vGPU, but vGPU devices ({class}) are published only with --vgpu-types (the plugin's --vgpu-types, chart vgpu.types); `gpu-dra inventory --sim-node {sim_node}` lists the types each GPU can create"
        )
    })
}

/// Prints the verdict; exit 0 when the claims fit, 1 when they do not, 2 on bad input
/// (claims, allocated claims, classes or slices that cannot be read, printed as `error: …`).
///
/// Fails when the cluster cannot be reached or listed, or stdout cannot be written.
pub(crate) fn run(mut args: ExplainArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::explain::{self, ExplainInput};
    use gpu_dra::explain_inputs;
    let bad_input = |e: String| -> anyhow::Result<ExitCode> {
        eprintln!("error: {e}");
        Ok(ExitCode::from(2))
    };
    let simulated = args.sim_node.is_some() || args.passthrough || args.fabric_manager;
    if args.kubeconfig.is_none() && !args.in_cluster && !simulated && args.slices.is_none() {
        args.kubeconfig = std::env::var_os("KUBECONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
    }
    let claims = match explain::load_claims(&args.claim) {
        Ok(c) => c,
        Err(e) => return bad_input(chain(&anyhow::Error::new(e))),
    };
    let mut allocated = match &args.allocated {
        // A JSON list streams in, each claim kept as only what it holds; anything else (or
        // a list it cannot read that way) is read whole, which also names what is wrong.
        Some(p) => match explain_inputs::allocated_file(p) {
            Some(a) => a,
            None => match explain::load_allocated(p) {
                Ok(a) => a,
                Err(e) => return bad_input(chain(&anyhow::Error::new(e))),
            },
        },
        None => Vec::new(),
    };
    let engine = gpu_dra::selectors::CelEngine;
    let rollback = args.counter_rollback.into();
    let report = if args.kubeconfig.is_some() || args.in_cluster {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let report = runtime.block_on(async {
            let client = gpu_dra::k8s::connect(args.kubeconfig.as_deref()).await?;
            let classes = match &args.classes {
                Some(_) => explain_inputs::classes(args.classes.as_deref()),
                None => Ok(explain_inputs::cluster_classes(&client).await?),
            };
            let classes = match classes {
                Ok(c) => c,
                Err(e) => return anyhow::Ok(Err(e)),
            };
            allocated.extend(explain_inputs::cluster_allocated(&client).await?);
            let report = explain_inputs::explain_cluster_as(
                &engine,
                &client,
                args.node.as_deref(),
                &classes,
                &allocated,
                &claims,
                rollback,
            )
            .await?;
            anyhow::Ok(Ok(report))
        });
        // A cluster that cannot be read is the command's input failing (exit 2), not a
        // claim that does not fit (1).
        match report {
            Ok(Ok(report)) => report,
            Ok(Err(e)) => return bad_input(e),
            Err(e) => return bad_input(chain(&e)),
        }
    } else {
        let classes = match explain_inputs::classes(args.classes.as_deref()) {
            Ok(c) => c,
            Err(e) => return bad_input(e),
        };
        let streamed = args.slices.as_deref().and_then(|path| {
            explain_inputs::explain_slices_file_as(
                &engine, &classes, &allocated, &claims, path, rollback,
            )
        });
        match streamed {
            Some(report) => report,
            None => {
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
                            slice_layout: args.slice_layout.slice_layout,
                            mig_attributes: args.slice_layout.mig_attributes,
                            passthrough: args.passthrough,
                            fabric_manager: args.fabric_manager,
                            vgpu_types: args.vgpu.vgpu_types.clone(),
                            compatibility_groups: args.vgpu.compatibility_groups,
                            partitionable_devices_type: args.vgpu.partitionable_devices_type,
                        },
                    )
                    .map_err(|e| chain(&anyhow::Error::new(e))),
                };
                let slices = match slices {
                    Ok(s) => s,
                    Err(e) => return bad_input(e),
                };
                let input = ExplainInput {
                    classes,
                    slices,
                    allocated,
                    claims,
                };
                let mut report = explain::explain_as(&engine, &input, rollback);
                if args.slices.is_none() && !report.fits && !args.vgpu.vgpu_types.is_on() {
                    let node = args.sim_node.as_deref().unwrap_or(demo::DEFAULT_PRESET);
                    if let Some(note) = vgpu_note(node, &args.driver_name, &input.claims) {
                        report.note = Some(match report.note.take() {
                            Some(first) => format!("{first}; {note}"),
                            None => note,
                        });
                    }
                }
                report
            }
        }
    };
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
