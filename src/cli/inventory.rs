//! `gpu-dra inventory`: what a node has and the ResourceSlices it would publish; also lists and
//! prints the simulator's presets.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use gpu_dra::devices::{ModelOptions, SharedGpus};
use gpu_dra::hardware::sim::{self, SimBackend, presets};
use gpu_dra::hardware::{GpuBackend, MigPolicy, catalog, nvml::NvmlBackend, policy_flag};
use gpu_dra::{demo, inventory};

use super::common::emit;
use super::flags::{
    Backend, DriverNameFlag, GpuMigPoliciesFlag, MigProfilesFlag, NvmlLibFlag, Output, Policy,
    SliceLayoutFlag, VgpuFlags,
};

/// Flags of `gpu-dra inventory`.
#[derive(clap::Args, Debug)]
pub(crate) struct InventoryArgs {
    /// GPU backend; defaults to `sim` when --sim-node is given, else `nvml`.
    #[arg(long, env = "GPU_DRA_GPU_BACKEND", value_enum)]
    gpu_backend: Option<Backend>,
    /// Simulated node: a preset name or a node file (implies --gpu-backend sim).
    #[arg(long, env = "GPU_DRA_SIM_NODE")]
    sim_node: Option<String>,
    /// `--nvml-lib`.
    #[command(flatten)]
    nvml_lib: NvmlLibFlag,
    /// `--gpu-mig-policies`.
    #[command(flatten)]
    gpu_mig_policies: GpuMigPoliciesFlag,
    /// Directory holding the simulated hardware state (created MIG devices, MIG mode), shared
    /// with a running plugin that uses the same directory.
    #[arg(long, env = "GPU_DRA_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Node name (and pool name) of the slices; defaults to the node file's, or the host name
    /// with the nvml backend.
    #[arg(long, env = "GPU_DRA_NODE_NAME")]
    node_name: Option<String>,
    /// `--driver-name`.
    #[command(flatten)]
    driver_name: DriverNameFlag,
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
    /// `--mig-profiles`.
    #[command(flatten)]
    mig_profiles: MigProfilesFlag,
    /// `--slice-layout`.
    #[command(flatten)]
    slice_layout: SliceLayoutFlag,
    /// `--vgpu-types`, `--compatibility-groups`, `--partitionable-devices-type`.
    #[command(flatten)]
    vgpu: VgpuFlags,
    /// Health policy file (YAML or JSON) the GPUs' faults are judged with, as the plugin's
    /// --health-policy (docs/health.md). Default: the built-in policy.
    #[arg(long, env = "GPU_DRA_HEALTH_POLICY", value_name = "FILE")]
    health_policy: Option<PathBuf>,
    /// Output: a table for people, or ResourceSlice objects for `kubectl create -f -`.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
    /// Also publish a VFIO device `gpu-vfio-<i>` per GPU on the PCI bus, as the plugin's
    /// --passthrough does: read from --host-root (default /), or from the simulated node's
    /// host tree with --gpu-backend sim (its state dir's, or a fresh one).
    #[arg(long)]
    passthrough: bool,
    /// Where the host's sys/ is found for --passthrough.
    #[arg(long, value_name = "DIR")]
    host_root: Option<PathBuf>,
    /// List the built-in simulated nodes and GPU models, then exit.
    #[arg(long)]
    list_presets: bool,
    /// Print a preset's node file (a starting point for your own), then exit.
    #[arg(long, value_name = "PRESET")]
    print_preset: Option<String>,
}

/// Prints the node's GPUs, devices and slices (or the presets) in the chosen output.
///
/// Fails on an unknown preset, `--sim-node` with `--gpu-backend nvml` (without `--nvml-lib`),
/// a backend that cannot be opened, a bad `--gpu-mig-policies` or health policy, or an
/// inventory that cannot be built.
pub(crate) fn run(args: InventoryArgs) -> anyhow::Result<ExitCode> {
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
        (Some(Backend::Nvml), Some(_)) if args.nvml_lib.nvml_lib.is_none() => {
            bail!("--sim-node needs --gpu-backend sim (or no --gpu-backend)")
        }
        (Some(b), _) => b,
        (None, Some(_)) => Backend::Sim,
        (None, None) => Backend::Nvml,
    };
    let mut options = ModelOptions {
        driver_name: args.driver_name.driver_name.clone(),
        policies: Default::default(),
        default_policy: args.mig_policy.map(MigPolicy::from),
        shared_gpus: args.shared_gpus,
        mig_profiles: args.mig_profiles.mig_profiles.clone(),
        slice_layout: args.slice_layout.slice_layout,
        mig_attributes: args.slice_layout.mig_attributes,
        passthrough: args.passthrough,
        fabric_partitions: None,
        vgpu_types: args.vgpu.vgpu_types.clone(),
        compatibility_groups: args.vgpu.compatibility_groups,
        partitionable_devices_type: args.vgpu.partitionable_devices_type,
    };
    // A simulated node keeps its host tree (PCI functions, vGPU VFs and mdev types) in a
    // state directory: a fresh one, at power-on, when none is given.
    let sim_vgpu = backend_kind == Backend::Sim && sim_has_vgpu(args.sim_node.as_deref());
    let scratch = match args.state_dir.is_none() && (args.passthrough || sim_vgpu) {
        true => Some(gpu_dra::fsutil::ScratchDir::new("inventory")?),
        false => None,
    };
    let state_dir = args
        .state_dir
        .clone()
        .or_else(|| scratch.as_ref().map(|d| d.path().to_path_buf()));
    let mut host_root = args.host_root.clone();
    let (backend, default_node): (Box<dyn GpuBackend>, String) = match backend_kind {
        Backend::Sim => {
            let node = args.sim_node.as_deref().unwrap_or(demo::DEFAULT_PRESET);
            let sim = SimBackend::open(node, state_dir.as_deref())?;
            if args.passthrough && host_root.is_none() {
                host_root = sim.host_root().map(PathBuf::from);
                anyhow::ensure!(
                    host_root.is_some(),
                    "--passthrough: the simulated node {node:?} simulates no host PCI tree; use a preset with one (hgx-h100-passthrough) or add a `passthrough:` section to its node file"
                );
            }
            if sim_vgpu && host_root.is_none() {
                host_root = sim.host_root().map(PathBuf::from);
            }
            if args.mig_policy.is_none() {
                options.policies =
                    ModelOptions::with_policies(&args.driver_name.driver_name, &sim.mig_policies())
                        .policies;
            }
            let name = sim.node_name().to_string();
            (Box::new(sim), name)
        }
        Backend::Nvml => (
            Box::new(NvmlBackend::open_with(args.nvml_lib.nvml_lib.as_deref())?),
            host_name(),
        ),
    };
    options.policies.extend(policy_flag::parse_gpu_policies(
        &args.gpu_mig_policies.gpu_mig_policies,
    )?);
    let root = host_root.unwrap_or_else(|| PathBuf::from("/"));
    let backend: Box<dyn GpuBackend> = if args.passthrough {
        use gpu_dra::hardware::passthrough::{HostKernel, PassthroughBackend, PciHost};
        // Read only: the inventory never writes sysfs, so the kernel side is the host's.
        let pci = std::sync::Arc::new(PciHost::new(root.clone(), std::sync::Arc::new(HostKernel)));
        // As the plugin with --passthrough: no IOMMU, no VFIO devices, and it refuses to start.
        pci.require_iommu()
            .context("--passthrough: the plugin would refuse to start")?;
        Box::new(PassthroughBackend::new(std::sync::Arc::from(backend), pci))
    } else {
        backend
    };
    // The host's vGPU files (VFs, mdev types, the vGPUs that exist): on a simulated node with
    // vGPU, and wherever --vgpu-types is on, as the plugin reads them. Read only.
    let backend: Box<dyn GpuBackend> = if sim_vgpu || args.vgpu.vgpu_types.is_on() {
        use gpu_dra::hardware::passthrough::HostKernel;
        use gpu_dra::hardware::vgpu::{VgpuBackend, VgpuHost};
        let host = VgpuHost::new(root, std::sync::Arc::new(HostKernel));
        Box::new(VgpuBackend::new(
            std::sync::Arc::from(backend),
            std::sync::Arc::new(host),
        ))
    } else {
        backend
    };
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
            "{}{}{}",
            inventory::clique_comments(&view),
            inventory::vgpu::comments(&view),
            inventory::slices_yaml(&view.slices)?
        ))?,
        Output::Json => emit(&inventory::slices_json(&view.slices)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `--list-presets`: the simulated nodes, the GPU models for node files, and where to start.
fn list_presets() -> anyhow::Result<String> {
    let mut out = String::from("Simulated nodes (--sim-node):\n");
    let width = presets::PRESETS
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(0);
    for p in presets::PRESETS {
        out.push_str(&format!("  {:<width$} {}\n", p.name, p.summary));
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

/// Whether the simulated node (preset or node file; the default preset without one) has a
/// GPU group with a `vgpu:` section; false when it cannot be read (opening it reports why).
fn sim_has_vgpu(sim_node: Option<&str>) -> bool {
    sim::NodeSource::resolve(sim_node.unwrap_or(demo::DEFAULT_PRESET))
        .and_then(|s| s.plan())
        .is_ok_and(|plan| plan.gpus.iter().any(|g| g.vgpu.is_some()))
}

/// The node name of the nvml backend's slices when `--node-name` is not given.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}
