//! VFIO devices in the claim lifecycle: the checks made before anything is touched, the
//! switch of the GPU from `nvidia` to `vfio-pci` and back, the CDI device a VM's container
//! gets, and GPUs left on `vfio-pci` by no claim.
//!
//! Order of a prepare, each durable step followed by a crash point:
//! 1. checks (IOMMU on, a viable IOMMU group, no SR-IOV VFs, no MIG instance, nothing holding
//!    `/dev/nvidia<minor>`), then the intent is recorded with the GPU's address and whether
//!    persistence mode must be restored;
//! 2. persistence mode off (`prepare-vfio-persistence-off`);
//! 3. `driver_override` cleared, `nvidia` unbound (`prepare-vfio-unbound`), `vfio-pci` written
//!    to `driver_override` and bound (`prepare-vfio-bound`);
//! 4. the CDI spec.
//!
//! Undo (unprepare, rollback, start-up recovery) runs the switch the other way, which finishes
//! or reverses a switch interrupted at any of those steps, then restores persistence mode.

use super::plan::{Action, PlannedDevice};
use super::{ClaimError, ClaimId, ClaimSource, ClaimsManager, RecoveryReport};
use crate::cdi;
use crate::checkpoint::{Checkpoint, DeviceRecord};
use crate::hardware::passthrough::{NVIDIA_DRIVER, PassthroughError, PciHost, VFIO_DRIVER};
use crate::opaque::{IommuBackend, VfioSettings};

impl<S: ClaimSource> ClaimsManager<S> {
    fn pci(&self, claim: &str, device: &str) -> Result<&PciHost, ClaimError> {
        self.pci.as_deref().ok_or_else(|| ClaimError::NotPassable {
            claim: claim.to_string(),
            device: device.to_string(),
            reason: "passthrough is off on this node (kubelet-plugin --passthrough)".into(),
        })
    }

    /// Checks every VFIO device of a planned claim before anything is touched, and records in
    /// its intent whether persistence mode must be restored on undo. `inventory` is the one
    /// the wave planned with (nothing has moved since).
    ///
    /// # Errors
    /// [`ClaimError::NotPassable`] naming the first device that cannot go to a VM and why:
    /// the IOMMU off, a shared IOMMU group, SR-IOV VFs, MIG instances, or processes holding
    /// the GPU's device node (named, with their PIDs).
    pub(super) fn vfio_preflight(
        &self,
        id: &ClaimId,
        inventory: &crate::hardware::NodeInventory,
        planned: &mut [PlannedDevice],
    ) -> Result<(), ClaimError> {
        if !planned
            .iter()
            .any(|p| matches!(p.action, Action::Vfio { .. }))
        {
            return Ok(());
        }
        let claim = id.to_string();
        for p in planned.iter_mut() {
            let Action::Vfio { address, minor } = &p.action else {
                continue;
            };
            let device = p.allocated.device.clone();
            let refuse = |reason: String| ClaimError::NotPassable {
                claim: claim.clone(),
                device: device.clone(),
                reason,
            };
            let pci = self.pci(&claim, &device)?;
            let gpu = pci
                .check_passable(address)
                .map_err(|e| refuse(crate::errors::error_chain(&e)))?;
            match gpu.driver.as_deref() {
                Some(NVIDIA_DRIVER | VFIO_DRIVER) | None => {}
                Some(other) => {
                    return Err(refuse(format!(
                        "GPU {address} is bound to {other}; gpu-dra hands over only GPUs on nvidia (or already on vfio-pci)"
                    )));
                }
            }
            let visible = inventory.gpus.iter().find(|g| {
                g.uuid == p.record.gpu_uuid && gpu.driver.as_deref() == Some(NVIDIA_DRIVER)
            });
            if let Some(g) = visible {
                let instances: Vec<String> = g
                    .mig_devices
                    .iter()
                    .map(|m| format!("{}@{} (GI {})", m.profile_name, m.placement.start, m.gi_id))
                    .chain(
                        g.empty_gpu_instances
                            .iter()
                            .map(|e| format!("GI {} without a compute instance", e.gi_id)),
                    )
                    .collect();
                if !instances.is_empty() {
                    return Err(refuse(format!(
                        "GPU {address} has MIG instances: {}; unprepare the claims using them, or destroy them (nvidia-smi mig -dci && nvidia-smi mig -dgi)",
                        instances.join(", ")
                    )));
                }
                // A dynamic-MIG GPU that can toggle MIG at once has it switched off in act,
                // as for a full-GPU claim.
                let toggles = self.model_options.policy_for(g)
                    == crate::hardware::MigPolicy::Dynamic
                    && !g.architecture.mig_toggle_needs_reset();
                if g.mig.current && !toggles {
                    return Err(refuse(format!(
                        "GPU {address} has MIG mode on; a VM gets the whole GPU only with MIG off (nvidia-smi -i {address} -mig 0, and a GPU reset on Ampere)"
                    )));
                }
                if let Some(vfio) = p.record.vfio.as_mut() {
                    vfio.restore_persistence =
                        self.backend.persistence_mode(g.index).unwrap_or(false);
                }
            }
            if *minor != crate::devices::UNKNOWN_GPU {
                // nvidia-persistenced holds every GPU's node while persistence mode is on and
                // lets go when act turns it off (NVML tells the daemon), as NVIDIA's driver
                // relies on with `nvidia-smi -pm 0`: not a user of the GPU.
                let holders: Vec<String> = pci
                    .holders(*minor)
                    .into_iter()
                    .filter(|h| !h.ends_with("(nvidia-persistenced)"))
                    .collect();
                if !holders.is_empty() {
                    let mps = holders.iter().any(|h| h.contains("nvidia-cuda-mps"));
                    return Err(refuse(format!(
                        "processes hold /dev/nvidia{minor}: {}{}; stop them first (common holders: an MPS control daemon, Xorg, nvidia-device-plugin, dcgm-exporter)",
                        holders.join(", "),
                        if mps { " (an MPS daemon)" } else { "" }
                    )));
                }
            }
        }
        Ok(())
    }

    /// Moves the GPU of a planned VFIO device to `vfio-pci` (persistence mode off first) and
    /// returns the CDI device a VM's container needs for it.
    ///
    /// # Errors
    /// [`ClaimError::Hardware`] when persistence mode cannot be turned off;
    /// [`ClaimError::Passthrough`] for a sysfs step the kernel refused; [`ClaimError::Cdi`]
    /// for a CDI name out of grammar. What was done stays recorded for the rollback.
    pub(super) fn vfio_prepare(
        &self,
        id: &ClaimId,
        p: &PlannedDevice,
    ) -> Result<cdi::Device, ClaimError> {
        let claim = id.to_string();
        let Action::Vfio { address, .. } = &p.action else {
            return Err(ClaimError::NotPassable {
                claim,
                device: p.allocated.device.clone(),
                reason: "not a VFIO device".into(),
            });
        };
        let device = &p.allocated.device;
        let pci = self.pci(&claim, device)?;
        let visible = self.visible(&p.record.gpu_uuid);
        if let Some(gpu) = visible.as_ref().filter(|g| g.mig.current) {
            self.ensure_mig_mode(&claim, device, gpu.index, false)?;
        }
        if p.record
            .vfio
            .as_ref()
            .is_some_and(|v| v.restore_persistence)
            && let Some(index) = visible.map(|g| g.index)
        {
            self.backend
                .set_persistence_mode(index, false)
                .map_err(|source| ClaimError::Hardware {
                    claim: claim.clone(),
                    device: device.clone(),
                    step: "turn persistence mode off",
                    source: Box::new(source),
                })?;
            crate::crashpoint::hit("prepare-vfio-persistence-off");
        }
        let switched = |step| {
            let claim = claim.clone();
            move |source: PassthroughError| ClaimError::Passthrough {
                claim,
                device: device.clone(),
                step,
                source: Box::new(source),
            }
        };
        pci.switch(address, NVIDIA_DRIVER, VFIO_DRIVER, "prepare-vfio")
            .map_err(switched("switch the GPU from nvidia to vfio-pci"))?;
        let gpu = pci.read_gpu(address).ok_or_else(|| {
            switched("read the GPU after the switch")(PassthroughError::NoSuchGpu {
                address: address.clone(),
                root: pci.root().to_path_buf(),
            })
        })?;
        let settings = p.vfio_settings.unwrap_or_default();
        let name = self
            .naming
            .device_name(&id.uid, device, p.allocated.share_id.as_deref())
            .map_err(|e| ClaimError::Cdi {
                claim: claim.clone(),
                detail: crate::errors::error_chain(&e),
            })?;
        vfio_cdi_device(name, pci, &gpu, settings, self.host.as_ref()).map_err(|detail| {
            ClaimError::Cdi {
                claim: claim.clone(),
                detail,
            }
        })
    }

    /// NVML's record of the GPU `uuid` now, if NVML lists it: the request inventory, whose
    /// NVML part is read now (its PCI part is the kept scan, not needed here).
    fn visible(&self, uuid: &str) -> Option<crate::hardware::GpuInfo> {
        crate::cost::count(crate::cost::Cost::InventoryRead);
        self.backend
            .request_inventory()
            .ok()?
            .gpus
            .into_iter()
            .find(|g| g.uuid == uuid)
    }

    /// Gives a claim's VFIO GPU back to `nvidia` and restores persistence mode; a GPU already
    /// on `nvidia` only gets persistence mode back. Tolerates every partial state a crash can
    /// leave.
    ///
    /// # Errors
    /// [`ClaimError::Passthrough`] or [`ClaimError::Hardware`] naming the step; the caller
    /// keeps the record so the next attempt repeats it.
    pub(super) fn vfio_undo(&self, claim: &str, d: &DeviceRecord) -> Result<(), ClaimError> {
        let Some(vfio) = &d.vfio else {
            return Ok(());
        };
        let pci = self.pci(claim, &d.device)?;
        pci.switch(&vfio.address, VFIO_DRIVER, NVIDIA_DRIVER, "unprepare-vfio")
            .map_err(|source| ClaimError::Passthrough {
                claim: claim.to_string(),
                device: d.device.clone(),
                step: "give the GPU back to nvidia",
                source: Box::new(source),
            })?;
        if vfio.restore_persistence
            && let Some(index) = self.visible(&d.gpu_uuid).map(|g| g.index)
        {
            self.backend
                .set_persistence_mode(index, true)
                .map_err(|source| ClaimError::Hardware {
                    claim: claim.to_string(),
                    device: d.device.clone(),
                    step: "turn persistence mode back on",
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    /// Gives every NVIDIA GPU on `vfio-pci` that no claim record names back to `nvidia`
    /// (start-up recovery): a plugin that crashed before recording, or a claim deleted
    /// while the plugin was down, must not keep a GPU from the node.
    pub(super) fn vfio_orphans(
        &self,
        checkpoint: &Checkpoint,
        report: &mut RecoveryReport,
        failures: &mut Vec<ClaimError>,
    ) {
        let Some(pci) = self.pci.as_deref() else {
            return;
        };
        let startup = "startup recovery";
        let facts = match pci.scan() {
            Ok(facts) => facts,
            Err(e) => {
                failures.push(ClaimError::Passthrough {
                    claim: startup.into(),
                    device: "-".into(),
                    step: "list the PCI bus",
                    source: Box::new(e),
                });
                return;
            }
        };
        let held: std::collections::BTreeSet<&str> = checkpoint
            .claims
            .values()
            .flat_map(|c| c.devices.iter())
            .filter_map(|d| d.vfio.as_ref().map(|v| v.address.as_str()))
            .collect();
        for gpu in &facts.gpus {
            let on_vfio = matches!(gpu.driver.as_deref(), Some(VFIO_DRIVER) | None);
            if !on_vfio || held.contains(gpu.address.as_str()) {
                continue;
            }
            match pci.switch(&gpu.address, VFIO_DRIVER, NVIDIA_DRIVER, "recover-vfio") {
                Ok(()) => report.vfio_reclaimed.push(gpu.address.clone()),
                Err(e) => failures.push(ClaimError::Passthrough {
                    claim: startup.into(),
                    device: gpu.address.clone(),
                    step: "give an orphaned GPU back to nvidia",
                    source: Box::new(e),
                }),
            }
        }
    }
}

/// The CDI device of a GPU on `vfio-pci`: its VFIO group node (or, with `PreferIommuFD` and
/// a kernel with iommufd, its VFIO device cdev), the API device with `enableAPIDevice`, and
/// `NVIDIA_VISIBLE_DEVICES=void` so no NVIDIA hook touches the container. Each node is as
/// `host` describes it ([`super::HostFactsSource::vfio_node`]).
///
/// # Errors
/// The node `host` cannot describe (missing on a real host), as text.
pub fn vfio_cdi_device(
    name: String,
    pci: &PciHost,
    gpu: &crate::hardware::passthrough::PciGpu,
    settings: VfioSettings,
    host: &dyn super::HostFactsSource,
) -> Result<cdi::Device, String> {
    let iommufd = settings.backend == IommuBackend::PreferIommuFd
        && pci.root().join("dev/iommu").exists()
        && gpu.vfio_dev.is_some();
    let mut nodes = Vec::new();
    if iommufd {
        if let Some(cdev) = &gpu.vfio_dev {
            nodes.push(format!("/dev/vfio/devices/{cdev}"));
        }
        if settings.api_device {
            nodes.push("/dev/iommu".to_string());
        }
    } else {
        if let Some(group) = &gpu.iommu_group {
            nodes.push(format!("/dev/vfio/{group}"));
        }
        if settings.api_device {
            nodes.push("/dev/vfio/vfio".to_string());
        }
    }
    let device_nodes = nodes
        .iter()
        .map(|path| host.vfio_node(path, pci.root()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(cdi::Device {
        name,
        annotations: Default::default(),
        container_edits: cdi::ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()],
            device_nodes,
            ..Default::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use crate::cdi::{GpuDeviceRef, HostFacts};
    use crate::claims::HostFactsSource;

    /// A real host's facts source (the trait's default `vfio_node`).
    struct RealHost;

    impl HostFactsSource for RealHost {
        fn facts(&self, _: &[GpuDeviceRef]) -> Result<HostFacts, String> {
            Err("not used".into())
        }
    }

    #[test]
    fn a_real_hosts_vfio_node_carries_the_numbers_of_the_node_under_the_host_root() {
        // /dev/null stands in for a VFIO node: any character device shows the reading.
        let node = RealHost
            .vfio_node("/dev/null", std::path::Path::new("/"))
            .unwrap();
        assert_eq!(
            (Some(1), Some(3), Some("/dev/null")),
            (node.major, node.minor, node.host_path.as_deref())
        );
        let missing = RealHost
            .vfio_node("/dev/vfio/999", std::path::Path::new("/nonexistent-root"))
            .unwrap_err();
        assert!(
            missing.contains("/nonexistent-root/dev/vfio/999 does not exist"),
            "{missing}"
        );
    }
}
