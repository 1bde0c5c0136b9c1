//! Whether a ResourceSlice in the cluster already holds the content we would write, the way the
//! API server stores it: it drops empty lists and maps, writes quantities canonically
//! (`1024Mi` comes back as `1Gi`) and stamps `timeAdded` on taints. Without this, a slice the
//! server normalised would look changed on every publish and never reach zero writes.
//!
//! It also drops the fields of a DRA feature that is off on the API server (its feature gate):
//! `allowMultipleAllocations` without `DRAConsumableCapacity`, say. Rewriting would not bring
//! them back, only churn the pool's generation. A missing field cannot tell "dropped" from "not
//! written yet" (a taint just added), so the publisher learns which fields the server drops
//! from its answers to writes ([`dropped_by_server`]) and only those are then ignored
//! ([`same_content_ignoring`]).

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceSliceSpec;
use serde_json::Value;

/// Object keys whose string values are quantities in a ResourceSlice spec (capacity values,
/// counter values, request policies).
const QUANTITY_KEYS: [&str; 6] = ["value", "default", "min", "max", "step", "validValues"];

/// Server-set fields: ignored when our side does not set them.
const SERVER_SET_KEYS: [&str; 1] = ["timeAdded"];

/// Fields the API server drops when the feature gate named next to them is off, with that gate
/// (the `resource.k8s.io/v1` ResourceSlice fields of alpha and beta DRA features).
const GATED_FIELDS: [(&str, &str); 11] = [
    ("allowMultipleAllocations", "DRAConsumableCapacity"),
    ("requestPolicy", "DRAConsumableCapacity"),
    ("taints", "DRADeviceTaints"),
    ("bindsToNode", "DRADeviceBindingConditions"),
    ("bindingConditions", "DRADeviceBindingConditions"),
    ("bindingFailureConditions", "DRADeviceBindingConditions"),
    ("sharedCounters", "DRAPartitionableDevices"),
    ("consumesCounters", "DRAPartitionableDevices"),
    ("perDeviceNodeSelection", "DRAPartitionableDevices"),
    // Kubernetes 1.37, alpha: --partitionable-devices-type and --compatibility-groups.
    ("partitionTypeAttribute", "DRAPartitionableDevicesType"),
    ("compatibilityGroups", "DRADeviceCompatibilityGroups"),
];

/// A field we publish that the API server did not keep, because a feature gate is off there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DroppedField {
    /// The field's name as in the API (`allowMultipleAllocations`).
    pub field: &'static str,
    /// The feature gate that must be on for the API server to keep it.
    pub gate: &'static str,
}

/// Whether `ours` and `theirs` describe the same pool content, ignoring the pool generation.
pub fn same_content(ours: &ResourceSliceSpec, theirs: &ResourceSliceSpec) -> bool {
    same_content_ignoring(ours, theirs, &BTreeSet::new())
}

/// [`same_content`], where a field of `dropped` that `ours` sets and `theirs` lacks is no
/// difference: the server is known to drop it ([`dropped_by_server`]).
pub fn same_content_ignoring(
    ours: &ResourceSliceSpec,
    theirs: &ResourceSliceSpec,
    dropped: &BTreeSet<DroppedField>,
) -> bool {
    identical(ours, theirs) || equivalent_json(ours, theirs, &mut Gated::Ignore(dropped))
}

/// The fields of `written` that `stored` (the server's answer to writing it) lacks because
/// their feature gate is off on the API server, in name order; empty when it kept everything.
pub fn dropped_by_server(
    written: &ResourceSliceSpec,
    stored: &ResourceSliceSpec,
) -> Vec<DroppedField> {
    let mut found = BTreeSet::new();
    if !identical(written, stored) {
        equivalent_json(written, stored, &mut Gated::Collect(&mut found));
    }
    found.into_iter().collect()
}

/// What a gated field that `ours` sets and `theirs` lacks means to a comparison.
enum Gated<'a> {
    /// A difference, unless the field is one of these.
    Ignore(&'a BTreeSet<DroppedField>),
    /// Dropped by the server: collected, and no difference.
    Collect(&'a mut BTreeSet<DroppedField>),
}

/// Field-by-field equality but for the generation: the cheap common case at steady state.
/// Destructured so that a field added to the API type fails to compile here until handled.
fn identical(ours: &ResourceSliceSpec, theirs: &ResourceSliceSpec) -> bool {
    let ResourceSliceSpec {
        all_nodes,
        devices,
        driver,
        node_name,
        node_selector,
        partition_type_attribute,
        per_device_node_selection,
        pool,
        shared_counters,
        skip_node_operations,
    } = ours;
    pool.name == theirs.pool.name
        && pool.resource_slice_count == theirs.pool.resource_slice_count
        && *driver == theirs.driver
        && *node_name == theirs.node_name
        && *all_nodes == theirs.all_nodes
        && *node_selector == theirs.node_selector
        && *partition_type_attribute == theirs.partition_type_attribute
        && *per_device_node_selection == theirs.per_device_node_selection
        && *skip_node_operations == theirs.skip_node_operations
        && *shared_counters == theirs.shared_counters
        && *devices == theirs.devices
}

/// Equality as the API server sees it (see the module comment); slower, used only when the
/// typed comparison finds a difference.
fn equivalent_json(
    ours: &ResourceSliceSpec,
    theirs: &ResourceSliceSpec,
    gated: &mut Gated,
) -> bool {
    let mut ours = ours.clone();
    let mut theirs = theirs.clone();
    ours.pool.generation = 0;
    theirs.pool.generation = 0;
    match (serde_json::to_value(&ours), serde_json::to_value(&theirs)) {
        (Ok(a), Ok(b)) => equivalent(&a, &b, Context::Plain, gated),
        // Specs always serialise; if one ever did not, rewriting it is the safe answer.
        _ => false,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Plain,
    /// Under a key holding a quantity (or a list of them).
    Quantity,
    /// Under `taints`, whose `value` is a plain string.
    Taint,
}

fn equivalent(ours: &Value, theirs: &Value, context: Context, gated: &mut Gated) -> bool {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            let keys = a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)));
            keys.into_iter().all(|key| {
                let (x, y) = (a.get(key), b.get(key));
                if x.is_none() && SERVER_SET_KEYS.contains(&key.as_str()) {
                    return true;
                }
                if let (Some(x), None) = (x, y)
                    && !is_empty(x)
                    && context != Context::Taint
                    && let Some((field, gate)) = GATED_FIELDS.iter().find(|(f, _)| f == key)
                {
                    let field = DroppedField { field, gate };
                    match gated {
                        Gated::Ignore(known) if known.contains(&field) => return true,
                        Gated::Ignore(_) => return false,
                        Gated::Collect(found) => {
                            found.insert(field);
                            return true;
                        }
                    }
                }
                let inner = if context == Context::Taint || key == "taints" {
                    Context::Taint
                } else if QUANTITY_KEYS.contains(&key.as_str()) {
                    Context::Quantity
                } else {
                    Context::Plain
                };
                equivalent(
                    x.unwrap_or(&Value::Null),
                    y.unwrap_or(&Value::Null),
                    inner,
                    gated,
                )
            })
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| equivalent(x, y, context, gated))
        }
        (Value::String(a), Value::String(b)) if a != b && context == Context::Quantity => {
            matches!((quantity(a), quantity(b)), (Some(x), Some(y)) if x == y)
        }
        (a, b) if is_empty(a) && is_empty(b) => true,
        (a, b) => a == b,
    }
}

/// Absent, null, `[]` and `{}` all mean "none" to the API server.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// A quantity's exact value as `mantissa × 10^exponent` with no trailing zeros in the
/// mantissa, so equal values compare equal; `None` when `text` is not a quantity or does not
/// fit.
pub fn quantity(text: &str) -> Option<(i128, i32)> {
    let text = text.trim();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let mut mantissa: i128 = 0;
    for c in whole.chars().chain(fraction.chars()) {
        mantissa = mantissa
            .checked_mul(10)?
            .checked_add(i128::from(c.to_digit(10)?))?;
    }
    let mut exponent = -i32::try_from(fraction.len()).ok()?;
    let (binary_power, decimal_power) = suffix_powers(suffix)?;
    mantissa = mantissa.checked_mul(1i128.checked_shl(binary_power)?)?;
    exponent = exponent.checked_add(decimal_power)?;
    if mantissa == 0 {
        return Some((0, 0));
    }
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exponent = exponent.checked_add(1)?;
    }
    Some((if negative { -mantissa } else { mantissa }, exponent))
}

/// `(power of two, power of ten)` a suffix multiplies by.
fn suffix_powers(suffix: &str) -> Option<(u32, i32)> {
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if let Some(i) = binary.iter().position(|s| *s == suffix) {
        return Some((10 * (i as u32 + 1), 0));
    }
    let decimal = match suffix {
        "" => 0,
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        _ => {
            let digits = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            digits.parse::<i32>().ok()?
        }
    };
    Some((0, decimal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_written_differently_have_the_same_value() {
        for (a, b) in [
            ("1024Mi", "1Gi"),
            ("1000M", "1G"),
            ("0.5Gi", "512Mi"),
            ("1e3", "1k"),
            ("1500m", "1.5"),
            ("0", "0Gi"),
        ] {
            assert_eq!(quantity(a), quantity(b), "{a} vs {b}");
        }
    }

    #[test]
    fn different_quantities_and_non_quantities_are_told_apart() {
        assert_ne!(quantity("1Gi"), quantity("1G"));
        assert_ne!(quantity("-1"), quantity("1"));
        for text in ["", "Gi", "1.2.3", "1Xi", "abc"] {
            assert_eq!(None, quantity(text), "{text}");
        }
    }

    #[test]
    fn empty_lists_and_server_set_taint_times_do_not_count_as_changes() {
        let ours = serde_json::json!({"devices": [{"name": "gpu-0", "attributes": {},
            "taints": [{"key": "k", "value": "1k", "effect": "NoSchedule"}],
            "capacity": {"memory": {"value": "1024Mi"}}}]});
        let theirs = serde_json::json!({"devices": [{"name": "gpu-0",
            "taints": [{"key": "k", "value": "1k", "effect": "NoSchedule",
                        "timeAdded": "2026-07-01T00:00:00Z"}],
            "capacity": {"memory": {"value": "1Gi"}}}]});
        assert!(equivalent(
            &ours,
            &theirs,
            Context::Plain,
            &mut Gated::Ignore(&BTreeSet::new())
        ));
    }

    #[test]
    fn taint_values_are_compared_as_plain_strings() {
        let ours = serde_json::json!({"taints": [{"key": "k", "value": "1k"}]});
        let theirs = serde_json::json!({"taints": [{"key": "k", "value": "1000"}]});
        assert!(!equivalent(
            &ours,
            &theirs,
            Context::Plain,
            &mut Gated::Ignore(&BTreeSet::new())
        ));
    }

    fn spec(devices: serde_json::Value) -> ResourceSliceSpec {
        serde_json::from_value(serde_json::json!({
            "driver": "gpu.nvidia.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        }))
        .unwrap()
    }

    #[test]
    fn fields_the_server_is_known_to_drop_are_the_same_content() {
        let ours = spec(
            serde_json::json!([{"name": "gpu-0", "allowMultipleAllocations": true,
            "capacity": {"memory": {"value": "80Gi",
                "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi"}}}}}]),
        );
        let theirs = spec(serde_json::json!([{"name": "gpu-0",
            "capacity": {"memory": {"value": "80Gi"}}}]));
        // Not known yet: a field we set and the server lacks may just not be written yet.
        assert!(!same_content(&ours, &theirs));
        let dropped = dropped_by_server(&ours, &theirs);
        assert_eq!(
            dropped,
            vec![
                DroppedField {
                    field: "allowMultipleAllocations",
                    gate: "DRAConsumableCapacity"
                },
                DroppedField {
                    field: "requestPolicy",
                    gate: "DRAConsumableCapacity"
                },
            ]
        );
        let known: BTreeSet<DroppedField> = dropped.into_iter().collect();
        assert!(same_content_ignoring(&ours, &theirs, &known));
        assert!(dropped_by_server(&ours, &ours).is_empty());
    }

    #[test]
    fn a_taint_not_written_yet_is_a_change_unless_the_server_drops_taints() {
        let tainted = spec(serde_json::json!([{"name": "gpu-0",
            "taints": [{"key": "k", "effect": "NoSchedule"}]}]));
        let plain = spec(serde_json::json!([{"name": "gpu-0"}]));
        let capacity: BTreeSet<DroppedField> = [DroppedField {
            field: "allowMultipleAllocations",
            gate: "DRAConsumableCapacity",
        }]
        .into();
        assert!(!same_content_ignoring(&tainted, &plain, &capacity));
        let taints: BTreeSet<DroppedField> =
            dropped_by_server(&tainted, &plain).into_iter().collect();
        assert!(same_content_ignoring(&tainted, &plain, &taints));
    }

    #[test]
    fn a_gated_field_with_another_value_is_a_change() {
        let ours = spec(serde_json::json!([{"name": "gpu-0", "allowMultipleAllocations": true}]));
        let theirs =
            spec(serde_json::json!([{"name": "gpu-0", "allowMultipleAllocations": false}]));
        assert!(!same_content(&ours, &theirs));
        // A taint the server holds that we no longer publish is a change, not a drop.
        let tainted = spec(serde_json::json!([{"name": "gpu-0",
            "taints": [{"key": "k", "effect": "NoSchedule"}]}]));
        let plain = spec(serde_json::json!([{"name": "gpu-0"}]));
        let all: BTreeSet<DroppedField> = GATED_FIELDS
            .iter()
            .map(|(field, gate)| DroppedField { field, gate })
            .collect();
        assert!(!same_content_ignoring(&plain, &tainted, &all));
    }

    #[test]
    fn the_1_37_fields_a_server_with_their_gates_off_drops_are_reported_and_then_the_same() {
        let ours: ResourceSliceSpec = serde_json::from_value(serde_json::json!({
            "driver": "gpu.nvidia.com", "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "partitionTypeAttribute": "gpu.nvidia.com/profile",
            "devices": [{"name": "vgpu-0-4c-0", "consumesCounters": [{"counterSet": "s",
                "counters": {"framebuffer": {"value": "4Gi"}},
                "compatibilityGroups": ["vgpu-4c"]}]}],
        }))
        .unwrap();
        let theirs: ResourceSliceSpec = serde_json::from_value(serde_json::json!({
            "driver": "gpu.nvidia.com", "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "vgpu-0-4c-0", "consumesCounters": [{"counterSet": "s",
                "counters": {"framebuffer": {"value": "4Gi"}}}]}],
        }))
        .unwrap();
        let dropped = dropped_by_server(&ours, &theirs);
        assert_eq!(
            dropped,
            vec![
                DroppedField {
                    field: "compatibilityGroups",
                    gate: "DRADeviceCompatibilityGroups"
                },
                DroppedField {
                    field: "partitionTypeAttribute",
                    gate: "DRAPartitionableDevicesType"
                },
            ]
        );
        // Known as dropped, the server's copy is up to date: no rewrite every round.
        assert!(same_content_ignoring(
            &ours,
            &theirs,
            &dropped.into_iter().collect()
        ));
    }
}
