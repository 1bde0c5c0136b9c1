//! Checks of what NVML reports: the library and driver, and every GPU's MIG mode.

use super::report::Check;
use crate::hardware::{GpuInfo, NodeInventory};

/// `nvml`: the library loaded, with the driver and CUDA versions; `inventory` is the
/// backend's answer or the error chain of opening it.
pub fn check_nvml(backend: &str, inventory: &Result<NodeInventory, String>) -> Check {
    const NAME: &str = "nvml";
    match inventory {
        Ok(inv) => Check::ok(
            NAME,
            format!(
                "{backend}: driver {}, CUDA {}, {} GPU(s)",
                inv.driver_version,
                inv.cuda_driver_version,
                inv.gpus.len()
            ),
        ),
        Err(why) => Check::fail(
            NAME,
            format!("{backend}: {why}"),
            "Install the NVIDIA driver and make libnvidia-ml.so.1 loadable (chart: driverRoot; or --nvml-lib), or run a simulated node with --gpu-backend sim",
            NAME,
        ),
    }
}

/// One check per GPU (`gpu-<index>`): its model, UUID and MIG mode. A pending MIG change
/// (Ampere applies it only at a GPU reset) is a warning: the plugin publishes the mode in
/// effect, not the one asked for. An unhealthy GPU is a warning too.
pub fn check_gpus(inventory: &NodeInventory) -> Vec<Check> {
    if inventory.gpus.is_empty() {
        return vec![Check::warn(
            "gpus",
            "NVML reports no GPUs",
            "Check that the GPUs are visible to the driver (nvidia-smi lists them) and not bound to vfio-pci",
            "gpus",
        )];
    }
    inventory.gpus.iter().map(check_gpu).collect()
}

fn check_gpu(gpu: &GpuInfo) -> Check {
    let name = format!("gpu-{}", gpu.index);
    let mig = match (gpu.mig.capable, gpu.mig.current, gpu.mig.pending) {
        (false, _, _) => "MIG not supported".to_string(),
        (true, cur, pend) if cur == pend => format!("MIG {}", on_off(cur)),
        (true, cur, pend) => format!(
            "MIG {} (pending {}: reset needed)",
            on_off(cur),
            on_off(pend)
        ),
    };
    let found = format!(
        "{} {} minor {}, {mig}",
        gpu.product_name, gpu.uuid, gpu.minor
    );
    if gpu.mig.current != gpu.mig.pending {
        return Check::warn(
            name,
            found,
            &format!(
                "Reset the GPU to apply the MIG mode change (nvidia-smi -i {} -r, with no process on it), or set it back with nvidia-smi -i {} -mig {}",
                gpu.index,
                gpu.index,
                u8::from(gpu.mig.current)
            ),
            "gpu-index",
        );
    }
    if !gpu.healthy {
        return Check::warn(
            name,
            format!("{found}, unhealthy"),
            "See the GPU's XID and ECC events (gpu-dra inventory shows them); a recovery or reset clears them",
            "gpu-index",
        );
    }
    Check::ok(name, found)
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;
    use crate::hardware::GpuBackend;
    use crate::hardware::sim::SimBackend;

    #[test]
    fn a_pending_mig_change_warns_that_a_reset_is_needed() {
        let mut inv = SimBackend::open("mixed", None)
            .unwrap()
            .inventory()
            .unwrap();
        let a100 = inv
            .gpus
            .iter_mut()
            .find(|g| g.mig.capable && g.architecture.mig_toggle_needs_reset())
            .expect("an A100 in the mixed preset");
        a100.mig.pending = !a100.mig.current;
        let index = a100.index as usize;
        let checks = check_gpus(&inv);
        let got = &checks[index];
        assert_eq!(got.status, Status::Warn);
        assert!(got.found.contains("reset needed"), "{}", got.found);
        assert!(got.fix.as_deref().unwrap().ends_with("#gpu-index)"));
        let others = checks.iter().filter(|c| c.name != got.name);
        assert!(others.map(|c| c.status).all(|s| s == Status::Ok));
    }

    #[test]
    fn nvml_that_does_not_load_fails_and_names_the_backend() {
        let c = check_nvml("nvml (/x/libnvidia-ml.so.1)", &Err("not found".into()));
        assert_eq!(
            (c.status, c.found.as_str()),
            (Status::Fail, "nvml (/x/libnvidia-ml.so.1): not found")
        );
    }

    #[test]
    fn no_gpus_is_a_warning() {
        let inv = NodeInventory {
            driver_version: "580".into(),
            cuda_driver_version: "13.0".into(),
            gpus: vec![],
            passthrough: None,
            vgpu_host: None,
        };
        assert_eq!(check_gpus(&inv)[0].status, Status::Warn);
    }
}
