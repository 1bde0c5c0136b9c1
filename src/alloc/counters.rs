//! Shared counters of partitionable devices: what each counter set of a pool holds, what
//! earlier allocations and the current search have taken, and whether a device still fits;
//! and which compatibility groups the devices on each set have in common ([`super::groups`]).

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::resource::v1::{DeviceCounterConsumption, ResourceSlice};

use super::groups::{GroupConflict, Meet, Member};
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
    /// What the devices of already-allocated claims on the set have in common.
    existing_meet: Meet,
    /// The groups of the devices placed on the set in this search, in order.
    joined: Vec<&'a [String]>,
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
    /// Pools where some device declares compatibility groups; elsewhere none can conflict.
    grouped: HashSet<usize>,
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
            grouped: HashSet::new(),
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
                existing_meet: Meet::Nobody,
                joined: Vec::new(),
            });
        }
        let declares_groups = pool.devices.iter().any(|d| {
            d.device.consumes_counters.iter().flatten().any(|c| {
                c.compatibility_groups
                    .as_ref()
                    .is_some_and(|g| !g.is_empty())
            })
        });
        if declares_groups {
            self.grouped.insert(pool_index);
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
            if declares_groups {
                for member in self.memberships(pool_index, consumption) {
                    let set = &mut self.sets[member.set];
                    set.existing_meet = set.existing_meet.with(member.groups);
                }
            }
        }
        Ok(())
    }

    /// The counter sets (known to the pool) that `consumption` draws from, with its groups.
    fn memberships(
        &self,
        pool: usize,
        consumption: &'a [DeviceCounterConsumption],
    ) -> Vec<Member<'a>> {
        consumption
            .iter()
            .filter_map(|c| {
                let set = *self.index.get(&(pool, c.counter_set.as_str()))?;
                Some(Member {
                    set,
                    groups: c.compatibility_groups.as_deref().unwrap_or_default(),
                })
            })
            .collect()
    }

    /// The counter sets the device at `at` is placed on, with the groups it declares on each;
    /// empty in a pool where no device declares groups (nothing can conflict there).
    pub(crate) fn members(
        &mut self,
        inventory: &Inventory<'a>,
        state: &AllocatedState<'a>,
        at: Located,
    ) -> Result<Vec<Member<'a>>, Box<Abort>> {
        let device = inventory.pools[at.pool].devices[at.index].device;
        let consumption = device.consumes_counters.as_deref().unwrap_or_default();
        if consumption.is_empty() {
            return Ok(Vec::new());
        }
        self.load_pool(inventory, state, at.pool)?;
        if !self.grouped.contains(&at.pool) {
            return Ok(Vec::new());
        }
        Ok(self.memberships(at.pool, consumption))
    }

    /// The first of `members` whose groups do not meet those of the devices already on its
    /// set: of earlier allocations, and with `with_search` of this search too.
    pub(crate) fn group_conflict(
        &self,
        members: &[Member<'a>],
        with_search: bool,
    ) -> Option<GroupConflict<'a>> {
        members.iter().find_map(|member| {
            let set = &self.sets[member.set];
            let mut held = set.existing_meet.clone();
            if with_search {
                for groups in &set.joined {
                    held = held.with(groups);
                }
            }
            (!held.admits(member.groups)).then_some(GroupConflict {
                set: member.set,
                groups: member.groups,
                held,
            })
        })
    }

    /// Places a chosen device on its sets.
    pub(crate) fn join(&mut self, members: &[Member<'a>]) {
        for member in members {
            self.sets[member.set].joined.push(member.groups);
        }
    }

    /// Takes back the last [`Counters::join`] of these members (the search undoes in
    /// reverse order).
    pub(crate) fn leave(&mut self, members: &[Member<'a>]) {
        for member in members.iter().rev() {
            self.sets[member.set].joined.pop();
        }
    }

    /// The name of counter set `set`.
    pub(crate) fn set_name(&self, set: usize) -> &'a str {
        self.sets[set].name
    }

    /// Devices of earlier allocations that consume from counter set `set`.
    pub(crate) fn set_consumers(
        &self,
        inventory: &Inventory<'a>,
        state: &AllocatedState<'a>,
        set: usize,
    ) -> Vec<Consumer> {
        let set = &self.sets[set];
        let pool = &inventory.pools[set.pool];
        let mut consumers = Vec::new();
        for (device_name, claim) in state
            .by_pool
            .get(&(pool.driver, pool.name))
            .into_iter()
            .flatten()
        {
            let on_set = pool.find(device_name).is_some_and(|found| {
                found
                    .device
                    .consumes_counters
                    .iter()
                    .flatten()
                    .any(|c| c.counter_set == set.name)
            });
            if on_set {
                consumers.push(Consumer {
                    device: device_name.to_string(),
                    by: format!("claim {claim}"),
                });
            }
        }
        consumers
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
