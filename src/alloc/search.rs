//! Depth-first search over the devices of one node, request after request, as the
//! Kubernetes allocator does: devices of a request are tried in node order (combinations,
//! not permutations), `firstAvailable` alternatives in list order, and every choice is
//! undone when what follows cannot be satisfied.

use std::collections::HashMap;
use std::rc::Rc;

use super::capacity::{Consumed, Fit};
use super::constraint::Constraints;
use super::counters::{Counters, Use};
use super::groups::Member;
use super::inventory::NodeDevices;
use super::reason::{Abort, Consumer, Rejection, Wants};
use super::{Allocator, CounterRollback, MAX_DEVICES_PER_CLAIM, Prepared, SelectorEngine};
use crate::quantity::Quantity;

/// What is known about a (slot, device) pair without looking at other choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Unknown,
    /// A selector is false (reason recorded in Full mode).
    NotSelectable,
    /// A selector failed to evaluate (reason always recorded).
    Error,
    /// Selected, but allocated elsewhere or tainted (reason recorded in Full mode).
    Blocked,
    Eligible,
}

/// One device taken for one slot.
pub(crate) struct Pick<'a> {
    pub(crate) slot: usize,
    pub(crate) pos: usize,
    pub(crate) uses: Rc<[Use]>,
    pub(crate) consumed: Vec<Consumed<'a>>,
    /// The counter sets it is placed on, with its compatibility groups.
    pub(crate) members: Vec<Member<'a>>,
}

pub(crate) struct NodeSearch<'s, 'a, E: SelectorEngine> {
    pub(crate) alloc: &'s Allocator<'a, E>,
    pub(crate) prep: &'s Prepared<'a, E>,
    pub(crate) node: &'s NodeDevices,
    pub(crate) full: bool,
    pub(crate) status: Vec<Status>,
    /// Static reasons per (slot, pos).
    pub(crate) reasons: HashMap<(usize, usize), Rejection>,
    /// First reason a statically eligible device was refused during the search.
    pub(crate) conflicts: HashMap<(usize, usize), Rejection>,
    /// Slot holding each device exclusively in this run.
    pub(crate) taken: Vec<Option<usize>>,
    /// Shares of each shareable device taken in this run.
    pub(crate) shares: Vec<u32>,
    pub(crate) share_use: HashMap<usize, HashMap<String, Quantity>>,
    pub(crate) counters: Counters<'a>,
    /// Counter consumption per device, resolved once.
    pub(crate) uses: Vec<Option<Rc<[Use]>>>,
    pub(crate) constraints: Constraints<'a>,
    pub(crate) picks: Vec<Pick<'a>>,
    /// Chosen alternative per top-level request.
    pub(crate) chosen: Vec<usize>,
    pub(crate) all_devices: HashMap<usize, Vec<usize>>,
    /// Eligible devices per slot, in node order, as far as classified (`scanned`).
    candidates: Vec<Vec<usize>>,
    scanned: Vec<usize>,
    pub(crate) steps: u64,
    pub(crate) best: usize,
    /// Counters kept by candidates a constraint refused ([`CounterRollback::Leaked`]): slot,
    /// device and what it consumes.
    leaked: Vec<(usize, usize, Rc<[Use]>)>,
    /// Each device's class of interchangeable devices ([`NodeSearch::twin_class`]), computed
    /// when first needed: `Some(None)` for a device that has no twins by construction.
    twins: Vec<Option<Option<u32>>>,
    /// The classes by their key.
    twin_keys: HashMap<(usize, String), u32>,
}

impl<'s, 'a, E: SelectorEngine> NodeSearch<'s, 'a, E> {
    pub(crate) fn new(
        alloc: &'s Allocator<'a, E>,
        prep: &'s Prepared<'a, E>,
        node: &'s NodeDevices,
        full: bool,
    ) -> Self {
        let n = node.devices.len();
        Self {
            alloc,
            prep,
            node,
            full,
            status: vec![Status::Unknown; n * prep.slots.len()],
            reasons: HashMap::new(),
            conflicts: HashMap::new(),
            taken: vec![None; n],
            shares: vec![0; n],
            share_use: HashMap::new(),
            counters: Counters::new(),
            uses: vec![None; n],
            constraints: Constraints::new(prep.constraints.len()),
            picks: Vec::new(),
            chosen: vec![0; prep.requests.len()],
            all_devices: HashMap::new(),
            candidates: vec![Vec::new(); prep.slots.len()],
            scanned: vec![0; prep.slots.len()],
            steps: 0,
            best: 0,
            leaked: Vec::new(),
            twins: vec![None; n],
            twin_keys: HashMap::new(),
        }
    }

    /// The class of devices interchangeable with the device at `pos` in this search: the same
    /// pool, capacity and counter consumption, the same eligibility for every request, and
    /// the same value of every attribute a constraint of the claims compares, e.g. the vGPU
    /// slots of one type on one GPU (which differ in name and `slot` only). Selectors reach
    /// the search only through eligibility, constraints only through those values, counters
    /// only through the consumption, so once a search with one of them taken at some step has
    /// failed, the same step with a later twin fails too (swapping the two maps the twin's
    /// subtree onto part of the first one's). `None` for a device that can be shared (what
    /// is left of it differs per device) or when the search keeps side effects across
    /// backtracking ([`CounterRollback::Leaked`]).
    fn twin_class(&mut self, pos: usize) -> Option<u32> {
        if let Some(class) = self.twins[pos] {
            return class;
        }
        let at = self.node.devices[pos];
        let pool = &self.alloc.inventory.pools[at.pool];
        let device = pool.devices[at.index].device;
        let class = if self.alloc.counter_rollback == CounterRollback::Leaked
            || device.allow_multiple_allocations == Some(true)
        {
            None
        } else {
            let mut key = serde_json::to_string(&(&device.capacity, &device.consumes_counters))
                .unwrap_or_default();
            for slot in 0..self.prep.slots.len() {
                let status = self.eligible(slot, pos).unwrap_or(Status::Error);
                key.push_str(&format!("|{status:?}"));
            }
            for constraint in &self.prep.constraints {
                let value = super::constraint::lookup(device, pool.driver, constraint.attribute);
                key.push_str(&format!("|{value:?}"));
            }
            let next = self.twin_keys.len() as u32;
            Some(*self.twin_keys.entry((at.pool, key)).or_insert(next))
        };
        self.twins[pos] = Some(class);
        class
    }

    /// Runs the search; `Ok(true)` when every request of every claim is satisfied.
    pub(crate) fn run(&mut self) -> Result<bool, Box<Abort>> {
        self.place(0, None, 0, 0)
    }

    fn place(
        &mut self,
        request: usize,
        alt: Option<usize>,
        k: usize,
        start: usize,
    ) -> Result<bool, Box<Abort>> {
        self.steps += 1;
        if self.steps > self.alloc.step_limit {
            return Err(Abort::StepLimit {
                steps: self.alloc.step_limit,
            }
            .into());
        }
        let prep = self.prep;
        let Some(plan) = prep.requests.get(request) else {
            return Ok(true);
        };
        let Some(alt) = alt else {
            for alt in 0..plan.alternatives.len() {
                if self.place(request, Some(alt), 0, 0)? {
                    self.chosen[request] = alt;
                    return Ok(true);
                }
            }
            return Ok(false);
        };
        let slot = plan.alternatives[alt];
        let needed = match prep.slots[slot].wants {
            Wants::ExactCount(n) => n,
            Wants::All => {
                let all = self.all_for(slot)?;
                if all.is_empty() {
                    return Ok(false);
                }
                all.len()
            }
        };
        if k == needed {
            return self.place(request + 1, None, 0, 0);
        }
        let held = self
            .picks
            .iter()
            .filter(|p| prep.slots[p.slot].claim == plan.claim)
            .count();
        if held + needed - k > MAX_DEVICES_PER_CLAIM {
            return Ok(false);
        }
        if prep.slots[slot].wants == Wants::All {
            let pos = self.all_devices[&slot][k];
            if self.eligible(slot, pos)? != Status::Eligible {
                return Ok(false);
            }
            return match self.try_take(slot, pos)? {
                Ok(pick) => self.descend(pick, request, alt, k, 0),
                Err(Rejection::Constraint { .. }) => Err(Abort::AllBlockedByConstraint {
                    request: prep.slots[slot].name.clone(),
                    device: self.device_ref(pos),
                }
                .into()),
                Err(_) => Ok(false),
            };
        }
        let mut next = self.candidates[slot].partition_point(|&p| p < start);
        // Classes of devices whose subtree failed at this step: their later twins are skipped
        // (a vGPU claim asking for more slots than a GPU has would otherwise try every subset).
        let mut failed: Vec<u32> = Vec::new();
        while let Some(pos) = self.next_candidate(slot, next)? {
            next += 1;
            let class = self.twin_class(pos);
            if class.is_some_and(|c| failed.contains(&c)) {
                continue;
            }
            if let Ok(pick) = self.try_take(slot, pos)? {
                if self.descend(pick, request, alt, k, pos + 1)? {
                    return Ok(true);
                }
                failed.extend(class);
            }
        }
        Ok(false)
    }

    /// The `index`-th eligible device of `slot` in node order. Devices are classified only
    /// as far as the search has needed, so a claim that fits early evaluates few selectors,
    /// while later steps skip ineligible devices without looking at them again.
    fn next_candidate(&mut self, slot: usize, index: usize) -> Result<Option<usize>, Box<Abort>> {
        while self.candidates[slot].len() <= index {
            let pos = self.scanned[slot];
            if pos == self.node.devices.len() {
                return Ok(None);
            }
            self.scanned[slot] += 1;
            // As in Kubernetes, a device another claim holds is passed over before any
            // selector is evaluated on it ("in use" is cheap); with full detail every device
            // is classified for its reason.
            if !self.full && self.exclusive_holder(slot, pos).is_some() {
                continue;
            }
            if self.eligible(slot, pos)? == Status::Eligible {
                self.candidates[slot].push(pos);
            }
        }
        Ok(Some(self.candidates[slot][index]))
    }

    /// Keeps `pick` and continues with the next device; undoes it if that fails.
    fn descend(
        &mut self,
        pick: Pick<'a>,
        request: usize,
        alt: usize,
        k: usize,
        next: usize,
    ) -> Result<bool, Box<Abort>> {
        self.commit(pick);
        self.best = self.best.max(self.picks.len());
        let found = self.place(request, Some(alt), k + 1, next);
        if !matches!(found, Ok(true)) {
            self.undo();
        }
        found
    }

    /// The devices a request for `All` must get: every device its selectors accept whose
    /// capacity could serve it. Computed once per slot.
    fn all_for(&mut self, slot: usize) -> Result<&Vec<usize>, Box<Abort>> {
        if !self.all_devices.contains_key(&slot) {
            let name = &self.prep.slots[slot].name;
            if let Some(&pool) = self.node.ignored_pools.first() {
                let pool = &self.alloc.inventory.pools[pool];
                return Err(Abort::PoolNotReady {
                    request: name.clone(),
                    pool: format!("{}/{}", pool.driver, pool.name),
                }
                .into());
            }
            let mut all = Vec::new();
            for pos in 0..self.node.devices.len() {
                if matches!(self.eligible(slot, pos)?, Status::NotSelectable) {
                    continue;
                }
                if matches!(self.capacity_fit(slot, pos, false)?, Fit::Fits(_)) {
                    all.push(pos);
                }
            }
            if all.len() > MAX_DEVICES_PER_CLAIM {
                return Err(Abort::TooManyDevices {
                    request: self.prep.slots[slot].name.clone(),
                    count: all.len(),
                    limit: MAX_DEVICES_PER_CLAIM,
                }
                .into());
            }
            self.all_devices.insert(slot, all);
        }
        Ok(&self.all_devices[&slot])
    }

    /// Checks everything that depends on other choices; on success returns the pick to
    /// commit, otherwise the reason (recorded as the device's first conflict in Full mode).
    fn try_take(
        &mut self,
        slot: usize,
        pos: usize,
    ) -> Result<Result<Pick<'a>, Rejection>, Box<Abort>> {
        let outcome = self.check_take(slot, pos)?;
        if let Err(reason) = &outcome
            && self.full
        {
            self.conflicts
                .entry((slot, pos))
                .or_insert_with(|| reason.clone());
        }
        Ok(outcome)
    }

    fn check_take(
        &mut self,
        slot: usize,
        pos: usize,
    ) -> Result<Result<Pick<'a>, Rejection>, Box<Abort>> {
        let prep = self.prep;
        let spec = &prep.slots[slot];
        if let Some(holder) = self.taken[pos]
            && (!spec.admin || prep.slots[holder].claim == spec.claim)
        {
            return Ok(Err(Rejection::TakenByRequest {
                request: prep.slots[holder].name.clone(),
            }));
        }
        let consumed = match self.capacity_fit(slot, pos, true)? {
            Fit::Fits(consumed) => consumed,
            Fit::No(reason) => return Ok(Err(reason)),
        };
        let at = self.node.devices[pos];
        let pool = &self.alloc.inventory.pools[at.pool];
        let device = pool.devices[at.index].device;
        let shareable = device.allow_multiple_allocations == Some(true);
        let already_shared = self.shares[pos] > 0
            || self.alloc.state.shared.contains_key(&(
                pool.driver,
                pool.name,
                device.name.as_str(),
            ));
        let mut uses: Rc<[Use]> = Rc::new([]);
        let mut members = Vec::new();
        // Admin access consumes nothing; a shared device's counters are taken by its first share.
        if !(spec.admin || (shareable && already_shared)) {
            uses = self.uses_at(pos)?;
            if let Some(short) = self.counters.shortfall(&uses, true) {
                let (counter_set, counter, needed, left) = self.counters.describe(&short);
                let mut consumers = self.counters.existing_consumers(
                    &self.alloc.inventory,
                    &self.alloc.state,
                    &short,
                );
                let touches = |uses: &[Use]| {
                    uses.iter()
                        .any(|u| u.set == short.set && u.counter == short.counter)
                };
                for pick in self.picks.iter().filter(|p| touches(&p.uses)) {
                    consumers.push(Consumer {
                        device: self.device_name(pick.pos).to_string(),
                        by: format!("request {}", prep.slots[pick.slot].name),
                    });
                }
                for (slot, pos, _) in self.leaked.iter().filter(|(_, _, u)| touches(u)) {
                    consumers.push(Consumer {
                        device: self.device_name(*pos).to_string(),
                        by: format!(
                            "request {} (refused by a constraint, counters kept: kube-scheduler before kubernetes#140431)",
                            prep.slots[*slot].name
                        ),
                    });
                }
                return Ok(Err(Rejection::CountersExhausted {
                    counter_set,
                    counter,
                    needed,
                    left,
                    consumers,
                }));
            }
            members = self
                .counters
                .members(&self.alloc.inventory, &self.alloc.state, at)?;
            if let Some(conflict) = self.counters.group_conflict(&members, true) {
                return Ok(Err(self.group_rejection(&conflict, true)));
            }
        }
        if let Err(reason) =
            self.constraints
                .try_add(&prep.constraints, &prep.slots, slot, device, pool.driver)
        {
            if self.alloc.counter_rollback == CounterRollback::Leaked && !uses.is_empty() {
                self.counters.take(&uses);
                self.leaked.push((slot, pos, uses));
            }
            return Ok(Err(*reason));
        }
        Ok(Ok(Pick {
            slot,
            pos,
            uses,
            consumed,
            members,
        }))
    }

    fn commit(&mut self, pick: Pick<'a>) {
        let device = self.device(pick.pos);
        if device.allow_multiple_allocations == Some(true) {
            self.shares[pick.pos] += 1;
            let usage = self.share_use.entry(pick.pos).or_default();
            for c in &pick.consumed {
                let slot = usage.entry(c.key.clone()).or_default();
                *slot = slot.saturating_add(&c.amount);
            }
        } else {
            self.taken[pick.pos] = Some(pick.slot);
        }
        self.counters.take(&pick.uses);
        self.counters.join(&pick.members);
        self.picks.push(pick);
    }

    fn undo(&mut self) {
        let Some(pick) = self.picks.pop() else {
            return;
        };
        let prep = self.prep;
        self.constraints
            .remove(&prep.constraints, &prep.slots, pick.slot);
        self.counters.release(&pick.uses);
        self.counters.leave(&pick.members);
        if self.shares[pick.pos] > 0 {
            self.shares[pick.pos] -= 1;
            if let Some(usage) = self.share_use.get_mut(&pick.pos) {
                for c in &pick.consumed {
                    if let Some(slot) = usage.get_mut(&c.key) {
                        *slot = slot.saturating_sub(&c.amount);
                    }
                }
            }
        } else {
            self.taken[pick.pos] = None;
        }
    }
}
