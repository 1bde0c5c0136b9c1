//! The effectful half of the binding conditions: [`Binder`] performs what
//! [`super::decide`] planned (node labels, claim conditions, released node objects) and keeps
//! the [`Memory`] the next decision is made from.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::ResourceExt;
use serde_json::json;

use super::{ConditionWrite, Memory, decide, status_patch};
use crate::compute_domain::api::{self, ComputeDomainNode};
use crate::compute_domain::controller::metrics::Stats;

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
    #[error(
        "writing condition {condition} of device {device} into ResourceClaim {namespace}/{name}"
    )]
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

/// Requests the binding conditions make; cheap to clone into the tasks of one pass.
#[derive(Clone)]
struct Writer {
    client: Client,
    namespace: String,
    stats: Arc<Stats>,
}

/// Requests one pass keeps in flight at once: 256 condition writes at 2 ms each take half a
/// second one after the other, and the scheduler binds each pod only when its write is in.
pub const PARALLEL_WRITES: usize = 16;

/// Performs [`super::Plan`]s: labels nodes, writes claim conditions, removes labels and node
/// objects, up to `PARALLEL_WRITES` (16) requests at a time. Every write is counted in the
/// controller's [`Stats`].
pub struct Binder {
    writer: Writer,
    timeout: Duration,
    /// What [`decide`] is given.
    pub memory: Memory,
}

impl Binder {
    /// A binder writing through `client`, with `--binding-timeout` `timeout`; node objects
    /// live in `namespace`.
    pub fn new(client: Client, namespace: &str, timeout: Duration, stats: Arc<Stats>) -> Self {
        Binder {
            writer: Writer {
                client,
                namespace: namespace.to_string(),
                stats,
            },
            timeout,
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
        let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_WRITES));
        let shared_live = Arc::new(live.clone());
        let mut labels = tokio::task::JoinSet::new();
        for (node, uid) in plan.label.clone() {
            let (writer, live, limit) = (self.writer.clone(), shared_live.clone(), limit.clone());
            labels.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let outcome = writer.label(&node, &uid, &live).await;
                (node, uid, outcome)
            });
        }
        while let Some(done) = labels.join_next().await {
            let Ok((node, uid, outcome)) = done else {
                continue;
            };
            let (node, uid) = (&node, &uid);
            match outcome {
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
        let mut writes = tokio::task::JoinSet::new();
        for write in plan.conditions.clone() {
            let Some(claim) = claims
                .iter()
                .find(|c| c.uid().as_deref() == Some(write.key.claim_uid.as_str()))
                .cloned()
            else {
                continue;
            };
            let (writer, limit) = (self.writer.clone(), limit.clone());
            writes.spawn(async move {
                let _permit = limit.acquire_owned().await;
                let outcome = writer.write_condition(&claim, &write).await;
                (write, outcome)
            });
        }
        while let Some(done) = writes.join_next().await {
            let Ok((write, outcome)) = done else {
                continue;
            };
            let write = &write;
            match outcome {
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
            match self.writer.unlabel(node, uid).await {
                Ok(()) => {
                    tracing::info!(node = %node, domain.uid = %uid, "removed the label no ComputeDomain channel holds any more");
                    self.memory.provisional.remove(node);
                    self.memory.labelled.remove(node);
                    self.memory.released.insert((node.clone(), uid.clone()));
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
            match self.writer.delete_node_object(&name).await {
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
        self.memory
            .first_seen
            .retain(|k, _| waiting.contains_key(k));
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
}

impl Writer {
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
            // A domain this controller's store has not seen may just be newer than its watch:
            // ask the API server before taking the node from it (as the plugin does).
            Some(other) if self.domain_exists(other).await.map_err(failed)? => {
                return Ok(Labelled::Taken(other.clone()));
            }
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

    /// Whether a ComputeDomain with `uid` exists and is not being deleted, as the API server
    /// has it now (one LIST, served from its watch cache: no field selector reaches
    /// `metadata.uid`). Asked only when a node's label names a domain the store lacks.
    async fn domain_exists(&self, uid: &str) -> Result<bool, kube::Error> {
        let domains = Api::<api::ComputeDomain>::all_with(
            self.client.clone(),
            &api::compute_domain_resource(),
        );
        let list = domains.list(&kube::api::ListParams::default()).await?;
        Ok(list.items.iter().any(|d| {
            d.metadata.uid.as_deref() == Some(uid) && d.metadata.deletion_timestamp.is_none()
        }))
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
                if [404, 409].contains(&s.code)
                    || (s.code == 422 && s.message.contains("test")) =>
            {
                Ok(false)
            }
            // Anything else, e.g. 422 `Forbidden: changing status.devices requires
            // resource="resourceclaims/driver"` (RBAC), is logged by the pass.
            Err(e) => Err(failed(e)),
        }
    }
}
