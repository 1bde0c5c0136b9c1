//! The inventory watcher: re-reads the GPUs every `--inventory-interval`, and within a
//! fraction of a second when the backend reports a health event or a GPU coming or going
//! ([`GpuBackend::health_generation`]). Each round judges the GPUs' faults with the health
//! policy, taints unhealthy devices, keeps prepared devices of vanished GPUs published
//! (tainted), and sends a changed model to the publisher and changed health to the kubelet.
//! GPU state transitions are logged and counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use super::memory;
use super::observe;
use crate::devices::{self, DeviceModel, ModelOptions};
use crate::hardware::health::unix_now;
use crate::hardware::{GpuBackend, NodeInventory};
use crate::health::{self, DeviceVerdict, HealthPolicy, HealthState, PreparedDevice};
use crate::kubelet::{DeviceHealth, HealthStatus};
use crate::metrics::Metrics;

/// How often the health generation of a backend without a signal
/// ([`GpuBackend::health_signal`]) is polled.
pub const HEALTH_POLL: Duration = Duration::from_millis(200);

/// Notified when a kubelet call ends: the call's own hardware changes (a GPU switched to
/// VFIO, a vGPU created) move the generation without any backend signal.
static CALL_ENDED: std::sync::LazyLock<Notify> = std::sync::LazyLock::new(Notify::new);

/// Tells the watcher a kubelet call has ended, so it compares the health generation now
/// rather than at its next interval. Cheap, and never blocks; the comparison runs on the
/// watcher's task in the same wake-up as the call.
pub fn call_ended() {
    CALL_ENDED.notify_one();
}

/// How the watcher learns that the health generation may have moved.
enum HealthWake {
    /// The backend notifies ([`GpuBackend::health_signal`]).
    Signal(Arc<Notify>),
    /// The backend cannot: the generation is polled every [`HEALTH_POLL`].
    Poll(tokio::time::Interval),
}

impl HealthWake {
    fn of(backend: &dyn GpuBackend) -> HealthWake {
        match backend.health_signal() {
            Some(signal) => HealthWake::Signal(signal),
            None => {
                let mut poll = tokio::time::interval(HEALTH_POLL);
                poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                HealthWake::Poll(poll)
            }
        }
    }

    /// Returns when the backend's signal fires, or at the next poll.
    async fn moved(&mut self) {
        match self {
            HealthWake::Signal(signal) => signal.notified().await,
            HealthWake::Poll(poll) => {
                poll.tick().await;
            }
        }
    }
}

/// The model to publish for `inventory`: devices, health taints, and the prepared devices
/// the inventory lacks (kept from `previous`, tainted); with the verdict on every device.
pub fn publishable(
    inventory: &NodeInventory,
    options: &ModelOptions,
    policy: &HealthPolicy,
    prepared: &[PreparedDevice],
    previous: &DeviceModel,
    now: i64,
) -> (DeviceModel, Vec<DeviceVerdict>) {
    let mut model = devices::build(inventory, options);
    let mut verdicts = health::judge(policy, inventory, &model, now);
    health::apply_taints(&mut model, &verdicts, policy);
    let kept = health::keep_prepared(&mut model, &mut verdicts, prepared, previous, policy, now);
    if !kept.is_empty() {
        warn!(
            devices = ?kept,
            "prepared devices whose GPU is gone stay published, tainted, until unprepared"
        );
    }
    (model, verdicts)
}

/// The devices prepared claims hold, from the checkpoint in `state_dir` (read without
/// opening the store): empty when there is no checkpoint of this boot, `None` when the file
/// could not be read whole just now (a write raced every re-read, or it is damaged). A caller
/// keeps what it knew then: reading "nothing prepared" from a torn read would stop publishing
/// the prepared devices of a vanished GPU, and the scheduler would forget their counters.
pub fn prepared_devices(state_dir: &std::path::Path, boot_id: &str) -> Option<Vec<PreparedDevice>> {
    let checkpoint = match crate::checkpoint::read_unlocked(state_dir, boot_id) {
        crate::checkpoint::Snapshot::Current(checkpoint) => checkpoint,
        crate::checkpoint::Snapshot::Empty => return Some(Vec::new()),
        crate::checkpoint::Snapshot::Unreadable => return None,
    };
    Some(
        checkpoint
            .claims
            .values()
            .flat_map(|c| &c.devices)
            .map(|d| PreparedDevice {
                device: d.device.clone(),
                gpu_uuid: d.gpu_uuid.clone(),
                mig_uuid: d.mig.as_ref().and_then(|m| m.uuid.clone()),
            })
            .collect(),
    )
}

/// The kubelet's health list: one entry per published device, `Unhealthy` for degraded and
/// failed devices with the verdict as the message.
pub fn health_list(
    verdicts: &[DeviceVerdict],
    pool: &str,
    now: i64,
    timeout_seconds: i64,
) -> Vec<DeviceHealth> {
    verdicts
        .iter()
        .map(|v| DeviceHealth {
            pool_name: pool.to_string(),
            device_name: v.device.clone(),
            status: if v.verdict.state == HealthState::Healthy {
                HealthStatus::Healthy
            } else {
                HealthStatus::Unhealthy
            },
            message: if v.verdict.state == HealthState::Healthy {
                String::new()
            } else {
                format!("GPU {}: {}", v.gpu_uuid, v.verdict.describe())
            },
            last_updated_unix_seconds: now,
            health_check_timeout_seconds: timeout_seconds,
        })
        .collect()
}

/// The verdict per GPU (by UUID) and per GPU instance: what transitions are logged for.
type GpuStates = BTreeMap<String, (HealthState, Option<String>)>;

fn gpu_states(
    policy: &HealthPolicy,
    inventory: &NodeInventory,
    verdicts: &[DeviceVerdict],
    now: i64,
) -> GpuStates {
    let mut out = GpuStates::new();
    for g in &inventory.gpus {
        let v = health::judge_gpu(policy, &g.faults, now);
        out.insert(g.uuid.clone(), (v.gpu.state, v.gpu.cause.clone()));
        for (gi, iv) in v.instances {
            out.insert(format!("{}/gi-{gi}", g.uuid), (iv.state, iv.cause));
        }
    }
    for v in verdicts {
        if v.verdict.cause.as_deref() == Some(health::GONE_CAUSE) {
            out.insert(
                v.gpu_uuid.clone(),
                (v.verdict.state, v.verdict.cause.clone()),
            );
        }
    }
    out
}

/// Logs and counts every change between `before` and `after`; a GPU that appears healthy
/// or disappears while healthy is not a transition.
fn record_transitions(metrics: &Metrics, before: &GpuStates, after: &GpuStates) {
    let healthy = (HealthState::Healthy, None);
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for key in keys {
        let from = before.get(key).unwrap_or(&healthy);
        let to = after.get(key).unwrap_or(&healthy);
        if from == to {
            continue;
        }
        metrics.record_health_transition(from.0.as_str(), to.0.as_str());
        let cause = to.1.as_deref().or(from.1.as_deref()).unwrap_or("");
        if to.0 == HealthState::Healthy {
            info!(gpu = %key, from = from.0.as_str(), to = "healthy", cause, "GPU health changed");
        } else {
            warn!(gpu = %key, from = from.0.as_str(), to = to.0.as_str(), cause, "GPU health changed");
        }
    }
}

/// Everything the watcher needs, fixed for the plugin's life.
pub struct Watcher {
    /// The GPU backend.
    pub backend: Arc<dyn GpuBackend>,
    /// How devices are modelled.
    pub options: ModelOptions,
    /// How faults are judged.
    pub policy: HealthPolicy,
    /// The pool (node) name.
    pub pool: String,
    /// The regular re-read interval.
    pub interval: Duration,
    /// The checkpoint's directory and boot ID (prepared devices).
    pub state_dir: PathBuf,
    /// This boot's ID.
    pub boot_id: String,
    /// Gauges and counters.
    pub metrics: Metrics,
}

impl Watcher {
    /// How long the kubelet may trust a health report: three intervals, at least 30 s. The
    /// list is re-sent every interval, so it never goes stale while the plugin runs.
    pub fn health_timeout_seconds(&self) -> i64 {
        i64::try_from(self.interval.as_secs().saturating_mul(3))
            .unwrap_or(i64::MAX)
            .max(30)
    }

    /// The first round, at start-up: the model and health list to start publishing with.
    pub fn first(&self, inventory: &NodeInventory) -> (DeviceModel, Vec<DeviceHealth>) {
        let now = unix_now();
        let prepared = prepared_devices(&self.state_dir, &self.boot_id).unwrap_or_else(|| {
            warn!(
                state_dir = %self.state_dir.display(),
                "checkpoint unreadable at start-up; devices of vanished GPUs are not kept published this round"
            );
            Vec::new()
        });
        let (model, verdicts) = publishable(
            inventory,
            &self.options,
            &self.policy,
            &prepared,
            &DeviceModel::default(),
            now,
        );
        observe::record_inventory(&self.metrics, inventory, &model, &verdicts);
        let states = gpu_states(&self.policy, inventory, &verdicts, now);
        record_transitions(&self.metrics, &GpuStates::new(), &states);
        (
            model,
            health_list(&verdicts, &self.pool, now, self.health_timeout_seconds()),
        )
    }

    /// Runs until the task is aborted or both receivers are gone.
    pub async fn run(
        self,
        published: NodeInventory,
        models: watch::Sender<DeviceModel>,
        health: watch::Sender<Vec<DeviceHealth>>,
    ) {
        let this = Arc::new(self);
        let mut ticker = crate::ticks::Ticks::every(this.interval);
        ticker.tick().await; // the first round ran at start-up
        // A backend that signals changes is waited for; one that cannot is polled. Either
        // way the generation is read on this task, not the blocking pool: the backends
        // answer from memory (an atomic counter under NVML, a stat of the state file in the
        // simulation).
        let mut wake = HealthWake::of(this.backend.as_ref());
        let generation = |w: &Arc<Watcher>| w.backend.health_generation();
        let mut seen_generation = generation(&this);
        let now = unix_now();
        let mut last_judged = gpu_states(&this.policy, &published, &[], now);
        let mut last_states = {
            let current = models.borrow();
            let kept: Vec<DeviceVerdict> = current
                .devices
                .iter()
                .filter(|d| health::gone_taint(&d.device, &this.policy).is_some())
                .map(|d| DeviceVerdict {
                    device: d.device.name.clone(),
                    gpu_uuid: d.gpu_uuid.clone(),
                    verdict: health::Verdict {
                        state: HealthState::Failed,
                        cause: Some(health::GONE_CAUSE.into()),
                        since: now,
                    },
                })
                .collect();
            gpu_states(&this.policy, &published, &kept, now)
        };
        let mut last_inventory = Some(published);
        let mut last_prepared =
            prepared_devices(&this.state_dir, &this.boot_id).unwrap_or_default();
        loop {
            let regular = tokio::select! {
                _ = ticker.tick() => true,
                () = wake.moved() => false,
                () = CALL_ENDED.notified() => false,
            };
            if !regular {
                let g = generation(&this);
                if g == seen_generation {
                    continue;
                }
                seen_generation = g;
            }
            if models.is_closed() && health.is_closed() {
                return;
            }
            let w = Arc::clone(&this);
            let read = tokio::task::spawn_blocking(move || {
                let inventory = w.backend.inventory();
                let prepared = prepared_devices(&w.state_dir, &w.boot_id);
                (inventory, prepared)
            })
            .await;
            let Ok((inventory, prepared)) = read else {
                continue;
            };
            // A checkpoint that could not be read whole this round says nothing new.
            let prepared = prepared.unwrap_or_else(|| last_prepared.clone());
            let inventory = match inventory {
                Ok(inv) => inv,
                Err(e) => {
                    warn!(error = %crate::errors::error_chain(&e), "reading the GPU inventory");
                    continue;
                }
            };
            let now = unix_now();
            let judged = gpu_states(&this.policy, &inventory, &[], now);
            // Model, health and gauges derive from the inventory, the verdicts (which change
            // with time only when a hold-down ends) and, for devices kept published after
            // their GPU went, the prepared devices. When none changed, no model is built
            // (about a megabyte of short-lived allocations on a large node, every tick, which
            // would keep the heap's high-water mark up).
            let ghosts_matter = prepared != last_prepared && {
                let current = models.borrow();
                prepared.iter().any(|p| current.device(&p.device).is_none())
                    || current
                        .devices
                        .iter()
                        .any(|d| health::gone_taint(&d.device, &this.policy).is_some())
            };
            let unchanged = last_inventory.as_ref() == Some(&inventory)
                && judged == last_judged
                && !ghosts_matter;
            if unchanged {
                if regular {
                    // Re-send the health list with a fresh time so the kubelet never finds it
                    // stale.
                    health.send_modify(|list| {
                        for d in list.iter_mut() {
                            d.last_updated_unix_seconds = now;
                        }
                    });
                }
                // A quiet round: the heap's free pages go back (the code a burst of kubelet
                // calls mapped is unmapped by `memory::release_after_calls`).
                memory::release_free_heap();
                continue;
            }
            let previous = models.borrow().clone();
            let (model, verdicts) = publishable(
                &inventory,
                &this.options,
                &this.policy,
                &prepared,
                &previous,
                now,
            );
            observe::record_inventory(&this.metrics, &inventory, &model, &verdicts);
            let states = gpu_states(&this.policy, &inventory, &verdicts, now);
            record_transitions(&this.metrics, &last_states, &states);
            let next_health =
                health_list(&verdicts, &this.pool, now, this.health_timeout_seconds());
            health.send_if_modified(|current| {
                let changed = strip_times(current) != strip_times(&next_health);
                if changed || regular {
                    *current = next_health;
                }
                changed || regular
            });
            models.send_if_modified(|current| {
                let changed = *current != model;
                if changed {
                    info!(
                        devices = model.devices.len(),
                        tainted = model
                            .devices
                            .iter()
                            .filter(|d| d.device.taints.is_some())
                            .count(),
                        "device model changed; re-publishing"
                    );
                    *current = model;
                }
                changed
            });
            last_states = states;
            last_judged = judged;
            last_inventory = Some(inventory);
            last_prepared = prepared;
        }
    }
}

fn strip_times(h: &[DeviceHealth]) -> Vec<(&str, &str, HealthStatus, &str)> {
    h.iter()
        .map(|d| {
            (
                d.pool_name.as_str(),
                d.device_name.as_str(),
                d.status,
                d.message.as_str(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{
        CHECKPOINT_FILE, Checkpoint, ClaimPhase, ClaimRecord, DeviceRecord, encode,
    };

    const BOOT: &str = "boot-1";

    fn checkpoint_with_one_device() -> Vec<u8> {
        let mut checkpoint = Checkpoint::new(BOOT);
        checkpoint.claims.insert(
            "uid-1".into(),
            ClaimRecord {
                uid: "uid-1".into(),
                namespace: "ml".into(),
                name: "train".into(),
                phase: ClaimPhase::PrepareCompleted,
                devices: vec![DeviceRecord {
                    request_names: vec!["gpu".into()],
                    pool: "node-a".into(),
                    device: "gpu-3".into(),
                    share_id: None,
                    cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-1-gpu-3".into()],
                    gpu_uuid: "GPU-ccc".into(),
                    mig: None,
                    sharing: None,
                    vfio: None,
                    vgpu: None,
                }],
                updated_unix: 1_760_000_000,
                fabric_partition: None,
            },
        );
        encode(&checkpoint).unwrap()
    }

    #[test]
    fn prepared_devices_tell_none_prepared_from_a_checkpoint_that_cannot_be_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(prepared_devices(dir.path(), BOOT), Some(vec![]), "no file");

        std::fs::write(
            dir.path().join(CHECKPOINT_FILE),
            checkpoint_with_one_device(),
        )
        .unwrap();
        let read = prepared_devices(dir.path(), BOOT).expect("a whole file");
        assert_eq!(
            read,
            vec![PreparedDevice {
                device: "gpu-3".into(),
                gpu_uuid: "GPU-ccc".into(),
                mig_uuid: None,
            }]
        );
        assert_eq!(
            prepared_devices(dir.path(), "another-boot"),
            Some(vec![]),
            "records of another boot are stale"
        );

        // A torn or damaged file is not "nothing prepared".
        let mut torn = checkpoint_with_one_device();
        torn.truncate(torn.len() / 2);
        std::fs::write(dir.path().join(CHECKPOINT_FILE), torn).unwrap();
        assert_eq!(prepared_devices(dir.path(), BOOT), None);
    }
}
