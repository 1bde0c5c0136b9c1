//! Per-device telemetry in the running plugin: every `--telemetry-interval`, a blocking
//! thread of the runtime's pool samples the backend, joins each GPU and MIG device with the
//! claims and pods that hold it (from the checkpoint, read without opening the store and
//! without the plugin lock) and replaces the `gpu_dra_device_*` families. Prepare and
//! unprepare never wait for it; `/metrics` serves the last sample.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, warn};

use crate::checkpoint::{Checkpoint, PodRef};
use crate::devices::{gpu_device_name, mig_device_name};
use crate::hardware::GpuBackend;
use crate::hardware::telemetry::{GpuTelemetry, NodeTelemetry};
use crate::metrics::Metrics;
use crate::metrics::telemetry::{DeviceReadings, Holder};

/// The pods of prepared claims as last re-read (when the kubelet prepared a claim again, e.g.
/// for a second pod of a shared claim), over what their checkpoint records say. In memory:
/// after a restart the records' pods hold until the next repeat prepare.
#[derive(Debug, Default)]
pub struct Reservations(Mutex<HashMap<String, Vec<PodRef>>>);

impl Reservations {
    /// Claim `uid` is reserved for `pods` now.
    pub fn set(&self, uid: &str, pods: Vec<PodRef>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_string(), pods);
    }

    /// Puts the re-read pods into `checkpoint`'s records and forgets claims it no longer has.
    pub fn apply(&self, checkpoint: &mut Checkpoint) {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        known.retain(|uid, _| checkpoint.claims.contains_key(uid));
        for (uid, pods) in known.iter() {
            if let Some(record) = checkpoint.claims.get_mut(uid) {
                record.pods = pods.clone();
            }
        }
    }
}

/// Who holds which device, by device name and by MIG UUID.
#[derive(Default)]
struct Holders {
    by_device: HashMap<String, Vec<Holder>>,
    by_uuid: HashMap<String, Vec<Holder>>,
}

impl Holders {
    fn from_checkpoint(checkpoint: Option<&Checkpoint>) -> Holders {
        let mut out = Holders::default();
        for record in checkpoint.into_iter().flat_map(|c| c.claims.values()) {
            let holders: Vec<Holder> = if record.pods.is_empty() {
                vec![Holder {
                    namespace: record.namespace.clone(),
                    claim: record.name.clone(),
                    pod: String::new(),
                }]
            } else {
                record
                    .pods
                    .iter()
                    .map(|p| Holder {
                        namespace: record.namespace.clone(),
                        claim: record.name.clone(),
                        pod: p.name.clone(),
                    })
                    .collect()
            };
            for device in &record.devices {
                out.by_device
                    .entry(device.device.clone())
                    .or_default()
                    .extend(holders.iter().cloned());
                if let Some(uuid) = device.mig.as_ref().and_then(|m| m.uuid.clone()) {
                    out.by_uuid
                        .entry(uuid)
                        .or_default()
                        .extend(holders.iter().cloned());
                }
            }
        }
        for list in out.by_device.values_mut().chain(out.by_uuid.values_mut()) {
            list.sort();
            list.dedup();
        }
        out
    }

    fn of(&self, device: &str, uuid: &str) -> Vec<Holder> {
        self.by_device
            .get(device)
            .or_else(|| self.by_uuid.get(uuid))
            .cloned()
            .unwrap_or_default()
    }
}

/// The figures NVML has per GPU only, which a MIG device row repeats from its parent.
fn parent_figures(gpu: &GpuTelemetry, row: &mut DeviceReadings) {
    row.power_watts = gpu.power_watts;
    row.power_limit_watts = gpu.power_limit_watts;
    row.temperature_celsius = gpu.temperature_celsius;
    if let Some(ecc) = gpu.ecc {
        row.ecc_errors = vec![
            ("single_bit", "volatile", ecc.single_bit_volatile),
            ("single_bit", "aggregate", ecc.single_bit_aggregate),
            ("double_bit", "volatile", ecc.double_bit_volatile),
            ("double_bit", "aggregate", ecc.double_bit_aggregate),
        ];
    }
    row.xid_errors = gpu.xid_errors.iter().map(|(x, n)| (*x, *n)).collect();
    row.retired_pages = gpu
        .retired_pages
        .iter()
        .map(|(cause, n)| (cause.label(), *n))
        .collect();
}

/// One row per GPU and per MIG device that exists, labelled with its holders. Pure.
///
/// A lost GPU keeps its row (so its series do not vanish silently) with XID counts only.
pub fn rows(telemetry: &NodeTelemetry, checkpoint: Option<&Checkpoint>) -> Vec<DeviceReadings> {
    let holders = Holders::from_checkpoint(checkpoint);
    let mut out = Vec::new();
    for gpu in &telemetry.gpus {
        let device = gpu_device_name(gpu.minor);
        let mut row = DeviceReadings {
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
            holders: holders.of(&device, &gpu.uuid),
            device,
            sm_active: gpu.sm_active,
            memory_used_bytes: gpu.memory_used_bytes,
            memory_total_bytes: gpu.memory_total_bytes,
            ..DeviceReadings::default()
        };
        parent_figures(gpu, &mut row);
        out.push(row);
        for mig in &gpu.mig {
            let device = mig_device_name(gpu.minor, &mig.profile, mig.placement_start);
            let mut row = DeviceReadings {
                gpu: gpu.index,
                uuid: mig.uuid.clone(),
                holders: holders.of(&device, &mig.uuid),
                device,
                profile: mig.profile.clone(),
                sm_active: mig.sm_active,
                memory_used_bytes: mig.memory_used_bytes,
                memory_total_bytes: mig.memory_total_bytes,
                ..DeviceReadings::default()
            };
            parent_figures(gpu, &mut row);
            out.push(row);
        }
    }
    out
}

/// Samples telemetry every `interval` until aborted. A failed sample keeps the previous one
/// on `/metrics` and is logged once until sampling works again.
pub async fn sample(
    backend: Arc<dyn GpuBackend>,
    metrics: Metrics,
    reservations: Arc<Reservations>,
    state_dir: PathBuf,
    boot_id: String,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticker.tick().await;
        let (backend, metrics) = (Arc::clone(&backend), metrics.clone());
        let reservations = Arc::clone(&reservations);
        let (dir, boot) = (state_dir.clone(), boot_id.clone());
        let round = tokio::task::spawn_blocking(move || {
            let telemetry = backend.telemetry()?;
            let mut checkpoint = super::usage::read_checkpoint(&dir, &boot);
            if let Some(cp) = checkpoint.as_mut() {
                reservations.apply(cp);
            }
            let rows = rows(&telemetry, checkpoint.as_ref());
            metrics.set_device_telemetry(&rows);
            Ok::<usize, crate::hardware::HardwareError>(rows.len())
        })
        .await;
        match round {
            Ok(Ok(devices)) => {
                if failing {
                    warn!(devices, "telemetry sampling works again");
                }
                failing = false;
                debug!(devices, "telemetry sampled");
            }
            Ok(Err(e)) if !failing => {
                failing = true;
                warn!(error = %crate::errors::error_chain(&e), "sampling GPU telemetry; /metrics keeps the last sample");
            }
            Err(e) if !failing => {
                failing = true;
                warn!(error = %e, "telemetry sampling task");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{ClaimPhase, ClaimRecord, DeviceRecord, MigRecord};
    use crate::hardware::telemetry::{EccTelemetry, MigTelemetry};

    fn record(name: &str, device: &str, mig_uuid: Option<&str>, pods: &[&str]) -> ClaimRecord {
        ClaimRecord {
            uid: format!("uid-{name}"),
            namespace: "team-a".into(),
            name: name.into(),
            phase: ClaimPhase::PrepareCompleted,
            devices: vec![DeviceRecord {
                request_names: vec!["gpu".into()],
                pool: "node".into(),
                device: device.into(),
                share_id: None,
                cdi_device_ids: vec![],
                gpu_uuid: "GPU-1".into(),
                mig: mig_uuid.map(|u| MigRecord {
                    parent_minor: 1,
                    profile_id: 19,
                    profile: "1g.10gb".into(),
                    placement_start: 2,
                    placement_size: 1,
                    gi_id: Some(9),
                    ci_id: Some(0),
                    uuid: Some(u.into()),
                }),
                sharing: None,
            }],
            updated_unix: 0,
            pods: pods
                .iter()
                .map(|p| PodRef {
                    name: p.to_string(),
                    uid: format!("uid-{p}"),
                })
                .collect(),
        }
    }

    fn node() -> NodeTelemetry {
        let mut gpu = GpuTelemetry::new(0, 1, "GPU-1");
        gpu.power_watts = Some(300.0);
        gpu.ecc = Some(EccTelemetry {
            double_bit_volatile: 2,
            ..EccTelemetry::default()
        });
        gpu.mig.push(MigTelemetry {
            uuid: "MIG-a".into(),
            profile: "1g.10gb".into(),
            placement_start: 2,
            gi_id: 9,
            sm_active: Some(0.6),
            memory_used_bytes: Some(10),
            memory_total_bytes: Some(20),
        });
        NodeTelemetry { gpus: vec![gpu] }
    }

    #[test]
    fn each_device_is_labelled_with_the_pods_of_the_claim_that_holds_it() {
        let mut cp = Checkpoint::new("boot");
        let rec = record("train", "gpu-1-mig-1g10gb-2", Some("MIG-a"), &["p1", "p2"]);
        cp.claims.insert(rec.uid.clone(), rec);
        let got = rows(&node(), Some(&cp));
        let summary: Vec<(String, String, Vec<String>)> = got
            .iter()
            .map(|r| {
                (
                    r.device.clone(),
                    r.profile.clone(),
                    r.holders.iter().map(|h| h.pod.clone()).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("gpu-1".to_string(), String::new(), vec![]),
                (
                    "gpu-1-mig-1g10gb-2".to_string(),
                    "1g.10gb".to_string(),
                    vec!["p1".to_string(), "p2".to_string()]
                ),
            ]
        );
        let mig = &got[1];
        assert_eq!(mig.power_watts, Some(300.0), "the parent's power");
        assert_eq!(mig.sm_active, Some(0.6));
        assert!(mig.ecc_errors.contains(&("double_bit", "volatile", 2)));
    }

    #[test]
    fn a_claim_without_recorded_pods_still_names_its_namespace_and_claim() {
        let mut cp = Checkpoint::new("boot");
        let rec = record("old", "gpu-1", None, &[]);
        cp.claims.insert(rec.uid.clone(), rec);
        let got = rows(&node(), Some(&cp));
        assert_eq!(
            got[0].holders,
            vec![Holder {
                namespace: "team-a".into(),
                claim: "old".into(),
                pod: String::new(),
            }]
        );
    }
}
