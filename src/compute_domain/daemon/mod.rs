//! `gpu-dra imex-daemon`: what each node's IMEX DaemonSet pod runs.
//!
//! It watches its domain's `ComputeDomainNode` objects (one WATCH, by the domain-UID label,
//! after one LIST) into a local store, and runs a round every tick (half a second) and
//! whenever the store changes (a peer joined, changed its IP or its readiness). A round
//! 1. creates or updates its own object: its IP, clique and stable index ([`plan`]: the
//!    lowest index free in its clique on creation; a concurrent starter that picked the same
//!    index and was created later re-picks before it turns Ready; afterwards the index never
//!    changes, across restarts of this process too);
//! 2. renders the nodes config (`IMEX_NODE_CONFIG_FILE` of the config the plugin wrote) from
//!    the objects of its clique in index order, and when it changed tells `nvidia-imex` to
//!    re-read it (SIGUSR1);
//! 3. keeps `nvidia-imex -c <config>` running, restarting it only after it exited, with a
//!    doubling backoff ([`process`]);
//! 4. asks `nvidia-imex-ctl -q` and writes readiness into its object: `Ready`, or `NotReady`
//!    with a reason (`DaemonStarting`, `WaitingForQuorum`, `DaemonCrashed`, `ConfigError`)
//!    and a message. Only changes are written.
//!
//! At steady state it sends no request: the rounds read the store, and the open watch (which
//! the API server ends every few minutes and kube re-opens from where it was) is all it
//! costs. Until the first full list is in the store it neither creates its object nor starts
//! `nvidia-imex`. When the watch fails (API server restart, 410 Gone) the daemon re-lists with
//! a doubling backoff; meanwhile rounds keep supervising `nvidia-imex` but write nothing and
//! keep the readiness last written, as they would have with a failed LIST.
//!
//! It writes no object but its own. On SIGTERM it stops `nvidia-imex` and marks its object
//! NotReady (`DaemonStopped`) without deleting it, so a restart keeps the index; removing the
//! objects of a deleted domain is the controller's job.
//!
//! **When the domain goes away.** Before it creates its object, and before any write after an
//! object of the domain went away (the controller deletes them when the domain is deleted;
//! nothing else does), a round reads the `ComputeDomain` (one GET). If it is gone, being
//! deleted, or another domain of the same name, the daemon *leaves*: it never writes its
//! object again (so it cannot re-create one the controller deleted), stops rendering the nodes
//! config and signalling `nvidia-imex` (whose running process it leaves alone until the pod
//! stops), and exits with status 0 once its claim is unprepared (the plugin removes the
//! config directory) or on SIGTERM, whichever comes first.

pub mod plan;
pub mod process;
mod round;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;

use crate::compute_domain::api::{self, ComputeDomain, ComputeDomainNode, Readiness};
use crate::compute_domain::imex::config::ImexConfigError;
use process::ImexProcess;
use round::{Next, Round};
use watch::{Shared, watch_domain};

/// Time between two rounds when the store does not change.
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
    /// Reading the daemon's `ComputeDomain` failed (is it still there?); the round writes
    /// nothing and is retried.
    #[error("reading ComputeDomain {namespace}/{name} failed")]
    Domain {
        /// The domain's namespace.
        namespace: String,
        /// The domain's name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Watching the domain's `ComputeDomainNode` objects failed (the API server restarted,
    /// 410 Gone, a list failed); the daemon re-lists with a backoff and meanwhile keeps the
    /// readiness last written.
    #[error("watching the ComputeDomainNodes {selector} failed")]
    Watch {
        /// The label selector watched.
        selector: String,
        /// Cause.
        #[source]
        source: Box<watcher::Error>,
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
        let required: [(&str, &'static str, &'static str); 7] = [
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
            (
                &self.domain_namespace,
                api::daemon_env::DOMAIN_NAMESPACE,
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
/// Runs the daemon until `shutdown` resolves; see the module docs. Transient API and process
/// failures are retried (a failed round at the next tick, a failed watch by re-listing with a
/// doubling backoff) and reported in the object where they can be; the function fails only
/// on a missing setting or an unusable kubeconfig.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    config.validate()?;
    let client = crate::k8s::connect(config.kubeconfig.as_deref())
        .await
        .map_err(|e| DaemonError::Connect(Box::new(e)))?;
    let objects: Api<ComputeDomainNode> = Api::namespaced_with(
        client.clone(),
        &config.namespace,
        &api::compute_domain_node_resource(),
    );
    let domains: Api<ComputeDomain> = Api::namespaced_with(
        client,
        &config.domain_namespace,
        &api::compute_domain_resource(),
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
    let writer = Writer::new(api::compute_domain_node_resource());
    let store = writer.as_reader();
    let shared = Arc::new(Shared::default());
    let watch = tokio::spawn(watch_domain(
        objects.clone(),
        writer,
        shared.clone(),
        config.domain_uid.clone(),
        config.object_name(),
    ));
    let mut round = Round {
        config: &config,
        objects: &objects,
        domains: &domains,
        config_file,
        rendered: None,
        store,
        shared: shared.clone(),
        written: None,
        checked_deletions: None,
        leaving: None,
    };
    tokio::pin!(shutdown);
    loop {
        match round.step(&mut imex).await {
            Ok(Next::Continue) => {}
            Ok(Next::Exit) => {
                tracing::info!(domain.uid = %config.domain_uid, node = %config.node_name, "the daemon claim was unprepared after the domain went away; exiting");
                break;
            }
            Err(e) => {
                tracing::warn!(domain.uid = %config.domain_uid, node = %config.node_name, error = %crate::errors::error_chain(&e), "IMEX daemon round failed; retrying");
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(TICK) => {}
            _ = shared.changed.notified() => {}
        }
    }
    watch.abort();
    imex.stop().await;
    if let Some(dir) = sim_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    if round.leaving.is_some() {
        // The domain is gone: its objects are the controller's to delete, not ours to write.
        return Ok(());
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
