//! Capacity requests against a device: the plain "at least this much" check, and for
//! devices with `allowMultipleAllocations` the consumable-capacity rules (request policy
//! rounding, what is left after other shares).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, Device, DeviceCapacity};

use super::SliceProblem;
use super::claim::CapacityRequest;
use super::quantity::{Amount, Style};
use super::reason::{CapacityProblem, Rejection};
use super::state::capacity_key;

/// What one share of a device consumes, per capacity.
#[derive(Clone, Debug)]
pub(crate) struct Consumed<'a> {
    /// The capacity name as the device publishes it (used in `consumedCapacity`).
    pub(crate) published: &'a str,
    /// The name without the driver's domain (used for accounting).
    pub(crate) key: String,
    pub(crate) amount: Amount,
    pub(crate) style: Style,
}

pub(crate) enum Fit<'a> {
    /// The device can serve the request; for shareable devices, what the share consumes.
    Fits(Vec<Consumed<'a>>),
    No(Rejection),
}

fn parse(published: &str, what: &str, text: &str) -> Result<(Amount, Style), SliceProblem> {
    Amount::parse(text).map_err(|problem| SliceProblem {
        field: format!("capacity.{published}.{what}"),
        value: text.to_string(),
        problem: problem.to_string(),
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
    used: impl Fn(&str) -> Amount,
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
            let (value, style) = parse(published, "value", &capacities[published].value.0)?;
            if request.amount > value {
                return Ok(Fit::No(Rejection::Capacity {
                    capacity: published.to_string(),
                    problem: CapacityProblem::Insufficient {
                        requested: request.amount.format(request.style),
                        left: value.format(style),
                    },
                }));
            }
        }
        return Ok(Fit::Fits(Vec::new()));
    }
    let mut consumed = Vec::with_capacity(capacities.len());
    for (published, capacity) in capacities {
        let (value, value_style) = parse(published, "value", &capacity.value.0)?;
        let requested = wanted
            .iter()
            .find(|(p, _)| p == published)
            .map(|(_, r)| (r.amount, r.style));
        let policy = capacity.request_policy.as_ref();
        let (amount, style) = consumed_amount(published, requested, (value, value_style), policy)?;
        if let Some(policy) = policy
            && let Some(description) = violation(published, amount, policy)?
        {
            return Ok(Fit::No(Rejection::Capacity {
                capacity: published.clone(),
                problem: CapacityProblem::PolicyViolated {
                    requested: amount.format(style),
                    policy: description,
                },
            }));
        }
        let key = capacity_key(driver, published);
        let left = value.minus(used(&key));
        if amount > left {
            return Ok(Fit::No(Rejection::Capacity {
                capacity: published.clone(),
                problem: CapacityProblem::Insufficient {
                    requested: amount.format(style),
                    left: left.format(value_style),
                },
            }));
        }
        consumed.push(Consumed {
            published,
            key,
            amount,
            style,
        });
    }
    Ok(Fit::Fits(consumed))
}

/// The amount one share consumes: the request rounded up per policy, else the policy's
/// default, else the whole capacity.
fn consumed_amount(
    published: &str,
    requested: Option<(Amount, Style)>,
    whole: (Amount, Style),
    policy: Option<&CapacityRequestPolicy>,
) -> Result<(Amount, Style), SliceProblem> {
    let Some((request, request_style)) = requested else {
        return match policy.and_then(|p| p.default.as_ref()) {
            Some(default) => parse(published, "requestPolicy.default", &default.0),
            None => Ok(whole),
        };
    };
    let Some(policy) = policy else {
        return Ok((request, request_style));
    };
    if let Some(range) = &policy.valid_range {
        let (min, min_style) = parse(published, "requestPolicy.validRange.min", &range.min.0)?;
        if request <= min {
            return Ok((min, min_style));
        }
        return match &range.step {
            Some(step) => {
                let (step, step_style) =
                    parse(published, "requestPolicy.validRange.step", &step.0)?;
                let rounded = request
                    .round_up_from(min, step)
                    .ok_or_else(|| SliceProblem {
                        field: format!("capacity.{published}.requestPolicy.validRange.step"),
                        value: step.format(step_style),
                        problem: "a step must be above zero".into(),
                    })?;
                Ok((rounded, step_style))
            }
            None => Ok((request, request_style)),
        };
    }
    for (i, valid) in policy.valid_values.iter().flatten().enumerate() {
        let (valid, style) = parse(
            published,
            &format!("requestPolicy.validValues[{i}]"),
            &valid.0,
        )?;
        if request <= valid {
            return Ok((valid, style));
        }
    }
    Ok((request, request_style))
}

/// Describes the policy when `amount` breaks it.
fn violation(
    published: &str,
    amount: Amount,
    policy: &CapacityRequestPolicy,
) -> Result<Option<String>, SliceProblem> {
    if let Some(default) = &policy.default
        && parse(published, "requestPolicy.default", &default.0)?.0 == amount
    {
        return Ok(None);
    }
    if let Some(range) = &policy.valid_range {
        let (min, _) = parse(published, "requestPolicy.validRange.min", &range.min.0)?;
        let mut description = format!("validRange min {}", range.min.0);
        let mut broken = false;
        if let Some(max) = &range.max {
            description.push_str(&format!(" max {}", max.0));
            broken |= amount > parse(published, "requestPolicy.validRange.max", &max.0)?.0;
        }
        if let Some(step) = &range.step {
            description.push_str(&format!(" step {}", step.0));
            let (step, _) = parse(published, "requestPolicy.validRange.step", &step.0)?;
            broken |= amount
                .minus(min)
                .rem(step)
                .is_some_and(|r| r != Amount::ZERO);
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
        )?
        .0 == amount
        {
            return Ok(None);
        }
    }
    let list: Vec<&str> = values.iter().map(|v| v.0.as_str()).collect();
    Ok(Some(format!("validValues {}", list.join(", "))))
}
