//! The `resource.k8s.io/v1` ResourceSlice limits (Kubernetes 1.37) and checks that a device
//! model stays within them, so the API server never rejects what gpu-dra publishes.

use k8s_openapi::api::resource::v1::Device;

use super::SliceError;
use crate::devices::DeviceModel;

/// Devices per slice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Devices per slice when any device uses taints or consumes counters.
pub const MAX_DEVICES_PER_SLICE_WITH_COUNTERS: usize = 64;
/// Attributes plus capacities per device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Counter sets per slice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// Counters per counter set, and per consumption.
pub const MAX_COUNTERS_PER_SET: usize = 32;
/// Counter consumptions per device.
pub const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Compatibility groups per counter consumption (KEP-5963; names unique).
pub const MAX_COMPATIBILITY_GROUPS: usize = 2;
/// Length of the identifier part of a fully qualified attribute name (`<domain>/<id>`).
pub const MAX_ATTRIBUTE_ID_LEN: usize = 32;
/// Length of string and version attribute values.
pub const MAX_ATTRIBUTE_VALUE_LEN: usize = 64;
/// Length of a DNS label (device, counter-set and counter names).
pub const MAX_DNS_LABEL_LEN: usize = 63;
/// Taints per device.
pub const MAX_TAINTS_PER_DEVICE: usize = 16;
/// Length of a taint value (a label value).
pub const MAX_TAINT_VALUE_LEN: usize = 63;

/// Whether a device counts towards the lower per-slice limit.
pub fn uses_counters_or_taints(d: &Device) -> bool {
    d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
        || d.taints.as_ref().is_some_and(|t| !t.is_empty())
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_DNS_LABEL_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn limit(object: &str, field: impl Into<String>, problem: impl Into<String>) -> SliceError {
    SliceError::Limit {
        object: object.to_string(),
        field: field.into(),
        problem: problem.into(),
    }
}

/// Checks every device and counter set against the limits.
pub fn check_model(model: &DeviceModel) -> Result<(), SliceError> {
    if let Some(attribute) = &model.partition_type_attribute {
        check_qualified_name(attribute)?;
    }
    let mut names = std::collections::BTreeSet::new();
    for d in &model.devices {
        check_device(&d.device)?;
        if !names.insert(d.device.name.as_str()) {
            return Err(limit(&d.device.name, "name", "is not unique in the pool"));
        }
    }
    let mut set_names = std::collections::BTreeSet::new();
    for set in &model.counter_sets {
        if !is_dns_label(&set.name) {
            return Err(limit(
                &set.name,
                "name",
                "must be a DNS label (lowercase letters, digits, '-', at most 63)",
            ));
        }
        if !set_names.insert(set.name.as_str()) {
            return Err(limit(&set.name, "name", "is not unique in the pool"));
        }
        if set.counters.len() > MAX_COUNTERS_PER_SET {
            return Err(limit(
                &set.name,
                "counters",
                format!(
                    "has {} counters; at most {MAX_COUNTERS_PER_SET} are allowed",
                    set.counters.len()
                ),
            ));
        }
        if let Some(bad) = set.counters.keys().find(|k| !is_dns_label(k)) {
            return Err(limit(
                &set.name,
                format!("counters[{bad}]"),
                "must be a DNS label",
            ));
        }
    }
    Ok(())
}

/// `partitionTypeAttribute` is a fully qualified attribute name: a DNS subdomain, `/`, and a
/// C identifier of at most [`MAX_ATTRIBUTE_ID_LEN`] characters.
fn check_qualified_name(attribute: &str) -> Result<(), SliceError> {
    let valid = attribute.split_once('/').is_some_and(|(domain, id)| {
        !domain.is_empty()
            && domain.len() <= 253
            && domain.split('.').all(is_dns_label)
            && !id.is_empty()
            && id.len() <= MAX_ATTRIBUTE_ID_LEN
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !id.as_bytes()[0].is_ascii_digit()
    });
    match valid {
        true => Ok(()),
        false => Err(limit(
            "slices",
            "partitionTypeAttribute",
            format!(
                "{attribute:?} is not a fully qualified attribute name (<DNS subdomain>/<C identifier of at most {MAX_ATTRIBUTE_ID_LEN}>)"
            ),
        )),
    }
}

fn check_device(d: &Device) -> Result<(), SliceError> {
    let name = d.name.as_str();
    if !is_dns_label(name) {
        return Err(limit(
            name,
            "name",
            "must be a DNS label (lowercase letters, digits, '-', at most 63)",
        ));
    }
    let attrs = d.attributes.as_ref().map_or(0, |a| a.len());
    let caps = d.capacity.as_ref().map_or(0, |c| c.len());
    if attrs + caps > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(limit(
            name,
            "attributes+capacity",
            format!(
                "has {} entries; at most {MAX_ATTRIBUTES_AND_CAPACITIES} are allowed",
                attrs + caps
            ),
        ));
    }
    for (key, value) in d.attributes.iter().flatten() {
        for text in [&value.string, &value.version].into_iter().flatten() {
            if text.len() > MAX_ATTRIBUTE_VALUE_LEN {
                return Err(limit(
                    name,
                    format!("attributes[{key}]"),
                    format!(
                        "{text:?} is {} characters; at most {MAX_ATTRIBUTE_VALUE_LEN} are allowed",
                        text.len()
                    ),
                ));
            }
        }
    }
    super::policy::check_device(d)?;
    let taints = d.taints.as_deref().unwrap_or_default();
    if taints.len() > MAX_TAINTS_PER_DEVICE {
        return Err(limit(
            name,
            "taints",
            format!(
                "has {} entries; at most {MAX_TAINTS_PER_DEVICE} are allowed",
                taints.len()
            ),
        ));
    }
    for t in taints {
        if !matches!(t.effect.as_str(), "None" | "NoSchedule" | "NoExecute") {
            return Err(limit(
                name,
                format!("taints[{}].effect", t.key),
                format!("{:?} is not one of None, NoSchedule, NoExecute", t.effect),
            ));
        }
        if let Some(v) = &t.value
            && (v.len() > MAX_TAINT_VALUE_LEN
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(limit(
                name,
                format!("taints[{}].value", t.key),
                format!(
                    "{v:?} is not a label value (at most {MAX_TAINT_VALUE_LEN} alphanumerics, '-', '_', '.')"
                ),
            ));
        }
    }
    let consumptions = d.consumes_counters.as_deref().unwrap_or_default();
    if consumptions.len() > MAX_CONSUMPTIONS_PER_DEVICE {
        return Err(limit(
            name,
            "consumesCounters",
            format!(
                "has {} entries; at most {MAX_CONSUMPTIONS_PER_DEVICE} are allowed",
                consumptions.len()
            ),
        ));
    }
    for c in consumptions {
        let groups = c.compatibility_groups.as_deref().unwrap_or_default();
        let field = || format!("consumesCounters[{}].compatibilityGroups", c.counter_set);
        if groups.len() > MAX_COMPATIBILITY_GROUPS {
            return Err(limit(
                name,
                field(),
                format!(
                    "has {} entries; at most {MAX_COMPATIBILITY_GROUPS} are allowed",
                    groups.len()
                ),
            ));
        }
        if let Some(bad) = groups.iter().find(|g| !is_dns_label(g)) {
            return Err(limit(name, field(), format!("{bad:?} is not a DNS label")));
        }
        if groups.len() == 2 && groups[0] == groups[1] {
            return Err(limit(
                name,
                field(),
                format!("{:?} is given twice", groups[0]),
            ));
        }
        if c.counters.len() > MAX_COUNTERS_PER_SET {
            return Err(limit(
                name,
                format!("consumesCounters[{}]", c.counter_set),
                format!(
                    "consumes {} counters; at most {MAX_COUNTERS_PER_SET} are allowed",
                    c.counters.len()
                ),
            ));
        }
    }
    Ok(())
}
