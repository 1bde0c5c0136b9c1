//! Usage accounting in the running plugin: what each prepared claim holds goes into the
//! [`Ledger`] when the kubelet's prepare succeeds and out of it when its unprepare does; a
//! periodic pass reconciles the ledger with the checkpoint and refreshes
//! `gpu_dra_claim_device_seconds_total`.
//!
//! Labels come from three places: the claim as read for prepare (each request's DeviceClass,
//! each share's consumed capacity), the published devices (profile, memory), and the
//! checkpoint record the lifecycle just wrote (the sharing strategy set up; its completion
//! time starts the hold of a claim the ledger missed, when a reconcile adopts it).
//!
//! Nothing here touches the disk on the kubelet's request path: a prepare or unprepare
//! changes the ledger in memory and wakes [`UsageTracker::persist`], a background task that
//! writes `usage.json` (fsynced) [`FLUSH_DELAY`] after a claim ends, or
//! [`START_FLUSH_DELAY`] after claims only started, coalescing every change in between, and a
//! graceful shutdown writes what is left. What a crash or
//! a power loss can cost the bill, and why nothing is counted twice: `docs/architecture.md`,
//! "Usage accounting and crashes".

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::checkpoint::{self, Checkpoint, ClaimPhase, ClaimRecord};
use crate::devices::{DeviceKind, DeviceModel};
use crate::metrics::Metrics;
use crate::quantity::Quantity;
use crate::usage::{self, DeviceFacts, HeldDevice, Ledger, Live, holdings, store, strategy_label};

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the claim said when it was read for prepare.
#[derive(Default)]
struct Fetched {
    classes: BTreeMap<String, String>,
    devices: Vec<HeldDevice>,
}

/// How long [`UsageTracker::persist`] waits after a claim ends (or a reconcile changed the
/// ledger, or a write failed) before writing, so that every change of a burst of calls lands
/// in one write. An end the file misses bills the claim until the plugin's restart.
pub const FLUSH_DELAY: Duration = Duration::from_secs(1);

/// How long [`UsageTracker::persist`] waits when claims only started since the last write
/// (an end meanwhile brings the write forward to [`FLUSH_DELAY`] after it). A start the file
/// misses costs nothing after a crash while its claim is still prepared (the restart adopts
/// it from the checkpoint's completion time). What can go unbilled, at most about this
/// long per claim: a claim that started within this window before a power loss, or that
/// started and ended within it with a crash in the second after its end (its record has
/// left the checkpoint by then). Under steady prepares it makes one fsynced write per
/// window instead of one per second.
pub const START_FLUSH_DELAY: Duration = Duration::from_secs(10);

/// The plugin's usage ledger and the facts that label it. Shared by the claim source, the
/// kubelet handler, the periodic pass and the background writer.
pub struct UsageTracker {
    path: PathBuf,
    ledger: Mutex<Ledger>,
    /// The ledger changed since it was last written.
    dirty: AtomicBool,
    /// Among those changes, one that is written after [`FLUSH_DELAY`] (an end, a reconcile,
    /// a failed write), not [`START_FLUSH_DELAY`].
    urgent: AtomicBool,
    /// Wakes the background writer.
    changed: Notify,
    fetched: Mutex<HashMap<String, Fetched>>,
    facts: Mutex<HashMap<String, DeviceFacts>>,
    metrics: Metrics,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Profile and capacity of every published device, by name.
pub fn device_facts(model: &DeviceModel) -> HashMap<String, DeviceFacts> {
    let capacity = |d: &k8s_openapi::api::resource::v1::Device, name: &str| {
        let value = d.capacity.as_ref()?.get(name)?;
        Quantity::from_k8s(&value.value).ok().map(|q| q.as_f64())
    };
    model
        .devices
        .iter()
        .map(|p| {
            let profile = match &p.kind {
                // A VM holds the whole GPU.
                DeviceKind::Gpu | DeviceKind::Vfio { .. } => usage::FULL_GPU.to_string(),
                DeviceKind::MigStatic { profile, .. } | DeviceKind::MigDynamic { profile, .. } => {
                    profile.clone()
                }
                DeviceKind::Vgpu { type_name, .. } => type_name.clone(),
            };
            let facts = DeviceFacts {
                profile,
                // A vGPU publishes its memory as `framebuffer`.
                memory: capacity(&p.device, "memory")
                    .or_else(|| capacity(&p.device, "framebuffer")),
                multiprocessors: capacity(&p.device, "multiprocessors"),
            };
            (p.name().to_string(), facts)
        })
        .collect()
}

/// The checkpoint in `state_dir` for boot `boot_id`, read without opening the store or
/// taking the plugin lock ([`checkpoint::read_unlocked`]); `None` when missing, unreadable
/// or stale. Callers that would take `None` for "nothing prepared" use
/// [`checkpoint::read_unlocked`] and its [`checkpoint::Snapshot::Unreadable`] instead.
pub fn read_checkpoint(state_dir: &Path, boot_id: &str) -> Option<Checkpoint> {
    checkpoint::read_unlocked(state_dir, boot_id).current()
}

impl UsageTracker {
    /// Opens the ledger in `state_dir`. One that cannot be read is moved aside (`.bad`) with
    /// a warning and accounting starts from zero: billing data is lost, claims are not.
    pub fn open(state_dir: &Path, metrics: Metrics) -> UsageTracker {
        let path = state_dir.join(store::USAGE_FILE);
        let ledger = match store::load(&path) {
            Ok(ledger) => ledger,
            Err(e) => {
                let aside = path.with_extension("json.bad");
                let moved = std::fs::rename(&path, &aside).is_ok();
                warn!(
                    error = %crate::kubelet::error_chain(&e),
                    moved_to = %aside.display(),
                    moved,
                    "usage ledger unreadable; device-seconds start from zero"
                );
                Ledger::default()
            }
        };
        UsageTracker {
            path,
            ledger: Mutex::new(ledger),
            dirty: AtomicBool::new(false),
            urgent: AtomicBool::new(false),
            changed: Notify::new(),
            fetched: Mutex::new(HashMap::new()),
            facts: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Takes the published devices' profiles and capacities from the current model.
    pub fn set_model(&self, model: &DeviceModel) {
        *lock(&self.facts) = device_facts(model);
    }

    /// Remembers what claim `uid` said when it was read for prepare.
    pub fn fetched(&self, uid: &str, classes: BTreeMap<String, String>, devices: Vec<HeldDevice>) {
        lock(&self.fetched).insert(uid.to_string(), Fetched { classes, devices });
    }

    /// The holdings of a prepared claim; `take` forgets what its read said afterwards.
    fn holdings_of(&self, record: &ClaimRecord, take: bool) -> Vec<usage::Holding> {
        let fetched = {
            let mut all = lock(&self.fetched);
            let found = if take {
                all.remove(&record.uid)
            } else {
                all.get(&record.uid).map(|f| Fetched {
                    classes: f.classes.clone(),
                    devices: f.devices.clone(),
                })
            };
            found.unwrap_or_default()
        };
        let devices: Vec<HeldDevice> = record
            .devices
            .iter()
            .map(|d| {
                let read = fetched.devices.iter().find(|f| f.device == d.device);
                HeldDevice {
                    request: read
                        .map(|f| f.request.clone())
                        .or_else(|| d.request_names.first().cloned())
                        .unwrap_or_default(),
                    device: d.device.clone(),
                    share_id: d.share_id.clone(),
                    consumed: read.map(|f| f.consumed.clone()).unwrap_or_default(),
                    strategy: strategy_label(d.sharing.as_ref()),
                }
            })
            .collect();
        holdings(
            &record.namespace,
            &fetched.classes,
            &devices,
            &lock(&self.facts),
        )
    }

    /// Asks the background writer to write the ledger, [`FLUSH_DELAY`] from now when
    /// `urgent`, else within [`START_FLUSH_DELAY`]; never waits.
    fn mark_changed(&self, urgent: bool) {
        if urgent {
            self.urgent.store(true, Ordering::Release);
        }
        self.dirty.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    /// Writes the ledger now if it changed since it was last written (fsynced: a totals file
    /// that a power loss rolled back would under-bill every claim that ended since). For the
    /// background writer and a graceful shutdown; never on the kubelet's request path.
    /// Returns whether the file was written; a failed write is logged and left for the next
    /// flush.
    pub fn flush(&self) -> bool {
        self.urgent.store(false, Ordering::Release);
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.write()
    }

    fn write(&self) -> bool {
        let snapshot = lock(&self.ledger).clone();
        match store::save(&self.path, &snapshot) {
            Ok(()) => true,
            Err(e) => {
                self.urgent.store(true, Ordering::Release);
                self.dirty.store(true, Ordering::Release);
                warn!(error = %crate::kubelet::error_chain(&e), "writing the usage ledger; trying again later");
                false
            }
        }
    }

    /// The background writer: writes the ledger [`FLUSH_DELAY`] after the first urgent change
    /// (an end, a reconcile, a failed write) and at the latest [`START_FLUSH_DELAY`] after the
    /// first change of any kind; every change meanwhile goes into the same write. Runs until
    /// aborted; the blocking write runs off the async threads.
    pub async fn persist(self: std::sync::Arc<Self>) {
        loop {
            // A permit left by a change the last write already carried wakes this once
            // with nothing to write: wait on, so the next change starts its own window.
            while !self.dirty.load(Ordering::Acquire) {
                self.changed.notified().await;
            }
            let first = tokio::time::Instant::now();
            let mut urgent_since = None;
            loop {
                if urgent_since.is_none() && self.urgent.load(Ordering::Acquire) {
                    urgent_since = Some(tokio::time::Instant::now());
                }
                let due = first + START_FLUSH_DELAY;
                let due = urgent_since.map_or(due, |t| due.min(t + FLUSH_DELAY));
                tokio::select! {
                    () = tokio::time::sleep_until(due) => break,
                    () = self.changed.notified() => {}
                }
            }
            let tracker = std::sync::Arc::clone(&self);
            let wrote = tokio::task::spawn_blocking(move || tracker.flush())
                .await
                .unwrap_or(false);
            debug!(wrote, "usage ledger");
        }
    }

    /// Claim `uid` was prepared (the kubelet got its devices) as `record` (the lifecycle's
    /// record of it, completed just now): it holds them from now. A claim already counted
    /// keeps its start; one whose start the ledger lost (a crash before the write) is
    /// adopted by the next reconcile from the record's completion time. Memory only: the
    /// write happens in the background ([`UsageTracker::persist`]).
    pub fn prepared(&self, uid: &str, record: Option<&ClaimRecord>) {
        let Some(record) = record.filter(|r| r.uid == uid) else {
            return;
        };
        let holdings = self.holdings_of(record, true);
        let mut ledger = lock(&self.ledger);
        let changed = match ledger.live.get_mut(uid) {
            // Adopted by a periodic pass before this call returned: keep its start, take
            // the labels only the claim's read knows.
            Some(live) if live.holdings != holdings => {
                live.holdings = holdings;
                true
            }
            Some(_) => false,
            None => ledger.start(uid, now_unix(), holdings),
        };
        self.publish_locked(&ledger);
        drop(ledger);
        if changed {
            self.mark_changed(false);
        }
    }

    /// Claim `uid` was unprepared: its device-seconds move into the totals. Memory only, as
    /// [`UsageTracker::prepared`].
    pub fn unprepared(&self, uid: &str) {
        lock(&self.fetched).remove(uid);
        let mut ledger = lock(&self.ledger);
        let changed = ledger.stop(uid, now_unix());
        self.publish_locked(&ledger);
        drop(ledger);
        if changed {
            self.mark_changed(true);
        }
    }

    /// [`UsageTracker::reconcile`] with what a lock-free read of the checkpoint found: a
    /// file that could not be read or verified changes nothing (it says nothing about which
    /// claims are prepared, and taking it for "none" would end every hold), and is retried at
    /// the next pass.
    pub fn reconcile_snapshot(&self, snapshot: &checkpoint::Snapshot) {
        match snapshot {
            checkpoint::Snapshot::Current(checkpoint) => self.reconcile(Some(checkpoint)),
            checkpoint::Snapshot::Empty => self.reconcile(None),
            checkpoint::Snapshot::Unreadable => {
                warn!("checkpoint unreadable; usage left as it was until the next pass");
            }
        }
    }

    /// Makes the ledger agree with `checkpoint` (claims prepared now; `None`: none, e.g.
    /// after a reboot) and refreshes the counter. Claims the ledger holds live but the
    /// checkpoint no longer does end now — never earlier, even after a restart whose ledger
    /// missed their unprepare: the previous process may have published their seconds up to
    /// its last scrape, and a counter that went down would read as a reset to PromQL's
    /// `increase()`, which would then count the whole total again.
    pub fn reconcile(&self, checkpoint: Option<&Checkpoint>) {
        let mut ledger = lock(&self.ledger);
        // A claim found prepared but not counted (prepared before accounting began, or its
        // prepare call is still returning) counts from when the checkpoint completed it.
        let prepared: BTreeMap<String, Live> = checkpoint
            .into_iter()
            .flat_map(|c| c.claims.values())
            .filter(|r| r.phase == ClaimPhase::PrepareCompleted)
            .map(|r| {
                let holdings = if ledger.live.contains_key(&r.uid) {
                    Vec::new()
                } else {
                    self.holdings_of(r, false)
                };
                let live = Live {
                    since_unix: r.updated_unix as f64,
                    holdings,
                };
                (r.uid.clone(), live)
            })
            .collect();
        let changed = ledger.reconcile(&prepared, now_unix());
        self.publish_locked(&ledger);
        drop(ledger);
        if changed {
            self.mark_changed(true);
        }
    }

    fn publish_locked(&self, ledger: &Ledger) {
        let series = ledger
            .device_seconds(now_unix())
            .into_iter()
            .map(|(l, v)| {
                (
                    vec![
                        ("namespace", l.namespace),
                        ("class", l.class),
                        ("profile", l.profile),
                        ("sharing", l.sharing),
                    ],
                    v,
                )
            })
            .collect();
        self.metrics.set_claim_device_seconds(series);
    }

    /// The current ledger (for tests and diagnostics).
    pub fn ledger(&self) -> Ledger {
        lock(&self.ledger).clone()
    }
}
