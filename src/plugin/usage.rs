//! Usage accounting in the running plugin: what each prepared claim holds goes into the
//! [`Ledger`] when the kubelet's prepare succeeds and out of it when its unprepare does; a
//! periodic pass reconciles the ledger with the checkpoint and refreshes
//! `gpu_dra_claim_device_seconds_total`.
//!
//! Labels come from three places: the claim as read for prepare (each request's DeviceClass,
//! each share's consumed capacity), the published devices (profile, memory), and the
//! checkpoint (the sharing strategy set up). The ledger is rewritten only when a claim starts
//! or ends, next to the checkpoint.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::warn;

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

/// The plugin's usage ledger and the facts that label it. Shared by the claim source, the
/// kubelet handler and the periodic pass.
pub struct UsageTracker {
    path: PathBuf,
    ledger: Mutex<Ledger>,
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
                DeviceKind::Gpu => usage::FULL_GPU.to_string(),
                DeviceKind::MigStatic { profile, .. } | DeviceKind::MigDynamic { profile, .. } => {
                    profile.clone()
                }
            };
            let facts = DeviceFacts {
                profile,
                memory: capacity(&p.device, "memory"),
                multiprocessors: capacity(&p.device, "multiprocessors"),
            };
            (p.name().to_string(), facts)
        })
        .collect()
}

/// The checkpoint in `state_dir` for boot `boot_id`, read without opening the store or
/// taking the plugin lock; `None` when missing, unreadable or stale.
pub fn read_checkpoint(state_dir: &Path, boot_id: &str) -> Option<Checkpoint> {
    let bytes = std::fs::read(state_dir.join(checkpoint::CHECKPOINT_FILE)).ok()?;
    let checkpoint = checkpoint::decode(&bytes).ok()?;
    (checkpoint.node_boot_id == boot_id).then_some(checkpoint)
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

    fn save(&self, ledger: &Ledger) {
        if let Err(e) = store::save(&self.path, ledger) {
            warn!(error = %crate::kubelet::error_chain(&e), "writing the usage ledger");
        }
    }

    /// Claim `uid` was prepared (the kubelet got its devices): it holds them from now, as
    /// `checkpoint` records them. A claim already counted keeps its start.
    pub fn prepared(&self, uid: &str, checkpoint: Option<&Checkpoint>) {
        let Some(record) = checkpoint.and_then(|c| c.claims.get(uid)) else {
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
        if changed {
            self.save(&ledger);
        }
        self.publish_locked(&ledger);
    }

    /// Claim `uid` was unprepared: its device-seconds move into the totals.
    pub fn unprepared(&self, uid: &str) {
        lock(&self.fetched).remove(uid);
        let mut ledger = lock(&self.ledger);
        if ledger.stop(uid, now_unix()) {
            self.save(&ledger);
        }
        self.publish_locked(&ledger);
    }

    /// Makes the ledger agree with `checkpoint` (claims prepared now; `None`: none, e.g.
    /// after a reboot) and refreshes the counter.
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
        if ledger.reconcile(&prepared, now_unix()) {
            self.save(&ledger);
        }
        self.publish_locked(&ledger);
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
