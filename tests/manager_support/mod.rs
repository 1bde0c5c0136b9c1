//! A claims manager on a simulated node in a temp dir, with claims answered from a table:
//! the lifecycle without an API server or a plugin process. One constructor for every test
//! file that drives [`ClaimsManager`] directly, so a new field is added in one place.
#![allow(dead_code)] // each test file uses a different part

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use gpu_dra::cdi::{CdiWriter, ClaimNaming};
use gpu_dra::claims::{ClaimAllocation, ClaimId, ClaimSource, ClaimsManager};
use gpu_dra::devices::ModelOptions;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::plugin::simhost::SimHostFacts;

/// Allocations by claim UID, as the API server would return them; an unknown UID is the
/// API server's "not found".
pub struct Table(pub BTreeMap<String, ClaimAllocation>);

impl ClaimSource for Table {
    async fn fetch(&self, id: &ClaimId) -> Result<ClaimAllocation, String> {
        self.0
            .get(&id.uid)
            .cloned()
            .ok_or_else(|| format!("resourceclaims \"{}\" not found", id.name))
    }
}

/// A manager for pool `pool` on `sim`, with CDI specs in `<root>/cdi`, state in
/// `<root>/state`, boot ID `boot-1`, the simulator's MIG policies and no sharing tools.
pub fn manager<S: ClaimSource>(
    sim: &Arc<SimBackend>,
    source: S,
    root: &Path,
    pool: &str,
) -> ClaimsManager<S> {
    ClaimsManager {
        backend: sim.clone(),
        source,
        host: Box::new(SimHostFacts),
        cdi: CdiWriter::new(root.join("cdi")),
        naming: ClaimNaming::default(),
        model_options: ModelOptions::with_policies(
            gpu_dra::devices::DEFAULT_DRIVER_NAME,
            &sim.mig_policies(),
        ),
        pool: pool.into(),
        state_dir: root.join("state"),
        boot_id: "boot-1".into(),
        model_cache: Default::default(),
        checkpoint_cache: Default::default(),
        sharing: None,
        prepared: Default::default(),
        metadata: None,
        pci: None,
        fabric: None,
        vgpu: None,
    }
}
