//! What a deleted `ComputeDomain` leaves behind, removed before its finalizer goes; and the
//! periodic sweep of what no domain owns any more.
//!
//! **Why the clean-up waits for the daemons.** `kubectl delete -f job.yaml` deletes the domain
//! while its IMEX daemons still run; the kubelet takes seconds to stop them. A running daemon
//! writes its `ComputeDomainNode`, so objects deleted before it stopped could come back (this
//! version's daemons read their domain first and do not; an older daemon, during an upgrade,
//! would). So the clean-up holds the finalizer until no daemon of the domain runs: it deletes
//! the DaemonSet in the foreground (the API server keeps the DaemonSet until the garbage
//! collector deleted its pods, and a pod object goes only after its containers stopped), and
//! re-checks (after [`FIRST_STOP_POLL`], doubling up to [`MAX_STOP_POLL`]) until the DaemonSet
//! is gone, or until the reconciler's daemon stop wait passed (a node that does not answer keeps its pods `Terminating`). Only then does
//! it delete the node objects a last time, remove the node labels and the finalizer: whatever
//! order the kubelet stops things in, nothing of the domain remains.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::ResourceExt;
use serde_json::json;

use super::deleting::Deleting;
use super::desired;
use super::error::ControllerError;
use super::reconcile::{Reconciler, lock};
use crate::compute_domain::api::{self, ComputeDomain, ComputeDomainNode};

/// How soon a deleted domain's clean-up first looks again whether its daemons stopped; the
/// wait doubles per look up to [`MAX_STOP_POLL`]. One GET of the DaemonSet per look.
pub const FIRST_STOP_POLL: Duration = Duration::from_millis(100);
/// The longest wait between two looks.
pub const MAX_STOP_POLL: Duration = Duration::from_secs(2);

fn gone(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}

impl Reconciler {
    /// One step of the clean-up of `domain`, whose node objects in the controller's store are
    /// `nodes`: `Ok(Some(wait))` while its daemons still run (look again after `wait`),
    /// `Ok(None)` once everything is deleted and the finalizer removed.
    ///
    /// # Errors
    /// [`ControllerError::Reconcile`] naming the request that failed; retried by the caller.
    pub(super) async fn clean_up(
        &self,
        domain: &ComputeDomain,
        nodes: &[&ComputeDomainNode],
    ) -> Result<Option<Duration>, ControllerError> {
        let uid = domain.uid().unwrap_or_default();
        let progress = lock(&self.deleting)
            .entry(uid.clone())
            .or_insert_with(Deleting::start)
            .clone();
        let first = !progress.daemon_set_deleted;
        let daemons_stopped = self.delete_daemon_set(domain, &progress).await?;
        if !progress.templates_deleted {
            self.delete_templates(domain).await?;
        }
        if let Some(p) = lock(&self.deleting).get_mut(&uid) {
            p.daemon_set_deleted = true;
            p.templates_deleted = true;
            p.looks += 1;
        }
        let waited = progress.since.elapsed();
        if !daemons_stopped && waited < self.daemon_stop_wait {
            // Tell the daemons still running (they stop writing once their object is gone),
            // and take away what an older daemon wrote again meanwhile.
            if first || !nodes.is_empty() {
                self.delete_node_objects(domain).await?;
            }
            tracing::debug!(
                waited_ms = waited.as_millis() as u64,
                "the domain's IMEX daemons still run; the finalizer stays"
            );
            let wait = FIRST_STOP_POLL.saturating_mul(1 << progress.looks.min(5));
            return Ok(Some(wait.min(MAX_STOP_POLL)));
        }
        if !daemons_stopped {
            tracing::warn!(
                waited_s = waited.as_secs(),
                daemon_set = %desired::daemon_object_name(&uid),
                "the domain's IMEX daemons did not stop in time (a node not answering?); deleting what is left"
            );
        }
        // No daemon runs any more: what this deletes stays deleted.
        self.delete_node_objects(domain).await?;
        self.remove_node_labels(domain, &uid).await?;
        self.set_finalizer(domain, false).await?;
        Ok(None)
    }

    /// Deletes the IMEX DaemonSet in the foreground (first call), then reads it: `true` once
    /// it is gone, which the API server allows only after its pods are.
    async fn delete_daemon_set(
        &self,
        domain: &ComputeDomain,
        progress: &Deleting,
    ) -> Result<bool, ControllerError> {
        let ns = &self.settings.namespace;
        let name = desired::daemon_object_name(&domain.uid().unwrap_or_default());
        let daemon_sets: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
        if progress.daemon_set_deleted {
            let found = daemon_sets
                .get_opt(&name)
                .await
                .map_err(self.failed(domain, format!("reading DaemonSet {ns}/{name}")))?;
            return Ok(found.is_none());
        }
        self.count(false);
        match daemon_sets.delete(&name, &DeleteParams::foreground()).await {
            Ok(either) => Ok(either.is_right()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
            Err(e) => Err(self
                .failed(domain, format!("deleting DaemonSet {ns}/{name}"))(
                e
            )),
        }
    }

    /// Deletes the daemon template and the workload template (at once, not when the garbage
    /// collector gets to it), the latter only if it is this domain's.
    async fn delete_templates(&self, domain: &ComputeDomain) -> Result<(), ControllerError> {
        let uid = domain.uid().unwrap_or_default();
        let ns = &self.settings.namespace;
        let name = desired::daemon_object_name(&uid);
        let templates: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), ns);
        self.count(false);
        gone(
            templates
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        )
        .map_err(self.failed(
            domain,
            format!("deleting ResourceClaimTemplate {ns}/{name}"),
        ))?;

        let Some(workload) = desired::workload_template(domain) else {
            return Ok(());
        };
        let namespace = domain.namespace().unwrap_or_default();
        let template = workload.metadata.name.unwrap_or_default();
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), &namespace);
        let step = format!("deleting ResourceClaimTemplate {namespace}/{template}");
        let existing = api
            .get_opt(&template)
            .await
            .map_err(self.failed(domain, step.clone()))?;
        if let Some(existing) = existing
            && existing.labels().get(api::DOMAIN_UID_LABEL) == Some(&uid)
        {
            let only_that_one = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: existing.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            self.count(false);
            gone(api.delete(&template, &only_that_one).await.map(|_| ()))
                .map_err(self.failed(domain, step))?;
        }
        Ok(())
    }

    /// Deletes every `ComputeDomainNode` of the domain (one delete-collection by its label).
    async fn delete_node_objects(&self, domain: &ComputeDomain) -> Result<(), ControllerError> {
        let ns = &self.settings.namespace;
        let uid = domain.uid().unwrap_or_default();
        self.count(false);
        self.node_objects()
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("{}={uid}", api::DOMAIN_UID_LABEL)),
            )
            .await
            .map_err(self.failed(domain, format!("deleting the ComputeDomainNodes in {ns}")))?;
        Ok(())
    }

    fn node_objects(&self) -> Api<ComputeDomainNode> {
        Api::namespaced_with(
            self.client.clone(),
            &self.settings.namespace,
            &api::compute_domain_node_resource(),
        )
    }

    /// Removes `resource.nvidia.com/computeDomain=<uid>` from every node carrying it.
    async fn remove_node_labels(
        &self,
        domain: &ComputeDomain,
        uid: &str,
    ) -> Result<(), ControllerError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let labelled = nodes
            .list_metadata(&ListParams::default().labels(&format!("{}={uid}", api::NODE_LABEL)))
            .await
            .map_err(self.failed(domain, "listing the domain's nodes".into()))?;
        for node in labelled.items {
            let node_name = node.name_any();
            self.count(false);
            self.unlabel(&nodes, &node_name).await.map_err(self.failed(
                domain,
                format!("removing label {} from Node {node_name}", api::NODE_LABEL),
            ))?;
        }
        Ok(())
    }

    async fn unlabel(&self, nodes: &Api<Node>, name: &str) -> Result<(), kube::Error> {
        let unlabel = json!({"metadata": {"labels": {api::NODE_LABEL: null}}});
        gone(
            nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&unlabel))
                .await
                .map(|_| ()),
        )
    }

    /// Deletes what no domain owns any more: the `ComputeDomainNode`s in `nodes` (the
    /// controller's store) whose domain UID is none of `domains`, and the node label of a UID
    /// none of `domains` has. Such leftovers come from a writer that raced a finished
    /// clean-up (a channel prepared on a node just as its domain went, an IMEX daemon of an
    /// older version, a daemon on a node that came back after the stop wait). Runs at every
    /// resync, when the stores have held every domain for a whole resync period: a domain
    /// whose UID a label names was seen by then. Costs one LIST of labelled nodes' metadata,
    /// and a request per leftover. Failures are logged, and retried at the next resync.
    pub async fn sweep(&self, domains: &BTreeSet<String>, nodes: &[&ComputeDomainNode]) {
        let orphans: BTreeSet<&str> = nodes
            .iter()
            .map(|n| n.spec.domain_uid.as_str())
            .filter(|uid| !domains.contains(*uid))
            .collect();
        for uid in orphans {
            self.count(false);
            let deleted = self
                .node_objects()
                .delete_collection(
                    &DeleteParams::default(),
                    &ListParams::default().labels(&format!("{}={uid}", api::DOMAIN_UID_LABEL)),
                )
                .await;
            match deleted {
                Ok(_) => {
                    tracing::info!(domain.uid = %uid, "deleted the ComputeDomainNodes of a domain that no longer exists")
                }
                Err(e) => {
                    tracing::warn!(domain.uid = %uid, error = %crate::errors::error_chain(&e), "deleting the ComputeDomainNodes of a domain that no longer exists; retried at the next resync")
                }
            }
        }
        let nodes_api: Api<Node> = Api::all(self.client.clone());
        let labelled = match nodes_api
            .list_metadata(&ListParams::default().labels(api::NODE_LABEL))
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(error = %crate::errors::error_chain(&e), "listing the nodes labelled for a ComputeDomain; retried at the next resync");
                return;
            }
        };
        for node in labelled {
            let Some(uid) = node.labels().get(api::NODE_LABEL).cloned() else {
                continue;
            };
            if domains.contains(&uid) {
                continue;
            }
            let name = node.name_any();
            self.count(false);
            match self.unlabel(&nodes_api, &name).await {
                Ok(()) => {
                    tracing::info!(node = %name, domain.uid = %uid, "removed the label of a ComputeDomain that no longer exists")
                }
                Err(e) => {
                    tracing::warn!(node = %name, domain.uid = %uid, error = %crate::errors::error_chain(&e), "removing the label of a ComputeDomain that no longer exists; retried at the next resync")
                }
            }
        }
    }
}
