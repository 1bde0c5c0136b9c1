//! What the compute-domain plugin asks of the API server, behind [`DomainCluster`]: the
//! claim, this node's domain label, the `ComputeDomainNode` objects the IMEX daemons write,
//! and a domain's name by UID. [`KubeCluster`] is the real one.

use std::future::Future;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};

use super::imex::DomainNames;
use crate::compute_domain::api::{self, ComputeDomain, ComputeDomainNode};
use crate::k8s::{AllocatedClaim, ClaimReader};
use crate::kubelet::ClaimRef;

/// A request to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The request failed; `step` names it and its object.
    #[error("{step}")]
    Api {
        /// What was asked, e.g. `labelling Node n1`.
        step: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Reading the claim failed.
    #[error("reading the claim")]
    Claim(#[source] Box<crate::k8s::K8sError>),
}

/// The plugin's view of the cluster. Every call is one request (or none), not retried: the
/// kubelet retries a failed prepare.
pub trait DomainCluster: Send + Sync + 'static {
    /// The claim the kubelet named, with this driver's results on this node.
    fn fetch_claim(
        &self,
        claim: &ClaimRef,
    ) -> impl Future<Output = Result<AllocatedClaim, ClusterError>> + Send;
    /// This node's [`api::NODE_LABEL`] value, if set.
    fn node_label(&self) -> impl Future<Output = Result<Option<String>, ClusterError>> + Send;
    /// Sets this node's [`api::NODE_LABEL`] to `domain` (the controller removes it when the
    /// domain is deleted).
    fn set_node_label(&self, domain: &str)
    -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// This node's `ComputeDomainNode` of domain `uid`, if the daemon created it.
    fn domain_node(
        &self,
        uid: &str,
    ) -> impl Future<Output = Result<Option<ComputeDomainNode>, ClusterError>> + Send;
    /// Every `ComputeDomainNode` of domain `uid` (by its [`api::DOMAIN_UID_LABEL`]).
    fn domain_nodes(
        &self,
        uid: &str,
    ) -> impl Future<Output = Result<Vec<ComputeDomainNode>, ClusterError>> + Send;
    /// The namespace and name of the `ComputeDomain` with UID `uid`, if it exists.
    fn find_domain(
        &self,
        uid: &str,
    ) -> impl Future<Output = Result<Option<DomainNames>, ClusterError>> + Send;
}

/// [`DomainCluster`] over a kube client.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
    node: String,
    namespace: String,
    claims: ClaimReader,
}

impl KubeCluster {
    /// The cluster as seen from `node`, with the daemons' objects in `namespace`.
    pub fn new(client: Client, node: impl Into<String>, namespace: impl Into<String>) -> Self {
        let node = node.into();
        KubeCluster {
            claims: ClaimReader::new(client.clone(), api::DRIVER_NAME, node.clone()),
            client,
            node,
            namespace: namespace.into(),
        }
    }

    fn failed(step: String) -> impl FnOnce(kube::Error) -> ClusterError {
        move |source| ClusterError::Api {
            step,
            source: Box::new(source),
        }
    }

    fn domain_nodes_api(&self) -> Api<ComputeDomainNode> {
        Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &api::compute_domain_node_resource(),
        )
    }
}

impl DomainCluster for KubeCluster {
    async fn fetch_claim(&self, claim: &ClaimRef) -> Result<AllocatedClaim, ClusterError> {
        self.claims
            .fetch(&claim.namespace, &claim.name, &claim.uid)
            .await
            .map_err(|e| ClusterError::Claim(Box::new(e)))
    }

    async fn node_label(&self) -> Result<Option<String>, ClusterError> {
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .map_err(Self::failed(format!("reading Node {}", self.node)))?;
        Ok(node
            .metadata
            .labels
            .and_then(|mut labels| labels.remove(api::NODE_LABEL)))
    }

    async fn set_node_label(&self, domain: &str) -> Result<(), ClusterError> {
        let patch = serde_json::json!({"metadata": {"labels": {api::NODE_LABEL: domain}}});
        let step = format!("labelling Node {} {}={domain}", self.node, api::NODE_LABEL);
        Api::<Node>::all(self.client.clone())
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Self::failed(step))?;
        Ok(())
    }

    async fn domain_node(&self, uid: &str) -> Result<Option<ComputeDomainNode>, ClusterError> {
        let name = api::compute_domain_node_name(uid, &self.node);
        self.domain_nodes_api()
            .get_opt(&name)
            .await
            .map_err(Self::failed(format!(
                "reading ComputeDomainNode {}/{name}",
                self.namespace
            )))
    }

    async fn domain_nodes(&self, uid: &str) -> Result<Vec<ComputeDomainNode>, ClusterError> {
        let selector = format!("{}={uid}", api::DOMAIN_UID_LABEL);
        let list = self
            .domain_nodes_api()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Self::failed(format!(
                "listing ComputeDomainNodes of domain {uid} in {}",
                self.namespace
            )))?;
        Ok(list.items)
    }

    async fn find_domain(&self, uid: &str) -> Result<Option<DomainNames>, ClusterError> {
        // No field selector reaches metadata.uid, and a daemon claim does not carry the
        // domain's name: one LIST per daemon claim (one per node and domain), served from
        // the API server's watch cache.
        let list =
            Api::<ComputeDomain>::all_with(self.client.clone(), &api::compute_domain_resource())
                .list(&ListParams::default())
                .await
                .map_err(Self::failed(format!(
                    "listing ComputeDomains to find uid {uid}"
                )))?;
        Ok(list
            .items
            .into_iter()
            .find(|d| d.metadata.uid.as_deref() == Some(uid))
            .map(|d| DomainNames {
                uid: uid.to_string(),
                namespace: d.metadata.namespace.unwrap_or_default(),
                name: d.metadata.name.unwrap_or_default(),
            }))
    }
}
