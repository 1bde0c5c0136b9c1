//! Capacity requests against a device: the plain "at least this much" check, and for
//! devices with `allowMultipleAllocations` the consumable-capacity rules (request policy
//! rounding, what is left after other shares).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, Device, DeviceCapacity};

use super::SliceProblem;
use super::plan::CapacityRequest;
use super::reason::{CapacityProblem, Rejection};
use super::state::capacity_key;
use crate::quantity::{Quantity, QuantityError};

/// What one share of a device consumes, per capacity.
#[derive(Clone, Debug)]
pub(crate) struct Consumed<'a> {
    /// The capacity name as the device publishes it (used in `consumedCapacity`).
    pub(crate) published: &'a str,
    /// The name without the driver's domain (used for accounting).
    pub(crate) key: String,
    /// Carries the format the share is reported in.
    pub(crate) amount: Quantity,
}

pub(crate) enum Fit<'a> {
    /// The device can serve the request; for shareable devices, what the share consumes.
    Fits(Vec<Consumed<'a>>),
    No(Rejection),
}

fn parse(published: &str, what: &str, text: &str) -> Result<Quantity, SliceProblem> {
    text.parse().map_err(|err: QuantityError| SliceProblem {
        field: format!("capacity.{published}.{what}"),
        value: text.to_string(),
        problem: err.problem(),
    })
}

fn resolve<'d>(
    capacities: &'d BTreeMap<String, DeviceCapacity>,
    driver: &str,
    name: &str,
) -> Option<&'d str> {
    if let Some((key, _)) = capacities.get_key_value(name) {
        return Some(key);
    }
    let qualified = match name.strip_prefix(driver).and_then(|r| r.strip_prefix('/')) {
        Some(bare) => bare.to_string(),
        None => format!("{driver}/{name}"),
    };
    capacities
        .get_key_value(&qualified)
        .map(|(k, _)| k.as_str())
}

/// Checks `requests` against `device`. `used` returns what other allocations (earlier
/// claims and this run) already consume of a capacity key on this device.
pub(crate) fn check<'a>(
    device: &'a Device,
    driver: &str,
    requests: &[CapacityRequest<'_>],
    used: impl Fn(&str) -> Quantity,
) -> Result<Fit<'a>, SliceProblem> {
    static NONE: BTreeMap<String, DeviceCapacity> = BTreeMap::new();
    let capacities = device.capacity.as_ref().unwrap_or(&NONE);
    let mut wanted: Vec<(&str, &CapacityRequest<'_>)> = Vec::with_capacity(requests.len());
    for request in requests {
        match resolve(capacities, driver, request.name) {
            Some(published) => wanted.push((published, request)),
            None => {
                return Ok(Fit::No(Rejection::Capacity {
                    capacity: request.name.to_string(),
                    problem: CapacityProblem::NotOffered,
                }));
            }
        }
    }
    if device.allow_multiple_allocations != Some(true) {
        for (published, request) in wanted {
            let value = parse(published, "value", &capacities[published].value.0)?;
            if request.amount > value {
                return Ok(Fit::No(Rejection::Capacity {
                    capacity: published.to_string(),
                    problem: CapacityProblem::Insufficient {
                        requested: request.amount.to_string(),
                        left: value.to_string(),
                    },
                }));
            }
        }
        return Ok(Fit::Fits(Vec::new()));
    }
    let mut consumed = Vec::with_capacity(capacities.len());
    for (published, capacity) in capacities {
        let value = parse(published, "value", &capacity.value.0)?;
        let requested = wanted
            .iter()
            .find(|(p, _)| p == published)
            .map(|(_, r)| r.amount);
        let policy = capacity.request_policy.as_ref();
        let amount = consumed_amount(published, requested, value, policy)?;
        if let Some(policy) = policy
            && let Some(description) = violation(published, amount, policy)?
        {
            return Ok(Fit::No(Rejection::Capacity {
                capacity: published.clone(),
                problem: CapacityProblem::PolicyViolated {
                    requested: amount.to_string(),
                    policy: description,
                },
            }));
        }
        let key = capacity_key(driver, published);
        // What is left is reported in the capacity's own format, even when nothing is.
        let left = value
            .saturating_sub(&used(&key))
            .with_format(value.format());
        if amount > left {
            return Ok(Fit::No(Rejection::Capacity {
                capacity: published.clone(),
                problem: CapacityProblem::Insufficient {
                    requested: amount.to_string(),
                    left: left.to_string(),
                },
            }));
        }
        consumed.push(Consumed {
            published,
            key,
            amount,
        });
    }
    Ok(Fit::Fits(consumed))
}

/// The amount one share consumes: the request rounded up per policy, else the policy's
/// default, else the whole capacity. The result carries the format it is reported in.
fn consumed_amount(
    published: &str,
    requested: Option<Quantity>,
    whole: Quantity,
    policy: Option<&CapacityRequestPolicy>,
) -> Result<Quantity, SliceProblem> {
    let Some(request) = requested else {
        return match policy.and_then(|p| p.default.as_ref()) {
            Some(default) => parse(published, "requestPolicy.default", &default.0),
            None => Ok(whole),
        };
    };
    let Some(policy) = policy else {
        return Ok(request);
    };
    if let Some(range) = &policy.valid_range {
        let min = parse(published, "requestPolicy.validRange.min", &range.min.0)?;
        if request <= min {
            return Ok(min);
        }
        return match &range.step {
            Some(step) => {
                let step = parse(published, "requestPolicy.validRange.step", &step.0)?;
                let rounded =
                    request
                        .round_up_to_step(&min, &step)
                        .map_err(|err| SliceProblem {
                            field: format!("capacity.{published}.requestPolicy.validRange.step"),
                            value: step.to_string(),
                            problem: err.problem(),
                        })?;
                // Reported in the step's format (Kubernetes keeps the request's).
                Ok(rounded.with_format(step.format()))
            }
            None => Ok(request),
        };
    }
    for (i, valid) in policy.valid_values.iter().flatten().enumerate() {
        let valid = parse(
            published,
            &format!("requestPolicy.validValues[{i}]"),
            &valid.0,
        )?;
        if request <= valid {
            return Ok(valid);
        }
    }
    Ok(request)
}

/// Describes the policy when `amount` breaks it.
fn violation(
    published: &str,
    amount: Quantity,
    policy: &CapacityRequestPolicy,
) -> Result<Option<String>, SliceProblem> {
    if let Some(default) = &policy.default
        && parse(published, "requestPolicy.default", &default.0)? == amount
    {
        return Ok(None);
    }
    if let Some(range) = &policy.valid_range {
        let min = parse(published, "requestPolicy.validRange.min", &range.min.0)?;
        let mut description = format!("validRange min {}", range.min.0);
        let mut broken = false;
        if let Some(max) = &range.max {
            description.push_str(&format!(" max {}", max.0));
            broken |= amount > parse(published, "requestPolicy.validRange.max", &max.0)?;
        }
        if let Some(step) = &range.step {
            description.push_str(&format!(" step {}", step.0));
            let step = parse(published, "requestPolicy.validRange.step", &step.0)?;
            broken |= amount
                .saturating_sub(&min)
                .remainder(&step)
                .is_some_and(|r| !r.is_zero());
        }
        return Ok(broken.then_some(description));
    }
    let values = policy.valid_values.as_deref().unwrap_or_default();
    if values.is_empty() {
        return Ok(None);
    }
    for (i, valid) in values.iter().enumerate() {
        if parse(
            published,
            &format!("requestPolicy.validValues[{i}]"),
            &valid.0,
        )? == amount
        {
            return Ok(None);
        }
    }
    let list: Vec<&str> = values.iter().map(|v| v.0.as_str()).collect();
    Ok(Some(format!("validValues {}", list.join(", "))))
}
