//! A [`GpuBackend`] that adds the host's PCI view to NVML's: every inventory carries
//! [`PciHostFacts`], including NVML's last record of each GPU that moved to `vfio-pci` (NVML
//! stops listing a GPU the moment `nvidia` lets go of it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{PciHost, PciHostFacts, normalize_address};
use crate::hardware::{GpuBackend, GpuInfo, HardwareError, NodeInventory};

/// NVML (or the simulator) plus the PCI bus under a host root.
pub struct PassthroughBackend {
    inner: Arc<dyn GpuBackend>,
    pci: Arc<PciHost>,
    /// NVML's last record of every GPU seen, by normalised PCI address.
    seen: Mutex<BTreeMap<String, GpuInfo>>,
    /// The last full scan of the bus.
    kept: Mutex<Option<PciHostFacts>>,
}

impl PassthroughBackend {
    /// Wraps `inner` with the bus of `pci`.
    pub fn new(inner: Arc<dyn GpuBackend>, pci: Arc<PciHost>) -> PassthroughBackend {
        PassthroughBackend {
            inner,
            pci,
            seen: Mutex::new(BTreeMap::new()),
            kept: Mutex::new(None),
        }
    }

    /// The host's PCI bus.
    pub fn pci(&self) -> &Arc<PciHost> {
        &self.pci
    }
}

impl std::fmt::Debug for PassthroughBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassthroughBackend")
            .field("inner", &self.inner.name())
            .field("root", &self.pci.root())
            .finish()
    }
}

impl PassthroughBackend {
    /// The bus's facts: a full scan when `fresh` or when none is kept, else the kept scan.
    /// What the model takes from them (addresses, device IDs, which GPUs exist) does not
    /// change when a driver is switched, so this process's own switches need no rescan.
    fn facts(&self, fresh: bool) -> Result<PciHostFacts, HardwareError> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if !fresh && let Some(facts) = kept.as_ref() {
            return Ok(facts.clone());
        }
        let facts = self.pci.scan().map_err(HardwareError::Passthrough)?;
        *kept = Some(facts.clone());
        Ok(facts)
    }

    /// `inventory` with `passthrough` filled in from `facts`; GPUs NVML no longer lists
    /// (moved to `vfio-pci`) keep the facts NVML last gave about them.
    fn with_facts(
        &self,
        mut inventory: NodeInventory,
        mut facts: PciHostFacts,
    ) -> Result<NodeInventory, HardwareError> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for gpu in &inventory.gpus {
            seen.insert(normalize_address(&gpu.pci_bus_id), gpu.clone());
        }
        let visible: std::collections::BTreeSet<String> = inventory
            .gpus
            .iter()
            .map(|g| normalize_address(&g.pci_bus_id))
            .collect();
        facts.hidden_gpus = facts
            .gpus
            .iter()
            .filter(|g| !visible.contains(&g.address))
            .filter_map(|g| seen.get(&g.address).cloned())
            .collect();
        inventory.passthrough = Some(facts);
        Ok(inventory)
    }
}

impl GpuBackend for PassthroughBackend {
    crate::hardware::forward_to_inner!();

    /// NVML's inventory with `passthrough` filled in from a full scan of the PCI bus.
    ///
    /// # Errors
    /// NVML's, or [`HardwareError::Passthrough`] when sysfs cannot be listed.
    fn inventory(&self) -> Result<NodeInventory, HardwareError> {
        let inventory = self.inner.inventory()?;
        self.with_facts(inventory, self.facts(true)?)
    }

    /// The inner backend's request inventory with `passthrough` as the last full scan read
    /// it (the inventory poll's, every `--inventory-interval`): a kubelet call lists no bus
    /// for it. What a call
    /// decides on is read afresh: the VFIO checks read their GPU and its IOMMU group
    /// ([`PciHost::check_passable`]) before anything is touched, and NVML's part is the
    /// inner backend's own. A GPU bound elsewhere by hand shows in the model at the next
    /// poll, as it shows in the published slices.
    fn request_inventory(&self) -> Result<NodeInventory, HardwareError> {
        let inventory = self.inner.request_inventory()?;
        self.with_facts(inventory, self.facts(false)?)
    }

    fn health_generation(&self) -> u64 {
        self.inner
            .health_generation()
            .wrapping_add(self.pci.switch_count() << 40)
    }
}
