//! Binding conditions for ComputeDomain channels (`--binding-conditions`, KEP-5007).
//!
//! With the flag the compute-domain plugin publishes every channel with
//! `bindingConditions: [IMEXDaemonReady]` and `bindingFailureConditions: [IMEXDaemonFailed]`,
//! and the scheduler holds a pod whose claim got such a channel in PreBind: the claim is
//! allocated (the scheduler copied both lists into the allocation result) but the pod is not
//! bound. This module is the controller's side of that wait:
//!
//! 1. it watches ResourceClaims and picks the allocation results of this driver that carry
//!    [`IMEX_DAEMON_READY`] and have neither condition `True` yet ("pending");
//! 2. it labels the result's node (the pool is the node) `resource.nvidia.com/computeDomain=<uid>`
//!    at once, so the domain's DaemonSet starts the IMEX daemon before the pod is bound;
//! 3. when that node's `ComputeDomainNode` turns Ready it writes `IMEXDaemonReady=True` into
//!    the claim's `status.devices[]` entry of that device, and the scheduler binds the pod:
//!    the plugin's prepare then finds the label set and the daemon Ready;
//! 4. when the daemon reports an error (`ConfigError`, `DaemonCrashed`), the node serves
//!    another existing domain, the domain is gone, or no daemon was Ready within
//!    `--binding-timeout`, it writes `IMEXDaemonFailed=True`: the scheduler de-allocates the
//!    claim and tries another node;
//! 5. a label it set that no pending or Ready claim of the domain holds any more is removed
//!    again, and once that node's daemon reported `DaemonStopped` its `ComputeDomainNode` is
//!    deleted (a node that never served the job leaves the domain). A label that a claim
//!    turned Ready on stays until the domain is deleted, as every label does without binding
//!    conditions.
//!
//! [`decide`] is pure: claims, node objects, live domains and what this controller
//! remembers in, a [`Plan`] out; [`Binder`] (`binder.rs`) performs it. What it remembers (when it first saw
//! a pending result, which labels it set) is lost with the leader: the next leader restarts
//! the timeout from when it sees the claim, and treats labels it finds as not its own (they
//! then last as long as the domain, the rule without binding conditions).

mod binder;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, DeviceRequestAllocationResult, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::ResourceExt;
use serde_json::{Value, json};

use crate::compute_domain::api::{self, ComputeDomainNode, Readiness};
pub use crate::compute_domain::plugin::devices::{IMEX_DAEMON_FAILED, IMEX_DAEMON_READY};
pub use binder::{Binder, BindingError, Labelled};

/// The default of `--binding-timeout`: how long a pending channel waits for its node's IMEX
/// daemon before the controller sets [`IMEX_DAEMON_FAILED`]. Under the scheduler's own
/// binding timeout (10 minutes by default, `DynamicResourcesArgs.bindingTimeout`), so the
/// scheduler hears the controller's reason rather than timing out itself.
pub const BINDING_TIMEOUT: Duration = Duration::from_secs(300);

/// Daemon reasons (`ComputeDomainNode.status.reason`) that fail a pending channel at once:
/// the daemon tried and could not start. `DaemonStarting` and `WaitingForQuorum` are waited
/// out (up to the timeout).
pub const FAILED_DAEMON_REASONS: &[&str] = &["ConfigError", "DaemonCrashed"];

/// The reason a stopped daemon writes into its `ComputeDomainNode` (on SIGTERM).
pub const DAEMON_STOPPED: &str = "DaemonStopped";

/// One allocated device of a claim, as `status.devices[]` keys it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceKey {
    /// Claim UID.
    pub claim_uid: String,
    /// Driver name (always [`api::DRIVER_NAME`] here).
    pub driver: String,
    /// Pool: the node's name.
    pub pool: String,
    /// Device name (`channel-<n>`).
    pub device: String,
    /// Share ID of a shared device's allocation (`channel-0`), if any.
    pub share_id: Option<String>,
}

/// A condition to write into one claim's `status.devices[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionWrite {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// The claim's resourceVersion the decision was made on (the write tests it).
    pub resource_version: String,
    /// Which entry.
    pub key: DeviceKey,
    /// [`IMEX_DAEMON_READY`] or [`IMEX_DAEMON_FAILED`].
    pub condition: &'static str,
    /// CamelCase reason.
    pub reason: &'static str,
    /// What happened, for `kubectl describe`.
    pub message: String,
}

/// What this controller remembers between passes.
#[derive(Debug, Default, Clone)]
pub struct Memory {
    /// When each pending device was first seen pending (its timeout runs from then).
    pub first_seen: BTreeMap<DeviceKey, Instant>,
    /// Labels this controller set, node → domain UID, while no claim of the domain turned
    /// Ready on the node (afterwards the label is the domain's: it is forgotten here).
    pub provisional: BTreeMap<String, String>,
    /// Nodes found labelled for a domain (by anyone), node → UID, so a pending claim does
    /// not cost a GET of the node per pass.
    pub labelled: BTreeMap<String, String>,
    /// Nodes found serving another existing domain: node → that domain's UID.
    pub taken: BTreeMap<String, String>,
    /// Provisional labels removed, (node, UID): the node's `ComputeDomainNode` is deleted
    /// once its daemon stopped.
    pub released: BTreeSet<(String, String)>,
    /// Conditions written, with the claim's resourceVersion they were written on: not
    /// written again until the watch delivered the claim anew.
    pub written: BTreeMap<DeviceKey, String>,
}

/// What one pass should do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Nodes to label, node → domain UID.
    pub label: BTreeMap<String, String>,
    /// Conditions to write.
    pub conditions: Vec<ConditionWrite>,
    /// Provisional labels no claim holds any more: (node, UID) to remove.
    pub unlabel: Vec<(String, String)>,
    /// Provisional labels a claim turned Ready on: from now on the domain's.
    pub commit: Vec<String>,
    /// `ComputeDomainNode`s of released nodes whose daemon stopped: (node, UID).
    pub delete_node_objects: Vec<(String, String)>,
    /// Released nodes to forget (domain gone or node labelled again).
    pub forget_released: Vec<(String, String)>,
    /// Pending devices still waiting, with the time their timeout ends.
    pub waiting: BTreeMap<DeviceKey, Instant>,
}

/// A pending or settled channel of one claim.
struct Channel<'a> {
    claim: &'a ResourceClaim,
    key: DeviceKey,
    domain: Option<String>,
    ready: bool,
    failed: bool,
}

/// The domain UID of `result` from the allocation's opaque configs of this driver
/// (`ComputeDomainChannelConfig.domainID`); `None` when no config names one.
fn domain_of(claim: &ResourceClaim, result: &DeviceRequestAllocationResult) -> Option<String> {
    let devices = claim
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .devices
        .as_ref()?;
    devices.config.iter().flatten().find_map(|config| {
        let opaque = config.opaque.as_ref()?;
        if opaque.driver != api::DRIVER_NAME {
            return None;
        }
        let applies = config.requests.as_ref().is_none_or(|requests| {
            requests.is_empty()
                || requests
                    .iter()
                    .any(|r| result.request == *r || result.request.starts_with(&format!("{r}/")))
        });
        let parameters = &opaque.parameters.0;
        (applies && parameters["kind"] == api::CHANNEL_CONFIG_KIND)
            .then(|| parameters["domainID"].as_str().map(str::to_string))
            .flatten()
            .filter(|uid| !uid.is_empty())
    })
}

fn condition_true(entry: Option<&AllocatedDeviceStatus>, kind: &str) -> bool {
    entry
        .and_then(|e| e.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
}

fn entry_of<'a>(claim: &'a ResourceClaim, key: &DeviceKey) -> Option<&'a AllocatedDeviceStatus> {
    claim.status.as_ref()?.devices.iter().flatten().find(|d| {
        d.driver == key.driver
            && d.pool == key.pool
            && d.device == key.device
            && d.share_id == key.share_id
    })
}

/// Every channel result of this driver with [`IMEX_DAEMON_READY`] among its binding
/// conditions, in `claims`.
fn channels(claims: &[Arc<ResourceClaim>]) -> Vec<Channel<'_>> {
    let mut out = Vec::new();
    for claim in claims {
        for result in crate::alloc::allocation_results(claim) {
            let waits = result
                .binding_conditions
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c == IMEX_DAEMON_READY));
            if result.driver != api::DRIVER_NAME || !waits {
                continue;
            }
            let key = DeviceKey {
                claim_uid: claim.uid().unwrap_or_default(),
                driver: result.driver.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
                share_id: result.share_id.clone(),
            };
            let entry = entry_of(claim, &key);
            out.push(Channel {
                claim,
                domain: domain_of(claim, result),
                ready: condition_true(entry, IMEX_DAEMON_READY),
                failed: condition_true(entry, IMEX_DAEMON_FAILED),
                key,
            });
        }
    }
    out
}

/// Decides one pass: which nodes to label, which conditions to write, which provisional
/// labels to remove or keep, given every claim (`claims`), the `ComputeDomainNode`s by name
/// (`nodes`), the UIDs of the domains that exist and are not being deleted (`live`), what
/// this controller remembers, the time, and `--binding-timeout`. Pure.
pub fn decide(
    claims: &[Arc<ResourceClaim>],
    nodes: &BTreeMap<String, Arc<ComputeDomainNode>>,
    live: &BTreeSet<String>,
    memory: &Memory,
    now: Instant,
    timeout: Duration,
) -> Plan {
    let mut plan = Plan::default();
    // (node, UID) of every pending or Ready channel: what keeps a provisional label.
    let mut held: BTreeSet<(String, String)> = BTreeSet::new();
    let mut ready_on: BTreeSet<(String, String)> = BTreeSet::new();
    for channel in channels(claims) {
        let key = channel.key.clone();
        let node = key.pool.clone();
        if channel.failed {
            continue;
        }
        if channel.ready {
            if let Some(uid) = &channel.domain {
                held.insert((node.clone(), uid.clone()));
                ready_on.insert((node, uid.clone()));
            }
            continue;
        }
        let claim = channel.claim;
        let rv = claim.resource_version().unwrap_or_default();
        if memory.written.get(&key) == Some(&rv) {
            // Written on this version; the watch has not brought the new one yet.
            if let Some(uid) = &channel.domain {
                held.insert((node, uid.clone()));
            }
            continue;
        }
        let write =
            |condition: &'static str, reason: &'static str, message: String| ConditionWrite {
                namespace: claim.namespace().unwrap_or_default(),
                name: claim.name_any(),
                resource_version: rv.clone(),
                key: key.clone(),
                condition,
                reason,
                message,
            };
        let Some(uid) = channel.domain.clone() else {
            plan.conditions.push(write(
                IMEX_DAEMON_FAILED,
                "NoComputeDomain",
                format!(
                    "the allocation names no {} with a domainID for {}",
                    api::CHANNEL_CONFIG_KIND,
                    key.device
                ),
            ));
            continue;
        };
        if !live.contains(&uid) {
            plan.conditions.push(write(
                IMEX_DAEMON_FAILED,
                "ComputeDomainNotFound",
                format!("ComputeDomain {uid} does not exist or is being deleted"),
            ));
            continue;
        }
        if let Some(other) = memory.taken.get(&node)
            && *other != uid
            && live.contains(other)
        {
            plan.conditions.push(write(
                IMEX_DAEMON_FAILED,
                "NodeInOtherComputeDomain",
                format!(
                    "node {node} serves ComputeDomain {other}; a node serves one domain at a time"
                ),
            ));
            continue;
        }
        let object = nodes.get(&api::compute_domain_node_name(&uid, &node));
        let state = object.and_then(|o| o.status.as_ref());
        if state.is_some_and(|s| s.status == Readiness::Ready) {
            plan.conditions.push(write(
                IMEX_DAEMON_READY,
                "DaemonReady",
                format!("the IMEX daemon of ComputeDomain {uid} is Ready on node {node}"),
            ));
            held.insert((node.clone(), uid.clone()));
            ready_on.insert((node, uid));
            continue;
        }
        if let Some(s) = state
            && let Some(reason) = s.reason.as_deref()
            && FAILED_DAEMON_REASONS.contains(&reason)
        {
            plan.conditions.push(write(
                IMEX_DAEMON_FAILED,
                "DaemonFailed",
                format!(
                    "the IMEX daemon of ComputeDomain {uid} on node {node} failed: {reason}: {}",
                    s.message.as_deref().unwrap_or("")
                ),
            ));
            continue;
        }
        let since = memory.first_seen.get(&key).copied().unwrap_or(now);
        let deadline = since + timeout;
        if now >= deadline {
            let how = match state {
                None => "has not reported".to_string(),
                Some(s) => format!(
                    "is {:?} ({})",
                    s.status,
                    s.reason.as_deref().unwrap_or("no reason")
                ),
            };
            plan.conditions.push(write(
                IMEX_DAEMON_FAILED,
                "DaemonNotReadyInTime",
                format!(
                    "the IMEX daemon of ComputeDomain {uid} on node {node} {how} after {}s \
                     (--binding-timeout)",
                    timeout.as_secs()
                ),
            ));
            continue;
        }
        plan.waiting.insert(key, deadline);
        held.insert((node.clone(), uid.clone()));
        if memory.labelled.get(&node) != Some(&uid) {
            plan.label.insert(node, uid);
        }
    }
    for (node, uid) in &memory.provisional {
        let at = (node.clone(), uid.clone());
        if ready_on.contains(&at) {
            plan.commit.push(node.clone());
        } else if !held.contains(&at) {
            plan.unlabel.push(at);
        }
    }
    for (node, uid) in &memory.released {
        let at = (node.clone(), uid.clone());
        if !live.contains(uid) || held.contains(&at) {
            plan.forget_released.push(at);
            continue;
        }
        let stopped = nodes
            .get(&api::compute_domain_node_name(uid, node))
            .and_then(|o| o.status.as_ref())
            .is_some_and(|s| s.reason.as_deref() == Some(DAEMON_STOPPED));
        if stopped {
            plan.delete_node_objects.push(at);
        }
    }
    plan
}

/// The JSON patch writing `write` into `claim` (as read): a test of its resourceVersion,
/// then the device's entry added (or its condition of that type replaced), keeping the
/// entry's other conditions and fields and every other entry.
pub fn status_patch(claim: &ResourceClaim, write: &ConditionWrite) -> Value {
    let condition = Condition {
        type_: write.condition.to_string(),
        status: "True".to_string(),
        reason: write.reason.to_string(),
        message: write.message.chars().take(1024).collect(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    };
    let rv = claim.resource_version().unwrap_or_default();
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv})];
    let devices = claim.status.as_ref().and_then(|s| s.devices.as_ref());
    let key = &write.key;
    let at = devices.and_then(|d| {
        d.iter().position(|e| {
            e.driver == key.driver
                && e.pool == key.pool
                && e.device == key.device
                && e.share_id == key.share_id
        })
    });
    match (devices, at) {
        (Some(devices), Some(i)) => {
            let mut entry = devices[i].clone();
            let mut conditions = entry.conditions.take().unwrap_or_default();
            conditions.retain(|c| c.type_ != write.condition);
            conditions.push(condition);
            entry.conditions = Some(conditions);
            ops.push(
                json!({"op": "replace", "path": format!("/status/devices/{i}"), "value": entry}),
            );
        }
        (devices, _) => {
            let entry = AllocatedDeviceStatus {
                driver: key.driver.clone(),
                pool: key.pool.clone(),
                device: key.device.clone(),
                share_id: key.share_id.clone(),
                conditions: Some(vec![condition]),
                ..Default::default()
            };
            if devices.is_some() {
                ops.push(json!({"op": "add", "path": "/status/devices/-", "value": entry}));
            } else {
                ops.push(json!({"op": "add", "path": "/status/devices", "value": [entry]}));
            }
        }
    }
    Value::Array(ops)
}

/// Whether `claim` has an allocation result of this driver carrying [`IMEX_DAEMON_READY`]
/// among its binding conditions: the only claims [`decide`] reads more of than their identity.
fn has_channel_with_conditions(claim: &ResourceClaim) -> bool {
    crate::alloc::allocation_results(claim).iter().any(|r| {
        r.driver == api::DRIVER_NAME
            && r.binding_conditions
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c == IMEX_DAEMON_READY))
    })
}

/// What the claims store keeps of a claim: of its metadata the name, namespace, UID,
/// resourceVersion and deletion timestamp (what [`decide`] and the [`Binder`] read); the
/// spec never; and the status only when an allocation result of this driver carries
/// [`IMEX_DAEMON_READY`] (its allocation has the configs [`decide`] reads, its
/// `status.devices` what [`status_patch`] keeps). Every other claim of the cluster (GPU
/// claims, channels without binding conditions) is kept as its identity alone, so the store
/// grows by a few hundred bytes per claim, not by the claim. A claim that later gets such a
/// result arrives whole in its next watch event and is kept with its status then.
pub fn trim_claim(claim: &mut ResourceClaim) {
    let meta = std::mem::take(&mut claim.metadata);
    claim.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        deletion_timestamp: meta.deletion_timestamp,
        ..Default::default()
    };
    claim.spec = Default::default();
    if !has_channel_with_conditions(claim) {
        claim.status = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute_domain::api::{ComputeDomainNodeSpec, ComputeDomainNodeState};

    const U: &str = "5a0c0000-0000-4000-8000-000000000001";

    fn claim(name: &str, node: &str, conditions: Option<Value>) -> Arc<ResourceClaim> {
        let mut result = json!({"request": "channel", "driver": api::DRIVER_NAME, "pool": node,
                                "device": "channel-0", "shareID": "s-1",
                                "bindingConditions": [IMEX_DAEMON_READY],
                                "bindingFailureConditions": [IMEX_DAEMON_FAILED]});
        if name.starts_with("plain") {
            result.as_object_mut().unwrap().remove("bindingConditions");
        }
        let mut status = json!({"allocation": {"devices": {
            "results": [result],
            "config": [{"source": "FromClaim", "requests": ["channel"], "opaque": {
                "driver": api::DRIVER_NAME,
                "parameters": {"apiVersion": api::API_VERSION, "kind": api::CHANNEL_CONFIG_KIND,
                               "domainID": U, "allocationMode": "Single"}}}]}}});
        if let Some(c) = conditions {
            status["devices"] = json!([{"driver": api::DRIVER_NAME, "pool": node,
                                        "device": "channel-0", "shareID": "s-1",
                                        "conditions": c}]);
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"),
                             "resourceVersion": "7"},
                "spec": {}, "status": status}))
            .unwrap(),
        )
    }

    fn key(name: &str, node: &str) -> DeviceKey {
        DeviceKey {
            claim_uid: format!("uid-{name}"),
            driver: api::DRIVER_NAME.into(),
            pool: node.into(),
            device: "channel-0".into(),
            share_id: Some("s-1".into()),
        }
    }

    fn node_object(
        node: &str,
        ready: bool,
        reason: Option<&str>,
    ) -> BTreeMap<String, Arc<ComputeDomainNode>> {
        let name = api::compute_domain_node_name(U, node);
        let mut o = ComputeDomainNode::new(
            &name,
            &api::compute_domain_node_resource(),
            ComputeDomainNodeSpec {
                domain_uid: U.into(),
                node_name: node.into(),
                ..Default::default()
            },
        );
        o.status = Some(ComputeDomainNodeState {
            status: if ready {
                Readiness::Ready
            } else {
                Readiness::NotReady
            },
            reason: reason.map(str::to_string),
            ..Default::default()
        });
        BTreeMap::from([(name, Arc::new(o))])
    }

    fn live() -> BTreeSet<String> {
        BTreeSet::from([U.to_string()])
    }

    fn kinds(plan: &Plan) -> Vec<(&'static str, &'static str)> {
        plan.conditions
            .iter()
            .map(|c| (c.condition, c.reason))
            .collect()
    }

    const T: Duration = Duration::from_secs(60);

    #[test]
    fn a_pending_channel_labels_its_node_and_turns_ready_only_with_the_daemon() {
        let now = Instant::now();
        let claims = vec![claim("w0", "node-a", None)];
        let waiting = decide(
            &claims,
            &BTreeMap::new(),
            &live(),
            &Memory::default(),
            now,
            T,
        );
        assert_eq!(
            waiting.label,
            BTreeMap::from([("node-a".to_string(), U.to_string())])
        );
        assert_eq!(kinds(&waiting), vec![]);
        assert_eq!(
            waiting.waiting.keys().collect::<Vec<_>>(),
            vec![&key("w0", "node-a")]
        );

        let starting = decide(
            &claims,
            &node_object("node-a", false, Some("DaemonStarting")),
            &live(),
            &Memory::default(),
            now,
            T,
        );
        assert_eq!(kinds(&starting), vec![]);

        let memory = Memory {
            labelled: BTreeMap::from([("node-a".to_string(), U.to_string())]),
            ..Default::default()
        };
        let ready = decide(
            &claims,
            &node_object("node-a", true, None),
            &live(),
            &memory,
            now,
            T,
        );
        assert_eq!(kinds(&ready), vec![(IMEX_DAEMON_READY, "DaemonReady")]);
        assert_eq!(ready.label, BTreeMap::new());
        assert_eq!(ready.conditions[0].key, key("w0", "node-a"));
        assert_eq!(ready.conditions[0].resource_version, "7");
    }

    #[test]
    fn past_the_timeout_the_channel_fails_and_the_provisional_label_is_released() {
        let now = Instant::now();
        let claims = vec![claim("w0", "node-a", None)];
        let memory = Memory {
            first_seen: BTreeMap::from([(key("w0", "node-a"), now - Duration::from_secs(61))]),
            provisional: BTreeMap::from([("node-a".to_string(), U.to_string())]),
            labelled: BTreeMap::from([("node-a".to_string(), U.to_string())]),
            ..Default::default()
        };
        let plan = decide(&claims, &BTreeMap::new(), &live(), &memory, now, T);
        assert_eq!(
            kinds(&plan),
            vec![(IMEX_DAEMON_FAILED, "DaemonNotReadyInTime")]
        );
        assert_eq!(plan.unlabel, vec![("node-a".to_string(), U.to_string())]);
    }

    #[test]
    fn a_daemon_error_or_a_missing_domain_fails_at_once() {
        let now = Instant::now();
        let claims = vec![claim("w0", "node-a", None)];
        let crashed = decide(
            &claims,
            &node_object("node-a", false, Some("ConfigError")),
            &live(),
            &Memory::default(),
            now,
            T,
        );
        assert_eq!(kinds(&crashed), vec![(IMEX_DAEMON_FAILED, "DaemonFailed")]);
        let gone = decide(
            &claims,
            &BTreeMap::new(),
            &BTreeSet::new(),
            &Memory::default(),
            now,
            T,
        );
        assert_eq!(
            kinds(&gone),
            vec![(IMEX_DAEMON_FAILED, "ComputeDomainNotFound")]
        );
    }

    #[test]
    fn a_ready_channel_makes_the_label_the_domains_and_settled_channels_are_left_alone() {
        let now = Instant::now();
        let ready = json!([{"type": IMEX_DAEMON_READY, "status": "True", "reason": "DaemonReady",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        let failed = json!([{"type": IMEX_DAEMON_FAILED, "status": "True", "reason": "DaemonFailed",
                             "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        let memory = Memory {
            provisional: BTreeMap::from([
                ("node-a".to_string(), U.to_string()),
                ("node-b".to_string(), U.to_string()),
            ]),
            ..Default::default()
        };
        let claims = vec![
            claim("w0", "node-a", Some(ready)),
            claim("w1", "node-b", Some(failed)),
        ];
        let plan = decide(&claims, &BTreeMap::new(), &live(), &memory, now, T);
        assert_eq!(kinds(&plan), vec![]);
        assert_eq!(plan.commit, vec!["node-a".to_string()]);
        assert_eq!(plan.unlabel, vec![("node-b".to_string(), U.to_string())]);
    }

    #[test]
    fn the_store_keeps_a_pending_channels_status_and_only_the_identity_of_other_claims() {
        let now = Instant::now();
        let mut pending = (*claim("w0", "node-a", None)).clone();
        pending.metadata.managed_fields = Some(vec![Default::default()]);
        pending.metadata.labels = Some(BTreeMap::from([("a".to_string(), "b".to_string())]));
        let mut plain = (*claim("plain-0", "node-b", None)).clone();
        trim_claim(&mut pending);
        trim_claim(&mut plain);
        assert!(pending.status.is_some());
        assert_eq!(pending.metadata.managed_fields, None);
        assert_eq!(pending.metadata.labels, None);
        assert_eq!(plain.status, None);
        assert_eq!(
            (
                plain.name_any(),
                plain.namespace(),
                plain.uid(),
                plain.resource_version()
            ),
            (
                "plain-0".to_string(),
                Some("team-a".to_string()),
                Some("uid-plain-0".to_string()),
                Some("7".to_string())
            )
        );
        // The decisions on trimmed claims are those on whole ones.
        let whole = vec![
            claim("w0", "node-a", None),
            claim("plain-0", "node-b", None),
        ];
        let trimmed = vec![Arc::new(pending), Arc::new(plain)];
        for nodes in [BTreeMap::new(), node_object("node-a", true, None)] {
            assert_eq!(
                decide(&trimmed, &nodes, &live(), &Memory::default(), now, T),
                decide(&whole, &nodes, &live(), &Memory::default(), now, T)
            );
        }
    }

    #[test]
    fn channels_without_the_condition_are_not_ours_to_hold() {
        let plan = decide(
            &[claim("plain-0", "node-a", None)],
            &BTreeMap::new(),
            &live(),
            &Memory::default(),
            Instant::now(),
            T,
        );
        assert_eq!(plan, Plan::default());
    }

    #[test]
    fn the_status_patch_tests_the_version_and_appends_the_entry_keeping_the_others() {
        let claims = vec![claim("w0", "node-a", Some(json!([])))];
        let mut with_other = (*claims[0]).clone();
        let status = with_other.status.as_mut().unwrap();
        let devices = status.devices.as_mut().unwrap();
        devices[0].driver = "gpu.nvidia.com".into();
        let plan = decide(
            &claims,
            &node_object("node-a", true, None),
            &live(),
            &Memory::default(),
            Instant::now(),
            T,
        );
        let ops = status_patch(&with_other, &plan.conditions[0]);
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(ops[1]["op"], "add");
        assert_eq!(ops[1]["path"], "/status/devices/-");
        assert_eq!(
            (
                &ops[1]["value"]["driver"],
                &ops[1]["value"]["pool"],
                &ops[1]["value"]["device"],
                &ops[1]["value"]["shareID"]
            ),
            (
                &json!(api::DRIVER_NAME),
                &json!("node-a"),
                &json!("channel-0"),
                &json!("s-1")
            )
        );
        assert_eq!(ops[1]["value"]["conditions"][0]["type"], IMEX_DAEMON_READY);
        assert_eq!(ops.as_array().unwrap().len(), 2);
    }
}
