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
//! remembers in, a [`Plan`] out; [`Binder`] performs it. What it remembers (when it first saw
//! a pending result, which labels it set) is lost with the leader: the next leader restarts
//! the timeout from when it sees the claim, and treats labels it finds as not its own (they
//! then last as long as the domain, the rule without binding conditions).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, DeviceRequestAllocationResult, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::ResourceExt;
use serde_json::{Value, json};

use super::metrics::Stats;
use crate::compute_domain::api::{self, ComputeDomainNode, Readiness};
pub use crate::compute_domain::plugin::devices::{IMEX_DAEMON_FAILED, IMEX_DAEMON_READY};

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
    let devices = claim.status.as_ref()?.allocation.as_ref()?.devices.as_ref()?;
    devices.config.iter().flatten().find_map(|config| {
        let opaque = config.opaque.as_ref()?;
        if opaque.driver != api::DRIVER_NAME {
            return None;
        }
        let applies = config.requests.as_ref().is_none_or(|requests| {
            requests.is_empty()
                || requests.iter().any(|r| {
                    result.request == *r || result.request.starts_with(&format!("{r}/"))
                })
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
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for result in results.into_iter().flatten() {
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
        let write = |condition: &'static str, reason: &'static str, message: String| {
            ConditionWrite {
                namespace: claim.namespace().unwrap_or_default(),
                name: claim.name_any(),
                resource_version: rv.clone(),
                key: key.clone(),
                condition,
                reason,
                message,
            }
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

/// Errors of one binding step; logged by the pass and retried at the next one.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// Reading or patching a Node's label failed.
    #[error("{step} label {label} of Node {node}", label = api::NODE_LABEL)]
    Label {
        /// `setting` or `removing`.
        step: &'static str,
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Writing a condition into a claim's status failed.
    #[error("writing condition {condition} of device {device} into ResourceClaim {namespace}/{name}")]
    Condition {
        /// Claim namespace.
        namespace: String,
        /// Claim name.
        name: String,
        /// The condition type.
        condition: &'static str,
        /// The device.
        device: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting a released node's `ComputeDomainNode` failed.
    #[error("deleting ComputeDomainNode {name}")]
    NodeObject {
        /// Object name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// What labelling a node found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Labelled {
    /// The label names the domain now; `by_us`: this call set it.
    Done {
        /// Whether this call set it (so it is provisional).
        by_us: bool,
    },
    /// The node serves another domain that exists: its UID.
    Taken(String),
    /// The node changed between the read and the write (409), or is gone: next pass.
    Later,
}

/// Performs [`Plan`]s: labels nodes, writes claim conditions, removes labels and node
/// objects. Every write is counted in the controller's [`Stats`].
pub struct Binder {
    client: Client,
    namespace: String,
    timeout: Duration,
    stats: Arc<Stats>,
    /// What [`decide`] is given.
    pub memory: Memory,
}

impl Binder {
    /// A binder writing through `client`, with `--binding-timeout` `timeout`; node objects
    /// live in `namespace`.
    pub fn new(client: Client, namespace: &str, timeout: Duration, stats: Arc<Stats>) -> Self {
        Binder {
            client,
            namespace: namespace.to_string(),
            timeout,
            stats,
            memory: Memory::default(),
        }
    }

    /// One pass over `claims`, `nodes` and the `live` domains: decides and acts. Returns the
    /// earliest deadline of a device still waiting, when one is. Failures are logged (the
    /// boundary) and retried by the next pass.
    pub async fn pass(
        &mut self,
        claims: &[Arc<ResourceClaim>],
        nodes: &BTreeMap<String, Arc<ComputeDomainNode>>,
        live: &BTreeSet<String>,
    ) -> Option<Instant> {
        let now = Instant::now();
        let mut plan = decide(claims, nodes, live, &self.memory, now, self.timeout);
        let mut taken = false;
        for (node, uid) in &plan.label {
            match self.label(node, uid, live).await {
                Ok(Labelled::Done { by_us }) => {
                    self.memory.labelled.insert(node.clone(), uid.clone());
                    self.memory.taken.remove(node);
                    self.memory.released.remove(&(node.clone(), uid.clone()));
                    if by_us {
                        self.memory.provisional.insert(node.clone(), uid.clone());
                    }
                }
                Ok(Labelled::Taken(other)) => {
                    self.memory.taken.insert(node.clone(), other);
                    taken = true;
                }
                Ok(Labelled::Later) => {}
                Err(e) => {
                    tracing::warn!(node = %node, domain.uid = %uid, error = %crate::errors::error_chain(&e), "labelling a node for a pending ComputeDomain channel; retried")
                }
            }
        }
        if taken {
            // The claims on a taken node fail now, not at the timeout.
            plan = decide(claims, nodes, live, &self.memory, now, self.timeout);
            plan.label.clear();
        }
        for write in &plan.conditions {
            let Some(claim) = claims
                .iter()
                .find(|c| c.uid().as_deref() == Some(write.key.claim_uid.as_str()))
            else {
                continue;
            };
            match self.write_condition(claim, write).await {
                Ok(true) => {
                    tracing::info!(
                        claim.namespace = %write.namespace, claim.name = %write.name,
                        claim.uid = %write.key.claim_uid, node = %write.key.pool,
                        device = %write.key.device, condition = write.condition,
                        reason = write.reason, message = %write.message,
                        "set a binding condition"
                    );
                    self.memory
                        .written
                        .insert(write.key.clone(), write.resource_version.clone());
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(claim.namespace = %write.namespace, claim.name = %write.name, error = %crate::errors::error_chain(&e), "writing a binding condition; retried")
                }
            }
        }
        for node in &plan.commit {
            self.memory.provisional.remove(node);
        }
        for (node, uid) in &plan.unlabel {
            match self.unlabel(node, uid).await {
                Ok(()) => {
                    tracing::info!(node = %node, domain.uid = %uid, "removed the label no ComputeDomain channel holds any more");
                    self.memory.provisional.remove(node);
                    self.memory.labelled.remove(node);
                    self.memory
                        .released
                        .insert((node.clone(), uid.clone()));
                }
                Err(e) => {
                    tracing::warn!(node = %node, domain.uid = %uid, error = %crate::errors::error_chain(&e), "removing a node label no channel holds; retried")
                }
            }
        }
        for at in &plan.forget_released {
            self.memory.released.remove(at);
        }
        for (node, uid) in &plan.delete_node_objects {
            let name = api::compute_domain_node_name(uid, node);
            match self.delete_node_object(&name).await {
                Ok(()) => {
                    self.memory.released.remove(&(node.clone(), uid.clone()));
                }
                Err(e) => {
                    tracing::warn!(node = %node, domain.uid = %uid, error = %crate::errors::error_chain(&e), "deleting the node object of a released node; retried")
                }
            }
        }
        // Timeouts run from the first pass that saw a device pending.
        let waiting = plan.waiting;
        self.memory.first_seen.retain(|k, _| waiting.contains_key(k));
        for key in waiting.keys() {
            self.memory.first_seen.entry(key.clone()).or_insert(now);
        }
        self.memory.written.retain(|k, rv| {
            claims.iter().any(|c| {
                c.uid().as_deref() == Some(k.claim_uid.as_str())
                    && c.resource_version().as_deref() == Some(rv.as_str())
            })
        });
        waiting.values().min().copied()
    }

    fn count(&self) {
        self.stats.binding_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets the node's label to `uid` unless it names it already or another domain in
    /// `live`. One GET of the node, and one PATCH (with the resourceVersion read) when it
    /// changes.
    async fn label(
        &self,
        node: &str,
        uid: &str,
        live: &BTreeSet<String>,
    ) -> Result<Labelled, BindingError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let failed = |source| BindingError::Label {
            step: "setting",
            node: node.to_string(),
            source,
        };
        let Some(current) = nodes.get_metadata_opt(node).await.map_err(failed)? else {
            return Ok(Labelled::Later);
        };
        match current.labels().get(api::NODE_LABEL) {
            Some(l) if l == uid => return Ok(Labelled::Done { by_us: false }),
            Some(other) if live.contains(other) => return Ok(Labelled::Taken(other.clone())),
            _ => {}
        }
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "labels": {api::NODE_LABEL: uid},
        }});
        self.count();
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Labelled::Done { by_us: true }),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(Labelled::Later),
            Err(e) => Err(failed(e)),
        }
    }

    /// Removes the node's label if it still names `uid`.
    async fn unlabel(&self, node: &str, uid: &str) -> Result<(), BindingError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let failed = |source| BindingError::Label {
            step: "removing",
            node: node.to_string(),
            source,
        };
        let Some(current) = nodes.get_metadata_opt(node).await.map_err(failed)? else {
            return Ok(());
        };
        if current.labels().get(api::NODE_LABEL).map(String::as_str) != Some(uid) {
            return Ok(());
        }
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "labels": {api::NODE_LABEL: null},
        }});
        self.count();
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn delete_node_object(&self, name: &str) -> Result<(), BindingError> {
        let objects: Api<ComputeDomainNode> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &api::compute_domain_node_resource(),
        );
        self.count();
        match objects.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(BindingError::NodeObject {
                name: name.to_string(),
                source,
            }),
        }
    }

    /// Writes `write` into the claim's `status.devices[]` with a JSON patch of the status
    /// subresource that tests the resourceVersion it was decided on and touches only this
    /// device's entry: other writers' entries are kept, and a claim that changed since
    /// (409, or 422 naming the failed test) is left to the next pass, which the watch
    /// delivering the change starts. `claim` is the store's copy the decision was made on.
    /// `Ok(false)` when it was not written.
    async fn write_condition(
        &self,
        claim: &ResourceClaim,
        write: &ConditionWrite,
    ) -> Result<bool, BindingError> {
        let failed = |source| BindingError::Condition {
            namespace: write.namespace.clone(),
            name: write.name.clone(),
            condition: write.condition,
            device: write.key.device.clone(),
            source,
        };
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &write.namespace);
        let ops = status_patch(claim, write);
        let body = serde_json::to_vec(&ops).map_err(|e| failed(kube::Error::SerdeError(e)))?;
        let request = http::Request::builder()
            .method(http::Method::PATCH)
            .uri(format!("{}/{}/status", claims.resource_url(), write.name))
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .map_err(|e| failed(kube::Error::HttpError(e)))?;
        self.count();
        match self.client.request::<ResourceClaim>(request).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s))
                if [404, 409].contains(&s.code) || (s.code == 422 && s.message.contains("test")) =>
            {
                Ok(false)
            }
            // Anything else, e.g. 422 `Forbidden: changing status.devices requires
            // resource="resourceclaims/driver"` (RBAC), is logged by the pass.
            Err(e) => Err(failed(e)),
        }
    }
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
            ops.push(json!({"op": "replace", "path": format!("/status/devices/{i}"), "value": entry}));
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

/// What the claims store keeps of a claim: its metadata without managed fields, and its
/// status (the allocation carries the configs [`decide`] reads); the spec is dropped.
pub fn trim_claim(claim: &mut ResourceClaim) {
    claim.metadata.managed_fields = None;
    claim.metadata.annotations = None;
    claim.spec = Default::default();
}
