//! The plugin's start-up log of `gpu-dra doctor --quick`: what would stop claims on this
//! node (failures, at warn level) and what may (warnings, at info), without failing the start.

use tracing::{debug, info, warn};

use super::PluginConfig;
use crate::doctor::{self, Status};
use crate::hardware::NodeInventory;

/// Runs the quick checks with the inventory just read and logs each, then a summary.
pub fn log(config: &PluginConfig, inventory: &NodeInventory) {
    let report = doctor::start_checks(config, inventory);
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
