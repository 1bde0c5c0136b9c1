//! ResourceSlices grouped into pools, indexed once and reused for every node.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourceSlice};

use super::node::{Node, reachable_from};

/// All pools of the input, current generation only.
pub(crate) struct Inventory<'a> {
    /// Sorted by driver, then pool name: the order in which devices are tried (as
    /// kube-scheduler's `sortPoolsByID`).
    pub(crate) pools: Vec<Pool<'a>>,
    /// Number of devices over all pools; [`PoolDevice::global`] indexes into it.
    pub(crate) device_count: usize,
    /// Slices naming a node, by node: (pool index, slice index in the pool).
    by_node: HashMap<&'a str, Vec<(usize, usize)>>,
    /// Slices reachable by `allNodes`, `nodeSelector` or per-device selection.
    elsewhere: Vec<(usize, usize)>,
}

/// One pool (driver + pool name) at its highest generation.
pub(crate) struct Pool<'a> {
    pub(crate) driver: &'a str,
    pub(crate) name: &'a str,
    /// `resourceSliceCount` of the current generation.
    pub(crate) expected_slices: i64,
    /// Slices seen at the current generation (device-less ones included), sorted by name.
    pub(crate) slices: Vec<&'a ResourceSlice>,
    /// Devices of all slices, in slice order; `slice_start[i]` is where slice `i` begins.
    pub(crate) devices: Vec<PoolDevice<'a>>,
    slice_start: Vec<usize>,
    /// Counter sets published anywhere in the pool.
    pub(crate) counter_sets: Vec<&'a CounterSet>,
    /// A device name listed twice makes the pool unusable, as in Kubernetes.
    pub(crate) duplicate: Option<&'a str>,
}

/// One device and the slice that lists it.
pub(crate) struct PoolDevice<'a> {
    pub(crate) device: &'a Device,
    pub(crate) slice: &'a ResourceSlice,
    /// Index over all devices of the inventory, for per-device caches.
    pub(crate) global: usize,
}

/// Where a device of a node lives: pool index and index in [`Pool::devices`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) pool: usize,
    pub(crate) index: usize,
}

/// The devices one node can use, in the order the search tries them.
pub(crate) struct NodeDevices {
    pub(crate) devices: Vec<Located>,
    /// Pools reachable from the node but skipped: incomplete or invalid.
    pub(crate) ignored_pools: Vec<usize>,
}

/// A slice's `metadata.name`, empty when it has none (as the upstream allocator compares it).
fn slice_name_of(slice: &ResourceSlice) -> &str {
    slice.metadata.name.as_deref().unwrap_or_default()
}

impl<'a> Pool<'a> {
    pub(crate) fn complete(&self) -> bool {
        self.slices.len() as i64 == self.expected_slices
    }

    pub(crate) fn usable(&self) -> bool {
        self.complete() && self.duplicate.is_none()
    }

    /// Finds a device by name (linear: only used for the few already-allocated devices).
    pub(crate) fn find(&self, name: &str) -> Option<&PoolDevice<'a>> {
        self.devices.iter().find(|d| d.device.name == name)
    }
}

impl<'a> Inventory<'a> {
    /// Groups `slices` into pools, keeping only each pool's highest generation.
    pub(crate) fn new(slices: &'a [ResourceSlice]) -> Self {
        let mut groups: BTreeMap<(&str, &str), Vec<&ResourceSlice>> = BTreeMap::new();
        for slice in slices {
            let key = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
            groups.entry(key).or_default().push(slice);
        }
        let mut inventory = Inventory {
            pools: Vec::with_capacity(groups.len()),
            device_count: 0,
            by_node: HashMap::new(),
            elsewhere: Vec::new(),
        };
        for ((driver, name), group) in groups {
            let generation = group
                .iter()
                .map(|s| s.spec.pool.generation)
                .max()
                .unwrap_or_default();
            let mut current: Vec<&ResourceSlice> = group
                .into_iter()
                .filter(|s| s.spec.pool.generation == generation)
                .collect();
            // kube-scheduler ≥ 1.36 walks a pool's slices sorted by name (`sortSlicesByName`
            // in the structured allocator's `buildPool`), whatever order its cache lists them
            // in. Slices with equal names (none, or the same name twice) keep the given order
            // here; upstream's sort is not stable, so for those its order is undefined.
            current.sort_by(|a, b| slice_name_of(a).cmp(slice_name_of(b)));
            let pool_index = inventory.pools.len();
            let pool = inventory.build_pool(driver, name, current, pool_index);
            inventory.pools.push(pool);
        }
        inventory
    }

    fn build_pool(
        &mut self,
        driver: &'a str,
        name: &'a str,
        slices: Vec<&'a ResourceSlice>,
        pool_index: usize,
    ) -> Pool<'a> {
        let expected_slices = slices
            .first()
            .map(|s| s.spec.pool.resource_slice_count)
            .unwrap_or_default();
        let mut devices = Vec::new();
        let mut slice_start = Vec::with_capacity(slices.len());
        let mut counter_sets = Vec::new();
        let mut names = HashSet::new();
        let mut duplicate = None;
        for (slice_index, slice) in slices.iter().enumerate() {
            slice_start.push(devices.len());
            counter_sets.extend(slice.spec.shared_counters.iter().flatten());
            for device in slice.spec.devices.iter().flatten() {
                if !names.insert(device.name.as_str()) && duplicate.is_none() {
                    duplicate = Some(device.name.as_str());
                }
                devices.push(PoolDevice {
                    device,
                    slice,
                    global: self.device_count,
                });
                self.device_count += 1;
            }
            let spec = &slice.spec;
            match spec.node_name.as_deref().filter(|n| !n.is_empty()) {
                Some(node) => self
                    .by_node
                    .entry(node)
                    .or_default()
                    .push((pool_index, slice_index)),
                None if spec.all_nodes == Some(true)
                    || spec.node_selector.is_some()
                    || spec.per_device_node_selection == Some(true) =>
                {
                    self.elsewhere.push((pool_index, slice_index))
                }
                // None of the known ways to reach a node: a future extension we cannot use.
                None => {}
            }
        }
        Pool {
            driver,
            name,
            expected_slices,
            slices,
            devices,
            slice_start,
            counter_sets,
            duplicate,
        }
    }

    /// Names of the nodes that slices are published for, sorted.
    pub(crate) fn node_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.by_node.keys().map(|n| n.to_string()).collect();
        names.sort();
        names
    }

    /// The devices reachable from `node`, pools in inventory order, devices in slice order.
    pub(crate) fn for_node(&self, node: &Node) -> NodeDevices {
        let mut reachable: Vec<(usize, usize)> = self
            .by_node
            .get(node.name.as_str())
            .cloned()
            .unwrap_or_default();
        for &(pool, slice) in &self.elsewhere {
            let spec = &self.pools[pool].slices[slice].spec;
            let whole_slice =
                reachable_from(node, None, spec.all_nodes, spec.node_selector.as_ref());
            if whole_slice || spec.per_device_node_selection == Some(true) {
                reachable.push((pool, slice));
            }
        }
        reachable.sort_unstable();
        let mut result = NodeDevices {
            devices: Vec::new(),
            ignored_pools: Vec::new(),
        };
        for (pool_index, slice_index) in reachable {
            let pool = &self.pools[pool_index];
            if !pool.usable() {
                if result.ignored_pools.last() != Some(&pool_index) {
                    result.ignored_pools.push(pool_index);
                }
                continue;
            }
            let start = pool.slice_start[slice_index];
            let end = pool
                .slice_start
                .get(slice_index + 1)
                .copied()
                .unwrap_or(pool.devices.len());
            let per_device = pool.slices[slice_index].spec.per_device_node_selection == Some(true);
            for index in start..end {
                let device = pool.devices[index].device;
                if per_device
                    && !reachable_from(
                        node,
                        device.node_name.as_deref(),
                        device.all_nodes,
                        device.node_selector.as_ref(),
                    )
                {
                    continue;
                }
                result.devices.push(Located {
                    pool: pool_index,
                    index,
                });
            }
        }
        result
    }
}
