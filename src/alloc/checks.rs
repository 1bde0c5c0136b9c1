//! Per-device checks that do not depend on other choices (selectors, earlier allocations,
//! taints), and the Full-detail classification of every device for every request.

use k8s_openapi::api::resource::v1::{Device, DeviceTaint, DeviceToleration};

use std::rc::Rc;

use super::SelectorEngine;
use super::capacity::{self, Fit};
use super::counters::{Use, invalid_slice};
use super::reason::{Abort, DeviceRef, Rejected, Rejection, RequestStatus, RequestTrace, Wants};
use super::search::{NodeSearch, Status};

/// True when one of `tolerations` tolerates `taint` (Kubernetes' `ToleratesTaint`).
pub(crate) fn tolerated(taint: &DeviceTaint, tolerations: &[DeviceToleration]) -> bool {
    tolerations.iter().any(|t| {
        if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
            && effect != taint.effect
        {
            return false;
        }
        if let Some(key) = t.key.as_deref().filter(|k| !k.is_empty())
            && key != taint.key
        {
            return false;
        }
        match t.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            "Equal" | "" => {
                t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            _ => false,
        }
    })
}

/// The first NoSchedule/NoExecute taint not tolerated; other effects never block.
fn blocking_taint<'d>(
    device: &'d Device,
    tolerations: &[DeviceToleration],
) -> Option<&'d DeviceTaint> {
    device.taints.iter().flatten().find(|taint| {
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerated(taint, tolerations)
    })
}

impl<'s, 'a, E: SelectorEngine> NodeSearch<'s, 'a, E> {
    pub(crate) fn device(&self, pos: usize) -> &'a Device {
        let at = self.node.devices[pos];
        self.alloc.inventory.pools[at.pool].devices[at.index].device
    }

    pub(crate) fn device_name(&self, pos: usize) -> &'a str {
        &self.device(pos).name
    }

    pub(crate) fn device_ref(&self, pos: usize) -> DeviceRef {
        let at = self.node.devices[pos];
        let pool = &self.alloc.inventory.pools[at.pool];
        DeviceRef {
            driver: pool.driver.to_string(),
            pool: pool.name.to_string(),
            device: pool.devices[at.index].device.name.clone(),
        }
    }

    /// The static status of (slot, device); a selector error aborts, as in Kubernetes.
    pub(crate) fn eligible(&mut self, slot: usize, pos: usize) -> Result<Status, Box<Abort>> {
        let status = self.status_of(slot, pos);
        if status != Status::Error {
            return Ok(status);
        }
        let Some(Rejection::SelectorError {
            class,
            expression,
            message,
        }) = self.reasons.get(&(slot, pos)).cloned()
        else {
            return Ok(Status::NotSelectable);
        };
        Err(Abort::SelectorError {
            request: self.prep.slots[slot].name.clone(),
            device: self.device_ref(pos),
            class,
            expression,
            message,
        }
        .into())
    }

    pub(crate) fn status_of(&mut self, slot: usize, pos: usize) -> Status {
        let index = slot * self.node.devices.len() + pos;
        if self.status[index] != Status::Unknown {
            return self.status[index];
        }
        let (status, reason) = self.evaluate_static(slot, pos);
        if let Some(reason) = reason {
            self.reasons.insert((slot, pos), reason);
        }
        self.status[index] = status;
        status
    }

    /// The claim an earlier allocation gave the device at `pos` to exclusively, unless `slot`
    /// asks for admin access: such a device is not `slot`'s whatever its selectors say. The
    /// walk checks this before evaluating any selector on the device, as Kubernetes does
    /// ("in use" is cheap).
    pub(crate) fn exclusive_holder(&self, slot: usize, pos: usize) -> Option<&'s String> {
        if self.prep.slots[slot].admin {
            return None;
        }
        let at = self.node.devices[pos];
        let pool = &self.alloc.inventory.pools[at.pool];
        let device = pool.devices[at.index].device;
        self.alloc
            .state
            .exclusive
            .get(&(pool.driver, pool.name, device.name.as_str()))
    }

    /// Selectors (class first, then request), earlier allocations, taints. Reasons are only
    /// built in Full mode, except for selector errors, which abort the search.
    fn evaluate_static(&self, slot: usize, pos: usize) -> (Status, Option<Rejection>) {
        let spec = &self.prep.slots[slot];
        let at = self.node.devices[pos];
        let pool = &self.alloc.inventory.pools[at.pool];
        let found = &pool.devices[at.index];
        let device = found.device;
        let view = self.alloc.view(found.global, pool.driver, device);
        let engine = self.alloc.engine;
        let class_side = spec.class_selectors.iter().map(|s| (s, true));
        let request_side = spec.selectors.iter().map(|s| (s, false));
        for (selector, of_class) in class_side.chain(request_side) {
            let verdict = match view {
                Ok(view) => engine.evaluate(&self.prep.programs[selector.program], view),
                Err(message) => Err(message.clone()),
            };
            match verdict {
                Ok(true) => {}
                Ok(false) => {
                    let reason = self.full.then(|| match of_class {
                        true => Rejection::ClassSelector {
                            class: spec.class_name.to_string(),
                            index: selector.index,
                            expression: selector.expression.to_string(),
                        },
                        false => Rejection::RequestSelector {
                            index: selector.index,
                            expression: selector.expression.to_string(),
                        },
                    });
                    return (Status::NotSelectable, reason);
                }
                Err(message) => {
                    let reason = Rejection::SelectorError {
                        class: of_class.then(|| spec.class_name.to_string()),
                        expression: selector.expression.to_string(),
                        message,
                    };
                    return (Status::Error, Some(reason));
                }
            }
        }
        if let Some(claim) = self.exclusive_holder(slot, pos) {
            let reason = self.full.then(|| Rejection::AlreadyAllocated {
                claim: claim.clone(),
            });
            return (Status::Blocked, reason);
        }
        // A device republished without allowMultipleAllocations while shares of it are still
        // allocated must not be handed out whole: the shares' workloads are still on it.
        if !spec.admin
            && device.allow_multiple_allocations != Some(true)
            && let Some(shared) =
                self.alloc
                    .state
                    .shared
                    .get(&(pool.driver, pool.name, device.name.as_str()))
        {
            let reason = self.full.then(|| Rejection::AlreadyAllocated {
                claim: shared.claims.join(", "),
            });
            return (Status::Blocked, reason);
        }
        if let Some(taint) = blocking_taint(device, spec.tolerations) {
            let reason = self.full.then(|| Rejection::TaintNotTolerated {
                key: taint.key.clone(),
                value: taint.value.clone(),
                effect: taint.effect.clone(),
            });
            return (Status::Blocked, reason);
        }
        (Status::Eligible, None)
    }

    /// Capacity check for `slot` on the device at `pos`; `with_search` also counts shares
    /// taken in this run.
    pub(crate) fn capacity_fit(
        &self,
        slot: usize,
        pos: usize,
        with_search: bool,
    ) -> Result<Fit<'a>, Box<Abort>> {
        let spec = &self.prep.slots[slot];
        let at = self.node.devices[pos];
        let pool = &self.alloc.inventory.pools[at.pool];
        let found = &pool.devices[at.index];
        let device = found.device;
        if spec.admin
            || (spec.capacity.is_empty() && device.allow_multiple_allocations != Some(true))
        {
            return Ok(Fit::Fits(Vec::new()));
        }
        let existing = self
            .alloc
            .state
            .shared
            .get(&(pool.driver, pool.name, device.name.as_str()));
        let in_run = self.share_use.get(&pos).filter(|_| with_search);
        let used = |key: &str| {
            let before = existing
                .and_then(|e| e.consumed.get(key))
                .copied()
                .unwrap_or_default();
            let now = in_run.and_then(|r| r.get(key)).copied().unwrap_or_default();
            before.saturating_add(&now)
        };
        capacity::check(device, pool.driver, &spec.capacity, used).map_err(|p| {
            invalid_slice(
                found.slice,
                format!("devices[{}].{}", device.name, p.field),
                &p.value,
                &p.problem,
            )
            .into()
        })
    }

    /// The counters the device at `pos` consumes, resolved on first use.
    pub(crate) fn uses_at(&mut self, pos: usize) -> Result<Rc<[Use]>, Box<Abort>> {
        if let Some(known) = &self.uses[pos] {
            return Ok(known.clone());
        }
        let at = self.node.devices[pos];
        let resolved: Rc<[Use]> = self
            .counters
            .uses(&self.alloc.inventory, &self.alloc.state, at)?
            .into();
        self.uses[pos] = Some(resolved.clone());
        Ok(resolved)
    }

    /// Why an eligible device cannot serve the slot even with nothing else chosen:
    /// capacity or counters already used by earlier allocations, or compatibility groups
    /// that do not meet theirs.
    fn alone_problem(&mut self, slot: usize, pos: usize) -> Option<Rejection> {
        if let Ok(Fit::No(reason)) = self.capacity_fit(slot, pos, false) {
            return Some(reason);
        }
        let at = self.node.devices[pos];
        let pool = &self.alloc.inventory.pools[at.pool];
        let device = pool.devices[at.index].device;
        let shared_before =
            self.alloc
                .state
                .shared
                .contains_key(&(pool.driver, pool.name, device.name.as_str()));
        if self.prep.slots[slot].admin
            || (device.allow_multiple_allocations == Some(true) && shared_before)
        {
            return None;
        }
        let uses = self.uses_at(pos).ok()?;
        if let Some(short) = self.counters.shortfall(&uses, false) {
            let (counter_set, counter, needed, left) = self.counters.describe(&short);
            let consumers =
                self.counters
                    .existing_consumers(&self.alloc.inventory, &self.alloc.state, &short);
            return Some(Rejection::CountersExhausted {
                counter_set,
                counter,
                needed,
                left,
                consumers,
            });
        }
        let members = self
            .counters
            .members(&self.alloc.inventory, &self.alloc.state, at)
            .ok()?;
        let conflict = self.counters.group_conflict(&members, false)?;
        Some(self.group_rejection(&conflict, false))
    }

    /// Classifies every device of the node for every request and sub-request.
    pub(crate) fn traces(&mut self, success: bool, aborted: bool) -> Vec<RequestTrace> {
        let prep = self.prep;
        let mut traces = Vec::new();
        for (r, plan) in prep.requests.iter().enumerate() {
            for (a, &slot) in plan.alternatives.iter().enumerate() {
                let spec = &prep.slots[slot];
                let mut trace = RequestTrace {
                    claim: prep.claims[spec.claim].display.clone(),
                    request: spec.name.clone(),
                    class: spec.class_name.to_string(),
                    wants: spec.wants,
                    admin_access: spec.admin,
                    status: RequestStatus::Blocked,
                    allocated: Vec::new(),
                    usable: Vec::new(),
                    rejected: Vec::new(),
                    conflicts: Vec::new(),
                };
                if success {
                    let picks: Vec<usize> = self
                        .picks
                        .iter()
                        .filter(|p| p.slot == slot)
                        .map(|p| p.pos)
                        .collect();
                    trace.allocated = picks.iter().map(|&p| self.device_ref(p)).collect();
                }
                let mut selected = 0;
                for pos in 0..self.node.devices.len() {
                    let status = self.status_of(slot, pos);
                    let problem = match status {
                        Status::Eligible => self.alone_problem(slot, pos),
                        _ => self.reasons.get(&(slot, pos)).cloned(),
                    };
                    if !matches!(status, Status::NotSelectable | Status::Error) {
                        selected += 1;
                    }
                    let device = self.device_ref(pos);
                    match problem {
                        Some(reason) => trace.rejected.push(Rejected { device, reason }),
                        None => {
                            let allocated = trace.allocated.contains(&device);
                            if let (false, Some(reason)) =
                                (allocated, self.conflicts.get(&(slot, pos)))
                            {
                                trace.conflicts.push(Rejected {
                                    device: device.clone(),
                                    reason: reason.clone(),
                                });
                            }
                            trace.usable.push(device);
                        }
                    }
                }
                let needed = match spec.wants {
                    Wants::ExactCount(n) => n,
                    Wants::All => selected.max(1),
                };
                let short = trace.usable.len() < needed;
                trace.status = match (success, aborted) {
                    (true, _) if a == self.chosen[r] => RequestStatus::Allocated,
                    (true, _) if a > self.chosen[r] => RequestStatus::NotTried,
                    _ if short => RequestStatus::Unsatisfiable,
                    (false, true) => RequestStatus::Aborted,
                    _ => RequestStatus::Blocked,
                };
                traces.push(trace);
            }
        }
        traces
    }
}
