//! Feeding [`Metrics`] and [`Health`] from what the plugin learns: the inventory, the
//! publisher's results and the kubelet's registration reports.

use tokio::sync::watch;

use std::collections::BTreeMap;

use crate::devices::DeviceModel;
use crate::hardware::NodeInventory;
use crate::health::{DeviceVerdict, HealthState};
use crate::k8s::PublishStatus;
use crate::kubelet::RegistrationState;
use crate::metrics::{Health, Metrics};

/// Sets the device, MIG and health gauges from one inventory reading and the health
/// policy's verdicts on its devices (a GPU is as healthy as its full-GPU device, or as the
/// worst of its devices when it has none published).
pub fn record_inventory(
    metrics: &Metrics,
    inventory: &NodeInventory,
    model: &DeviceModel,
    verdicts: &[DeviceVerdict],
) {
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    metrics.set_published_devices(count(model.devices.len()));
    metrics.set_mig_instances(count(
        inventory.gpus.iter().map(|g| g.mig_devices.len()).sum(),
    ));
    let mut per_gpu: BTreeMap<&str, HealthState> = inventory
        .gpus
        .iter()
        .map(|g| (g.uuid.as_str(), HealthState::Healthy))
        .collect();
    for v in verdicts {
        if let Some(state) = per_gpu.get_mut(v.gpu_uuid.as_str()) {
            *state = (*state).max(v.verdict.state);
        }
    }
    let states: Vec<HealthState> = per_gpu.values().copied().collect();
    let healthy = states
        .iter()
        .filter(|s| **s == HealthState::Healthy)
        .count();
    metrics.set_gpu_health(count(healthy), count(states.len() - healthy));
    let mut gpus_by_state = BTreeMap::new();
    for s in [
        HealthState::Healthy,
        HealthState::Degraded,
        HealthState::Failed,
    ] {
        gpus_by_state.insert(
            s.as_str(),
            count(states.iter().filter(|x| **x == s).count()),
        );
    }
    let mut tainted: BTreeMap<String, u64> = BTreeMap::new();
    for d in &model.devices {
        for t in d.device.taints.iter().flatten() {
            *tainted.entry(t.effect.clone()).or_default() += 1;
        }
    }
    metrics.set_health_gauges(gpus_by_state, tainted);
}

/// Marks `health` published at the publisher's first success, and then — start-up being
/// done — gives back the memory only start-up used ([`super::memory::release_startup`]);
/// ends with the publisher.
pub async fn follow_publisher(mut status: watch::Receiver<PublishStatus>, health: Health) {
    loop {
        if matches!(*status.borrow_and_update(), PublishStatus::Published(_)) {
            health.set_published();
            let _ = tokio::task::spawn_blocking(super::memory::release_startup).await;
            return;
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// Keeps `health`'s registration in step with the kubelet's reports; ends with the sockets.
///
/// Each time the kubelet (re)registers the plugin, the current model is sent again on
/// `republish`, which makes the publisher check the node's slices at once and again after
/// [`REPUBLISH_AGAIN`]: a kubelet that starts deletes the node's ResourceSlices (and one that
/// lost the plugin for longer than its grace period deletes the driver's), and that deletion
/// may land just before or just after the registration.
pub async fn follow_registration(
    mut state: watch::Receiver<RegistrationState>,
    health: Health,
    republish: Option<watch::Sender<DeviceModel>>,
) {
    let mut again: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let registered = matches!(*state.borrow_and_update(), RegistrationState::Registered);
        health.set_registered(registered);
        if registered && let Some(models) = &republish {
            models.send_modify(|_| {});
            if let Some(previous) = again.take() {
                previous.abort();
            }
            let models = models.clone();
            again = Some(tokio::spawn(async move {
                tokio::time::sleep(REPUBLISH_AGAIN).await;
                models.send_modify(|_| {});
            }));
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// How long after a registration the publisher checks the slices a second time.
pub const REPUBLISH_AGAIN: std::time::Duration = std::time::Duration::from_secs(5);
