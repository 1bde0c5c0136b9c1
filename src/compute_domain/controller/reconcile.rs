//! Acting on one `ComputeDomain`: the finalizer, the three objects, the status, and (in
//! [`super::cleanup`]) the clean-up when the domain is deleted. Each call brings one domain one
//! step closer to what [`super::desired`] and [`super::status`] say; an error is retried by the
//! caller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Client;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::ResourceExt;
use serde_json::json;

use super::deleting::Deleting;
use super::desired::{self, Settings};
use super::error::ControllerError;
use super::finalizer;
use super::metrics::Stats;
use super::status;
use crate::compute_domain::api::{self, ComputeDomain, ComputeDomainNode, ComputeDomainStatus};

/// The default of [`Reconciler::with_daemon_stop_wait`]: how long a deleted domain's clean-up
/// waits for its IMEX daemons to stop. A daemon pod gets 30 s to stop after SIGTERM (the pod
/// default; ours stops at once); the rest is the kubelet's and the garbage collector's slack.
pub const DAEMON_STOP_WAIT: Duration = Duration::from_secs(40);

/// `reportingController` and `source.component` of the controller's Events.
pub const EVENT_COMPONENT: &str = "gpu-dra-compute-domain-controller";

/// API requests the controller made, by kind of request: what the bench and the tests count.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Writes {
    /// Status writes (`PATCH .../computedomains/<name>/status`).
    pub status: u64,
    /// Every other create, patch or delete.
    pub other: u64,
    /// Writes of the binding conditions ([`super::binding`]): claim conditions, labels of
    /// pending channels' nodes, node objects of released nodes.
    pub binding: u64,
}

/// What a reconcile left for later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing until the domain or one of its node objects changes.
    Done,
    /// Reconcile again after this long: a deleted domain whose IMEX daemons still run.
    Again(Duration),
}

/// The reconciler: one per leader term. What it remembers (statuses written, objects known
/// to exist, deletions in progress) only saves requests or bounds a wait; after a restart it
/// is rebuilt from the API server.
pub struct Reconciler {
    pub(super) client: Client,
    pub(super) settings: Settings,
    /// Per domain UID, the last status written: a status the watch has not delivered back
    /// yet is not written twice.
    written: Mutex<BTreeMap<String, ComputeDomainStatus>>,
    /// Domain UIDs whose templates and DaemonSet are known to exist.
    ensured: Mutex<BTreeSet<String>>,
    /// Domain UIDs this reconciler put the finalizer on.
    finalized: Mutex<BTreeSet<String>>,
    /// Per UID of a deleted domain, how far its clean-up got.
    pub(super) deleting: Mutex<BTreeMap<String, Deleting>>,
    /// UIDs of deleted domains whose finalizer this reconciler removed, and when.
    released: Mutex<BTreeMap<String, std::time::Instant>>,
    /// How long a clean-up waits for the domain's IMEX daemons to stop.
    pub(super) daemon_stop_wait: Duration,
    stats: Arc<Stats>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
            deleting: Mutex::default(),
            released: Mutex::default(),
            daemon_stop_wait: DAEMON_STOP_WAIT,
            stats: Arc::default(),
        }
    }

    /// How long the clean-up of a deleted domain waits for its IMEX daemons to stop before it
    /// deletes what is left anyway ([`DAEMON_STOP_WAIT`] unless set).
    pub fn with_daemon_stop_wait(mut self, wait: Duration) -> Self {
        self.daemon_stop_wait = wait;
        self
    }

    /// The settings the objects are made with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Forgets which domains' objects are known to exist, so the next reconcile of each
    /// checks them again (re-creating one deleted by hand): the periodic resync calls it.
    pub fn forget_ensured(&self) {
        lock(&self.ensured).clear();
        // By now the watch delivered the deletion of every domain released a minute ago.
        lock(&self.released).retain(|_, at| at.elapsed() < Duration::from_secs(60));
    }

    /// Requests written so far.
    pub fn writes(&self) -> Writes {
        Writes {
            status: self.stats.status_writes.load(Ordering::Relaxed),
            other: self.stats.other_writes.load(Ordering::Relaxed),
            binding: self.stats.binding_writes.load(Ordering::Relaxed),
        }
    }

    /// The counters this reconciler updates (and the controller's metrics serve).
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    pub(super) fn count(&self, status_write: bool) {
        let counter = if status_write {
            &self.stats.status_writes
        } else {
            &self.stats.other_writes
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn domains(&self, namespace: &str) -> Api<ComputeDomain> {
        Api::namespaced_with(
            self.client.clone(),
            namespace,
            &api::compute_domain_resource(),
        )
    }

    /// Brings `domain` one step closer to its desired state, given its node objects
    /// `nodes`: clean-up when it is being deleted ([`super::cleanup`]), else finalizer,
    /// objects and status.
    ///
    /// # Errors
    /// [`ControllerError::Reconcile`] naming the step whose request failed; the caller
    /// retries the whole call (every step is idempotent).
    pub async fn reconcile(
        &self,
        domain: &ComputeDomain,
        nodes: &[&ComputeDomainNode],
    ) -> Result<Outcome, ControllerError> {
        let uid = domain.uid().unwrap_or_default();
        if domain.meta().deletion_timestamp.is_some() {
            // Our finalizer was removed, so the domain is gone: the copy here is older than
            // that (the watch has not delivered the deletion yet). Cleaning up again would
            // only send requests that 404; the first version did, and logged the finalizer
            // patch's 404 as `reconcile failed … setting the finalizers` on every delete.
            if lock(&self.released).contains_key(&uid) {
                return Ok(Outcome::Done);
            }
            if domain.finalizers().iter().any(|f| f == api::FINALIZER) {
                if let Some(wait) = self.clean_up(domain, nodes).await? {
                    return Ok(Outcome::Again(wait));
                }
                lock(&self.released).insert(uid.clone(), std::time::Instant::now());
            }
            lock(&self.written).remove(&uid);
            lock(&self.ensured).remove(&uid);
            lock(&self.finalized).remove(&uid);
            lock(&self.deleting).remove(&uid);
            return Ok(Outcome::Done);
        }
        // The watch may not have delivered the finalizer written by an earlier reconcile yet.
        let has_finalizer = domain.finalizers().iter().any(|f| f == api::FINALIZER);
        if !has_finalizer && !lock(&self.finalized).contains(&uid) {
            if !self.set_finalizer(domain, true).await? {
                // Deleted (or replaced) before it got the finalizer: nothing was made yet,
                // and the watch brings the rest.
                return Ok(Outcome::Done);
            }
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
            return Ok(Outcome::Done);
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
        Ok(Outcome::Done)
    }

    pub(super) fn failed(
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

    /// Adds (`add`) or removes the controller's finalizer with a JSON patch that tests only
    /// the UID and the finalizers it read ([`finalizer`]): a write elsewhere in the object
    /// does not conflict with it. When the finalizers changed since they were read (the test
    /// fails, 422, or the API server says 409), it reads the domain once more and tries again
    /// with what it read. Returns whether the domain now carries the finalizer (`add`), or is
    /// rid of it; `false` when the domain was deleted (adding) or replaced meanwhile.
    pub(super) async fn set_finalizer(
        &self,
        domain: &ComputeDomain,
        add: bool,
    ) -> Result<bool, ControllerError> {
        let (namespace, name) = (domain.namespace().unwrap_or_default(), domain.name_any());
        let uid = domain.uid().unwrap_or_default();
        let step = if add {
            "adding the finalizer"
        } else {
            "removing the finalizer"
        };
        let api = self.domains(&namespace);
        let mut finalizers = domain.finalizers().to_vec();
        let mut deleting = domain.meta().deletion_timestamp.is_some();
        for attempt in 0..2 {
            if add && deleting {
                return Ok(false);
            }
            let patch = if add {
                finalizer::add(&uid, &finalizers)
            } else {
                finalizer::remove(&uid, &finalizers)
            };
            let Some(patch) = patch else {
                return Ok(true);
            };
            self.count(false);
            match self.json_patch(&api, &name, &patch).await {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(!add),
                Err(kube::Error::Api(s)) if attempt == 0 && (s.code == 409 || s.code == 422) => {
                    let fresh = api
                        .get_opt(&name)
                        .await
                        .map_err(self.failed(domain, format!("{step} (reading it again)")))?;
                    match fresh {
                        Some(fresh) if fresh.uid().as_deref() == Some(uid.as_str()) => {
                            finalizers = fresh.finalizers().to_vec();
                            deleting = fresh.meta().deletion_timestamp.is_some();
                        }
                        _ => return Ok(!add),
                    }
                }
                Err(e) => return Err(self.failed(domain, step.to_string())(e)),
            }
        }
        Err(ControllerError::FinalizerRace {
            namespace,
            name,
            step,
        })
    }

    /// A JSON patch (`application/json-patch+json`) of the domain `name`.
    async fn json_patch(
        &self,
        api: &Api<ComputeDomain>,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<ComputeDomain, kube::Error> {
        let body = serde_json::to_vec(patch).map_err(kube::Error::SerdeError)?;
        let request = http::Request::builder()
            .method(http::Method::PATCH)
            .uri(format!("{}/{name}", api.resource_url()))
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .map_err(kube::Error::HttpError)?;
        self.client.request::<ComputeDomain>(request).await
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
                error = %crate::errors::error_chain(&e),
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
