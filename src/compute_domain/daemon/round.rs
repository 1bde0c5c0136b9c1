//! One round of the daemon ([`super`]'s module docs): its own object, the nodes config, the
//! `nvidia-imex` process and readiness, and the domain check before writes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::store::Store;

use super::plan::{self, INDEX_CONFIRMED_ANNOTATION, Member};
use super::process::{self, ImexProcess};
use super::watch::Shared;
use super::{DaemonConfig, DaemonError};
use crate::compute_domain::api::{
    self, ComputeDomain, ComputeDomainNode, ComputeDomainNodeSpec, ComputeDomainNodeState,
    Readiness,
};
use crate::compute_domain::imex::config::ImexConfig;

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

/// The own object as a round may use it.
enum Own {
    /// Neither in the store nor (still) written by this process: to be created.
    Missing,
    /// This process wrote it and the watch has not delivered that write yet: the object as the
    /// write returned it. Nothing may be decided from the store about it yet.
    Pending(ComputeDomainNode),
    /// The store's copy, which shows the last write of ours (or, before this process wrote
    /// it, the copy the first full list found).
    Current(ComputeDomainNode),
}

/// What the main loop does after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Wait for the next tick or change.
    Continue,
    /// The domain went away and the claim is unprepared: stop.
    Exit,
}

pub(super) struct Round<'a> {
    pub(super) config: &'a DaemonConfig,
    pub(super) objects: &'a Api<ComputeDomainNode>,
    /// The domain's namespace, where the daemon reads whether its domain still exists.
    pub(super) domains: &'a Api<ComputeDomain>,
    pub(super) config_file: PathBuf,
    /// The nodes config last written, to signal only on change.
    pub(super) rendered: Option<String>,
    /// The domain's objects, kept by [`super::watch::watch_domain`].
    pub(super) store: Store<ComputeDomainNode>,
    pub(super) shared: Arc<Shared>,
    /// The own object as this process's last create or replace returned it.
    pub(super) written: Option<ComputeDomainNode>,
    /// [`super::watch::WatchState::deletions`] when the domain was last read and found alive.
    pub(super) checked_deletions: Option<u64>,
    /// Why the daemon has no domain to serve any more, once it found that out: from then on
    /// it writes nothing.
    pub(super) leaving: Option<String>,
}

impl Round<'_> {
    fn api_err(&self, step: &'static str) -> impl FnOnce(kube::Error) -> DaemonError + '_ {
        move |source| DaemonError::Api {
            step,
            name: self.config.object_name(),
            source: Box::new(source),
        }
    }

    /// Remembers `object` as our last write, for [`Round::own`] and the watch.
    fn wrote(&mut self, object: ComputeDomainNode) -> ComputeDomainNode {
        self.shared.lock().last_write = object.metadata.resource_version.clone();
        self.written = Some(object.clone());
        object
    }

    /// Whether the domain is still there to serve, read before a write when it must be: at the
    /// first round, before the own object is created (`creating`), and after an object of the
    /// domain went away since the last read. Sets [`Round::leaving`] when the domain is gone.
    async fn domain_alive(&mut self, creating: bool) -> Result<bool, DaemonError> {
        if self.leaving.is_some() {
            return Ok(false);
        }
        let deletions = self.shared.lock().deletions;
        if !creating && self.checked_deletions == Some(deletions) {
            return Ok(true);
        }
        let found = self
            .domains
            .get_opt(&self.config.domain_name)
            .await
            .map_err(|source| DaemonError::Domain {
                namespace: self.config.domain_namespace.clone(),
                name: self.config.domain_name.clone(),
                source: Box::new(source),
            })?;
        match plan::domain_gone(found.as_ref(), &self.config.domain_uid) {
            None => {
                self.checked_deletions = Some(deletions);
                Ok(true)
            }
            Some(why) => {
                tracing::info!(
                    domain.uid = %self.config.domain_uid,
                    domain.namespace = %self.config.domain_namespace,
                    domain.name = %self.config.domain_name,
                    node = %self.config.node_name,
                    why = %why,
                    "the domain went away: this daemon writes nothing more and exits once its claim is unprepared"
                );
                self.leaving = Some(why);
                Ok(false)
            }
        }
    }

    /// A round of a daemon whose domain went away: no request, no file write, no signal.
    /// Exits once the plugin removed the claim's config (the daemon claim was unprepared).
    fn leaving_round(&self) -> Next {
        if self.config_file.exists() {
            Next::Continue
        } else {
            Next::Exit
        }
    }

    /// The own object in `all` (the store's content), checked against our last write.
    ///
    /// STABLE INDICES rest on this. Our last write is known to be in the store when the watch
    /// delivered the own object with the resourceVersion that write returned (the store's copy
    /// has it, or had it: it is kept in [`super::watch::WatchState::own_versions`]), or when a
    /// list started after that write completed. Watch events arrive in resourceVersion order, so then every
    /// object written before our write, in particular every member that took an index before
    /// we took ours, is in the store too: the store says as much as a LIST taken after our
    /// write would. Only this process writes its object, so equality is the test, and
    /// resourceVersions are never compared for order (they are opaque). Before this process
    /// wrote the object, the first full list (a quorum read, made after this process started)
    /// is read after every earlier write, the previous run's too. A write of someone else to
    /// our object does not stall this: our version was still delivered before theirs.
    fn own(&self, all: &[ComputeDomainNode]) -> Own {
        let name = self.config.object_name();
        let stored = all
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(&name));
        let Some(written) = &self.written else {
            return stored.map_or(Own::Missing, |o| Own::Current(o.clone()));
        };
        let version = written.metadata.resource_version.as_ref();
        let delivered = version.is_some_and(|v| {
            stored.is_some_and(|o| o.metadata.resource_version.as_ref() == Some(v))
                || self.shared.lock().own_versions.contains(v)
        });
        match (stored, delivered) {
            (Some(o), true) => Own::Current(o.clone()),
            // Delivered, then deleted (the controller removes the objects of a departed node).
            (None, true) => Own::Missing,
            (_, false) => Own::Pending(written.clone()),
        }
    }

    /// Creates the own object with the lowest index free in its clique, NotReady.
    async fn create(&mut self, members: &[Member]) -> Result<ComputeDomainNode, DaemonError> {
        let name = self.config.object_name();
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
            index: plan::lowest_free_index(members, &self.config.clique, &name),
            status: Readiness::NotReady,
            reason: Some("DaemonStarting".into()),
            message: Some("the IMEX daemon is starting".into()),
        });
        let created = self
            .objects
            .create(&PostParams::default(), &object)
            .await
            .map_err(self.api_err("creating"))?;
        Ok(self.wrote(created))
    }

    /// Fixes the index of `existing` (the store's current copy; a concurrent starter with the
    /// same index was created first or is Ready) and its IP (a new pod IP). Returns the object
    /// as written, or `None` when nothing needed fixing.
    async fn fix_own(
        &mut self,
        existing: &ComputeDomainNode,
        members: &[Member],
    ) -> Result<Option<ComputeDomainNode>, DaemonError> {
        let name = self.config.object_name();
        let mut state = existing.status.clone().unwrap_or_default();
        let repick = Member::of(existing).is_some_and(|own| plan::must_repick(members, &own));
        if repick {
            state.index = plan::lowest_free_index(members, &self.config.clique, &name);
            state.status = Readiness::NotReady;
            state.reason = Some("DaemonStarting".into());
            state.message = Some("choosing a stable index among concurrent starters".into());
        }
        if !repick && state.ip_address == self.config.pod_ip {
            return Ok(None);
        }
        state.ip_address = self.config.pod_ip.clone();
        let mut object = existing.clone();
        object.status = Some(state);
        let written = self
            .objects
            .replace(&name, &PostParams::default(), &object)
            .await
            .map_err(self.api_err("updating"))?;
        Ok(Some(self.wrote(written)))
    }

    /// One round: own object, nodes config, process, readiness. When the store cannot be
    /// trusted (no full list yet, or the watch failed and the re-list is not in), it only
    /// supervises an `nvidia-imex` already started and keeps the readiness last written.
    pub(super) async fn step(&mut self, imex: &mut ImexProcess) -> Result<Next, DaemonError> {
        if self.leaving.is_some() {
            return Ok(self.leaving_round());
        }
        let unsynced = {
            let state = self.shared.lock();
            (!state.synced).then(|| {
                state
                    .unsynced_because
                    .clone()
                    .unwrap_or_else(|| "waiting for the first list".into())
            })
        };
        if let Some(reason) = unsynced {
            tracing::debug!(domain.uid = %self.config.domain_uid, node = %self.config.node_name, reason = %reason, "the domain's store is not synced; supervising only, readiness kept");
            return match self.rendered {
                Some(_) => imex.supervise().await.map(|()| Next::Continue),
                None => Ok(Next::Continue),
            };
        }
        let name = self.config.object_name();
        let mut all: Vec<ComputeDomainNode> =
            self.store.state().iter().map(|o| (**o).clone()).collect();
        let others: Vec<Member> = all
            .iter()
            .filter(|o| o.metadata.name.as_deref() != Some(&name))
            .filter_map(Member::of)
            .collect();
        let own = self.own(&all);
        if !self.domain_alive(matches!(own, Own::Missing)).await? {
            return Ok(self.leaving_round());
        }
        let (own, current) = match own {
            Own::Missing => (self.create(&others).await?, false),
            Own::Pending(o) => (o, false),
            Own::Current(o) => match self.fix_own(&o, &others).await? {
                Some(written) => (written, false),
                None => (o, true),
            },
        };
        all.retain(|o| o.metadata.name.as_deref() != Some(&name));
        all.push(own.clone());
        let members: Vec<Member> = all.iter().filter_map(Member::of).collect();
        // Settled: the store shows our last write (so every member that could collide) and
        // no member of the clique shares our index, or our index is already final.
        let settled = current && Member::of(&own).is_some_and(|m| !plan::must_wait(&members, &m));
        let nodes = plan::nodes_config(&members, &self.config.clique);
        let imex_config = match ImexConfig::load(&self.config_file) {
            Ok(c) => c,
            Err(e) => {
                if current {
                    let message = crate::errors::error_chain(&e);
                    let config_error = (
                        Readiness::NotReady,
                        Some("ConfigError".into()),
                        Some(message),
                    );
                    self.write_own_status(config_error, Some(own)).await?;
                }
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
        let spawned = imex.supervise().await.map(|()| Next::Continue);
        if !current {
            // Our write is on its way back through the watch, which runs the next round.
            tracing::debug!(domain.uid = %self.config.domain_uid, node = %self.config.node_name, "waiting for the own object's last write in the store; readiness kept");
            return spawned;
        }
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

    /// Writes the own object's status when it differs from `current` (the store's current
    /// copy; read with a GET when `None`, as on shutdown), and marks the index confirmed on
    /// Ready. At steady state it sends nothing.
    pub(super) async fn write_own_status(
        &mut self,
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
        let written = self
            .objects
            .replace(&name, &PostParams::default(), &object)
            .await
            .map_err(self.api_err("updating the status of"))?;
        self.wrote(written);
        Ok(())
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
