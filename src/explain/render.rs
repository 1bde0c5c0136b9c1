//! The report for people: one line per request, identical reasons grouped with a count and
//! a few example devices, so a node with hundreds of devices stays a screenful.

use std::fmt::Write;

use crate::alloc::{
    Abort, CapacityProblem, ConstraintKind, Consumer, Outcome, Rejected, Rejection, RequestStatus,
    RequestTrace, Wants,
};

use super::ExplainReport;

/// Example devices shown per group of identical reasons.
const EXAMPLES: usize = 3;
/// Fitting nodes named before "and N more".
const NODES_NAMED: usize = 5;

pub(super) fn render(report: &ExplainReport) -> String {
    let mut out = String::new();
    let subject = match report.claims.as_slice() {
        [one] => format!("claim {one}"),
        many => format!("claims {} (together)", many.join(", ")),
    };
    if let Some(error) = &report.error {
        let _ = writeln!(out, "{subject}: cannot be checked\n  {error}");
        return out;
    }
    let single = report.nodes_checked == 1;
    if report.fits {
        let where_ = if single {
            let node = report
                .fitting_nodes
                .first()
                .map(String::as_str)
                .unwrap_or_default();
            format!("node {}", node_name(node))
        } else {
            format!(
                "{} of {} nodes ({})",
                report.fitting_nodes.len(),
                report.nodes_checked,
                some(&report.fitting_nodes, NODES_NAMED)
            )
        };
        let _ = writeln!(out, "{subject}: fits on {where_}");
        if let Some(chosen) = &report.chosen {
            outcome(&mut out, chosen);
        }
        notes(&mut out, report);
        return out;
    }
    if single {
        let node = report
            .near_misses
            .first()
            .map(|o| o.node.as_str())
            .unwrap_or_default();
        let _ = writeln!(out, "{subject}: does not fit on node {}", node_name(node));
    } else {
        let closest: Vec<String> = report
            .near_misses
            .iter()
            .map(|o| {
                format!(
                    "{} (placed {} of {})",
                    node_name(&o.node),
                    o.progress.placed,
                    o.progress.needed
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{subject}: fits on none of {} nodes; closest: {}",
            report.nodes_checked,
            closest.join(", ")
        );
    }
    for miss in &report.near_misses {
        outcome(&mut out, miss);
    }
    notes(&mut out, report);
    out
}

/// The report's notes, whether the claims fit or not: a note that the allocated claims hold
/// devices no slice publishes matters most when they "fit" only because of it.
fn notes(out: &mut String, report: &ExplainReport) {
    if let Some(note) = &report.note {
        let _ = writeln!(out, "  note: {note}");
    }
    if !report.unpublished_allocations.is_empty() {
        let _ = writeln!(
            out,
            "  note: left out, no slice publishes what these allocated claims hold: {}",
            report.unpublished_allocations.join(", ")
        );
    }
}

fn node_name(name: &str) -> &str {
    if name.is_empty() { "(any)" } else { name }
}

fn some(items: &[String], limit: usize) -> String {
    let mut shown = items
        .iter()
        .take(limit)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > limit {
        let _ = write!(shown, ", and {} more", items.len() - limit);
    }
    shown
}

fn outcome(out: &mut String, o: &Outcome) {
    let progress = if o.fits() {
        String::new()
    } else {
        format!(
            ": placed {} of {} devices",
            o.progress.placed, o.progress.needed
        )
    };
    let _ = writeln!(out, "  node {}{progress}", node_name(&o.node));
    for pool in &o.ignored_pools {
        let _ = writeln!(
            out,
            "    ignored pool {}/{}: {}",
            pool.driver, pool.pool, pool.why
        );
    }
    if let Some(abort) = &o.abort {
        let _ = writeln!(out, "    search stopped: {}", abort_text(abort));
    }
    if o.requests.is_empty() {
        for result in o.allocations.iter().flatten() {
            for r in result
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
            {
                let _ = writeln!(out, "    request {} -> {}", r.request, r.device);
            }
        }
    }
    let several_claims = o.requests.iter().any(|t| t.claim != o.requests[0].claim);
    for trace in &o.requests {
        request(out, trace, &o.node, several_claims);
    }
}

fn request(out: &mut String, t: &RequestTrace, node: &str, show_claim: bool) {
    let total = t.usable.len() + t.rejected.len();
    let wants = match t.wants {
        Wants::ExactCount(1) => "1 device".to_string(),
        Wants::ExactCount(n) => format!("{n} devices"),
        Wants::All => "all devices".to_string(),
    };
    let claim = if show_claim {
        format!("{} ", t.claim)
    } else {
        String::new()
    };
    let admin = if t.admin_access { ", admin access" } else { "" };
    let status = match t.status {
        RequestStatus::Allocated => {
            let names: Vec<String> = t.allocated.iter().map(|d| d.device.clone()).collect();
            format!("allocated {}", names.join(", "))
        }
        RequestStatus::NotTried => "not needed (an earlier alternative was allocated)".to_string(),
        RequestStatus::Unsatisfiable => {
            format!("not enough devices: {} of {total} usable", t.usable.len())
        }
        RequestStatus::Blocked => format!(
            "{} of {total} devices usable alone, but not together with the other requests",
            t.usable.len()
        ),
        RequestStatus::Aborted => format!(
            "{} of {total} devices usable; search stopped",
            t.usable.len()
        ),
    };
    let _ = writeln!(
        out,
        "    {claim}request {} ({}, {wants}{admin}): {status}",
        t.request, t.class
    );
    if matches!(t.status, RequestStatus::Allocated | RequestStatus::NotTried) {
        return;
    }
    if !t.conflicts.is_empty() {
        let _ = writeln!(out, "      refused in combination:");
        groups(out, &t.conflicts, node);
    }
    if !t.rejected.is_empty() {
        let _ = writeln!(out, "      not usable:");
        groups(out, &t.rejected, node);
    }
}

/// Prints identical headlines once, with a count and a few example devices.
fn groups(out: &mut String, items: &[Rejected], node: &str) {
    let mut grouped: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for item in items {
        let (headline, detail) = describe(&item.reason);
        let device = if item.device.pool == node {
            item.device.device.clone()
        } else {
            format!("{}/{}", item.device.pool, item.device.device)
        };
        match grouped.iter_mut().find(|(h, _)| *h == headline) {
            Some((_, devices)) => devices.push((device, detail)),
            None => grouped.push((headline, vec![(device, detail)])),
        }
    }
    for (headline, devices) in grouped {
        let examples: Vec<String> = devices
            .iter()
            .take(EXAMPLES)
            .map(|(d, detail)| {
                if detail.is_empty() {
                    d.clone()
                } else {
                    format!("{d} ({detail})")
                }
            })
            .collect();
        let more = match devices.len().saturating_sub(EXAMPLES) {
            0 => String::new(),
            n => format!(", and {n} more"),
        };
        let _ = writeln!(
            out,
            "        {} x {headline}: {}{more}",
            devices.len(),
            examples.join(", ")
        );
    }
}

fn consumers(list: &[Consumer]) -> String {
    let names: Vec<String> = list.iter().map(|c| c.device.clone()).collect();
    match names.len() {
        0 => "nothing recorded".into(),
        _ => some(&names, EXAMPLES),
    }
}

fn kind_name(kind: ConstraintKind) -> &'static str {
    match kind {
        ConstraintKind::MatchAttribute => "matchAttribute",
        ConstraintKind::DistinctAttribute => "distinctAttribute",
    }
}

/// A headline shared by all devices failing the same way, and the device-specific detail.
fn describe(reason: &Rejection) -> (String, String) {
    match reason {
        Rejection::ClassSelector {
            class,
            index,
            expression,
        } => (
            format!("not in class {class} (selector {index} is false: {expression})"),
            String::new(),
        ),
        Rejection::RequestSelector { index, expression } => (
            format!("request selector {index} is false: {expression}"),
            String::new(),
        ),
        Rejection::SelectorError {
            class,
            expression,
            message,
        } => {
            let of = class
                .as_ref()
                .map(|c| format!(" of class {c}"))
                .unwrap_or_default();
            (
                format!("selector{of} failed: {expression}"),
                message.clone(),
            )
        }
        Rejection::AlreadyAllocated { claim } => {
            (format!("allocated to claim {claim}"), String::new())
        }
        Rejection::TaintNotTolerated { key, value, effect } => {
            let value = value.as_ref().map(|v| format!("={v}")).unwrap_or_default();
            (
                format!("taint {key}{value}:{effect} not tolerated"),
                String::new(),
            )
        }
        Rejection::Capacity { capacity, problem } => {
            let text = match problem {
                CapacityProblem::NotOffered => format!("has no capacity {capacity}"),
                CapacityProblem::PolicyViolated { requested, policy } => {
                    format!("capacity {capacity}: {requested} is not allowed ({policy})")
                }
                CapacityProblem::Insufficient { requested, left } => {
                    format!("capacity {capacity}: needs {requested}, {left} left")
                }
            };
            (text, String::new())
        }
        Rejection::CountersExhausted {
            counter_set,
            counter,
            needed,
            left,
            consumers: held,
        } => {
            let mut holders: Vec<&str> = held.iter().map(|c| c.by.as_str()).collect();
            holders.dedup();
            let by = match holders.as_slice() {
                [] => String::new(),
                some => format!(" by {}", some.join(", ")),
            };
            (
                format!("shared counters used up{by}"),
                format!(
                    "{counter_set}/{counter}: needs {needed}, {left} left, held by {}",
                    consumers(held)
                ),
            )
        }
        Rejection::Constraint {
            index,
            kind,
            attribute,
            value,
            chosen,
        } => {
            let name = format!("constraint {index} ({} {attribute})", kind_name(*kind));
            match (value, chosen) {
                (None, _) => {
                    let hint =
                        match crate::fabric_manager::partitions::is_fabric_attribute(attribute) {
                            true => {
                                " (Fabric Manager attributes: published only with --fabric-manager)"
                            }
                            false => "",
                        };
                    (
                        format!("{name}: device lacks the attribute{hint}"),
                        String::new(),
                    )
                }
                (Some(v), Some(h)) => {
                    let relation = match kind {
                        ConstraintKind::MatchAttribute => "differs from",
                        ConstraintKind::DistinctAttribute => "repeats",
                    };
                    (
                        format!("{name}: value {relation} the one already chosen"),
                        format!(
                            "{v}; {} for request {} has {}",
                            h.device, h.request, h.value
                        ),
                    )
                }
                (Some(v), None) => (format!("{name}: value not accepted"), v.clone()),
            }
        }
        Rejection::CompatibilityGroups {
            counter_set,
            groups,
            held,
            consumers: on_set,
        } => {
            let names = |list: &[String]| match list.is_empty() {
                true => "no groups".to_string(),
                false => list.join("+"),
            };
            let mut holders: Vec<&str> = on_set.iter().map(|c| c.by.as_str()).collect();
            holders.dedup();
            let by = match holders.as_slice() {
                [] => String::new(),
                some => format!(" by {}", some.join(", ")),
            };
            (
                format!(
                    "compatibility groups: {} does not meet {} held{by} on counter set {counter_set}",
                    names(groups),
                    names(held)
                ),
                format!("devices on the set: {}", consumers(on_set)),
            )
        }
        Rejection::TakenByRequest { request } => (
            format!("already chosen for request {request}"),
            String::new(),
        ),
    }
}

fn abort_text(abort: &Abort) -> String {
    match abort {
        Abort::SelectorError {
            request,
            device,
            expression,
            message,
            ..
        } => format!(
            "selector {expression} failed on {} for request {request}: {message} \
             (Kubernetes stops allocating on a node when a selector fails)",
            device.device
        ),
        Abort::PoolNotReady { request, pool } => format!(
            "request {request} asks for all devices, but pool {pool} is incomplete or invalid"
        ),
        Abort::AllBlockedByConstraint { request, device } => format!(
            "request {request} asks for all devices, but a claim constraint rejects {}",
            device.device
        ),
        Abort::TooManyDevices {
            request,
            count,
            limit,
        } => format!("request {request} would get {count} devices; a claim holds at most {limit}"),
        Abort::StepLimit { steps } => format!("gave up after {steps} search steps"),
        Abort::InvalidSlice {
            slice,
            field,
            value,
            problem,
        } => {
            format!("slice {slice}: {field} is {value:?}: {problem}")
        }
    }
}
