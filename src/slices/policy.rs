//! The API server's rules for capacity request policies (KEP-5075), checked before publishing
//! so that a shared device is never refused by the server.

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange, Device};

use super::SliceError;
use crate::quantity::Quantity;

/// Entries of `validValues`.
pub const MAX_VALID_VALUES: usize = 10;

struct At<'a> {
    device: &'a str,
    field: String,
}

impl At<'_> {
    fn err(&self, sub: &str, problem: impl Into<String>) -> SliceError {
        SliceError::Limit {
            object: self.device.to_string(),
            field: format!("{}{sub}", self.field),
            problem: problem.into(),
        }
    }

    fn parse(&self, sub: &str, text: &str) -> Result<Quantity, SliceError> {
        text.parse()
            .map_err(|e: crate::quantity::QuantityError| self.err(sub, e.to_string()))
    }
}

/// Checks every capacity's `requestPolicy` of `d`: only on devices with
/// `allowMultipleAllocations`, one kind of policy, a default the policy allows, bounds within
/// the capacity, steps that line up, at most [`MAX_VALID_VALUES`] sorted values.
pub fn check_device(d: &Device) -> Result<(), SliceError> {
    for (name, capacity) in d.capacity.iter().flatten() {
        let Some(policy) = &capacity.request_policy else {
            continue;
        };
        let at = At {
            device: &d.name,
            field: format!("capacity[{name}].requestPolicy"),
        };
        if d.allow_multiple_allocations != Some(true) {
            return Err(at.err("", "is only allowed with allowMultipleAllocations: true"));
        }
        let value = at.parse(".value", &capacity.value.0)?;
        check_policy(&at, policy, value)?;
    }
    Ok(())
}

fn check_policy(
    at: &At,
    policy: &CapacityRequestPolicy,
    value: Quantity,
) -> Result<(), SliceError> {
    let values = policy.valid_values.as_deref().unwrap_or_default();
    if !values.is_empty() && policy.valid_range.is_some() {
        return Err(at.err("", "sets both validValues and validRange; set one"));
    }
    let default = match &policy.default {
        Some(d) => Some(at.parse(".default", &d.0)?),
        None => None,
    };
    if values.is_empty() && policy.valid_range.is_none() {
        return Ok(());
    }
    let Some(default) = default else {
        return Err(at.err(".default", "is required with validValues or validRange"));
    };
    match &policy.valid_range {
        Some(range) => check_range(at, range, default, value),
        None => check_values(at, values, default, value),
    }
}

fn check_values(
    at: &At,
    values: &[k8s_openapi::apimachinery::pkg::api::resource::Quantity],
    default: Quantity,
    value: Quantity,
) -> Result<(), SliceError> {
    if values.len() > MAX_VALID_VALUES {
        return Err(at.err(
            ".validValues",
            format!(
                "has {} entries; at most {MAX_VALID_VALUES} are allowed",
                values.len()
            ),
        ));
    }
    let mut previous: Option<Quantity> = None;
    for (i, text) in values.iter().enumerate() {
        let sub = format!(".validValues[{i}]");
        let v = at.parse(&sub, &text.0)?;
        if v > value {
            return Err(at.err(&sub, format!("{v} is above the capacity {value}")));
        }
        if previous.is_some_and(|p| p >= v) {
            return Err(at.err(&sub, "values must be unique and in ascending order"));
        }
        previous = Some(v);
    }
    let listed = values
        .iter()
        .any(|t| t.0.parse::<Quantity>().is_ok_and(|v| v == default));
    if !listed {
        return Err(at.err(".default", format!("{default} is not one of validValues")));
    }
    Ok(())
}

fn check_range(
    at: &At,
    range: &CapacityRequestPolicyRange,
    default: Quantity,
    value: Quantity,
) -> Result<(), SliceError> {
    let min = at.parse(".validRange.min", &range.min.0)?;
    if min.sign() < 0 || min > value {
        return Err(at.err(
            ".validRange.min",
            format!("{min} is outside 0 to the capacity {value}"),
        ));
    }
    if default < min {
        return Err(at.err(".default", format!("{default} is below min {min}")));
    }
    let max = match &range.max {
        Some(text) => Some(at.parse(".validRange.max", &text.0)?),
        None => None,
    };
    if let Some(max) = max {
        if max < min || max > value {
            return Err(at.err(
                ".validRange.max",
                format!("{max} is outside min {min} to the capacity {value}"),
            ));
        }
        if default > max {
            return Err(at.err(".default", format!("{default} is above max {max}")));
        }
    }
    if let Some(text) = &range.step {
        let step = at.parse(".validRange.step", &text.0)?;
        if step.sign() <= 0 || min.saturating_add(&step) > value {
            return Err(at.err(
                ".validRange.step",
                format!("{step} must be above 0 and min + step at most the capacity {value}"),
            ));
        }
        for (sub, v) in [(".default", Some(default)), (".validRange.max", max)] {
            let Some(v) = v else { continue };
            let off = v.saturating_sub(&min).remainder(&step);
            if off.is_some_and(|r| !r.is_zero()) {
                return Err(at.err(
                    sub,
                    format!("{v} is not min {min} plus a multiple of step {step}"),
                ));
            }
        }
    }
    Ok(())
}
