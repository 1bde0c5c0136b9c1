//! A domain's status from its `ComputeDomainNode` objects. Pure.
//!
//! `Ready` when at least one node reported, every node reported is `Ready`, and, with
//! `spec.numNodes` > 0, at least that many are. Otherwise `NotReady` with a reason:
//! - a node's own reason (`DaemonCrashed`, `DaemonStartFailed`, `ConfigError`, …) when a
//!   node that is not ready gave one: the first such node by clique and index, named in the
//!   message, so a daemon's start-up error reaches the domain;
//! - [`DAEMON_NOT_READY`] when nodes are not ready without saying why;
//! - [`WAITING_FOR_NODES`] when every node is ready but fewer than `numNodes`, or none
//!   reported yet.

use crate::compute_domain::api::{
    ComputeDomainNode, ComputeDomainNodeStatus, ComputeDomainStatus, Readiness,
};

/// Reason: nodes are not ready and gave no reason.
pub const DAEMON_NOT_READY: &str = "DaemonNotReady";
/// Reason: fewer nodes reported ready than expected.
pub const WAITING_FOR_NODES: &str = "WaitingForNodes";
/// Reason: the spec cannot be acted on (no channel, an empty template name).
pub const INVALID_SPEC: &str = "InvalidSpec";
/// Reason: a ResourceClaimTemplate of the requested name exists and belongs to someone else.
pub const TEMPLATE_CONFLICT: &str = "TemplateConflict";

/// How many not-ready nodes a message names before it says "and N more".
const NAMED_NODES: usize = 5;

/// `status.nodes[]` entry of one node object; a node whose daemon has not written its
/// status yet is `NotReady` at index 0.
fn entry(node: &ComputeDomainNode) -> ComputeDomainNodeStatus {
    let state = node.status.clone().unwrap_or_default();
    ComputeDomainNodeStatus {
        name: node.spec.node_name.clone(),
        ip_address: state.ip_address,
        clique_id: node.spec.clique_id.clone(),
        index: state.index,
        status: state.status,
    }
}

/// The status of a domain expecting `num_nodes` nodes (0: any) whose node objects are
/// `nodes` (any order). Nodes are sorted by clique, index, then name.
pub fn aggregate(num_nodes: u32, nodes: &[&ComputeDomainNode]) -> ComputeDomainStatus {
    let mut sorted: Vec<&ComputeDomainNode> = nodes.to_vec();
    sorted.sort_by(|a, b| {
        let key = |n: &ComputeDomainNode| {
            (
                n.spec.clique_id.clone(),
                n.status.as_ref().map_or(0, |s| s.index),
                n.spec.node_name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let entries: Vec<ComputeDomainNodeStatus> = sorted.iter().map(|n| entry(n)).collect();
    let not_ready: Vec<&ComputeDomainNode> = sorted
        .iter()
        .copied()
        .filter(|n| {
            n.status
                .as_ref()
                .is_none_or(|s| s.status != Readiness::Ready)
        })
        .collect();
    let ready = entries.len() - not_ready.len();
    let (reason, message) = if let Some(failed) = not_ready
        .iter()
        .find(|n| n.status.as_ref().is_some_and(|s| s.reason.is_some()))
    {
        let state = failed.status.as_ref().expect("filtered on status");
        let mut message = format!(
            "node {}: {}",
            failed.spec.node_name,
            state.message.as_deref().unwrap_or("no detail given")
        );
        if not_ready.len() > 1 {
            message.push_str(&format!(
                "; {} of {} nodes not ready: {}",
                not_ready.len(),
                entries.len(),
                names(&not_ready)
            ));
        }
        (state.reason.clone(), Some(message))
    } else if !not_ready.is_empty() {
        let message = format!(
            "{ready} of {} nodes ready; waiting for the IMEX daemons of {}",
            entries.len(),
            names(&not_ready)
        );
        (Some(DAEMON_NOT_READY.to_string()), Some(message))
    } else if entries.is_empty() || ready < num_nodes as usize {
        let message = if num_nodes > 0 {
            format!("{ready} of {num_nodes} nodes ready")
        } else {
            "no IMEX daemon has reported yet: a node joins when a pod with the domain's \
             channel claim is prepared on it"
                .to_string()
        };
        (Some(WAITING_FOR_NODES.to_string()), Some(message))
    } else {
        (None, None)
    };
    ComputeDomainStatus {
        status: if reason.is_none() {
            Readiness::Ready
        } else {
            Readiness::NotReady
        },
        nodes: entries,
        reason,
        message,
    }
}

fn names(nodes: &[&ComputeDomainNode]) -> String {
    let mut text: Vec<&str> = nodes
        .iter()
        .take(NAMED_NODES)
        .map(|n| n.spec.node_name.as_str())
        .collect();
    let more = nodes.len().saturating_sub(NAMED_NODES);
    let more_text = format!("and {more} more");
    if more > 0 {
        text.push(&more_text);
    }
    text.join(", ")
}

/// The status of a domain whose spec cannot be acted on: `NotReady` with `reason` and
/// `message`, keeping the nodes that reported.
pub fn spec_error(
    reason: &str,
    message: String,
    nodes: &[&ComputeDomainNode],
) -> ComputeDomainStatus {
    let mut status = aggregate(0, nodes);
    status.status = Readiness::NotReady;
    status.reason = Some(reason.to_string());
    status.message = Some(message);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute_domain::api::{
        ComputeDomainNodeSpec, ComputeDomainNodeState, compute_domain_node_resource,
    };

    fn node(name: &str, clique: &str, index: u32, ready: bool) -> ComputeDomainNode {
        let mut n = ComputeDomainNode::new(
            &format!("u.{name}"),
            &compute_domain_node_resource(),
            ComputeDomainNodeSpec {
                domain_uid: "u".into(),
                domain_namespace: "default".into(),
                domain_name: "d".into(),
                node_name: name.into(),
                clique_id: clique.into(),
            },
        );
        n.status = Some(ComputeDomainNodeState {
            ip_address: format!("10.0.0.{index}"),
            index,
            status: if ready {
                Readiness::Ready
            } else {
                Readiness::NotReady
            },
            reason: None,
            message: None,
        });
        n
    }

    #[test]
    fn every_node_ready_makes_the_domain_ready_with_nodes_sorted_by_clique_and_index() {
        let (a, b, c) = (
            node("n-b", "c.1", 1, true),
            node("n-a", "c.1", 0, true),
            node("n-c", "c.0", 5, true),
        );
        let got = aggregate(0, &[&a, &b, &c]);
        assert_eq!(
            (got.status, got.reason, got.message),
            (Readiness::Ready, None, None)
        );
        let order: Vec<(&str, &str, u32)> = got
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.clique_id.as_str(), n.index))
            .collect();
        assert_eq!(
            order,
            vec![("n-c", "c.0", 5), ("n-a", "c.1", 0), ("n-b", "c.1", 1)]
        );
        assert_eq!(got.nodes[1].ip_address, "10.0.0.0");
    }

    #[test]
    fn fewer_ready_nodes_than_num_nodes_is_waiting_for_nodes() {
        let a = node("a", "c.1", 0, true);
        let got = aggregate(2, &[&a]);
        assert_eq!(
            (got.status, got.reason.as_deref(), got.message.as_deref()),
            (
                Readiness::NotReady,
                Some(WAITING_FOR_NODES),
                Some("1 of 2 nodes ready")
            )
        );
    }

    #[test]
    fn no_node_at_all_is_not_ready() {
        let got = aggregate(0, &[]);
        assert_eq!(
            (got.status, got.reason.as_deref()),
            (Readiness::NotReady, Some(WAITING_FOR_NODES))
        );
    }

    #[test]
    fn a_daemon_error_becomes_the_domains_reason_naming_the_node() {
        let a = node("a", "c.1", 0, true);
        let mut b = node("b", "c.1", 1, false);
        let c = node("c", "c.1", 2, false);
        let state = b.status.as_mut().unwrap();
        state.reason = Some("DaemonCrashed".into());
        state.message = Some("nvidia-imex exited with status 1".into());
        let got = aggregate(0, &[&a, &b, &c]);
        assert_eq!(
            (got.status, got.reason.as_deref(), got.message.as_deref()),
            (
                Readiness::NotReady,
                Some("DaemonCrashed"),
                Some("node b: nvidia-imex exited with status 1; 2 of 3 nodes not ready: b, c")
            )
        );
    }

    #[test]
    fn nodes_not_ready_without_a_reason_are_named_up_to_five() {
        let nodes: Vec<ComputeDomainNode> = (0..8)
            .map(|i| node(&format!("n{i}"), "c.1", i, i == 0))
            .collect();
        let refs: Vec<&ComputeDomainNode> = nodes.iter().collect();
        let got = aggregate(0, &refs);
        assert_eq!(
            (got.reason.as_deref(), got.message.as_deref()),
            (
                Some(DAEMON_NOT_READY),
                Some(
                    "1 of 8 nodes ready; waiting for the IMEX daemons of n1, n2, n3, n4, n5, \
                     and 2 more"
                )
            )
        );
    }

    #[test]
    fn a_node_object_without_status_counts_as_not_ready() {
        let mut a = node("a", "c.1", 0, true);
        a.status = None;
        let got = aggregate(0, &[&a]);
        assert_eq!(
            (got.status, got.nodes[0].status, got.reason.as_deref()),
            (
                Readiness::NotReady,
                Readiness::NotReady,
                Some(DAEMON_NOT_READY)
            )
        );
    }
}
