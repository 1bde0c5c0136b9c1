//! What claims that are already allocated hold: exclusive devices, shares of devices with
//! consumable capacity, and (through their devices) shared counters.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::AllocError;
use crate::quantity::Quantity;

/// (driver, pool, device).
pub(crate) type DeviceKey<'a> = (&'a str, &'a str, &'a str);

/// Use of one shareable device by earlier allocations.
#[derive(Default)]
pub(crate) struct SharedUse {
    /// Consumed amount per capacity name (without the driver's domain).
    pub(crate) consumed: HashMap<String, Quantity>,
    pub(crate) claims: Vec<String>,
}

/// Devices held by already-allocated claims.
#[derive(Default)]
pub(crate) struct AllocatedState<'a> {
    /// Exclusively allocated devices and the claim holding each.
    pub(crate) exclusive: HashMap<DeviceKey<'a>, String>,
    /// Devices allocated in shares (`shareID` set).
    pub(crate) shared: HashMap<DeviceKey<'a>, SharedUse>,
    /// Devices whose counters are consumed, per (driver, pool): device and claim, once each.
    pub(crate) by_pool: HashMap<(&'a str, &'a str), Vec<(&'a str, String)>>,
    /// Share IDs in use, so new ones never collide.
    pub(crate) share_ids: HashSet<(DeviceKey<'a>, &'a str)>,
}

/// The results of `claim`'s allocation (`status.allocation.devices.results`), every driver's;
/// empty while it is not allocated.
pub fn allocation_results(
    claim: &ResourceClaim,
) -> &[k8s_openapi::api::resource::v1::DeviceRequestAllocationResult] {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
}

/// `<namespace>/<name>` (or just the name) of a claim, as reports show it.
pub fn claim_display(claim: &ResourceClaim) -> String {
    let name = claim.metadata.name.as_deref().unwrap_or("<unnamed>");
    match claim.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// Strips the driver's own domain from a capacity name, so `gpu.nvidia.com/memory` and
/// `memory` of a `gpu.nvidia.com` device are the same capacity.
pub(crate) fn capacity_key(driver: &str, name: &str) -> String {
    name.strip_prefix(driver)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(name)
        .to_string()
}

impl<'a> AllocatedState<'a> {
    /// Collects what `claims` hold. Admin-access results hold nothing, as in Kubernetes.
    ///
    /// Fails when a recorded `consumedCapacity` is not a quantity.
    pub(crate) fn new(claims: &'a [ResourceClaim]) -> Result<Self, AllocError> {
        let mut state = AllocatedState::default();
        for claim in claims {
            let results = allocation_results(claim);
            if results.is_empty() {
                continue;
            }
            let display = claim_display(claim);
            for (i, result) in results.iter().enumerate() {
                if result.admin_access == Some(true) {
                    continue;
                }
                let key = (
                    result.driver.as_str(),
                    result.pool.as_str(),
                    result.device.as_str(),
                );
                let first_use =
                    !state.exclusive.contains_key(&key) && !state.shared.contains_key(&key);
                match result.share_id.as_deref() {
                    Some(share) => {
                        state.share_ids.insert((key, share));
                        let entry = state.shared.entry(key).or_default();
                        entry.claims.push(display.clone());
                        for (name, quantity) in result.consumed_capacity.iter().flatten() {
                            let amount = Quantity::from_k8s(quantity).map_err(|err| {
                                AllocError::AllocatedClaim {
                                    claim: display.clone(),
                                    field: format!(
                                        "status.allocation.devices.results[{i}].consumedCapacity.{name}"
                                    ),
                                    value: quantity.0.clone(),
                                    problem: err.problem(),
                                }
                            })?;
                            let slot = entry.consumed.entry(capacity_key(key.0, name)).or_default();
                            *slot = slot.saturating_add(&amount);
                        }
                    }
                    None => {
                        state.exclusive.insert(key, display.clone());
                    }
                }
                if first_use {
                    state
                        .by_pool
                        .entry((key.0, key.1))
                        .or_default()
                        .push((key.2, display.clone()));
                }
            }
        }
        Ok(state)
    }
}
