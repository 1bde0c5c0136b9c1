//! Which nodes a ResourceSlice (or one device of it) is reachable from.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// The node an allocation is attempted for: its name and, when known, its labels.
///
/// Labels only matter for slices or devices that use a `nodeSelector` with label
/// expressions; without them such selectors match nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// `metadata.name` of the node.
    pub name: String,
    /// `metadata.labels` of the node.
    pub labels: BTreeMap<String, String>,
}

impl Node {
    /// A node known only by name.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            labels: BTreeMap::new(),
        }
    }
}

/// Applies the `nodeName` / `allNodes` / `nodeSelector` trio of a slice or device.
pub(crate) fn reachable_from(
    node: &Node,
    node_name: Option<&str>,
    all_nodes: Option<bool>,
    selector: Option<&NodeSelector>,
) -> bool {
    if let Some(name) = node_name.filter(|n| !n.is_empty()) {
        return name == node.name;
    }
    if all_nodes == Some(true) {
        return true;
    }
    selector.is_some_and(|s| s.node_selector_terms.iter().any(|t| term_matches(node, t)))
}

fn term_matches(node: &Node, term: &NodeSelectorTerm) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // An empty term selects nothing, as in the scheduler.
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(node.labels.get(&r.key).map(String::as_str), r))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(node.name.as_str());
            requirement_matches(value, r)
        })
}

fn requirement_matches(value: Option<&str>, requirement: &NodeSelectorRequirement) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let as_int = |s: &str| s.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(as_int),
                values.first().and_then(|b| as_int(b)),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(key: &str, operator: &str, values: &[&str], field: bool) -> NodeSelector {
        let requirement = NodeSelectorRequirement {
            key: key.to_string(),
            operator: operator.to_string(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        let term = if field {
            NodeSelectorTerm {
                match_fields: Some(vec![requirement]),
                ..Default::default()
            }
        } else {
            NodeSelectorTerm {
                match_expressions: Some(vec![requirement]),
                ..Default::default()
            }
        };
        NodeSelector {
            node_selector_terms: vec![term],
        }
    }

    #[test]
    fn node_name_all_nodes_and_selectors_decide_reachability() {
        let mut node = Node::named("node-a");
        node.labels.insert("zone".into(), "z1".into());
        let by_name = selector("metadata.name", "In", &["node-a"], true);
        let by_label = selector("zone", "NotIn", &["z2"], false);
        let other_label = selector("zone", "In", &["z2"], false);
        let cases = [
            (Some("node-a"), None, None, true),
            (Some("node-b"), None, None, false),
            (None, Some(true), None, true),
            (None, None, Some(&by_name), true),
            (None, None, Some(&by_label), true),
            (None, None, Some(&other_label), false),
            (None, None, None, false),
        ];
        for (name, all, sel, want) in cases {
            assert_eq!(
                want,
                reachable_from(&node, name, all, sel),
                "{name:?} {all:?}"
            );
        }
    }
}
