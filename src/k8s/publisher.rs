//! Publishing this node's pool of ResourceSlices: list what the cluster holds, plan
//! ([`super::plan`]), write, and retry the whole round on transient failures.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use tokio::sync::{OnceCell, watch};

use super::backoff::Backoff;
use super::cluster::node_uid;
use super::compare::{self, DroppedField};
use super::error::{K8sError, Step};
use super::plan::{self, Delete, Write};
use crate::devices::DeviceModel;
use crate::errors::error_chain;
use crate::slices::{self, PoolOptions};

/// How the publisher retries and who it says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherOptions {
    /// Retries within one [`SlicePublisher::publish`] or [`SlicePublisher::unpublish`] call.
    pub retry: Backoff,
    /// Delays between failed rounds of [`SlicePublisher::run`] (its `attempts` is ignored:
    /// the background loop never gives up).
    pub background: Backoff,
    /// [`SlicePublisher::run`] re-publishes this often when nothing changed, to restore slices
    /// someone else deleted (the kubelet deletes a node's slices when it starts). At steady
    /// state a round is one LIST and no write. The rounds fall on the process's shared timer
    /// grid ([`crate::ticks`]: multiples of this period since its first timer), so the first
    /// one after a change may come sooner than a whole period. `None`: only on a new model.
    pub resync: Option<Duration>,
    /// Field manager recorded with every write.
    pub field_manager: String,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            retry: Backoff::default(),
            background: Backoff {
                initial: Duration::from_secs(5),
                max: Duration::from_secs(300),
                attempts: u32::MAX,
            },
            resync: Some(Duration::from_secs(60)),
            field_manager: "gpu-dra".to_string(),
        }
    }
}

/// What one publish wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishOutcome {
    /// The pool generation the cluster now holds (0 after unpublishing).
    pub generation: i64,
    /// Slices in the pool.
    pub slices: usize,
    /// Slices created, over all tries.
    pub created: usize,
    /// Slices updated, over all tries.
    pub updated: usize,
    /// Slices deleted, over all tries.
    pub deleted: usize,
    /// Tries it took (1 when the first succeeded).
    pub attempts: u32,
}

impl PublishOutcome {
    /// Whether nothing was written: the cluster already held the pool.
    pub fn wrote_nothing(&self) -> bool {
        self.created == 0 && self.updated == 0 && self.deleted == 0
    }
}

/// The latest result of the background loop, for health reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishStatus {
    /// Nothing published yet.
    Pending,
    /// The last round succeeded.
    Published(PublishOutcome),
    /// The last round failed; the loop tries again (after a delay when `transient`, else on
    /// the next model or resync).
    Failed {
        /// The error, with its causes.
        error: String,
        /// Whether it was transient.
        transient: bool,
        /// Rounds failed in a row.
        failures: u32,
    },
}

/// Publishes the ResourceSlices of one driver on one node. Cheap to clone; clones share the
/// Node lookup and the status.
#[derive(Clone)]
pub struct SlicePublisher {
    client: Client,
    driver: String,
    node: String,
    options: PublisherOptions,
    owner: Arc<OnceCell<OwnerReference>>,
    status: Arc<watch::Sender<PublishStatus>>,
    /// Fields the API server dropped from our writes (a feature gate off there): each warned
    /// about once, and no reason to rewrite a slice afterwards.
    warned_dropped: Arc<Mutex<BTreeSet<DroppedField>>>,
}

enum Job<'a> {
    Publish(&'a [ResourceSlice]),
    Unpublish,
}

impl SlicePublisher {
    /// A publisher for `driver`'s pool on `node` (the pool is named after the node) with
    /// default options. Sends nothing until called.
    pub fn new(client: Client, driver: impl Into<String>, node: impl Into<String>) -> Self {
        SlicePublisher {
            client,
            driver: driver.into(),
            node: node.into(),
            options: PublisherOptions::default(),
            owner: Arc::new(OnceCell::new()),
            status: Arc::new(watch::channel(PublishStatus::Pending).0),
            warned_dropped: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    /// The same publisher with other options.
    pub fn with_options(mut self, options: PublisherOptions) -> Self {
        self.options = options;
        self
    }

    /// Follows the background loop's results.
    pub fn status(&self) -> watch::Receiver<PublishStatus> {
        self.status.subscribe()
    }

    /// Makes the cluster hold exactly `model`'s slices for this node and driver.
    ///
    /// Guarantees: when the cluster already holds that content nothing is written; otherwise
    /// every slice carries the next pool generation and the new slice count, all written
    /// (created or updated) before any left-over is deleted, and every slice is owned by the
    /// Node (looked up once). Transient failures ([`K8sError::is_transient`]) restart the round
    /// from a fresh list after a backoff, up to `options.retry.attempts` tries.
    ///
    /// Fails with [`K8sError::BuildSlices`] when the model breaks an API limit, or the last
    /// request's error naming its step and slice: [`K8sError::Api`] with the server's message
    /// at once for a permanent refusal (422, 403, 404 Node), or after the last try.
    pub async fn publish(&self, model: &DeviceModel) -> Result<PublishOutcome, K8sError> {
        let desired = self.desired(model)?;
        self.retrying(Job::Publish(&desired)).await
    }

    /// Deletes every slice of this driver on this node (for shutdown), with the same retries.
    pub async fn unpublish(&self) -> Result<PublishOutcome, K8sError> {
        self.retrying(Job::Unpublish).await
    }

    /// Publishes every model `models` carries until its sender is dropped: at once, then on
    /// each change and every `options.resync`. A failed round is logged, shown in
    /// [`SlicePublisher::status`] and tried again after a growing delay (or at the next model
    /// when the model itself is at fault). Sending the same model again forces a round, e.g.
    /// after the kubelet re-registered the plugin.
    pub async fn run(&self, mut models: watch::Receiver<DeviceModel>) {
        let mut failures = 0u32;
        loop {
            // The desired slices (a copy of every device) are dropped once published, not
            // kept through the wait: at idle the model in the channel is the only copy.
            let result = {
                let desired = self.desired(&models.borrow_and_update());
                match desired {
                    Ok(desired) => self.retrying(Job::Publish(&desired)).await,
                    Err(e) => Err(e),
                }
            };
            let wait = match result {
                Ok(outcome) => {
                    failures = 0;
                    if !outcome.wrote_nothing() {
                        tracing::info!(
                            node = %self.node, driver = %self.driver,
                            generation = outcome.generation, slices = outcome.slices,
                            created = outcome.created, updated = outcome.updated,
                            deleted = outcome.deleted, "published ResourceSlices"
                        );
                    }
                    self.status.send_replace(PublishStatus::Published(outcome));
                    // On the shared timer grid: the resync wakes the plugin together with
                    // its 10 s rounds instead of on its own (`crate::ticks`).
                    self.options.resync.map(crate::ticks::next)
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let error = error_chain(&e);
                    let transient = e.is_transient();
                    tracing::warn!(
                        node = %self.node, driver = %self.driver, failures, transient,
                        error = %error, "publishing ResourceSlices failed"
                    );
                    self.status.send_replace(PublishStatus::Failed {
                        error,
                        transient,
                        failures,
                    });
                    match e {
                        K8sError::BuildSlices { .. } => None,
                        _ => Some(
                            tokio::time::Instant::now()
                                + self
                                    .options
                                    .background
                                    .delay_after(failures, e.retry_after()),
                        ),
                    }
                }
            };
            tokio::select! {
                changed = models.changed() => if changed.is_err() { return },
                () = sleep_or_forever(wait) => {}
            }
        }
    }

    fn desired(&self, model: &DeviceModel) -> Result<Vec<ResourceSlice>, K8sError> {
        let pool = PoolOptions {
            driver_name: self.driver.clone(),
            node_name: self.node.clone(),
            generation: 0,
        };
        slices::build(model, &pool).map_err(|source| K8sError::BuildSlices {
            node: self.node.clone(),
            source,
        })
    }

    async fn retrying(&self, job: Job<'_>) -> Result<PublishOutcome, K8sError> {
        let mut outcome = PublishOutcome::default();
        loop {
            outcome.attempts += 1;
            let result = match job {
                Job::Publish(desired) => self.reconcile(desired, &mut outcome).await,
                Job::Unpublish => self.delete_all(&mut outcome).await,
            };
            match result {
                Ok(()) => return Ok(outcome),
                Err(e) if e.is_transient() && self.options.retry.may_retry(outcome.attempts) => {
                    let delay = self
                        .options
                        .retry
                        .delay_after(outcome.attempts, e.retry_after());
                    tracing::debug!(
                        node = %self.node, attempt = outcome.attempts, ?delay,
                        error = %error_chain(&e), "transient API error, retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One round: list, plan, write, delete left-overs.
    async fn reconcile(
        &self,
        desired: &[ResourceSlice],
        outcome: &mut PublishOutcome,
    ) -> Result<(), K8sError> {
        let owner = self.owner().await?;
        let existing = self.list().await?;
        // Fields the server dropped from earlier writes are not written again for that.
        let dropped = self
            .warned_dropped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let plan = plan::plan_ignoring(desired, &existing, &self.node, owner, &dropped);
        outcome.generation = plan.generation;
        outcome.slices = desired.len();
        let api = self.api();
        let params = PostParams {
            dry_run: false,
            field_manager: Some(self.options.field_manager.clone()),
        };
        for write in &plan.writes {
            let name = write.slice().metadata.name.clone().unwrap_or_default();
            match write {
                Write::Create(slice) => {
                    let stored = api
                        .create(&params, slice)
                        .await
                        .map_err(|e| K8sError::from_kube(Step::CreateSlice { name }, e))?;
                    self.warn_dropped(slice, &stored);
                    outcome.created += 1;
                }
                Write::Update(slice) => {
                    let stored = api
                        .replace(&name, &params, slice)
                        .await
                        .map_err(|e| K8sError::from_kube(Step::UpdateSlice { name }, e))?;
                    self.warn_dropped(slice, &stored);
                    outcome.updated += 1;
                }
            }
        }
        for delete in &plan.deletes {
            if self.delete(delete).await? {
                outcome.deleted += 1;
            }
        }
        Ok(())
    }

    /// Warns, once per field for the life of the publisher, about each field of `written`
    /// that the API server did not store because its feature gate is off there: the scheduler
    /// does not see it (shares of a GPU, taints, counters), and re-publishing cannot help.
    fn warn_dropped(&self, written: &ResourceSlice, stored: &ResourceSlice) {
        let dropped = compare::dropped_by_server(&written.spec, &stored.spec);
        if dropped.is_empty() {
            return;
        }
        let mut warned = self
            .warned_dropped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for field in dropped {
            if warned.insert(field) {
                tracing::warn!(
                    node = %self.node, driver = %self.driver,
                    slice = written.metadata.name.as_deref().unwrap_or_default(),
                    field = field.field, feature_gate = field.gate,
                    "the API server dropped a field of the published ResourceSlice: turn its \
                     feature gate on (kube-apiserver and kube-scheduler) or the scheduler \
                     ignores it; the slice is not rewritten for it"
                );
            }
        }
    }

    async fn delete_all(&self, outcome: &mut PublishOutcome) -> Result<(), K8sError> {
        for slice in self.list().await? {
            let delete = Delete {
                name: slice.metadata.name.unwrap_or_default(),
                uid: slice.metadata.uid,
            };
            if self.delete(&delete).await? {
                outcome.deleted += 1;
            }
        }
        Ok(())
    }

    /// Deletes one slice; `false` when it was already gone.
    async fn delete(&self, delete: &Delete) -> Result<bool, K8sError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: delete.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api().delete(&delete.name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(K8sError::from_kube(
                Step::DeleteSlice {
                    name: delete.name.clone(),
                },
                e,
            )),
        }
    }

    async fn list(&self) -> Result<Vec<ResourceSlice>, K8sError> {
        let selector = format!("spec.nodeName={},spec.driver={}", self.node, self.driver);
        let list = self
            .api()
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| {
                let step = Step::ListSlices {
                    node: self.node.clone(),
                    driver: self.driver.clone(),
                };
                K8sError::from_kube(step, e)
            })?;
        Ok(list.items)
    }

    async fn owner(&self) -> Result<&OwnerReference, K8sError> {
        self.owner
            .get_or_try_init(|| async {
                let uid = node_uid(&self.client, &self.node).await?;
                Ok(plan::node_owner(&self.node, &uid))
            })
            .await
    }

    fn api(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }
}

async fn sleep_or_forever(until: Option<tokio::time::Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
