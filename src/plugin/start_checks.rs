//! The plugin's start-up log of `gpu-dra doctor --quick`: what would stop claims on this
//! node (failures, at warn level) and what may (warnings, at info), without failing the start.
//!
//! The plugin imports the doctor, never the other way round: the plugin's settings are
//! turned into the doctor's own [`DoctorConfig`] and [`NodeGpus`] here.

use tracing::{debug, info, warn};

use super::{BackendChoice, PluginConfig};
use crate::cdi::HostLayout;
use crate::doctor::{
    self, DoctorConfig, GpuProbe, GpuSource, NodeGpus, Report, RuntimePaths, Status,
};
use crate::hardware::NodeInventory;

/// Runs the quick checks with the inventory just read and logs each, then a summary.
pub fn log(config: &PluginConfig, inventory: &NodeInventory) {
    let report = start_checks(config, inventory);
    for c in &report.checks {
        let fix = c.fix.as_deref().unwrap_or("");
        match c.status {
            Status::Fail => warn!(check = %c.name, found = %c.found, fix, "doctor: check failed"),
            Status::Warn => info!(check = %c.name, found = %c.found, fix, "doctor: check warns"),
            Status::Ok => debug!(check = %c.name, found = %c.found, "doctor: check ok"),
        }
    }
    let count = |s: Status| report.checks.iter().filter(|c| c.status == s).count();
    info!(
        ok = count(Status::Ok),
        warn = count(Status::Warn),
        fail = count(Status::Fail),
        "doctor --quick at start (run `gpu-dra doctor` in this pod for every check)"
    );
}

/// `gpu-dra doctor --quick` for a plugin that has just read `inventory`: the same node checks,
/// without opening the GPUs a second time.
fn start_checks(config: &PluginConfig, inventory: &NodeInventory) -> Report {
    let (doctor, gpus) = for_plugin(config);
    let simulated = gpus.simulated();
    let inventory = Ok(inventory.clone());
    let mut checks = doctor::node_checks(&doctor, &gpus, &inventory, simulated);
    checks.extend(vgpu_checks(config, &inventory));
    Report { checks }
}

/// `doctor --vgpu`'s node checks (vGPU manager, VFs or mdev types, the configured types) when
/// the plugin offers vGPU types, on the vGPU files its inventory just read: a node whose VFs
/// are not enabled says so in the first lines of the log, not at the first claim.
fn vgpu_checks(
    config: &PluginConfig,
    inventory: &Result<NodeInventory, String>,
) -> Vec<doctor::Check> {
    let Ok(read) = inventory else {
        return Vec::new();
    };
    let Some(facts) = &read.vgpu_host else {
        return Vec::new();
    };
    let settings = doctor::vgpu::VgpuSettings {
        types: config.vgpu_types.clone(),
        compatibility_groups: config.compatibility_groups,
    };
    let host = doctor::vgpu::VgpuHostRead {
        root: match (&config.host_root, &config.backend) {
            (Some(root), _) => root.display().to_string(),
            (None, BackendChoice::Sim { .. }) => "the simulated node's host tree".to_string(),
            (None, BackendChoice::Nvml { .. }) => "/".to_string(),
        },
        facts: Ok(facts.clone()),
    };
    doctor::vgpu::checks(&settings, inventory, &host)
}

/// The doctor's view of a running plugin: its directories and driver layout, the runtime's
/// default config paths, quick checks only.
fn for_plugin(config: &PluginConfig) -> (DoctorConfig, NodeGpus) {
    let doctor = DoctorConfig {
        driver_name: config.driver_name.clone(),
        node_name: Some(config.node_name.clone()),
        kubeconfig: config.kubeconfig.clone(),
        cluster: false,
        layout: HostLayout {
            dev_root: config.dev_root.clone(),
            proc_root: config.proc_root.clone(),
            driver_root: config.driver_root.clone(),
            host_driver_root: config.host_driver_root.clone(),
        },
        cdi_root: config.cdi_root.clone(),
        plugin_dir: config.plugin_dir.clone(),
        registry_dir: config.registry_dir.clone(),
        runtime: RuntimePaths::default(),
        quick: true,
    };
    let backend = match &config.backend {
        BackendChoice::Nvml { lib } => GpuSource::Nvml { lib: lib.clone() },
        BackendChoice::Sim { sim_node } => GpuSource::Sim {
            sim_node: sim_node.clone(),
        },
    };
    let gpus = NodeGpus {
        simulated: config.simulated_host || matches!(backend, GpuSource::Sim { .. }),
        backend,
        driver_root: config.driver_root.clone(),
        sim_state: config.state_dir.join("sim"),
    };
    (doctor, gpus)
}
