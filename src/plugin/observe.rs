//! Feeding [`Metrics`] and [`Health`] from what the plugin learns: the inventory, the
//! publisher's results and the kubelet's registration reports.

use tokio::sync::watch;

use crate::devices::DeviceModel;
use crate::hardware::NodeInventory;
use crate::k8s::PublishStatus;
use crate::kubelet::RegistrationState;
use crate::metrics::{Health, Metrics};

/// Sets the device, MIG and GPU-health gauges from one inventory reading.
pub fn record_inventory(metrics: &Metrics, inventory: &NodeInventory, model: &DeviceModel) {
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    metrics.set_published_devices(count(model.devices.len()));
    metrics.set_mig_instances(count(
        inventory.gpus.iter().map(|g| g.mig_devices.len()).sum(),
    ));
    let healthy = inventory.gpus.iter().filter(|g| g.healthy).count();
    metrics.set_gpu_health(count(healthy), count(inventory.gpus.len() - healthy));
}

/// Marks `health` published at the publisher's first success; ends with the publisher.
pub async fn follow_publisher(mut status: watch::Receiver<PublishStatus>, health: Health) {
    loop {
        if matches!(*status.borrow_and_update(), PublishStatus::Published(_)) {
            health.set_published();
            return;
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// Keeps `health`'s registration in step with the kubelet's reports; ends with the sockets.
pub async fn follow_registration(mut state: watch::Receiver<RegistrationState>, health: Health) {
    loop {
        let registered = matches!(*state.borrow_and_update(), RegistrationState::Registered);
        health.set_registered(registered);
        if state.changed().await.is_err() {
            return;
        }
    }
}
