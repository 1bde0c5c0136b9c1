//! Shared counters of partitionable devices: what each counter set of a pool holds, what
//! earlier allocations and the current search have taken, and whether a device still fits.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::resource::v1::{DeviceCounterConsumption, ResourceSlice};

use super::inventory::{Inventory, Located};
use super::reason::{Abort, Consumer};
use super::state::AllocatedState;
use crate::quantity::Quantity;

struct CounterState<'a> {
    name: &'a str,
    /// Its format is the one shortfalls of the counter are reported in.
    total: Quantity,
    /// Taken by devices of already-allocated claims.
    existing: Quantity,
    /// Taken by devices chosen so far in this search.
    claim: Quantity,
}

struct SetState<'a> {
    pool: usize,
    name: &'a str,
    counters: Vec<CounterState<'a>>,
}

/// One counter a device consumes, as indices into the book.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Use {
    pub(crate) set: usize,
    pub(crate) counter: usize,
    pub(crate) amount: Quantity,
}

/// The first counter a device would overdraw.
pub(crate) struct Shortfall {
    pub(crate) set: usize,
    pub(crate) counter: usize,
    pub(crate) needed: Quantity,
    pub(crate) left: Quantity,
}

/// Counter bookkeeping for one node's search; pools are loaded on first use.
pub(crate) struct Counters<'a> {
    sets: Vec<SetState<'a>>,
    index: HashMap<(usize, &'a str), usize>,
    loaded: HashSet<usize>,
}

pub(crate) fn invalid_slice(
    slice: &ResourceSlice,
    field: String,
    value: &str,
    problem: &str,
) -> Abort {
    Abort::InvalidSlice {
        slice: slice.metadata.name.clone().unwrap_or_default(),
        field,
        value: value.to_string(),
        problem: problem.to_string(),
    }
}

impl<'a> Counters<'a> {
    pub(crate) fn new() -> Self {
        Self {
            sets: Vec::new(),
            index: HashMap::new(),
            loaded: HashSet::new(),
        }
    }

    fn load_pool(
        &mut self,
        inventory: &Inventory<'a>,
        state: &AllocatedState<'a>,
        pool_index: usize,
    ) -> Result<(), Box<Abort>> {
        if !self.loaded.insert(pool_index) {
            return Ok(());
        }
        let pool = &inventory.pools[pool_index];
        for set in &pool.counter_sets {
            let mut counters = Vec::with_capacity(set.counters.len());
            for (name, counter) in &set.counters {
                let total = Quantity::from_k8s(&counter.value).map_err(|err| {
                    let slice = pool
                        .slices
                        .iter()
                        .find(|s| {
                            s.spec
                                .shared_counters
                                .iter()
                                .flatten()
                                .any(|c| c.name == set.name)
                        })
                        .copied();
                    Abort::InvalidSlice {
                        slice: slice
                            .and_then(|s| s.metadata.name.clone())
                            .unwrap_or_default(),
                        field: format!("spec.sharedCounters[{}].counters.{name}.value", set.name),
                        value: counter.value.0.clone(),
                        problem: err.problem(),
                    }
                })?;
                counters.push(CounterState {
                    name,
                    total,
                    existing: Quantity::ZERO,
                    claim: Quantity::ZERO,
                });
            }
            self.index
                .insert((pool_index, set.name.as_str()), self.sets.len());
            self.sets.push(SetState {
                pool: pool_index,
                name: &set.name,
                counters,
            });
        }
        let key = (pool.driver, pool.name);
        for (device_name, _) in state.by_pool.get(&key).into_iter().flatten() {
            let Some(found) = pool.find(device_name) else {
                continue;
            };
            let consumption = found
                .device
                .consumes_counters
                .as_deref()
                .unwrap_or_default();
            for one in self.resolve(pool_index, found.slice, consumption)? {
                let counter = &mut self.sets[one.set].counters[one.counter];
                counter.existing = counter.existing.saturating_add(&one.amount);
            }
        }
        Ok(())
    }

    fn resolve(
        &self,
        pool: usize,
        slice: &ResourceSlice,
        consumption: &[DeviceCounterConsumption],
    ) -> Result<Vec<Use>, Box<Abort>> {
        let mut uses = Vec::new();
        for consumed in consumption {
            // Unknown counter sets and counters are ignored, as in Kubernetes: API
            // validation is meant to prevent them.
            let Some(&set) = self.index.get(&(pool, consumed.counter_set.as_str())) else {
                continue;
            };
            for (name, value) in &consumed.counters {
                let Some(counter) = self.sets[set].counters.iter().position(|c| c.name == name)
                else {
                    continue;
                };
                let amount = Quantity::from_k8s(&value.value).map_err(|err| {
                    invalid_slice(
                        slice,
                        format!("consumesCounters[{}].counters.{name}", consumed.counter_set),
                        &value.value.0,
                        &err.problem(),
                    )
                })?;
                uses.push(Use {
                    set,
                    counter,
                    amount,
                });
            }
        }
        Ok(uses)
    }

    /// The counters the device at `at` consumes (empty for devices without counters).
    pub(crate) fn uses(
        &mut self,
        inventory: &Inventory<'a>,
        state: &AllocatedState<'a>,
        at: Located,
    ) -> Result<Vec<Use>, Box<Abort>> {
        let pool_device = &inventory.pools[at.pool].devices[at.index];
        let consumption = pool_device
            .device
            .consumes_counters
            .as_deref()
            .unwrap_or_default();
        if consumption.is_empty() {
            return Ok(Vec::new());
        }
        self.load_pool(inventory, state, at.pool)?;
        self.resolve(at.pool, pool_device.slice, consumption)
    }

    /// A counter that `uses` would overdraw; `with_search` also counts what the current
    /// search has taken. Of several, the one a person recognises as the conflict: first one
    /// with nothing left, and of those the smallest (a memory slice rather than an engine
    /// count).
    pub(crate) fn shortfall(&self, uses: &[Use], with_search: bool) -> Option<Shortfall> {
        let mut best: Option<(bool, Quantity, Shortfall)> = None;
        for one in uses {
            let counter = &self.sets[one.set].counters[one.counter];
            let mut left = counter.total.saturating_sub(&counter.existing);
            if with_search {
                left = left.saturating_sub(&counter.claim);
            }
            if one.amount <= left {
                continue;
            }
            let rank = (left > Quantity::ZERO, counter.total);
            if best
                .as_ref()
                .is_none_or(|(some_left, total, _)| rank < (*some_left, *total))
            {
                let short = Shortfall {
                    set: one.set,
                    counter: one.counter,
                    needed: one.amount,
                    left,
                };
                best = Some((rank.0, rank.1, short));
            }
        }
        best.map(|(_, _, short)| short)
    }

    pub(crate) fn take(&mut self, uses: &[Use]) {
        for one in uses {
            let counter = &mut self.sets[one.set].counters[one.counter];
            counter.claim = counter.claim.saturating_add(&one.amount);
        }
    }

    pub(crate) fn release(&mut self, uses: &[Use]) {
        for one in uses {
            let counter = &mut self.sets[one.set].counters[one.counter];
            counter.claim = counter.claim.saturating_sub(&one.amount);
        }
    }

    /// Names and printed amounts of a shortfall: (set, counter, needed, left).
    pub(crate) fn describe(&self, shortfall: &Shortfall) -> (String, String, String, String) {
        let set = &self.sets[shortfall.set];
        let counter = &set.counters[shortfall.counter];
        let left = shortfall.left.max(Quantity::ZERO);
        let format = counter.total.format();
        (
            set.name.to_string(),
            counter.name.to_string(),
            shortfall.needed.with_format(format).to_string(),
            left.with_format(format).to_string(),
        )
    }

    /// Devices of earlier allocations that consume the counter of `shortfall`.
    pub(crate) fn existing_consumers(
        &self,
        inventory: &Inventory<'a>,
        state: &AllocatedState<'a>,
        shortfall: &Shortfall,
    ) -> Vec<Consumer> {
        let set = &self.sets[shortfall.set];
        let pool = &inventory.pools[set.pool];
        let counter = set.counters[shortfall.counter].name;
        let mut consumers = Vec::new();
        for (device_name, claim) in state
            .by_pool
            .get(&(pool.driver, pool.name))
            .into_iter()
            .flatten()
        {
            let Some(found) = pool.find(device_name) else {
                continue;
            };
            let consumes = found
                .device
                .consumes_counters
                .iter()
                .flatten()
                .any(|c| c.counter_set == set.name && c.counters.contains_key(counter));
            if consumes {
                consumers.push(Consumer {
                    device: device_name.to_string(),
                    by: format!("claim {claim}"),
                });
            }
        }
        consumers
    }
}
