//! A [`GpuBackend`] that adds the host's vGPU view to NVML's: every inventory carries
//! [`super::VgpuHostFacts`] (virtual functions, mdev types, the vGPUs that exist), read from
//! sysfs by [`VgpuHost::scan`].

use std::sync::Arc;

use super::sysfs::VgpuHost;
use crate::hardware::{
    GpuBackend, HardwareError, MigDevice, MigModeChange, NodeInventory, telemetry,
};

/// NVML (or the simulator, or a [`crate::hardware::passthrough::PassthroughBackend`]) plus
/// the vGPU files under a host root.
pub struct VgpuBackend {
    inner: Arc<dyn GpuBackend>,
    host: Arc<VgpuHost>,
}

impl VgpuBackend {
    /// Wraps `inner` with the vGPU files of `host`.
    pub fn new(inner: Arc<dyn GpuBackend>, host: Arc<VgpuHost>) -> VgpuBackend {
        VgpuBackend { inner, host }
    }

    /// The host's vGPU files.
    pub fn host(&self) -> &Arc<VgpuHost> {
        &self.host
    }
}

impl std::fmt::Debug for VgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VgpuBackend")
            .field("inner", &self.inner.name())
            .field("root", &self.host.root())
            .finish()
    }
}

impl GpuBackend for VgpuBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// The inner inventory with `vgpu_host` filled in.
    ///
    /// # Errors
    /// The inner backend's, or [`HardwareError::Vgpu`] when sysfs cannot be listed.
    fn inventory(&self) -> Result<NodeInventory, HardwareError> {
        let mut inventory = self.inner.inventory()?;
        inventory.vgpu_host = Some(
            self.host
                .scan()
                .map_err(|e| HardwareError::Vgpu(Box::new(e)))?,
        );
        Ok(inventory)
    }

    /// The inner generation, moved by every vGPU write this process makes (what NVML
    /// reports as creatable changes with them).
    fn health_generation(&self) -> u64 {
        self.inner
            .health_generation()
            .wrapping_add(self.host.change_count() << 48)
    }

    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<MigModeChange, HardwareError> {
        self.inner.set_mig_mode(index, enabled)
    }

    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, HardwareError> {
        self.inner
            .create_mig_device(index, profile_id, placement_start)
    }

    fn destroy_mig_device(&self, index: u32, gi_id: u32, ci_id: u32) -> Result<(), HardwareError> {
        self.inner.destroy_mig_device(index, gi_id, ci_id)
    }

    fn telemetry(&self) -> Result<telemetry::NodeTelemetry, HardwareError> {
        self.inner.telemetry()
    }

    fn persistence_mode(&self, index: u32) -> Result<bool, HardwareError> {
        self.inner.persistence_mode(index)
    }

    fn set_persistence_mode(&self, index: u32, enabled: bool) -> Result<(), HardwareError> {
        self.inner.set_persistence_mode(index, enabled)
    }
}
