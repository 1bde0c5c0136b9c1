//! `gpu-dra demo`: the driver's pipeline on a simulated node, in-process, explained step by
//! step for a person reading the terminal.

mod claims;
pub mod sharing;

use std::fmt::Write as _;
use std::sync::Arc;

use crate::devices::{DeviceKind, ModelOptions};
use crate::hardware::sim::{NodeSource, SimBackend, SimError};
use crate::inventory::{self, InventoryError, NodeView};

/// The preset `demo` uses when none is given.
pub const DEFAULT_PRESET: &str = "mixed";

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The simulated node could not be built.
    #[error("building the simulated node failed")]
    Sim(#[source] SimError),
    /// Inventory or slices failed.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// Allocating or preparing the example claims failed.
    #[error("running the example claims: {detail}")]
    Claims {
        /// What failed.
        detail: String,
    },
}

/// Runs the demo on `sim_node` (a preset name or node file) and returns what it prints.
pub fn run(sim_node: &str, driver_name: &str) -> Result<String, DemoError> {
    let source = NodeSource::resolve(sim_node).map_err(DemoError::Sim)?;
    let plan = source.plan().map_err(DemoError::Sim)?;
    let backend = Arc::new(SimBackend::from_plan(plan, None));
    let options = ModelOptions::with_policies(driver_name, &backend.mig_policies());
    let view = inventory::view(backend.as_ref(), backend.node_name(), &options)?;
    let mut out = String::new();
    let described = match &source {
        NodeSource::Preset(p) => format!("preset {}: {}", p.name, p.summary),
        NodeSource::File(path) => format!("node file {}", path.display()),
    };
    let _ = writeln!(
        out,
        "gpu-dra demo: the driver's pipeline on a simulated GPU node, in-process\n"
    );
    let _ = writeln!(out, "Node {:?} ({described})\n", view.node_name);
    let _ = writeln!(out, "1. Inventory: what the (simulated) NVML reports");
    out.push_str(&indent(&inventory::gpu_table(&view)));
    let _ = writeln!(out, "\n2. Devices published for driver {driver_name}");
    out.push_str(&devices_summary(&view));
    let _ = writeln!(
        out,
        "\n3. ResourceSlices: pool {:?}, generation 1, {} slice(s)",
        view.node_name,
        view.slices.len()
    );
    out.push_str(&indent(&inventory::slice_table(&view.slices)));
    for w in &view.model.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let classes = crate::explain_inputs::builtin_classes().map_err(|e| DemoError::Claims {
        detail: e.to_string(),
    })?;
    claims::run(&mut out, backend.clone(), &options, &classes, &view.slices)
        .map_err(|detail| DemoError::Claims { detail })?;
    sharing::run(&mut out, driver_name, &classes).map_err(|detail| DemoError::Claims { detail })?;
    let _ = writeln!(
        out,
        "\nSee every device: gpu-dra inventory --sim-node {sim_node}\nPrint the slices for kubectl: gpu-dra inventory --sim-node {sim_node} -o yaml"
    );
    Ok(out)
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("   {l}\n")).collect()
}

/// One paragraph per GPU saying what it publishes and why.
fn devices_summary(view: &NodeView) -> String {
    let mut out = String::new();
    for (gpu, policy) in view.inventory.gpus.iter().zip(&view.policies) {
        let devices: Vec<_> = view
            .model
            .devices
            .iter()
            .filter(|d| d.gpu_index == gpu.index)
            .collect();
        let full = devices.iter().any(|d| d.kind == DeviceKind::Gpu);
        let statics: Vec<String> = devices
            .iter()
            .filter_map(|d| match &d.kind {
                DeviceKind::MigStatic { profile, uuid, .. } => {
                    Some(format!("{} ({profile}, {uuid})", d.name()))
                }
                _ => None,
            })
            .collect();
        let dynamic = devices
            .iter()
            .filter(|d| matches!(d.kind, DeviceKind::MigDynamic { .. }))
            .count();
        let _ = writeln!(
            out,
            "   GPU {} {} — MIG policy {}:",
            gpu.index,
            gpu.product_name,
            policy.as_str()
        );
        if full {
            let _ = writeln!(
                out,
                "      full GPU {}",
                crate::devices::gpu_device_name(gpu.minor)
            );
        }
        for s in &statics {
            let _ = writeln!(out, "      existing MIG device {s}");
        }
        if dynamic > 0 {
            let mut profiles: Vec<&str> = Vec::new();
            for p in &gpu.mig_profiles {
                profiles.push(&p.name);
            }
            let _ = writeln!(
                out,
                "      {dynamic} MIG placements carved on demand ({}), sharing counter set {}{}",
                profiles.join(", "),
                crate::devices::counter_set_name(gpu.minor),
                if full { " with the full GPU" } else { "" }
            );
        }
        if devices.is_empty() {
            let _ = writeln!(out, "      nothing (see warnings)");
        }
    }
    out
}
