//! `gpu-dra inventory`: what a node has and the ResourceSlices it would publish, rendered as a
//! table for people or as Kubernetes objects for `kubectl create -f -`.
//!
//! The GPUs' recorded faults are judged with a health policy exactly as the plugin judges
//! them (`crate::health`), so the table shows each GPU's and device's verdict and the slices
//! carry the taints the plugin would publish. Not included: the devices the plugin keeps
//! published for prepared claims whose GPU is gone (that needs the plugin's checkpoint).
//!
//! On a node whose GPUs report vGPU support, [`vgpu`] adds what the host shows of it: how
//! vGPUs are created, the types offered as devices, the vGPUs that exist now.

pub mod vgpu;

use std::fmt::Write as _;

use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::devices::{DeviceKind, DeviceModel, ModelOptions};
use crate::hardware::{HardwareError, MigPolicy, NodeInventory};
use crate::health::{self, DeviceVerdict, GpuVerdicts, HealthPolicy};
use crate::slices::{self, PoolOptions, SliceError};

/// Errors of the inventory verb.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The backend could not be queried.
    #[error("reading the GPU inventory failed")]
    Hardware(#[source] HardwareError),
    /// `--mig-profiles` names a profile no GPU of the node has.
    #[error("checking --mig-profiles against the node's GPUs")]
    MigProfiles(#[source] crate::devices::MigProfilesError),
    /// `--vgpu-types` names a type the GPUs do not offer, or types that cannot share a GPU.
    #[error("checking --vgpu-types against the node's GPUs")]
    VgpuTypes(#[source] Box<crate::devices::VgpuTypesError>),
    /// The model breaks a ResourceSlice limit.
    #[error("building ResourceSlices failed")]
    Slices(#[source] SliceError),
    /// Serialising the slices failed.
    #[error("rendering ResourceSlices as {format} failed: {detail}")]
    Render {
        /// yaml or json.
        format: &'static str,
        /// Serializer message.
        detail: String,
    },
}

/// Everything `inventory` and `demo` show about a node.
#[derive(Debug, Clone)]
pub struct NodeView {
    /// Node name.
    pub node_name: String,
    /// Backend name (`sim`, `nvml`).
    pub backend: &'static str,
    /// Hardware inventory.
    pub inventory: NodeInventory,
    /// MIG policy each GPU is published with.
    pub policies: Vec<MigPolicy>,
    /// The device model, unhealthy devices tainted.
    pub model: DeviceModel,
    /// The verdict on each GPU of `inventory` (same order) and on its GPU instances.
    pub gpu_health: Vec<GpuVerdicts>,
    /// The verdict on each device of `model` (same order).
    pub device_health: Vec<DeviceVerdict>,
    /// The pool's slices.
    pub slices: Vec<ResourceSlice>,
}

/// [`view_judged`] with the built-in health policy, now.
pub fn view(
    backend: &dyn crate::hardware::GpuBackend,
    node_name: &str,
    options: &ModelOptions,
) -> Result<NodeView, InventoryError> {
    view_judged(
        backend,
        node_name,
        options,
        &HealthPolicy::default(),
        crate::hardware::health::unix_now(),
    )
}

/// Reads the backend and computes the model and slices (generation 1), the GPUs' faults
/// judged with `policy` at `now` (Unix seconds) as the plugin judges them: every device of
/// a degraded or failed GPU or MIG instance carries the policy's taint. Fails when the
/// backend cannot be read, `options.mig_profiles` names a profile no GPU of the node has, or
/// the model breaks a ResourceSlice limit.
pub fn view_judged(
    backend: &dyn crate::hardware::GpuBackend,
    node_name: &str,
    options: &ModelOptions,
    policy: &HealthPolicy,
    now: i64,
) -> Result<NodeView, InventoryError> {
    let inventory = backend.inventory().map_err(InventoryError::Hardware)?;
    crate::devices::profiles::check(&options.mig_profiles, &inventory)
        .map_err(InventoryError::MigProfiles)?;
    crate::devices::vgpu_config::check(
        &options.vgpu_types,
        &inventory,
        options.compatibility_groups,
    )
    .map_err(|e| InventoryError::VgpuTypes(Box::new(e)))?;
    let mut model = crate::devices::build(&inventory, options);
    let device_health = health::judge(policy, &inventory, &model, now);
    health::apply_taints(&mut model, &device_health, policy);
    let gpu_health = inventory
        .gpus
        .iter()
        .map(|g| health::judge_gpu(policy, &g.faults, now))
        .collect();
    let slices = slices::build(
        &model,
        &PoolOptions {
            driver_name: options.driver_name.clone(),
            node_name: node_name.to_string(),
            generation: 1,
        },
    )
    .map_err(InventoryError::Slices)?;
    let policies = inventory
        .gpus
        .iter()
        .map(|g| options.policy_for(g))
        .collect();
    Ok(NodeView {
        node_name: node_name.to_string(),
        backend: backend.name(),
        inventory,
        policies,
        model,
        gpu_health,
        device_health,
        slices,
    })
}

/// The HEALTH column of a table of `rows` rows: each row's verdict (`-` where `verdict`
/// knows none) and the column's width.
fn health_column(rows: usize, verdict: impl Fn(usize) -> Option<String>) -> (Vec<String>, usize) {
    let cells: Vec<String> = (0..rows)
        .map(|i| verdict(i).unwrap_or_else(|| "-".into()))
        .collect();
    let width = cells
        .iter()
        .map(|c| c.chars().count())
        .fold("HEALTH".len(), usize::max);
    (cells, width)
}

/// Slices as multi-document YAML, each a complete object.
pub fn slices_yaml(slices: &[ResourceSlice]) -> Result<String, InventoryError> {
    let mut out = String::new();
    for s in slices {
        out.push_str("---\n");
        out.push_str(
            &serde_yaml::to_string(s).map_err(|e| InventoryError::Render {
                format: "yaml",
                detail: e.to_string(),
            })?,
        );
    }
    Ok(out)
}

/// Slices as one JSON `v1 List`, which `kubectl create -f` accepts.
pub fn slices_json(slices: &[ResourceSlice]) -> Result<String, InventoryError> {
    let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": slices });
    serde_json::to_string_pretty(&list)
        .map(|mut s| {
            s.push('\n');
            s
        })
        .map_err(|e| InventoryError::Render {
            format: "json",
            detail: e.to_string(),
        })
}

/// The GPU table: one line per GPU, with the health policy's verdict on the whole GPU
/// (`failed: xid-79`; a fault of one MIG instance shows on that device in the device table).
pub fn gpu_table(view: &NodeView) -> String {
    let (health, hw) = health_column(view.inventory.gpus.len(), |i| {
        view.gpu_health.get(i).map(|v| v.gpu.describe())
    });
    let cliques = clique_column(view);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<4} {:<26} {:<9} {:<8} {:<9} {:<8} {:<14} {:<5} {:<hw$} {}UUID",
        "GPU",
        "PRODUCT",
        "MEMORY",
        "MIG",
        "POLICY",
        "DEVICES",
        "PCI",
        "NUMA",
        "HEALTH",
        cliques.as_ref().map(|c| c.header()).unwrap_or_default()
    );
    for (i, ((gpu, policy), health)) in view
        .inventory
        .gpus
        .iter()
        .zip(&view.policies)
        .zip(&health)
        .enumerate()
    {
        let mig = match (gpu.mig.capable, gpu.mig.current, gpu.mig.pending) {
            (false, _, _) => "n/a",
            (true, true, true) => "on",
            (true, false, false) => "off",
            (true, false, true) => "pending-on",
            (true, true, false) => "pending-off",
        };
        let devices = view
            .model
            .devices
            .iter()
            .filter(|d| d.gpu_index == gpu.index)
            .count();
        let _ = writeln!(
            out,
            "{:<4} {:<26} {:<9} {:<8} {:<9} {:<8} {:<14} {:<5} {:<hw$} {}{}",
            gpu.index,
            gpu.product_name,
            format!("{}Mi", gpu.memory_mib),
            mig,
            policy.as_str(),
            devices,
            gpu.pci_bus_id,
            gpu.numa_node
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            health,
            cliques.as_ref().map(|c| c.cell(i)).unwrap_or_default(),
            gpu.uuid
        );
    }
    out
}

/// The CLIQUE column of the GPU table, present only when some GPU is on an NVLink fabric
/// (so tables of ordinary nodes keep their shape).
struct CliqueColumn {
    cells: Vec<String>,
    width: usize,
}

impl CliqueColumn {
    fn header(&self) -> String {
        format!("{:<w$} ", "CLIQUE", w = self.width)
    }

    fn cell(&self, i: usize) -> String {
        format!("{:<w$} ", self.cells[i], w = self.width)
    }
}

/// Each GPU's clique (`<clusterUuid>.<cliqueId>`), `-` for a GPU in none, or its fabric state
/// while registration is unfinished; `None` when no GPU reports a fabric.
fn clique_column(view: &NodeView) -> Option<CliqueColumn> {
    let gpus = &view.inventory.gpus;
    if gpus.iter().all(|g| g.fabric.is_none()) {
        return None;
    }
    let cells: Vec<String> = gpus.iter().map(gpu_clique_text).collect();
    let width = cells
        .iter()
        .map(String::len)
        .fold("CLIQUE".len(), usize::max);
    Some(CliqueColumn { cells, width })
}

fn gpu_clique_text(gpu: &crate::hardware::GpuInfo) -> String {
    use crate::hardware::fabric::FabricState;
    match &gpu.fabric {
        None => "-".into(),
        Some(f) => match f.clique() {
            Some(clique) => clique,
            None if f.state != FabricState::Completed => format!("({:?})", f.state),
            None => "-".into(),
        },
    }
}

/// YAML comment lines naming each GPU's clique, put before the slices by `-o yaml` when some
/// GPU is on an NVLink fabric (comments, so `kubectl create -f -` still takes the output);
/// empty otherwise.
pub fn clique_comments(view: &NodeView) -> String {
    let mut out = String::new();
    if view.inventory.gpus.iter().all(|g| g.fabric.is_none()) {
        return out;
    }
    for gpu in &view.inventory.gpus {
        let _ = writeln!(
            out,
            "# gpu {} {} clique: {}",
            gpu.index,
            gpu.uuid,
            gpu_clique_text(gpu)
        );
    }
    out
}

/// The device table: one line per published device, with its verdict (its GPU's, or its MIG
/// instance's when that is worse). A vGPU's MEMORY is its type's framebuffer.
pub fn device_table(view: &NodeView) -> String {
    let (health, hw) = health_column(view.model.devices.len(), |i| {
        view.device_health.get(i).map(|v| v.verdict.describe())
    });
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<4} {:<11} {:<9} {:<10} {:<4} {:<hw$} UUID",
        "DEVICE", "TYPE", "PROFILE", "PLACEMENT", "MEMORY", "SMS", "HEALTH"
    );
    for (d, health) in view.model.devices.iter().zip(&health) {
        let cap = |k: &str| {
            d.device
                .capacity
                .as_ref()
                .and_then(|c| c.get(k))
                .map(|q| q.value.0.clone())
                .unwrap_or_else(|| "-".into())
        };
        let (kind, profile, placement, uuid) = match &d.kind {
            DeviceKind::Gpu => ("gpu", "-".to_string(), "-".to_string(), d.gpu_uuid.clone()),
            DeviceKind::Vfio { address } => {
                ("vfio", "-".to_string(), address.clone(), d.gpu_uuid.clone())
            }
            DeviceKind::Vgpu {
                type_name, slot, ..
            } => (
                "vgpu",
                type_name.clone(),
                format!("slot {slot}"),
                "(created on demand)".to_string(),
            ),
            DeviceKind::MigStatic {
                profile,
                placement,
                uuid,
                ..
            } => (
                "mig",
                profile.clone(),
                format!("{}:{}", placement.start, placement.size),
                uuid.clone(),
            ),
            DeviceKind::MigDynamic {
                profile, placement, ..
            } => (
                "mig",
                profile.clone(),
                format!("{}:{}", placement.start, placement.size),
                "(carved on demand)".to_string(),
            ),
        };
        let _ = writeln!(
            out,
            "{:<24} {:<4} {:<11} {:<9} {:<10} {:<4} {:<hw$} {}",
            d.name(),
            kind,
            profile,
            placement,
            match &d.kind {
                DeviceKind::Vgpu { .. } => cap("framebuffer"),
                _ => cap("memory"),
            },
            cap("multiprocessors"),
            health,
            uuid
        );
    }
    out
}

/// One line per slice: name, devices, counter sets.
pub fn slice_table(slices: &[ResourceSlice]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:<8} {:<13} CONTENT",
        "RESOURCESLICE", "DEVICES", "COUNTER-SETS"
    );
    for s in slices {
        let devices = s.spec.devices.as_deref().unwrap_or_default();
        let sets = s.spec.shared_counters.as_deref().unwrap_or_default();
        let content = if !sets.is_empty() {
            let names: Vec<&str> = sets.iter().map(|c| c.name.as_str()).collect();
            names.join(", ")
        } else {
            match (devices.first(), devices.last()) {
                (Some(a), Some(b)) => format!("{} … {}", a.name, b.name),
                _ => String::new(),
            }
        };
        let _ = writeln!(
            out,
            "{:<40} {:<8} {:<13} {}",
            s.metadata.name.as_deref().unwrap_or_default(),
            devices.len(),
            sets.len(),
            content
        );
    }
    out
}

/// The full human-readable inventory: header, GPUs, vGPU (on nodes with vGPU), devices,
/// slices and warnings.
pub fn render_table(view: &NodeView) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Node {} ({} backend): {} GPU(s), driver {}, CUDA {}\n",
        view.node_name,
        view.backend,
        view.inventory.gpus.len(),
        view.inventory.driver_version,
        view.inventory.cuda_driver_version
    );
    out.push_str(&gpu_table(view));
    out.push('\n');
    let vgpus = vgpu::table(view);
    if !vgpus.is_empty() {
        out.push_str(&vgpus);
        out.push('\n');
    }
    out.push_str(&device_table(view));
    out.push('\n');
    out.push_str(&slice_table(&view.slices));
    for w in &view.model.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}
