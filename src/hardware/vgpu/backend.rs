//! A [`GpuBackend`] that adds the host's vGPU view to NVML's: every inventory carries
//! [`super::VgpuHostFacts`] (virtual functions, mdev types, the vGPUs that exist), read from
//! sysfs by [`VgpuHost::scan`].
//!
//! A full scan reads every VF of every GPU (256 on an HGX H100 with VFs on: three files and a
//! link each), a few milliseconds, so it is kept. The inventory poll scans in full (every
//! 10 s by default); its read right after one of our writes (the health generation moves
//! with them), within [`RESCAN_AFTER`] of a full scan, reads again only the GPUs written to
//! ([`VgpuHost::refresh`]). A kubelet call's inventory ([`GpuBackend::request_inventory`])
//! takes the kept scan as it is: the call's vGPU checks read their parent GPU themselves, and
//! the host refuses a create that is not possible now before anything is written.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::VgpuHostFacts;
use super::sysfs::VgpuHost;
use crate::hardware::{GpuBackend, HardwareError, NodeInventory};

/// NVML (or the simulator, or a [`crate::hardware::passthrough::PassthroughBackend`]) plus
/// the vGPU files under a host root.
pub struct VgpuBackend {
    inner: Arc<dyn GpuBackend>,
    host: Arc<VgpuHost>,
    /// The last full scan, when it was taken, brought up to date with this process's writes.
    scanned: Mutex<Option<(Instant, VgpuHostFacts)>>,
}

/// How long a full sysfs scan serves inventories (with the GPUs this process wrote to read
/// again) before the next inventory scans everything again.
pub const RESCAN_AFTER: Duration = Duration::from_secs(1);

impl VgpuBackend {
    /// Wraps `inner` with the vGPU files of `host`.
    pub fn new(inner: Arc<dyn GpuBackend>, host: Arc<VgpuHost>) -> VgpuBackend {
        VgpuBackend {
            inner,
            host,
            scanned: Mutex::default(),
        }
    }

    /// The host's vGPU facts: the kept full scan while it is younger than `max_age` (or
    /// whatever its age, when `None`), brought up to date with this process's writes
    /// ([`VgpuHost::refresh`]) when `refresh`; else a full scan, kept for the next call.
    fn facts(
        &self,
        max_age: Option<Duration>,
        refresh: bool,
    ) -> Result<VgpuHostFacts, HardwareError> {
        let mut kept = self
            .scanned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, facts)) = kept.as_mut()
            && max_age.is_none_or(|max| at.elapsed() < max)
        {
            if refresh {
                self.host
                    .refresh(facts)
                    .map_err(|e| HardwareError::Vgpu(Box::new(e)))?;
            }
            return Ok(facts.clone());
        }
        *kept = None;
        let at = Instant::now();
        // Marks made before this scan are read by it.
        self.host.clear_dirty();
        let facts = self
            .host
            .scan()
            .map_err(|e| HardwareError::Vgpu(Box::new(e)))?;
        *kept = Some((at, facts.clone()));
        Ok(facts)
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
    crate::hardware::forward_to_inner!();

    /// The inner inventory with `vgpu_host` filled in from a full scan of sysfs, or, within
    /// [`RESCAN_AFTER`] of the last full scan (the inventory poll's read right after this
    /// process wrote), from that scan with the GPUs written to since read again.
    ///
    /// # Errors
    /// The inner backend's, or [`HardwareError::Vgpu`] when sysfs cannot be listed.
    fn inventory(&self) -> Result<NodeInventory, HardwareError> {
        let mut inventory = self.inner.inventory()?;
        inventory.vgpu_host = Some(self.facts(Some(RESCAN_AFTER), true)?);
        Ok(inventory)
    }

    /// The inner request inventory with `vgpu_host` as the inventory poll last read it
    /// (a full scan only when none is kept yet): a kubelet call reads no VF of the node for
    /// it. The vGPU checks of a prepare read their parent GPU afresh
    /// ([`crate::hardware::vgpu::VgpuHost::gpu`]), so nothing a call decides on comes from
    /// these facts.
    ///
    /// # Errors
    /// As [`VgpuBackend::inventory`].
    fn request_inventory(&self) -> Result<NodeInventory, HardwareError> {
        let mut inventory = self.inner.request_inventory()?;
        inventory.vgpu_host = Some(self.facts(None, false)?);
        Ok(inventory)
    }

    /// The inner generation, moved by every vGPU write this process makes (what NVML
    /// reports as creatable changes with them).
    fn health_generation(&self) -> u64 {
        self.inner
            .health_generation()
            .wrapping_add(self.host.change_count() << 48)
    }
}
