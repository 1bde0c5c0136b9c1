//! `gpu-dra compute-domain-controller`: the cluster-wide controller of `ComputeDomain`s.
//!
//! For each domain it puts a finalizer on it, creates the workload's ResourceClaimTemplate
//! (in the domain's namespace, owned by the domain), the IMEX daemons' ResourceClaimTemplate
//! and DaemonSet (in the driver's namespace, labelled with the domain's UID), and aggregates
//! the domain's `ComputeDomainNode` objects into its status ([`status`]). When the domain is
//! deleted it deletes those objects, waits until the domain's IMEX daemons stopped (or a
//! bounded time), deletes the node objects and the nodes' domain labels, then removes the
//! finalizer ([`cleanup`]). Every resync it also sweeps node objects and node labels of
//! domains that no longer exist.
//!
//! It watches `ComputeDomain`s (every namespace) and `ComputeDomainNode`s (the driver's
//! namespace) into in-memory stores, keeping of each object what it reads (managed fields and
//! kubectl's last-applied copy of the spec are dropped); nothing it watches grows with the
//! cluster's nodes, only with the nodes that joined a domain. A change marks its domain dirty
//! and one worker
//! reconciles dirty domains one at a time, so a burst of node updates (64 daemons turning
//! Ready) coalesces into few status writes. The status is the controller's alone: it is
//! written as a merge patch of the status subresource only when it changed, so it never
//! conflicts. With leader election (the default) only the holder of a Lease acts; see
//! [`leader`].
//!
//! With `--binding-conditions` it also watches ResourceClaims (every namespace, keeping of a
//! claim its identity, and its status only when it has a channel with binding conditions:
//! [`binding::trim_claim`]) and holds the pods of a domain in the scheduler's PreBind until
//! their node's IMEX daemon is Ready, or fails them over to another node; see [`binding`].

pub mod binding;
pub mod cleanup;
pub mod deleting;
pub mod desired;
pub mod error;
pub mod finalizer;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod status;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::api::Api;
use kube::core::ResourceExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::compute_domain::api::{self, ComputeDomain, ComputeDomainNode};
pub use desired::Settings;
pub use error::ControllerError;
pub use reconcile::{DAEMON_STOP_WAIT, Outcome, Reconciler, Writes};

/// Name of the controller's Lease in its namespace.
pub const LEASE_NAME: &str = "gpu-dra-compute-domain-controller";

/// The default of [`ControllerConfig::resync_period`].
pub const RESYNC_PERIOD: Duration = Duration::from_secs(300);

/// Seconds a watch request lasts before it is renewed: under the client's 30 s read
/// timeout, so a quiet watch ends cleanly instead of timing out.
const WATCH_TIMEOUT_SECS: u32 = 25;

/// What `gpu-dra compute-domain-controller` needs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Kubeconfig file; the in-cluster configuration when `None`.
    pub kubeconfig: Option<PathBuf>,
    /// How the created objects look and where the driver's objects live.
    pub settings: Settings,
    /// Elect a leader with a Lease in `settings.namespace` (off: act at once, for a single
    /// replica).
    pub leader_election: bool,
    /// This replica's identity in the Lease (the pod name).
    pub identity: String,
    /// The election's timing.
    pub timing: leader::Timing,
    /// Time before a failed reconcile of a domain is retried (doubling up to 5 min).
    pub retry_after: Duration,
    /// Address (`host:port`) serving `/metrics` and `/healthz`; none when `None`.
    pub metrics_addr: Option<String>,
    /// Every domain is reconciled again this often even without a change, and its objects
    /// checked again (one deleted by hand is re-created); leftovers of deleted domains are
    /// swept then too. [`RESYNC_PERIOD`] by default.
    pub resync_period: Duration,
    /// How long the clean-up of a deleted domain waits for its IMEX daemons to stop
    /// ([`DAEMON_STOP_WAIT`] by default).
    pub daemon_stop_wait: Duration,
    /// `(namespace, name)` of the controller's own pod (`POD_NAMESPACE`, `POD_NAME`): when
    /// `settings.image` is empty, the IMEX daemons run that pod's image.
    pub own_pod: Option<(String, String)>,
    /// `--binding-conditions`: set `IMEXDaemonReady` / `IMEXDaemonFailed` on claims allocated
    /// a channel that carries them ([`binding`]); off: ResourceClaims are not even watched.
    pub binding_conditions: bool,
    /// `--binding-timeout`: how long a pending channel waits for its node's daemon
    /// ([`binding::BINDING_TIMEOUT`] by default).
    pub binding_timeout: Duration,
}

/// The name of the controller's container in the chart's Deployment: its image is the IMEX
/// daemons' when `--image` is not given (else the pod's first container's).
pub const CONTROLLER_CONTAINER: &str = "controller";

/// Runs the controller until `shutdown` is cancelled (then `Ok`, after giving up the Lease)
/// or leadership is lost (then [`ControllerError::LostLease`]: the process should exit and be
/// restarted as a follower, as client-go's controllers do).
///
/// # Errors
/// [`ControllerError::Connect`] when no client can be built; [`ControllerError::NoImage`],
/// [`ControllerError::OwnPod`] or [`ControllerError::OwnPodNoImage`] when no image is given
/// and the own pod's cannot be read; [`ControllerError::LostLease`];
/// [`ControllerError::WatchEnded`] if a watch stream ends. API errors while reconciling are
/// retried, not returned.
pub async fn run(
    config: ControllerConfig,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    let client = crate::k8s::connect(config.kubeconfig.as_deref())
        .await
        .map_err(ControllerError::Connect)?;
    run_with_client(client, config, shutdown).await
}

/// [`run`] until SIGTERM or SIGINT, what the binary does.
///
/// # Errors
/// As [`run`].
pub async fn run_until_signalled(config: ControllerConfig) -> Result<(), ControllerError> {
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        on_signal.cancel();
    });
    run(config, shutdown).await
}

/// [`run`] with a client already built.
///
/// # Errors
/// As [`run`].
pub async fn run_with_client(
    client: Client,
    mut config: ControllerConfig,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    if config.settings.image.is_empty() {
        let (namespace, name) = config.own_pod.clone().ok_or(ControllerError::NoImage)?;
        config.settings.image = own_image(&client, &namespace, &name).await?;
        tracing::info!(image = %config.settings.image, pod = %name, "the IMEX daemons run the controller's own image");
    }
    let reconciler = Arc::new(
        Reconciler::new(client.clone(), config.settings.clone())
            .with_daemon_stop_wait(config.daemon_stop_wait),
    );
    let stats = reconciler.stats();
    let _metrics = match &config.metrics_addr {
        Some(addr) => Some(AbortOnDrop(metrics::serve(addr, stats.clone()).await?)),
        None => None,
    };
    let binding = config.binding_conditions.then_some(config.binding_timeout);
    if !config.leader_election {
        return tokio::select! {
            r = lead(client, reconciler, config.retry_after, config.resync_period, binding) => r,
            _ = shutdown.cancelled() => Ok(()),
        };
    }
    let mut elector = leader::Elector::new(
        client.clone(),
        &config.settings.namespace,
        LEASE_NAME,
        &config.identity,
        config.timing,
    );
    tokio::select! {
        _ = elector.acquire() => {}
        _ = shutdown.cancelled() => return Ok(()),
    }
    stats
        .leader
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let outcome = tokio::select! {
        lost = elector.keep_renewing() => Err(lost),
        r = lead(client, reconciler, config.retry_after, config.resync_period, binding) => r,
        _ = shutdown.cancelled() => Ok(()),
    };
    stats
        .leader
        .store(false, std::sync::atomic::Ordering::Relaxed);
    if outcome.is_ok() {
        elector.release().await;
    }
    outcome
}

/// The image of the controller's pod `namespace/name`: its [`CONTROLLER_CONTAINER`]'s, else
/// its first container's. One GET (RBAC: `pods` `get` in its namespace).
///
/// # Errors
/// [`ControllerError::OwnPod`] when the pod cannot be read, [`ControllerError::OwnPodNoImage`]
/// when no container names an image.
pub async fn own_image(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<String, ControllerError> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods
        .get(name)
        .await
        .map_err(|source| ControllerError::OwnPod {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        })?;
    image_of(&pod).ok_or_else(|| ControllerError::OwnPodNoImage {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// The image of `pod`'s [`CONTROLLER_CONTAINER`], else of its first container; `None` when
/// that container names none.
pub fn image_of(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| &s.containers[..])
        .unwrap_or_default();
    containers
        .iter()
        .find(|c| c.name == CONTROLLER_CONTAINER)
        .or(containers.first())
        .and_then(|c| c.image.clone())
        .filter(|image| !image.is_empty())
}

/// Stops the metrics server with the controller.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Domains waiting for a reconcile; a domain marked twice before it is taken is reconciled
/// once.
#[derive(Default)]
struct Dirty {
    keys: Mutex<BTreeSet<(String, String)>>,
    wake: tokio::sync::Notify,
}

impl Dirty {
    fn mark(&self, key: (String, String)) {
        let inserted = self
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
        if inserted {
            self.wake.notify_one();
        }
    }

    fn take(&self) -> BTreeSet<(String, String)> {
        std::mem::take(&mut *self.keys.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// `(namespace, name)` of a domain: the key of [`Dirty`].
fn domain_key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_string(), name.to_string())
}

fn store_key(key: &(String, String)) -> ObjectRef<ComputeDomain> {
    ObjectRef::new_with(&key.1, api::compute_domain_resource()).within(&key.0)
}

fn mark_all(dirty: &Dirty, domains: &Store<ComputeDomain>) {
    for domain in domains.state() {
        dirty.mark(domain_key(
            &domain.namespace().unwrap_or_default(),
            &domain.name_any(),
        ));
    }
}

/// The leader's work: watch, and reconcile what changed; with `binding` (the
/// `--binding-timeout`) also the binding conditions of pending channels. Returns only if a
/// watch ends.
async fn lead(
    client: Client,
    reconciler: Arc<Reconciler>,
    retry_after: Duration,
    resync_period: Duration,
    binding: Option<Duration>,
) -> Result<(), ControllerError> {
    let namespace = reconciler_namespace(&reconciler);
    let dirty = Arc::new(Dirty::default());
    let domain_writer = reflector::store::Writer::new(api::compute_domain_resource());
    let domains = domain_writer.as_reader();
    let node_writer = reflector::store::Writer::new(api::compute_domain_node_resource());
    let nodes = node_writer.as_reader();

    let domain_api: Api<ComputeDomain> =
        Api::all_with(client.clone(), &api::compute_domain_resource());
    let wc = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let domain_events = reflector::reflector(
        domain_writer,
        watcher::watcher(domain_api, wc.clone())
            .default_backoff()
            .modify(trim_domain),
    );
    let node_api: Api<ComputeDomainNode> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &api::compute_domain_node_resource(),
    );
    let node_events = reflector::reflector(
        node_writer,
        watcher::watcher(node_api, wc.labels(api::DOMAIN_UID_LABEL))
            .default_backoff()
            .modify(|n: &mut ComputeDomainNode| trim_meta(&mut n.metadata)),
    );

    let mark_domains = {
        let dirty = dirty.clone();
        async move {
            let mut events = std::pin::pin!(domain_events.touched_objects());
            while let Some(event) = events.next().await {
                match event {
                    Ok(domain) => dirty.mark(domain_key(
                        &domain.namespace().unwrap_or_default(),
                        &domain.name_any(),
                    )),
                    Err(e) => {
                        tracing::warn!(error = %crate::errors::error_chain(&e), "watching ComputeDomains")
                    }
                }
            }
            ControllerError::WatchEnded {
                resource: api::COMPUTE_DOMAIN_PLURAL,
            }
        }
    };
    let binding_wake = Arc::new(tokio::sync::Notify::new());
    let mark_nodes = {
        let dirty = dirty.clone();
        let binding_wake = binding_wake.clone();
        async move {
            let mut events = std::pin::pin!(node_events.touched_objects());
            while let Some(event) = events.next().await {
                match event {
                    Ok(node) => {
                        dirty.mark(domain_key(
                            &node.spec.domain_namespace,
                            &node.spec.domain_name,
                        ));
                        binding_wake.notify_one();
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::errors::error_chain(&e), "watching ComputeDomainNodes")
                    }
                }
            }
            ControllerError::WatchEnded {
                resource: api::COMPUTE_DOMAIN_NODE_PLURAL,
            }
        }
    };
    let bind = {
        let (client, reconciler) = (client.clone(), reconciler.clone());
        let (domains, nodes, wake) = (domains.clone(), nodes.clone(), binding_wake.clone());
        async move {
            match binding {
                Some(timeout) => bind(client, reconciler, domains, nodes, wake, timeout).await,
                None => std::future::pending().await,
            }
        }
    };
    let work = work(
        reconciler,
        domains,
        nodes,
        dirty.clone(),
        retry_after,
        resync_period,
    );
    tokio::select! {
        e = mark_domains => Err(e),
        e = mark_nodes => Err(e),
        e = bind => Err(e),
        () = work => Ok(()),
    }
}

/// Longest pause between two binding passes while a channel waits (its timeout is checked
/// then at the latest); events (a claim or node object changed) start a pass at once.
const BINDING_RECHECK: Duration = Duration::from_secs(1);

/// The binding conditions' loop: watches ResourceClaims and runs a [`binding::Binder`] pass
/// whenever a claim or node object changed, and at the next timeout of a waiting channel.
/// Returns only if the claims' watch ends.
async fn bind(
    client: Client,
    reconciler: Arc<Reconciler>,
    domains: Store<ComputeDomain>,
    nodes: Store<ComputeDomainNode>,
    wake: Arc<tokio::sync::Notify>,
    timeout: Duration,
) -> ControllerError {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claim_writer = reflector::store::Writer::<ResourceClaim>::default();
    let claims = claim_writer.as_reader();
    let claim_api: Api<ResourceClaim> = Api::all(client.clone());
    let wc = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let claim_events = reflector::reflector(
        claim_writer,
        watcher::watcher(claim_api, wc)
            .default_backoff()
            .modify(binding::trim_claim),
    );
    let mark_claims = {
        let wake = wake.clone();
        async move {
            let mut events = std::pin::pin!(claim_events.touched_objects());
            while let Some(event) = events.next().await {
                match event {
                    Ok(_) => wake.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %crate::errors::error_chain(&e), "watching ResourceClaims")
                    }
                }
            }
            ControllerError::WatchEnded {
                resource: "resourceclaims",
            }
        }
    };
    let namespace = reconciler_namespace(&reconciler);
    let mut binder = binding::Binder::new(client, &namespace, timeout, reconciler.stats());
    let passes = async move {
        if claims.wait_until_ready().await.is_err()
            || domains.wait_until_ready().await.is_err()
            || nodes.wait_until_ready().await.is_err()
        {
            return;
        }
        loop {
            let live: BTreeSet<String> = domains
                .state()
                .iter()
                .filter(|d| d.metadata.deletion_timestamp.is_none())
                .filter_map(|d| d.uid())
                .collect();
            let by_name: std::collections::BTreeMap<String, Arc<ComputeDomainNode>> = nodes
                .state()
                .into_iter()
                .map(|n| (n.name_any(), n))
                .collect();
            let all = claims.state();
            let next = binder.pass(&all, &by_name, &live).await;
            let pause = match next {
                Some(deadline) => deadline
                    .saturating_duration_since(std::time::Instant::now())
                    .min(BINDING_RECHECK),
                None if binder.memory.released.is_empty() => RESYNC_PERIOD,
                None => BINDING_RECHECK,
            };
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    };
    tokio::select! {
        e = mark_claims => e,
        () = passes => std::future::pending().await,
    }
}

/// The annotation `kubectl apply` keeps a copy of the applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the stores keep of an object's metadata: no managed fields (one entry per writer,
/// often as large as the object) and no `kubectl apply` copy; nothing here reads them.
fn trim_meta(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

fn trim_domain(domain: &mut ComputeDomain) {
    trim_meta(&mut domain.metadata);
}

fn reconciler_namespace(reconciler: &Reconciler) -> String {
    reconciler.settings().namespace.clone()
}

/// The worker: once both stores are complete, reconciles dirty domains one at a time, every
/// domain every `resync_period`, and a failed one again after a doubling delay.
async fn work(
    reconciler: Arc<Reconciler>,
    domains: Store<ComputeDomain>,
    nodes: Store<ComputeDomainNode>,
    dirty: Arc<Dirty>,
    retry_after: Duration,
    resync_period: Duration,
) {
    // A status computed before every node object is known would drop nodes.
    if domains.wait_until_ready().await.is_err() || nodes.wait_until_ready().await.is_err() {
        return;
    }
    mark_all(&dirty, &domains);
    let mut failures: std::collections::BTreeMap<(String, String), u32> = Default::default();
    let mut resync = tokio::time::interval(resync_period.max(Duration::from_millis(10)));
    resync.tick().await;
    loop {
        let keys = dirty.take();
        if keys.is_empty() {
            tokio::select! {
                () = dirty.wake.notified() => {}
                _ = resync.tick() => {
                    reconciler.forget_ensured();
                    mark_all(&dirty, &domains);
                    let known: BTreeSet<String> =
                        domains.state().iter().filter_map(|d| d.uid()).collect();
                    let all = nodes.state();
                    let all: Vec<&ComputeDomainNode> = all.iter().map(|n| &**n).collect();
                    reconciler.sweep(&known, &all).await;
                }
            }
            continue;
        }
        for key in keys {
            let Some(domain) = domains.get(&store_key(&key)) else {
                failures.remove(&key);
                continue;
            };
            let uid = domain.uid().unwrap_or_default();
            let mine: Vec<Arc<ComputeDomainNode>> = nodes.state_filter(|n| {
                n.spec.domain_uid == uid && n.labels().get(api::DOMAIN_UID_LABEL) == Some(&uid)
            });
            let mine: Vec<&ComputeDomainNode> = mine.iter().map(|n| &**n).collect();
            let span = tracing::info_span!(
                "reconcile",
                domain.namespace = %key.0,
                domain.name = %key.1,
                domain.uid = %uid,
            );
            let stats = reconciler.stats();
            stats
                .reconciles
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match reconciler.reconcile(&domain, &mine).instrument(span).await {
                Ok(Outcome::Done) => {
                    failures.remove(&key);
                }
                Ok(Outcome::Again(delay)) => {
                    failures.remove(&key);
                    let dirty = dirty.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        dirty.mark(key);
                    });
                }
                Err(e) => {
                    stats
                        .reconcile_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let n = failures.entry(key.clone()).or_insert(0);
                    *n += 1;
                    let delay = retry_after
                        .saturating_mul(1 << (*n - 1).min(10))
                        .min(Duration::from_secs(300));
                    tracing::warn!(
                        domain.namespace = %key.0,
                        domain.name = %key.1,
                        domain.uid = %uid,
                        error = %crate::errors::error_chain(&e),
                        retry_in = ?delay,
                        "reconcile failed"
                    );
                    let dirty = dirty.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        dirty.mark(key);
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

    fn pod(containers: &[(&str, Option<&str>)]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: containers
                    .iter()
                    .map(|(name, image)| Container {
                        name: name.to_string(),
                        image: image.map(str::to_string),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_own_image_is_the_controller_containers_else_the_first_containers() {
        let with_sidecar = pod(&[
            ("log-shipper", Some("busybox:1")),
            ("controller", Some("gpu-dra:2")),
        ]);
        assert_eq!(image_of(&with_sidecar).as_deref(), Some("gpu-dra:2"));
        let renamed = pod(&[("main", Some("gpu-dra:3")), ("other", Some("x:1"))]);
        assert_eq!(image_of(&renamed).as_deref(), Some("gpu-dra:3"));
        assert_eq!(image_of(&pod(&[("controller", None)])), None);
        assert_eq!(image_of(&pod(&[])), None);
    }
}
