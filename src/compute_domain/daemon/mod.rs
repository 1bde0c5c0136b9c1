//! `gpu-dra imex-daemon`: what each node's IMEX DaemonSet pod runs.
//!
//! Every tick (half a second) it
//! 1. lists its domain's `ComputeDomainNode` objects (one LIST, by the domain-UID label) and
//!    creates or updates its own: its IP, clique and stable index ([`plan`]: the lowest index
//!    free in its clique on creation; a concurrent starter that picked the same index and was
//!    created later re-picks before it turns Ready; afterwards the index never changes, across
//!    restarts of this process too);
//! 2. renders the nodes config (`IMEX_NODE_CONFIG_FILE` of the config the plugin wrote) from
//!    the objects of its clique in index order, and when it changed tells `nvidia-imex` to
//!    re-read it (SIGUSR1);
//! 3. keeps `nvidia-imex -c <config>` running, restarting it only after it exited, with a
//!    doubling backoff ([`process`]);
//! 4. asks `nvidia-imex-ctl -q` and writes readiness into its object: `Ready`, or `NotReady`
//!    with a reason (`DaemonStarting`, `WaitingForQuorum`, `DaemonCrashed`, `ConfigError`)
//!    and a message. Only changes are written.
//!
//! It writes no object but its own. On SIGTERM it stops `nvidia-imex` and marks its object
//! NotReady (`DaemonStopped`) without deleting it, so a restart keeps the index; removing the
//! objects of a departed node or a deleted domain is the controller's job.

pub mod plan;
pub mod process;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::compute_domain::api::{
    self, ComputeDomainNode, ComputeDomainNodeSpec, ComputeDomainNodeState, Readiness,
};
use crate::compute_domain::imex::config::{ImexConfig, ImexConfigError};
use plan::{INDEX_CONFIRMED_ANNOTATION, Member};
use process::ImexProcess;

/// Time between two rounds.
const TICK: Duration = Duration::from_millis(500);

/// What the daemon needs to know; the verb's flags and the `api::daemon_env` variables.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// This node's name.
    pub node_name: String,
    /// This pod's IP, what peers connect to.
    pub pod_ip: String,
    /// Namespace of the `ComputeDomainNode` objects (the driver's).
    pub namespace: String,
    /// Kubeconfig file; in-cluster configuration when `None`.
    pub kubeconfig: Option<PathBuf>,
    /// Directory holding `config.cfg` (written by the plugin).
    pub config_dir: PathBuf,
    /// `nvidia-imex` to run.
    pub imex_bin: PathBuf,
    /// `nvidia-imex-ctl` to query.
    pub imex_ctl_bin: PathBuf,
    /// Run the simulated `nvidia-imex` / `nvidia-imex-ctl` (this binary under those names,
    /// linked into a private temp directory) instead of `imex_bin` / `imex_ctl_bin`: for
    /// simulated nodes (kind, CI), where no IMEX package is installed.
    pub simulated_imex: bool,
    /// The domain's UID.
    pub domain_uid: String,
    /// The domain's name.
    pub domain_name: String,
    /// The domain's namespace.
    pub domain_namespace: String,
    /// `<clusterUuid>.<cliqueId>` of this node's GPUs.
    pub clique: String,
}

/// Errors of the IMEX daemon wrapper.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A required setting is missing or empty.
    #[error("{name} is required ({how})")]
    Missing {
        /// Flag or environment variable.
        name: &'static str,
        /// How to set it.
        how: &'static str,
    },
    /// Connecting to the API server failed.
    #[error("connecting to the API server failed")]
    Connect(#[source] Box<crate::k8s::K8sError>),
    /// An API request failed.
    #[error("{step} ComputeDomainNode {name} failed")]
    Api {
        /// What was being done.
        step: &'static str,
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Reading the IMEX config failed.
    #[error("reading the IMEX config failed")]
    Config(#[source] ImexConfigError),
    /// Writing the nodes config failed.
    #[error("writing the nodes config failed")]
    WriteNodes(#[source] crate::fsutil::FsError),
    /// The simulated IMEX tools could not be linked.
    #[error("installing the simulated IMEX tools failed")]
    InstallTools(#[source] crate::compute_domain::imex::ImexToolError),
    /// `nvidia-imex` could not be started.
    #[error("starting {} failed", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Signalling `nvidia-imex` failed.
    #[error("signalling nvidia-imex (pid {pid}) failed")]
    Signal {
        /// Its pid.
        pid: u32,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

impl DaemonConfig {
    /// Checks that every identity setting is present, naming the missing flag and variable.
    pub fn validate(&self) -> Result<(), DaemonError> {
        let required: [(&str, &'static str, &'static str); 6] = [
            (&self.node_name, "--node-name", "or NODE_NAME"),
            (&self.pod_ip, "--pod-ip", "or POD_IP, from the downward API"),
            (&self.namespace, "--namespace", "or POD_NAMESPACE"),
            (
                &self.domain_uid,
                api::daemon_env::DOMAIN_UID,
                "set by the daemon claim's CDI spec",
            ),
            (
                &self.clique,
                api::daemon_env::CLIQUE_ID,
                "set by the daemon claim's CDI spec",
            ),
            (
                &self.domain_name,
                api::daemon_env::DOMAIN_NAME,
                "set by the daemon claim's CDI spec",
            ),
        ];
        match required.iter().find(|(value, _, _)| value.is_empty()) {
            Some((_, name, how)) => Err(DaemonError::Missing { name, how }),
            None => Ok(()),
        }
    }

    fn object_name(&self) -> String {
        api::compute_domain_node_name(&self.domain_uid, &self.node_name)
    }
}

/// The daemon's view of its own object's status, before writing it.
fn desired_state(
    own: &ComputeDomainNodeState,
    ip: &str,
    readiness: (Readiness, Option<String>, Option<String>),
) -> ComputeDomainNodeState {
    ComputeDomainNodeState {
        ip_address: ip.to_string(),
        index: own.index,
        status: readiness.0,
        reason: readiness.1,
        message: readiness.2,
    }
}

/// Runs the daemon until `shutdown` resolves; see the module docs. Transient API and process
/// failures are retried every tick (and reported in the object where they can be); the
/// function fails only on a missing setting or an unusable kubeconfig.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    config.validate()?;
    let client = crate::k8s::connect(config.kubeconfig.as_deref())
        .await
        .map_err(|e| DaemonError::Connect(Box::new(e)))?;
    let objects: Api<ComputeDomainNode> = Api::namespaced_with(
        client,
        &config.namespace,
        &api::compute_domain_node_resource(),
    );
    let config_file = config.config_dir.join(api::IMEX_CONFIG_FILE);
    let sim_dir = config
        .simulated_imex
        .then(|| std::env::temp_dir().join(format!("gpu-dra-imex-{}", std::process::id())));
    let (imex_bin, ctl_bin) = match &sim_dir {
        Some(dir) => {
            let exe = std::env::current_exe().map_err(|source| DaemonError::Spawn {
                program: PathBuf::from("/proc/self/exe"),
                source,
            })?;
            crate::compute_domain::imex::install_simulated(&exe, dir)
                .map_err(DaemonError::InstallTools)?
        }
        None => (config.imex_bin.clone(), config.imex_ctl_bin.clone()),
    };
    let mut imex = ImexProcess::new(&config.pod_ip, imex_bin, ctl_bin, config_file.clone());
    let mut round = Round {
        config: &config,
        objects: &objects,
        config_file,
        rendered: None,
    };
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = round.step(&mut imex).await {
            tracing::warn!(domain.uid = %config.domain_uid, node = %config.node_name, error = %crate::errors::error_chain(&e), "IMEX daemon round failed; retrying");
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(TICK) => {}
        }
    }
    imex.stop().await;
    if let Some(dir) = sim_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    let stopped = (
        Readiness::NotReady,
        Some("DaemonStopped".to_string()),
        Some("the IMEX daemon pod is shutting down".to_string()),
    );
    if let Err(e) = round.write_own_status(stopped, None).await {
        tracing::warn!(domain.uid = %config.domain_uid, error = %crate::errors::error_chain(&e), "marking the node stopped failed");
    }
    Ok(())
}

/// The state one round needs.
struct Round<'a> {
    config: &'a DaemonConfig,
    objects: &'a Api<ComputeDomainNode>,
    config_file: PathBuf,
    /// The nodes config last written, to signal only on change.
    rendered: Option<String>,
}

impl Round<'_> {
    async fn list(&self) -> Result<Vec<ComputeDomainNode>, DaemonError> {
        let selector = format!("{}={}", api::DOMAIN_UID_LABEL, self.config.domain_uid);
        self.objects
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .map_err(|source| DaemonError::Api {
                step: "listing the domain's",
                name: selector,
                source: Box::new(source),
            })
    }

    fn api_err(&self, step: &'static str) -> impl FnOnce(kube::Error) -> DaemonError + '_ {
        move |source| DaemonError::Api {
            step,
            name: self.config.object_name(),
            source: Box::new(source),
        }
    }

    /// Creates the own object, or fixes its index (concurrent start) and IP. Also says whether
    /// the index is settled: the object existed when `all` was listed and its index was not
    /// changed now, so `all` (listed after the index was written) shows every member that
    /// could collide with it. Only a settled node may turn Ready, which makes its index final:
    /// of two nodes with one index, the one whose quiet listing came later sees the other.
    async fn ensure_own(
        &self,
        all: &[ComputeDomainNode],
    ) -> Result<(ComputeDomainNode, bool), DaemonError> {
        let name = self.config.object_name();
        let members: Vec<Member> = all.iter().filter_map(Member::of).collect();
        let existing = all
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(&name));
        let Some(existing) = existing else {
            let mut object = ComputeDomainNode::new(
                &name,
                &api::compute_domain_node_resource(),
                ComputeDomainNodeSpec {
                    domain_uid: self.config.domain_uid.clone(),
                    domain_namespace: self.config.domain_namespace.clone(),
                    domain_name: self.config.domain_name.clone(),
                    node_name: self.config.node_name.clone(),
                    clique_id: self.config.clique.clone(),
                },
            );
            object.metadata.namespace = Some(self.config.namespace.clone());
            object.metadata.labels = Some(BTreeMap::from([(
                api::DOMAIN_UID_LABEL.to_string(),
                self.config.domain_uid.clone(),
            )]));
            object.status = Some(ComputeDomainNodeState {
                ip_address: self.config.pod_ip.clone(),
                index: plan::lowest_free_index(&members, &self.config.clique, &name),
                status: Readiness::NotReady,
                reason: Some("DaemonStarting".into()),
                message: Some("the IMEX daemon is starting".into()),
            });
            return self
                .objects
                .create(&PostParams::default(), &object)
                .await
                .map(|o| (o, false))
                .map_err(self.api_err("creating"));
        };
        let mut object = existing.clone();
        let mut state = object.status.clone().unwrap_or_default();
        let mut settled = true;
        if let Some(own) = Member::of(existing)
            && plan::must_repick(&members, &own)
        {
            state.index = plan::lowest_free_index(&members, &self.config.clique, &name);
            settled = false;
        }
        let moved = state.ip_address != self.config.pod_ip;
        if settled && !moved {
            return Ok((object, true));
        }
        state.ip_address = self.config.pod_ip.clone();
        object.status = Some(state);
        self.objects
            .replace(&name, &PostParams::default(), &object)
            .await
            .map(|o| (o, settled))
            .map_err(self.api_err("updating"))
    }

    /// One round: own object, nodes config, process, readiness.
    async fn step(&mut self, imex: &mut ImexProcess) -> Result<(), DaemonError> {
        let mut all = self.list().await?;
        let (own, settled) = self.ensure_own(&all).await?;
        let name = self.config.object_name();
        all.retain(|o| o.metadata.name.as_deref() != Some(&name));
        all.push(own.clone());
        let members: Vec<Member> = all.iter().filter_map(Member::of).collect();
        let nodes = plan::nodes_config(&members, &self.config.clique);
        let imex_config = match ImexConfig::load(&self.config_file) {
            Ok(c) => c,
            Err(e) => {
                let message = crate::errors::error_chain(&e);
                self.write_own_status(
                    (
                        Readiness::NotReady,
                        Some("ConfigError".into()),
                        Some(message),
                    ),
                    Some(own),
                )
                .await?;
                return Err(DaemonError::Config(e));
            }
        };
        if self.rendered.as_deref() != Some(nodes.as_str()) {
            crate::fsutil::replace_atomic(&imex_config.node_config_file, nodes.as_bytes(), 0o644)
                .map_err(DaemonError::WriteNodes)?;
            tracing::info!(domain.uid = %self.config.domain_uid, nodes = nodes.lines().count(), "nodes config rendered");
            self.rendered = Some(nodes);
            imex.reload()?;
        }
        let spawned = imex.supervise().await;
        let readiness = if !settled {
            (
                Readiness::NotReady,
                Some("DaemonStarting".into()),
                Some("choosing a stable index among concurrent starters".into()),
            )
        } else if imex.pid().is_some() {
            match imex.query().await.as_str() {
                "READY" => {
                    imex.healthy();
                    imex.last_crash = None;
                    (Readiness::Ready, None, None)
                }
                state => match &imex.last_crash {
                    Some(crash) => crash_readiness(crash),
                    None => (
                        Readiness::NotReady,
                        Some(if state.is_empty() || state == "UNAVAILABLE" {
                            "DaemonStarting".into()
                        } else {
                            "WaitingForQuorum".into()
                        }),
                        Some(format!(
                            "nvidia-imex-ctl -q: {}",
                            if state.is_empty() { "no answer" } else { state }
                        )),
                    ),
                },
            }
        } else {
            match &imex.last_crash {
                Some(crash) => crash_readiness(crash),
                None => (Readiness::NotReady, Some("DaemonStarting".into()), None),
            }
        };
        self.write_own_status(readiness, Some(own)).await?;
        spawned
    }

    /// Writes the own object's status when it differs from `current` (the object as this
    /// round read or wrote it; read afresh when `None`), and marks the index confirmed on
    /// Ready. At steady state it sends nothing.
    async fn write_own_status(
        &self,
        readiness: (Readiness, Option<String>, Option<String>),
        current: Option<ComputeDomainNode>,
    ) -> Result<(), DaemonError> {
        let name = self.config.object_name();
        let object = match current {
            Some(o) => Some(o),
            None => self
                .objects
                .get_opt(&name)
                .await
                .map_err(self.api_err("reading"))?,
        };
        let Some(mut object) = object else {
            return Ok(());
        };
        let current = object.status.clone().unwrap_or_default();
        let ready = readiness.0 == Readiness::Ready;
        let want = desired_state(&current, &self.config.pod_ip, readiness);
        let annotations = object
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        let confirm = ready && !annotations.contains_key(INDEX_CONFIRMED_ANNOTATION);
        if want == current && !confirm {
            return Ok(());
        }
        if confirm {
            annotations.insert(INDEX_CONFIRMED_ANNOTATION.into(), "true".into());
        }
        if want.status != current.status || want.reason != current.reason {
            tracing::info!(domain.uid = %self.config.domain_uid, node = %self.config.node_name, status = ?want.status, reason = ?want.reason, "node readiness changed");
        }
        object.status = Some(want);
        self.objects
            .replace(&name, &PostParams::default(), &object)
            .await
            .map(|_| ())
            .map_err(self.api_err("updating the status of"))
    }
}

fn crash_readiness(crash: &process::Crash) -> (Readiness, Option<String>, Option<String>) {
    let mut message = format!(
        "nvidia-imex exited ({}), {} time(s); restarting",
        crash.status, crash.count
    );
    if !crash.stderr_tail.is_empty() {
        message.push_str(&format!("; its last output: {}", crash.stderr_tail));
    }
    (
        Readiness::NotReady,
        Some("DaemonCrashed".into()),
        Some(message),
    )
}

/// [`run`] on its own runtime until SIGTERM or SIGINT: what `gpu-dra imex-daemon` does.
pub fn run_until_signal(config: DaemonConfig) -> Result<(), DaemonError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| DaemonError::Spawn {
            program: PathBuf::from("the async runtime"),
            source,
        })?;
    runtime.block_on(async {
        let shutdown = async {
            use tokio::signal::unix::{SignalKind, signal};
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => std::future::pending::<()>().await,
            }
        };
        run(config, shutdown).await
    })
}
