//! Acting on one `ComputeDomain`: the finalizer, the three objects, the status, and the
//! clean-up when the domain is deleted. Each call brings one domain one step closer to what
//! [`super::desired`] and [`super::status`] say; an error is retried by the caller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Client;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::ResourceExt;
use serde_json::json;

use super::desired::{self, Settings};
use super::error::ControllerError;
use super::metrics::Stats;
use super::status;
use crate::compute_domain::api::{self, ComputeDomain, ComputeDomainNode, ComputeDomainStatus};

/// `reportingController` and `source.component` of the controller's Events.
pub const EVENT_COMPONENT: &str = "gpu-dra-compute-domain-controller";

/// API requests the controller made, by kind of request: what the bench and the tests count.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Writes {
    /// Status writes (`PATCH .../computedomains/<name>/status`).
    pub status: u64,
    /// Every other create, patch or delete.
    pub other: u64,
}

/// The reconciler: one per leader term. What it remembers (statuses written, objects known
/// to exist) only saves requests; after a restart it is rebuilt from the API server.
pub struct Reconciler {
    client: Client,
    settings: Settings,
    /// Per domain UID, the last status written: a status the watch has not delivered back
    /// yet is not written twice.
    written: Mutex<BTreeMap<String, ComputeDomainStatus>>,
    /// Domain UIDs whose templates and DaemonSet are known to exist.
    ensured: Mutex<BTreeSet<String>>,
    /// Domain UIDs this reconciler put the finalizer on.
    finalized: Mutex<BTreeSet<String>>,
    stats: Arc<Stats>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which of the domain's objects could not be made: a spec problem to report in the status.
struct SpecProblem {
    reason: &'static str,
    message: String,
}

impl Reconciler {
    /// A reconciler writing through `client` with `settings`.
    pub fn new(client: Client, settings: Settings) -> Self {
        Reconciler {
            client,
            settings,
            written: Mutex::default(),
            ensured: Mutex::default(),
            finalized: Mutex::default(),
            stats: Arc::default(),
        }
    }

    /// The settings the objects are made with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Forgets which domains' objects are known to exist, so the next reconcile of each
    /// checks them again (re-creating one deleted by hand): the periodic resync calls it.
    pub fn forget_ensured(&self) {
        lock(&self.ensured).clear();
    }

    /// Requests written so far.
    pub fn writes(&self) -> Writes {
        Writes {
            status: self.stats.status_writes.load(Ordering::Relaxed),
            other: self.stats.other_writes.load(Ordering::Relaxed),
        }
    }

    /// The counters this reconciler updates (and the controller's metrics serve).
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    fn count(&self, status_write: bool) {
        let counter = if status_write {
            &self.stats.status_writes
        } else {
            &self.stats.other_writes
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn domains(&self, namespace: &str) -> Api<ComputeDomain> {
        Api::namespaced_with(
            self.client.clone(),
            namespace,
            &api::compute_domain_resource(),
        )
    }

    /// Brings `domain` one step closer to its desired state, given its node objects
    /// `nodes`: clean-up when it is being deleted, else finalizer, objects and status.
    ///
    /// # Errors
    /// [`ControllerError::Reconcile`] naming the step whose request failed; the caller
    /// retries the whole call (every step is idempotent).
    pub async fn reconcile(
        &self,
        domain: &ComputeDomain,
        nodes: &[&ComputeDomainNode],
    ) -> Result<(), ControllerError> {
        let uid = domain.uid().unwrap_or_default();
        if domain.meta().deletion_timestamp.is_some() {
            if domain.finalizers().iter().any(|f| f == api::FINALIZER) {
                self.clean_up(domain).await?;
            }
            lock(&self.written).remove(&uid);
            lock(&self.ensured).remove(&uid);
            lock(&self.finalized).remove(&uid);
            return Ok(());
        }
        // The watch may not have delivered the finalizer written by an earlier reconcile yet:
        // adding it again with that stale resourceVersion would only conflict.
        let has_finalizer = domain.finalizers().iter().any(|f| f == api::FINALIZER);
        if !has_finalizer && !lock(&self.finalized).contains(&uid) {
            let mut finalizers = domain.finalizers().to_vec();
            finalizers.push(api::FINALIZER.to_string());
            self.patch_finalizers(domain, finalizers).await?;
            lock(&self.finalized).insert(uid.clone());
        }
        let new_status = match self.ensure_objects(domain).await? {
            Some(problem) => status::spec_error(problem.reason, problem.message, nodes),
            None => status::aggregate(domain.spec.num_nodes, nodes),
        };
        let current = lock(&self.written)
            .get(&uid)
            .cloned()
            .or_else(|| domain.status.clone());
        if current.as_ref() == Some(&new_status) {
            return Ok(());
        }
        self.write_status(domain, &new_status).await?;
        let spec_problem = new_status
            .reason
            .as_deref()
            .filter(|r| [status::INVALID_SPEC, status::TEMPLATE_CONFLICT].contains(r));
        if let Some(reason) = spec_problem
            && current.and_then(|c| c.reason).as_deref() != Some(reason)
        {
            self.post_event(domain, reason, new_status.message.as_deref().unwrap_or(""))
                .await;
        }
        lock(&self.written).insert(uid, new_status);
        Ok(())
    }

    fn failed(
        &self,
        domain: &ComputeDomain,
        step: String,
    ) -> impl Fn(kube::Error) -> ControllerError {
        let (namespace, name) = (domain.namespace().unwrap_or_default(), domain.name_any());
        move |source| ControllerError::Reconcile {
            step: step.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        }
    }

    /// Sets `metadata.finalizers`, guarded by the resourceVersion read (a 409 is retried
    /// with the newer object).
    async fn patch_finalizers(
        &self,
        domain: &ComputeDomain,
        finalizers: Vec<String>,
    ) -> Result<(), ControllerError> {
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": domain.resource_version(),
        }});
        self.count(false);
        self.domains(&domain.namespace().unwrap_or_default())
            .patch(
                &domain.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(self.failed(domain, "setting the finalizers".into()))?;
        Ok(())
    }

    /// The whole status as a merge patch of the status subresource: the controller is its
    /// only writer, so no resourceVersion is needed and no write can conflict.
    async fn write_status(
        &self,
        domain: &ComputeDomain,
        status: &ComputeDomainStatus,
    ) -> Result<(), ControllerError> {
        let mut body = serde_json::to_value(status).unwrap_or_default();
        // A merge patch keeps fields it does not mention: clear a reason that went away.
        for field in ["reason", "message"] {
            if body.get(field).is_none() {
                body[field] = serde_json::Value::Null;
            }
        }
        self.count(true);
        self.domains(&domain.namespace().unwrap_or_default())
            .patch_status(
                &domain.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": body})),
            )
            .await
            .map_err(self.failed(domain, "writing the status".into()))?;
        Ok(())
    }

    /// Creates the workload template, the daemon template and the DaemonSet unless known to
    /// exist. Returns the spec problem that keeps them from being made, if any.
    async fn ensure_objects(
        &self,
        domain: &ComputeDomain,
    ) -> Result<Option<SpecProblem>, ControllerError> {
        let uid = domain.uid().unwrap_or_default();
        let Some(workload) = desired::workload_template(domain) else {
            return Ok(Some(SpecProblem {
                reason: status::INVALID_SPEC,
                message: "spec.channel is missing: set spec.channel.resourceClaimTemplate.name \
                          (and optionally spec.channel.allocationMode: Single or All)"
                    .to_string(),
            }));
        };
        let template_name = workload.metadata.name.clone().unwrap_or_default();
        if template_name.is_empty() {
            return Ok(Some(SpecProblem {
                reason: status::INVALID_SPEC,
                message: "spec.channel.resourceClaimTemplate.name is empty: name the \
                          ResourceClaimTemplate the workload's pods reference"
                    .to_string(),
            }));
        }
        if lock(&self.ensured).contains(&uid) {
            return Ok(None);
        }
        let namespace = domain.namespace().unwrap_or_default();
        let templates: Api<ResourceClaimTemplate> =
            Api::namespaced(self.client.clone(), &namespace);
        if let Some(owner) = self
            .create_once(&templates, &workload, domain, "ResourceClaimTemplate")
            .await?
        {
            let message = format!(
                "ResourceClaimTemplate {namespace}/{template_name} exists and belongs to {}: \
                 choose another spec.channel.resourceClaimTemplate.name (a ComputeDomain's \
                 spec is immutable: delete and re-create it) or delete that template",
                if owner.is_empty() {
                    "no ComputeDomain".to_string()
                } else {
                    format!("the ComputeDomain with UID {owner}")
                }
            );
            return Ok(Some(SpecProblem {
                reason: status::TEMPLATE_CONFLICT,
                message,
            }));
        }
        let ns = &self.settings.namespace;
        let daemon_templates: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), ns);
        let daemon_template = desired::daemon_template(domain, &self.settings);
        self.create_once(
            &daemon_templates,
            &daemon_template,
            domain,
            "ResourceClaimTemplate",
        )
        .await?;
        let daemon_sets: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
        let daemon_set = desired::daemon_set(domain, &self.settings);
        self.ensure_daemon_set(&daemon_sets, &daemon_set, domain)
            .await?;
        lock(&self.ensured).insert(uid);
        Ok(None)
    }

    /// Creates the IMEX DaemonSet, or brings one of this domain's that another version of
    /// the controller made up to date (image, arguments, environment, service account:
    /// [`desired::daemon_set_outdated`]), so an upgrade of the driver reaches the daemons of
    /// running domains. Checked once per domain per controller start; a DaemonSet of that name
    /// that is not this domain's is left alone.
    async fn ensure_daemon_set(
        &self,
        api: &Api<DaemonSet>,
        desired: &DaemonSet,
        domain: &ComputeDomain,
    ) -> Result<(), ControllerError> {
        let Some(Existing {
            object: mut existing,
            owner,
            at,
        }) = self
            .create_or_get(api, desired, domain, "DaemonSet")
            .await?
        else {
            return Ok(());
        };
        if owner != domain.uid().unwrap_or_default() {
            return Ok(());
        }
        let Some(changed) = desired::daemon_set_outdated(&existing, desired) else {
            return Ok(());
        };
        existing.spec.template = desired.spec.template.clone();
        existing.metadata.managed_fields = None;
        self.count(false);
        let name = existing.name_any();
        api.replace(&name, &PostParams::default(), &existing)
            .await
            .map_err(self.failed(domain, format!("updating DaemonSet {at}")))?;
        tracing::info!(
            daemon_set = %at, domain = %domain.name_any(), %changed,
            "updated the IMEX daemons' DaemonSet to this controller's version"
        );
        Ok(())
    }

    /// Creates `object` unless it exists. `Ok(None)` when it exists now and carries this
    /// domain's UID label; `Ok(Some(other uid or ""))` when an object of that name belongs
    /// to someone else.
    async fn create_once<K>(
        &self,
        api: &Api<K>,
        object: &K,
        domain: &ComputeDomain,
        kind: &str,
    ) -> Result<Option<String>, ControllerError>
    where
        K: kube::Resource
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let uid = domain.uid().unwrap_or_default();
        Ok(self
            .create_or_get(api, object, domain, kind)
            .await?
            .map(|existing| existing.owner)
            .filter(|owner| *owner != uid))
    }

    /// Creates `object`; `Ok(None)` when that made it, or the object of that name that
    /// already existed (409), read back with the domain UID its label names.
    async fn create_or_get<K>(
        &self,
        api: &Api<K>,
        object: &K,
        domain: &ComputeDomain,
        kind: &str,
    ) -> Result<Option<Existing<K>>, ControllerError>
    where
        K: kube::Resource
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let name = object.meta().name.clone().unwrap_or_default();
        let at = format!(
            "{}/{name}",
            object.meta().namespace.clone().unwrap_or_default()
        );
        self.count(false);
        match api.create(&PostParams::default(), object).await {
            Ok(_) => return Ok(None),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(self.failed(domain, format!("creating {kind} {at}"))(e)),
        }
        let existing = api
            .get(&name)
            .await
            .map_err(self.failed(domain, format!("reading {kind} {at}")))?;
        let owner = existing
            .labels()
            .get(api::DOMAIN_UID_LABEL)
            .cloned()
            .unwrap_or_default();
        Ok(Some(Existing {
            object: existing,
            owner,
            at,
        }))
    }

    /// Deletes what the domain made outside its namespace's garbage collection (the daemon
    /// template, the DaemonSet, the node objects, the node labels) and the workload template
    /// (at once, not when the garbage collector gets to it), then removes the finalizer.
    async fn clean_up(&self, domain: &ComputeDomain) -> Result<(), ControllerError> {
        let uid = domain.uid().unwrap_or_default();
        let ns = &self.settings.namespace;
        let name = desired::daemon_object_name(&uid);
        let gone = |r: Result<(), kube::Error>| match r {
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            other => other,
        };
        let daemon_sets: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
        self.count(false);
        gone(
            daemon_sets
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        )
        .map_err(self.failed(domain, format!("deleting DaemonSet {ns}/{name}")))?;
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

        if let Some(workload) = desired::workload_template(domain) {
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
        }

        let selector = format!("{}={uid}", api::DOMAIN_UID_LABEL);
        let node_objects: Api<ComputeDomainNode> = Api::namespaced_with(
            self.client.clone(),
            ns,
            &api::compute_domain_node_resource(),
        );
        self.count(false);
        node_objects
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector),
            )
            .await
            .map_err(self.failed(domain, format!("deleting the ComputeDomainNodes in {ns}")))?;

        let nodes: Api<Node> = Api::all(self.client.clone());
        let labelled = nodes
            .list_metadata(&ListParams::default().labels(&format!("{}={uid}", api::NODE_LABEL)))
            .await
            .map_err(self.failed(domain, "listing the domain's nodes".into()))?;
        let unlabel = json!({"metadata": {"labels": {api::NODE_LABEL: null}}});
        for node in labelled.items {
            let node_name = node.name_any();
            self.count(false);
            gone(
                nodes
                    .patch(&node_name, &PatchParams::default(), &Patch::Merge(&unlabel))
                    .await
                    .map(|_| ()),
            )
            .map_err(self.failed(
                domain,
                format!("removing label {} from Node {node_name}", api::NODE_LABEL),
            ))?;
        }

        let finalizers: Vec<String> = domain
            .finalizers()
            .iter()
            .filter(|f| *f != api::FINALIZER)
            .cloned()
            .collect();
        self.patch_finalizers(domain, finalizers).await
    }

    /// A Warning Event on the domain; best effort (an event that cannot be posted is logged,
    /// the status already says the same).
    async fn post_event(&self, domain: &ComputeDomain, reason: &str, message: &str) {
        let namespace = domain.namespace().unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", domain.name_any())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some(api::API_VERSION.to_string()),
                kind: Some(api::COMPUTE_DOMAIN_KIND.to_string()),
                name: Some(domain.name_any()),
                namespace: Some(namespace.clone()),
                uid: domain.uid(),
                resource_version: domain.resource_version(),
                ..Default::default()
            },
            reason: Some(reason.to_string()),
            message: Some(message.chars().take(1024).collect()),
            type_: Some("Warning".to_string()),
            source: Some(EventSource {
                component: Some(EVENT_COMPONENT.to_string()),
                host: None,
            }),
            reporting_component: Some(EVENT_COMPONENT.to_string()),
            reporting_instance: Some(EVENT_COMPONENT.to_string()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some("Reconcile".to_string()),
            count: Some(1),
            ..Default::default()
        };
        self.count(false);
        let posted = Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await;
        if let Err(e) = posted {
            tracing::warn!(
                domain.namespace = %namespace,
                domain.name = %domain.name_any(),
                %reason,
                error = %e,
                "could not post an Event"
            );
        }
    }
}

/// An object [`Reconciler::create_or_get`] found already there.
struct Existing<K> {
    object: K,
    /// The domain UID its label names ("" when none).
    owner: String,
    /// `namespace/name`, for errors and logs.
    at: String,
}
