//! Prepare and unprepare of compute-domain claims, and start-up recovery.
//!
//! A channel claim waits for the node's IMEX daemon, which cannot start before the node is
//! labelled for the domain and its own (daemon) claim is prepared by this same plugin. The
//! kubelet's calls run one at a time under the plugin lock, so the label and the wait happen
//! in [`DraHandler::prefetch`], outside the lock: a waiting channel never holds up the daemon
//! claim it waits for. Under the lock, [`CdHandler::prepare`] records the claim in the
//! checkpoint before any effect, writes the files, and records it prepared.
//!
//! With host-managed IMEX (`--imex-mode HostManaged`) there is no daemon to wait for: no
//! label is set, daemon claims are refused, every channel claim gets channel 0, and a channel
//! is handed out only when the host's `nvidia-imex-ctl -q` answers `READY` (asked under the
//! lock, at each prepare).
//!
//! The node label is the domain's for the domain's lifetime: the first channel prepared on the
//! node sets it, and no unprepare removes it, so a job whose pods restart one at a time keeps
//! its IMEX daemon on the node in between. The controller removes it when the domain is
//! deleted (and sweeps labels of domains that no longer exist). A channel of another domain
//! is refused while the labelled domain exists; a label naming a domain that no longer exists
//! is taken over.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::cdi::{self as cd_cdi, CdiError, ChannelNodes};
use super::cluster::{ClusterError, DomainCluster};
use super::config::{HostImex, ImexMode};
use super::imex::{self, DomainNames};
use super::plan::{self, ClaimPlan, PlanError};
use super::state::{self, Checkpoint, ClaimKind, ClaimRecord, Phase, RecordedDevice, StateError};
use crate::cdi::CdiWriter;
use crate::claims::metadata;
use crate::compute_domain::api::{self, AllocationMode};
use crate::errors::error_chain;
use crate::fsutil::{self, FsError};
use crate::k8s::AllocatedClaim;
use crate::kubelet::{ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults};

/// Why a claim could not be prepared or unprepared; the text reaches the pod's events.
#[derive(Debug, thiserror::Error)]
pub enum CdClaimError {
    /// Reading the claim or asking the API server failed.
    #[error("asking the API server")]
    Cluster(#[source] ClusterError),
    /// The claim's allocation or config is not usable.
    #[error("the claim's allocation or opaque config")]
    Plan(#[source] PlanError),
    /// The node is labelled for another domain, which still exists.
    #[error(
        "node {node} already serves ComputeDomain {other} (label {label}={other}), so it \
         cannot join ComputeDomain {domain}: a node serves one ComputeDomain at a time, from \
         the first channel prepared on it until that domain is deleted; the claim can be \
         prepared once ComputeDomain {other} is deleted (or schedule the pod elsewhere)",
        label = api::NODE_LABEL
    )]
    OtherDomain {
        /// This node.
        node: String,
        /// The claim's domain.
        domain: String,
        /// The domain the node serves.
        other: String,
    },
    /// The node's IMEX daemon did not turn Ready in time.
    #[error(transparent)]
    NotReady(Box<NotReady>),
    /// A daemon claim on a node whose GPUs are in no NVLink clique.
    #[error(
        "node {node} is in no NVLink clique (no GPU reports a completed fabric registration \
         with a cluster UUID), so it cannot run an IMEX daemon; run ComputeDomains on \
         multi-node NVLink nodes, or set --clique-id if NVML cannot report the fabric"
    )]
    NoClique {
        /// This node.
        node: String,
    },
    /// The daemon claim's domain does not exist.
    #[error("no ComputeDomain has uid {uid}: it was deleted, or the claim names another cluster's")]
    DomainNotFound {
        /// The UID.
        uid: String,
    },
    /// A CDI spec could not be built.
    #[error("building the CDI spec")]
    Cdi(#[source] CdiError),
    /// A CDI spec could not be written or removed.
    #[error("writing or removing the CDI spec")]
    Spec(#[source] crate::cdi::WriterError),
    /// The claim's device metadata files could not be written or removed.
    #[error("the claim's device metadata")]
    Metadata(#[source] Box<crate::claims::metadata::MetadataError>),
    /// The daemon's config directory could not be written or removed.
    #[error("{step} the IMEX config in {path}")]
    Config {
        /// `writing` / `removing`.
        step: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: FsError,
    },
    /// The checkpoint could not be read or written.
    #[error("the checkpoint of prepared claims")]
    State(#[source] StateError),
    /// Host-managed IMEX: the host's `nvidia-imex` service did not answer `READY`.
    #[error(
        "IMEX on node {node} is host-managed (--imex-mode HostManaged), but the host's \
         nvidia-imex service is not ready: `{command}` {answer}; start the nvidia-imex service \
         on the node (systemctl enable --now nvidia-imex) with IMEX_CMD_ENABLED=1 and \
         IMEX_CMD_UNIX_DOMAIN_PATH={socket} in /etc/nvidia-imex/config.cfg, and wait until \
         `nvidia-imex-ctl -q --u={socket}` answers READY (or set computeDomains.imex.mode to \
         DriverManaged); the kubelet retries"
    )]
    HostImexNotReady {
        /// This node.
        node: String,
        /// The query as run.
        command: String,
        /// What it answered, or why it could not.
        answer: String,
        /// The service's command socket.
        socket: String,
    },
    /// Host-managed IMEX: a daemon claim, which only driver-managed IMEX uses.
    #[error(
        "IMEX on node {node} is host-managed (--imex-mode HostManaged): the host's nvidia-imex \
         service serves every ComputeDomain, so no IMEX daemon claim is prepared; remove the \
         daemon claim, or set computeDomains.imex.mode to DriverManaged"
    )]
    HostManagedDaemon {
        /// This node.
        node: String,
    },
}

/// The node's IMEX daemon of a domain did not turn Ready within the wait.
#[derive(Debug, thiserror::Error)]
#[error(
    "the IMEX daemon of ComputeDomain {domain} on node {node} is not ready after {waited_s} s: \
     {why}; its status is ComputeDomainNode {namespace}/{object} \
     (kubectl -n {namespace} get computedomainnodes {object} -o yaml); the kubelet retries"
)]
pub struct NotReady {
    /// The domain.
    pub domain: String,
    /// This node.
    pub node: String,
    /// How long the prepare waited.
    pub waited_s: u64,
    /// The daemon's reason and message, or what kept the plugin from reading them.
    pub why: String,
    /// The driver namespace.
    pub namespace: String,
    /// The object's name.
    pub object: String,
}

/// The effects and settings a [`CdHandler`] works with.
pub struct CdHandlerParts<C> {
    /// The API server.
    pub cluster: C,
    /// This node.
    pub node: String,
    /// The driver namespace (of the `ComputeDomainNode` objects).
    pub namespace: String,
    /// Checkpoint and config directories.
    pub state_dir: PathBuf,
    /// The CDI writer (compute-domain naming).
    pub cdi: CdiWriter,
    /// Where channel device nodes come from.
    pub channels: ChannelNodes,
    /// The node's clique, if any.
    pub clique: Option<String>,
    /// Devices published per kind.
    pub max_domains: u32,
    /// How long a channel prepare waits for the daemon.
    pub ready_timeout: Duration,
    /// Per-domain daemons, or the host's IMEX service.
    pub imex_mode: ImexMode,
    /// How the host's IMEX service is asked (host-managed mode).
    pub host_imex: HostImex,
    /// Where the request path's costs are counted (`gpu_dra_request_path_costs_total`).
    pub metrics: crate::metrics::Metrics,
    /// Device metadata files (KEP-5304) for every prepared claim; `None`: none written.
    pub metadata: Option<crate::claims::metadata::MetadataWriter>,
}

/// The compute-domain plugin's [`DraHandler`].
pub struct CdHandler<C> {
    parts: CdHandlerParts<C>,
    /// Claims read (and, for channels, waited for) ahead of the lock, by UID.
    prefetched: Mutex<HashMap<String, Prefetched>>,
    /// Held from reading the node label to setting it: read-aheads of several pods run at
    /// once, and without it two domains could both find the node free and both label it
    /// (the later PATCH winning), or one domain's pods would each PATCH the same label.
    labelling: tokio::sync::Mutex<()>,
}

struct Prefetched {
    claim: Result<AllocatedClaim, String>,
    /// For a channel claim: whether the daemon turned Ready (and the label held).
    ready: Option<Result<(), String>>,
    /// When the read-ahead finished.
    at: Instant,
}

/// A read-ahead older than this was abandoned (its kubelet call went away before taking
/// the lock) and is forgotten. Longer than any prepare call lives.
const ABANDONED_AFTER: Duration = Duration::from_secs(120);

/// How long `nvidia-imex-ctl -q` may take in host-managed mode (it answers at once).
const HOST_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The directory of a domain's IMEX config under the state directory.
pub fn config_dir(state_dir: &Path, domain_uid: &str) -> PathBuf {
    state_dir.join("compute-domains").join(domain_uid)
}

impl<C: DomainCluster> CdHandler<C> {
    /// A handler over `parts`.
    pub fn new(parts: CdHandlerParts<C>) -> Self {
        CdHandler {
            parts,
            prefetched: Mutex::default(),
            labelling: tokio::sync::Mutex::default(),
        }
    }

    fn load(&self) -> Result<Checkpoint, CdClaimError> {
        state::load(&self.parts.state_dir).map_err(CdClaimError::State)
    }

    fn store(&self, checkpoint: &Checkpoint) -> Result<(), CdClaimError> {
        state::store(&self.parts.state_dir, checkpoint).map_err(CdClaimError::State)
    }

    fn take_prefetched(&self, uid: &str) -> Option<Prefetched> {
        self.prefetched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid)
    }

    /// Labels the node for `domain` unless it already is. A node labelled for another domain
    /// is refused while that domain exists; its label is taken over when it does not (a
    /// channel prepared just as that domain's clean-up finished left it). One GET, a PATCH
    /// when it labels, and a LIST of domains only on a conflict.
    async fn ensure_label(&self, domain: &str) -> Result<(), CdClaimError> {
        let _labelling = self.labelling.lock().await;
        let cluster = &self.parts.cluster;
        let current = cluster.node_label().await.map_err(CdClaimError::Cluster)?;
        match current {
            Some(uid) if uid == domain => return Ok(()),
            Some(other) => {
                let exists = cluster
                    .find_domain(&other)
                    .await
                    .map_err(CdClaimError::Cluster)?
                    .is_some();
                if exists {
                    return Err(CdClaimError::OtherDomain {
                        node: self.parts.node.clone(),
                        domain: domain.to_string(),
                        other,
                    });
                }
                tracing::info!(node = %self.parts.node, stale = %other, domain = %domain, "the node's label named a ComputeDomain that no longer exists; taking it over");
            }
            None => {}
        }
        cluster
            .set_node_label(domain)
            .await
            .map_err(CdClaimError::Cluster)
    }

    /// Polls the node's `ComputeDomainNode` of `domain` until it is Ready, for at most
    /// `timeout` (zero: one look).
    async fn wait_ready(&self, domain: &str, timeout: Duration) -> Result<(), CdClaimError> {
        let start = Instant::now();
        let mut interval = Duration::from_millis(100);
        loop {
            let why = match self.parts.cluster.domain_node(domain).await {
                Ok(node) => match imex::readiness(node.as_ref()) {
                    Ok(()) => return Ok(()),
                    Err(why) => why,
                },
                Err(e) => error_chain(&e),
            };
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(CdClaimError::NotReady(Box::new(NotReady {
                    domain: domain.to_string(),
                    node: self.parts.node.clone(),
                    waited_s: start.elapsed().as_secs(),
                    why,
                    namespace: self.parts.namespace.clone(),
                    object: api::compute_domain_node_name(domain, &self.parts.node),
                })));
            }
            tokio::time::sleep(interval.min(left)).await;
            interval = (interval * 2).min(Duration::from_secs(1));
        }
    }

    /// Host-managed IMEX: whether the host's service answers `READY` to `nvidia-imex-ctl -q`.
    async fn host_ready(&self) -> Result<(), CdClaimError> {
        let host = &self.parts.host_imex;
        imex::host_ready(host, HOST_QUERY_TIMEOUT)
            .await
            .map_err(|answer| {
                let (program, args) = imex::host_query(host);
                CdClaimError::HostImexNotReady {
                    node: self.parts.node.clone(),
                    command: format!("{} {}", program.display(), args.join(" ")),
                    answer,
                    socket: host.socket.display().to_string(),
                }
            })
    }

    /// Drops read-aheads whose call went away.
    fn purge_abandoned(&self) {
        let mut prefetched = self.prefetched.lock().unwrap_or_else(|p| p.into_inner());
        let limit = ABANDONED_AFTER + self.parts.ready_timeout;
        prefetched.retain(|_, p| p.at.elapsed() <= limit);
    }

    async fn prefetch_one(&self, claim: &ClaimRef) {
        self.purge_abandoned();
        // A claim prepared before (the kubelet asks again after it restarts) is answered
        // from the checkpoint under the lock: no label, no wait. Read without the lock:
        // the file is replaced atomically, and the lock holder re-checks.
        if state::load(&self.parts.state_dir).is_ok_and(|c| {
            c.claims
                .get(&claim.uid)
                .is_some_and(|r| r.phase == Phase::Prepared)
        }) {
            return;
        }
        let fetched = self
            .parts
            .cluster
            .fetch_claim(claim)
            .await
            .map_err(|e| error_chain(&CdClaimError::Cluster(e)));
        let channel_domain = match &fetched {
            // Host-managed: no label and no daemon to wait for.
            _ if self.parts.imex_mode == ImexMode::HostManaged => None,
            Ok(allocated) => match plan::plan(allocated, self.parts.max_domains) {
                Ok(ClaimPlan::Channel { domain_uid, .. }) => Some(domain_uid),
                _ => None,
            },
            Err(_) => None,
        };
        let entry = Prefetched {
            claim: fetched,
            ready: None,
            at: Instant::now(),
        };
        // In the map before the wait: if the kubelet hangs up and this future is dropped,
        // the entry is purged as abandoned rather than kept forever.
        self.prefetched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(claim.uid.clone(), entry);
        if let Some(domain) = channel_domain {
            let ready = match self.ensure_label(&domain).await {
                Ok(()) => self.wait_ready(&domain, self.parts.ready_timeout).await,
                Err(e) => Err(e),
            };
            let mut prefetched = self.prefetched.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(entry) = prefetched.get_mut(&claim.uid) {
                entry.ready = Some(ready.map_err(|e| error_chain(&e)));
            }
        }
    }

    async fn prepare_one(
        &self,
        checkpoint: &mut Checkpoint,
        claim: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, String> {
        let ahead = self.take_prefetched(&claim.uid);
        if let Some(record) = checkpoint.claims.get(&claim.uid)
            && record.phase == Phase::Prepared
        {
            return Ok(returned(record, self.metadata_ids(&claim.uid, record)));
        }
        let allocated = match ahead.as_ref().map(|a| a.claim.clone()) {
            Some(claim) => claim?,
            None => self
                .parts
                .cluster
                .fetch_claim(claim)
                .await
                .map_err(|e| error_chain(&CdClaimError::Cluster(e)))?,
        };
        let plan = plan::plan(&allocated, self.parts.max_domains)
            .map_err(|e| error_chain(&CdClaimError::Plan(e)))?;
        if self.parts.imex_mode == ImexMode::HostManaged {
            match &plan {
                ClaimPlan::Channel { .. } => {
                    self.host_ready().await.map_err(|e| error_chain(&e))?;
                }
                ClaimPlan::Daemon { .. } => {
                    return Err(error_chain(&CdClaimError::HostManagedDaemon {
                        node: self.parts.node.clone(),
                    }));
                }
            }
        } else if let ClaimPlan::Channel { domain_uid, .. } = &plan {
            match ahead.and_then(|a| a.ready) {
                Some(ready) => ready?,
                // Not read ahead (a retry that found the claim in another call's batch):
                // label, and one look at the daemon.
                None => {
                    let checked = async {
                        self.ensure_label(domain_uid).await?;
                        self.wait_ready(domain_uid, Duration::ZERO).await
                    };
                    checked.await.map_err(|e| error_chain(&e))?;
                }
            }
        }
        let kind = match plan {
            ClaimPlan::Channel { .. } => ClaimKind::Channel,
            ClaimPlan::Daemon { .. } => ClaimKind::Daemon,
        };
        let mut record = ClaimRecord {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            kind,
            domain_uid: plan.domain_uid().to_string(),
            phase: Phase::Preparing,
            devices: Vec::new(),
        };
        checkpoint.claims.insert(claim.uid.clone(), record.clone());
        self.store(checkpoint).map_err(|e| error_chain(&e))?;
        crate::crashpoint::hit("cd-prepare-recorded");
        let about = crate::claims::metadata::MetadataClaim {
            namespace: &claim.namespace,
            name: &claim.name,
            uid: &claim.uid,
            pod_claim_name: allocated.pod_claim_name.as_deref(),
        };
        match self.act(&about, &plan).await {
            Ok(devices) => {
                record.phase = Phase::Prepared;
                record.devices = devices;
                checkpoint.claims.insert(claim.uid.clone(), record.clone());
                self.store(checkpoint).map_err(|e| error_chain(&e))?;
                Ok(returned(&record, self.metadata_ids(&claim.uid, &record)))
            }
            Err(e) => {
                let message = error_chain(&e);
                // Nothing of a failed prepare stays: the kubelet prepares it again.
                let _ = self.undo(checkpoint, &claim.uid);
                Err(message)
            }
        }
    }

    /// The CDI IDs of claim `uid`'s device metadata, by request, when its files exist (a
    /// claim prepared by a release without them, or with `--device-metadata=false`, has
    /// none): one `stat`, on a repeated prepare or after the first.
    fn metadata_ids(&self, uid: &str, record: &ClaimRecord) -> BTreeMap<String, String> {
        let Some(writer) = &self.parts.metadata else {
            return BTreeMap::new();
        };
        let first = record
            .devices
            .first()
            .map(|d| metadata::base_request(&d.request));
        if !first.is_some_and(|r| writer.host_file(uid, r).is_file()) {
            return BTreeMap::new();
        }
        let kind = self.parts.cdi.naming().kind();
        record
            .devices
            .iter()
            .map(|d| {
                let request = metadata::base_request(&d.request);
                (
                    request.to_string(),
                    format!("{kind}={uid}-metadata-{request}"),
                )
            })
            .collect()
    }

    /// Writes the claim's files (its device metadata, for a daemon its config directory, its
    /// CDI spec) and returns what to record.
    async fn act(
        &self,
        about: &crate::claims::metadata::MetadataClaim<'_>,
        plan: &ClaimPlan,
    ) -> Result<Vec<RecordedDevice>, CdClaimError> {
        let uid = about.uid;
        let naming = self.parts.cdi.naming().clone();
        let mut spec = match plan {
            ClaimPlan::Channel { mode, devices, .. } => {
                let all = match (self.parts.imex_mode, mode) {
                    // The host's one IMEX domain: every claim gets channel 0, whatever it asked.
                    (ImexMode::HostManaged, _) => Some(vec![0]),
                    (_, AllocationMode::All) => {
                        Some(self.parts.channels.all().map_err(CdClaimError::Cdi)?)
                    }
                    (_, AllocationMode::Single) => None,
                };
                let mut nodes = BTreeMap::new();
                for d in devices {
                    let ids = all.clone().unwrap_or_else(|| vec![d.id]);
                    let found = self.parts.channels.nodes(&ids).map_err(CdClaimError::Cdi)?;
                    nodes.insert(d.device.clone(), found);
                }
                cd_cdi::channel_spec(&naming, uid, devices, |d| {
                    nodes.get(&d.device).cloned().unwrap_or_default()
                })
                .map_err(CdClaimError::Cdi)?
            }
            ClaimPlan::Daemon {
                domain_uid,
                devices,
            } => {
                let clique = self
                    .parts
                    .clique
                    .clone()
                    .ok_or_else(|| CdClaimError::NoClique {
                        node: self.parts.node.clone(),
                    })?;
                let cluster = &self.parts.cluster;
                let domain = cluster
                    .find_domain(domain_uid)
                    .await
                    .map_err(CdClaimError::Cluster)?
                    .ok_or_else(|| CdClaimError::DomainNotFound {
                        uid: domain_uid.clone(),
                    })?;
                let peers = cluster
                    .domain_nodes(domain_uid)
                    .await
                    .map_err(CdClaimError::Cluster)?;
                let dir = config_dir(&self.parts.state_dir, domain_uid);
                crate::crashpoint::hit("cd-prepare-before-config");
                self.write_config(&dir, &domain, &clique, &peers)?;
                cd_cdi::daemon_spec(&naming, uid, devices, &domain, &clique, &dir)
                    .map_err(CdClaimError::Cdi)?
            }
        };
        if let Some(writer) = &self.parts.metadata {
            let described: Vec<_> = plan
                .devices()
                .iter()
                .map(|d| crate::claims::metadata::MetadataDevice {
                    request: d.request.clone(),
                    pool: self.parts.node.clone(),
                    name: d.device.clone(),
                    attributes: metadata_attributes(plan, d.id),
                })
                .collect();
            let mounts = writer
                .write(about, &described)
                .map_err(|e| CdClaimError::Metadata(Box::new(e)))?;
            for (request, mount) in mounts {
                spec.devices.push(crate::cdi::Device {
                    name: format!("{uid}-metadata-{request}"),
                    annotations: Default::default(),
                    container_edits: crate::cdi::ContainerEdits {
                        mounts: vec![mount],
                        ..Default::default()
                    },
                });
            }
        }
        self.parts
            .cdi
            .write_claim_spec(uid, &spec)
            .map_err(CdClaimError::Spec)?;
        crate::crashpoint::hit("cd-prepare-spec-written");
        plan.devices()
            .iter()
            .map(|d| {
                Ok(RecordedDevice {
                    request: d.request.clone(),
                    device: d.device.clone(),
                    cdi_device_id: cd_cdi::device_id(&naming, uid, d).map_err(CdClaimError::Cdi)?,
                    share_id: d.share_id.clone(),
                })
            })
            .collect()
    }

    fn write_config(
        &self,
        dir: &Path,
        domain: &DomainNames,
        clique: &str,
        peers: &[api::ComputeDomainNode],
    ) -> Result<(), CdClaimError> {
        let files = [
            (api::IMEX_CONFIG_FILE, imex::config_cfg(domain, clique)),
            (
                api::IMEX_NODES_CONFIG_FILE,
                imex::nodes_config_cfg(peers, clique),
            ),
        ];
        for (name, text) in files {
            let path = dir.join(name);
            fsutil::replace_atomic(&path, text.as_bytes(), 0o644).map_err(|source| {
                CdClaimError::Config {
                    step: "writing",
                    path: path.clone(),
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// Removes what claim `uid` has on the node (spec; a daemon's config directory unless
    /// another daemon claim of the domain remains) and its record.
    fn undo(&self, checkpoint: &mut Checkpoint, uid: &str) -> Result<(), CdClaimError> {
        let Some(record) = checkpoint.claims.get(uid).cloned() else {
            return Ok(());
        };
        self.parts
            .cdi
            .remove_claim_spec(uid)
            .map_err(CdClaimError::Spec)?;
        if let Some(writer) = &self.parts.metadata {
            let removed = if record.devices.is_empty() {
                // A prepare that failed before it recorded its devices.
                writer.remove_all(uid)
            } else {
                writer.remove(uid, record.devices.iter().map(|d| d.request.as_str()))
            };
            removed.map_err(|e| CdClaimError::Metadata(Box::new(e)))?;
        }
        if record.kind == ClaimKind::Daemon && checkpoint.daemons_of(&record.domain_uid, uid) == 0 {
            remove_dir(&config_dir(&self.parts.state_dir, &record.domain_uid))?;
        }
        checkpoint.claims.remove(uid);
        self.store(checkpoint)
    }

    /// Start-up recovery, under the plugin lock: undoes claims a crash left part-way, removes
    /// CDI specs and config directories no prepared claim accounts for. The node label is
    /// left alone: it is the domain's until the domain is deleted. Returns what it removed,
    /// for the log.
    ///
    /// # Errors
    /// The first step that failed; only an unreadable checkpoint stops the start.
    pub async fn recover(&self) -> Result<RecoveryReport, CdClaimError> {
        let mut report = RecoveryReport::default();
        let mut checkpoint = self.load()?;
        let unfinished: Vec<String> = checkpoint
            .claims
            .iter()
            .filter(|(_, r)| r.phase == Phase::Preparing)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in unfinished {
            self.undo(&mut checkpoint, &uid)?;
            report.rolled_back.push(uid);
        }
        // Temp files of spec writes a crash interrupted: swept here, once, not per unprepare.
        self.parts
            .cdi
            .remove_interrupted_writes()
            .map_err(CdClaimError::Spec)?;
        for uid in self
            .parts
            .cdi
            .list_claim_specs()
            .map_err(CdClaimError::Spec)?
        {
            if !checkpoint.claims.contains_key(&uid) {
                self.parts
                    .cdi
                    .remove_claim_spec(&uid)
                    .map_err(CdClaimError::Spec)?;
                report.stale_specs_removed.push(uid);
            }
        }
        if let Some(writer) = &self.parts.metadata {
            let files = writer
                .files()
                .map_err(|e| CdClaimError::Metadata(Box::new(e)))?;
            for (uid, request) in files {
                if !checkpoint.claims.contains_key(&uid) {
                    writer
                        .remove(&uid, [request.as_str()])
                        .map_err(|e| CdClaimError::Metadata(Box::new(e)))?;
                }
            }
        }
        let root = self.parts.state_dir.join("compute-domains");
        if let Ok(entries) = std::fs::read_dir(&root) {
            for entry in entries.flatten() {
                let domain = entry.file_name().to_string_lossy().into_owned();
                if checkpoint.daemons_of(&domain, "") == 0 {
                    remove_dir(&entry.path())?;
                    report.stale_configs_removed.push(domain);
                }
            }
        }
        Ok(report)
    }
}

/// What start-up recovery removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Claims a crash left part-way, undone.
    pub rolled_back: Vec<String>,
    /// CDI specs of claims not prepared.
    pub stale_specs_removed: Vec<String>,
    /// Config directories of domains without a prepared daemon claim.
    pub stale_configs_removed: Vec<String>,
}

fn remove_dir(dir: &Path) -> Result<(), CdClaimError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CdClaimError::Config {
            step: "removing",
            path: dir.to_path_buf(),
            source: FsError::Remove {
                path: dir.to_path_buf(),
                source,
            },
        }),
    }
}

/// Every claim fails with `error` (the checkpoint could not be read).
fn fail_all<T>(claims: Vec<ClaimRef>, error: &CdClaimError) -> BTreeMap<String, Result<T, String>> {
    let message = error_chain(error);
    claims
        .into_iter()
        .map(|c| (c.uid, Err(message.clone())))
        .collect()
}

/// The attributes a channel or daemon device of `plan` is published with.
fn metadata_attributes(
    plan: &ClaimPlan,
    id: u32,
) -> BTreeMap<String, k8s_openapi::api::resource::v1::DeviceAttribute> {
    let kind = match plan {
        ClaimPlan::Channel { .. } => api::DEVICE_TYPE_CHANNEL,
        ClaimPlan::Daemon { .. } => api::DEVICE_TYPE_DAEMON,
    };
    super::devices::attributes(kind, id)
}

/// What the kubelet gets for a prepared claim: each device's CDI ID, and the first device of
/// each request in `metadata` (base request → CDI ID) also the one mounting its metadata.
fn returned(record: &ClaimRecord, mut metadata: BTreeMap<String, String>) -> Vec<PreparedDevice> {
    record
        .devices
        .iter()
        .map(|d| {
            let mut cdi_device_ids = vec![d.cdi_device_id.clone()];
            if let Some(id) = metadata.remove(metadata::base_request(&d.request)) {
                cdi_device_ids.push(id);
            }
            PreparedDevice {
                request_names: vec![d.request.clone()],
                pool_name: String::new(),
                device_name: d.device.clone(),
                cdi_device_ids,
                share_id: d.share_id.clone(),
            }
        })
        .collect()
}

impl<C: DomainCluster> DraHandler for CdHandler<C> {
    async fn prefetch(&self, claims: &[ClaimRef]) {
        for claim in claims {
            self.prefetch_one(claim).await;
        }
    }

    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let (results, cost) = crate::cost::measure(self.prepare_counted(claims)).await;
        self.parts
            .metrics
            .record_request_path(crate::metrics::Operation::Prepare, &cost);
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let (results, cost) = crate::cost::measure(self.unprepare_counted(claims)).await;
        self.parts
            .metrics
            .record_request_path(crate::metrics::Operation::Unprepare, &cost);
        results
    }
}

impl<C: DomainCluster> CdHandler<C> {
    /// [`DraHandler::prepare`], inside the scope that counts its costs.
    async fn prepare_counted(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let mut checkpoint = match self.load() {
            Ok(c) => c,
            Err(e) => {
                for claim in &claims {
                    let _ = self.take_prefetched(&claim.uid);
                }
                return fail_all(claims, &e);
            }
        };
        let mut results = PrepareResults::new();
        for claim in claims {
            let mut outcome = self.prepare_one(&mut checkpoint, &claim).await;
            if let Ok(devices) = &mut outcome {
                for d in devices.iter_mut() {
                    d.pool_name = self.parts.node.clone();
                }
            }
            results.insert(claim.uid, outcome);
        }
        results
    }

    /// [`DraHandler::unprepare`], inside the scope that counts its costs.
    async fn unprepare_counted(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let mut checkpoint = match self.load() {
            Ok(c) => c,
            Err(e) => return fail_all(claims, &e),
        };
        let mut results = UnprepareResults::new();
        for claim in claims {
            let outcome = self
                .undo(&mut checkpoint, &claim.uid)
                .map_err(|e| error_chain(&e));
            results.insert(claim.uid, outcome);
        }
        results
    }
}
