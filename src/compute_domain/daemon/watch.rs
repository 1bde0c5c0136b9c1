//! The daemon's view of its domain's `ComputeDomainNode` objects: one kube watcher by the
//! domain-UID label into a local store, and what the rounds need to know besides the store
//! (is it complete, did our last write come back, did an object of the domain go away).

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, ListSemantic};
use tokio_stream::StreamExt;

use super::DaemonError;
use crate::compute_domain::api::{self, ComputeDomainNode};

/// First wait before re-listing after the watch failed; doubles per failure up to
/// [`MAX_RELIST_BACKOFF`], and starts afresh once a list succeeded.
const FIRST_RELIST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_RELIST_BACKOFF: Duration = Duration::from_secs(30);
/// How many resourceVersions of the own object, as the watch delivered them, are kept to tell
/// that a write of ours came back (more than the writes between two rounds).
const OWN_VERSIONS_KEPT: usize = 16;

/// What the watch task tells the rounds, besides the store itself.
#[derive(Default)]
pub(super) struct Shared {
    state: Mutex<WatchState>,
    /// Woken after every change the watch applied to the store, and when the watch failed.
    pub(super) changed: tokio::sync::Notify,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
pub(super) struct WatchState {
    /// A full list is in the store and the watch has not failed since: the store is the
    /// domain's objects as of some resourceVersion, behind the API server only by the events
    /// on their way.
    pub(super) synced: bool,
    /// Why the store is not synced, for the rounds' logs.
    pub(super) unsynced_because: Option<String>,
    /// resourceVersions the own object had as the watch delivered it, newest last (at most
    /// [`OWN_VERSIONS_KEPT`]); see `Round::own`.
    pub(super) own_versions: VecDeque<String>,
    /// The resourceVersion the own object's last create or replace returned (set by the
    /// rounds).
    pub(super) last_write: Option<String>,
    /// `last_write` when the list in progress was started: that list was read after that
    /// write, so it shows it (or its deletion).
    listing_after: Option<String>,
    /// How many times an object of the domain went away: a watch `DELETED` event, or a
    /// re-list that no longer shows an object the store had. Nothing deletes the objects of a
    /// live domain (a daemon that stops keeps its object), so a deletion is the sign that the
    /// domain is being deleted: a round that sees this count change asks the API server about
    /// the domain before it writes anything.
    pub(super) deletions: u64,
    /// The names in the store when the list in progress started, and those the list brought
    /// so far: what the list dropped counts as deleted.
    listed_before: BTreeSet<String>,
    listed_now: BTreeSet<String>,
}

impl WatchState {
    fn saw_own(&mut self, version: Option<&String>) {
        let Some(version) = version else { return };
        if self.own_versions.back() != Some(version) {
            self.own_versions.push_back(version.clone());
            if self.own_versions.len() > OWN_VERSIONS_KEPT {
                self.own_versions.pop_front();
            }
        }
    }
}

fn names(objects: &[Arc<ComputeDomainNode>]) -> BTreeSet<String> {
    objects
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect()
}

/// Keeps `writer`'s store the domain's `ComputeDomainNode` objects: a kube watcher by the
/// domain-UID label, its first list a consistent (quorum) read. On any watcher error the store
/// is marked unsynced, the watcher dropped and a new one started after a doubling backoff:
/// a fresh list is the one event that says the store is complete again (a watch that kube
/// resumed quietly says nothing), and the store keeps its last complete content until that
/// list is in. Counts the objects that went away ([`WatchState::deletions`]). Runs until
/// aborted.
pub(super) async fn watch_domain(
    objects: Api<ComputeDomainNode>,
    mut writer: Writer<ComputeDomainNode>,
    shared: Arc<Shared>,
    domain_uid: String,
    own: String,
) {
    let selector = format!("{}={domain_uid}", api::DOMAIN_UID_LABEL);
    let config = watcher::Config::default()
        .labels(&selector)
        .list_semantic(ListSemantic::MostRecent);
    let store = writer.as_reader();
    let is_own = |o: &ComputeDomainNode| o.metadata.name.as_deref() == Some(own.as_str());
    let mut backoff = FIRST_RELIST_BACKOFF;
    loop {
        let mut events = std::pin::pin!(watcher::watcher(objects.clone(), config.clone()));
        let failure = loop {
            let event = match events.next().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    let error = DaemonError::Watch {
                        selector: selector.clone(),
                        source: Box::new(e),
                    };
                    break crate::errors::error_chain(&error);
                }
                None => break "the watch stream ended".to_string(),
            };
            let mut state = shared.lock();
            // A deletion is counted before the store shows it: a round that sees an object
            // gone in the store then also sees the count that makes it ask about the domain.
            match &event {
                watcher::Event::Init => {
                    state.listing_after = state.last_write.clone();
                    // The store keeps its content until the list is done.
                    state.listed_before = names(&store.state());
                    state.listed_now.clear();
                }
                watcher::Event::InitApply(o) => {
                    if let Some(name) = &o.metadata.name {
                        state.listed_now.insert(name.clone());
                    }
                }
                watcher::Event::InitDone => {
                    let before = std::mem::take(&mut state.listed_before);
                    let now = std::mem::take(&mut state.listed_now);
                    if before.iter().any(|name| !now.contains(name)) {
                        state.deletions += 1;
                    }
                }
                watcher::Event::Delete(_) => state.deletions += 1,
                watcher::Event::Apply(_) => {}
            }
            writer.apply_watcher_event(&event);
            match &event {
                watcher::Event::Init | watcher::Event::InitApply(_) => continue,
                watcher::Event::InitDone => {
                    let listed = store.find(|o| is_own(o));
                    state.saw_own(
                        listed
                            .and_then(|o| o.metadata.resource_version.clone())
                            .as_ref(),
                    );
                    let after = state.listing_after.take();
                    state.saw_own(after.as_ref());
                    state.synced = true;
                    state.unsynced_because = None;
                    backoff = FIRST_RELIST_BACKOFF;
                    tracing::debug!(domain.uid = %domain_uid, objects = store.len(), "the domain's ComputeDomainNodes are listed");
                }
                watcher::Event::Apply(o) if is_own(o) => {
                    state.saw_own(o.metadata.resource_version.as_ref());
                }
                watcher::Event::Apply(_) | watcher::Event::Delete(_) => {}
            }
            drop(state);
            shared.changed.notify_one();
        };
        {
            let mut state = shared.lock();
            state.synced = false;
            state.unsynced_because = Some(failure.clone());
        }
        shared.changed.notify_one();
        tracing::warn!(domain.uid = %domain_uid, retry_in_ms = backoff.as_millis() as u64, error = %failure, "watching the domain's ComputeDomainNodes failed; re-listing");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_RELIST_BACKOFF);
    }
}
