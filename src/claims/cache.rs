//! What the claim lifecycle keeps between calls: the device model of recent inventories and
//! the checkpoint as this instance last read or wrote it. Neither can go stale: the model is
//! looked up by the inventory read from the hardware on every call (or kept while the
//! backend's stamp of its inventory is unchanged), and the checkpoint is
//! used only while the file is still the version it came from.

use std::sync::Arc;

use super::{ClaimError, ClaimSource, ClaimsManager};
use crate::checkpoint::CheckpointStore;
use crate::devices::{self, DeviceModel, ModelOptions};
use crate::hardware::{InventoryStamp, NodeInventory};

/// The device models of the last two inventories seen, rebuilt only for an inventory not
/// among them.
///
/// Building the model (every MIG profile at every placement, counters) is the main CPU cost
/// of a prepare; the inventory it derives from is still read from the hardware on every call
/// (unless the backend's stamp says it cannot differ), so a cached model is never stale — a
/// second plugin instance (rolling update) that changed the hardware makes the next lookup
/// miss. Two entries, because a MIG claim's prepare and
/// unprepare alternate between two inventories (without and with its instance); each model of
/// a large node holds about a megabyte, so the cache stays small.
///
/// A backend that stamps its inventory ([`crate::hardware::GpuBackend::inventory_stamp`])
/// lets a call skip even the read: the entry last read under an equal stamp is the one the
/// read would find ([`ModelCache::get_stamped`]).
#[derive(Default)]
pub struct ModelCache(std::sync::Mutex<Vec<Entry>>);

/// An inventory, its model, and the stamp the backend gave when it was last read.
struct Entry {
    inventory: Arc<NodeInventory>,
    model: Arc<DeviceModel>,
    stamp: Option<InventoryStamp>,
}

impl Entry {
    fn shared(&self) -> (Arc<NodeInventory>, Arc<DeviceModel>) {
        (Arc::clone(&self.inventory), Arc::clone(&self.model))
    }
}

/// How many inventories [`ModelCache`] remembers.
const MODEL_CACHE_ENTRIES: usize = 2;

impl ModelCache {
    /// The inventory and model last read under a stamp equal to `stamp`, if one is kept.
    pub fn get_stamped(
        &self,
        stamp: &InventoryStamp,
    ) -> Option<(Arc<NodeInventory>, Arc<DeviceModel>)> {
        let mut entries = self.entries();
        let at = entries
            .iter()
            .position(|e| e.stamp.as_ref() == Some(stamp))?;
        let entry = entries.remove(at);
        let found = entry.shared();
        entries.insert(0, entry);
        Some(found)
    }

    /// The model for `inventory`, from the cache when it was seen recently, and the
    /// inventory it was built from (equal to `inventory`), shared rather than copied, for
    /// the steps of the same call that read it too. `stamp` is the backend's stamp taken
    /// before the read (`None` when it gives none), which the entry keeps for
    /// [`ModelCache::get_stamped`].
    pub fn get_read_under(
        &self,
        inventory: NodeInventory,
        options: &ModelOptions,
        stamp: Option<InventoryStamp>,
    ) -> (Arc<NodeInventory>, Arc<DeviceModel>) {
        let mut entries = self.entries();
        if let Some(at) = entries.iter().position(|e| *e.inventory == inventory) {
            let mut entry = entries.remove(at);
            entry.stamp = stamp;
            let found = entry.shared();
            entries.insert(0, entry);
            return found;
        }
        let entry = Entry {
            model: Arc::new(devices::build(&inventory, options)),
            inventory: Arc::new(inventory),
            stamp,
        };
        let found = entry.shared();
        entries.insert(0, entry);
        entries.truncate(MODEL_CACHE_ENTRIES);
        found
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The checkpoint as this instance last read or wrote it, reused by the next call while the
/// file is still that version ([`CheckpointStore::is_current`]: one `stat`), so a call does
/// not re-read and re-verify the whole file; any other writer's change makes it re-read.
#[derive(Default)]
pub struct CheckpointCache(std::sync::Mutex<Option<CheckpointStore>>);

impl<S: ClaimSource> ClaimsManager<S> {
    /// The checkpoint for this call: the cached one while the file is unchanged, else the
    /// file read afresh. Give it back with [`ClaimsManager::check_in`].
    pub(super) fn check_out(&self, claim: &str) -> Result<CheckpointStore, ClaimError> {
        let cached = self
            .checkpoint_cache
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(store) = cached
            && store.is_current()
        {
            return Ok(store);
        }
        CheckpointStore::open(&self.state_dir, &self.boot_id)
            .map(|(store, _)| store)
            .map_err(|e| ClaimError::Checkpoint {
                claim: claim.to_string(),
                source: Box::new(e),
            })
    }

    /// The records of `uids` in the checkpoint as this instance last read or wrote it, from
    /// memory (no file is read): for what a call just did, e.g. usage accounting after a
    /// prepare. `None` for a claim the checkpoint does not hold, or when no call has run yet.
    pub fn recorded(&self, uids: &[&str]) -> Vec<Option<crate::checkpoint::ClaimRecord>> {
        let cache = self
            .checkpoint_cache
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        uids.iter()
            .map(|uid| cache.as_ref()?.checkpoint().claims.get(*uid).cloned())
            .collect()
    }

    /// Like [`ClaimsManager::recorded`], but says when it cannot know: `None` when no
    /// checkpoint is held in memory (before the first call, or while a call has it checked
    /// out), so the caller can read the file instead of taking "no record" for an answer.
    pub fn recorded_if_cached(
        &self,
        uids: &[&str],
    ) -> Option<Vec<Option<crate::checkpoint::ClaimRecord>>> {
        let cache = self
            .checkpoint_cache
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let checkpoint = cache.as_ref()?.checkpoint();
        Some(
            uids.iter()
                .map(|uid| checkpoint.claims.get(*uid).cloned())
                .collect(),
        )
    }

    /// Keeps `store` for the next call. Always safe: a store's content equals the file it
    /// last read or wrote, and the next call checks the file is still that one.
    pub(super) fn check_in(&self, store: CheckpointStore) {
        *self
            .checkpoint_cache
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::GpuBackend;
    use crate::hardware::sim::SimBackend;

    fn inventory() -> NodeInventory {
        SimBackend::open("dgx-a100", None)
            .unwrap()
            .inventory()
            .unwrap()
    }

    #[test]
    fn a_stamp_finds_the_entry_read_under_it_and_no_other() {
        let cache = ModelCache::default();
        let options = ModelOptions::default();
        let (s1, s2) = (InventoryStamp([1; 7]), InventoryStamp([2; 7]));
        assert!(cache.get_stamped(&s1).is_none(), "empty");
        let (inv, model) = cache.get_read_under(inventory(), &options, Some(s1));
        let (kept_inv, kept_model) = cache.get_stamped(&s1).expect("read under s1");
        assert!(Arc::ptr_eq(&inv, &kept_inv) && Arc::ptr_eq(&model, &kept_model));
        assert!(
            cache.get_stamped(&s2).is_none(),
            "another stamp reads again"
        );

        // The same inventory read again under another stamp: the entry is reused (no new
        // model) and answers to the new stamp only.
        let (_, again) = cache.get_read_under(inventory(), &options, Some(s2));
        assert!(Arc::ptr_eq(&model, &again));
        assert!(cache.get_stamped(&s2).is_some());
        assert!(cache.get_stamped(&s1).is_none());

        // Read without a stamp (a backend that cannot stamp): nothing answers to a stamp.
        cache.get_read_under(inventory(), &options, None);
        assert!(cache.get_stamped(&s2).is_none());
    }
}
