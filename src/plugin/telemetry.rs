//! Per-device telemetry in the running plugin: every `--telemetry-interval`, a blocking
//! thread of the runtime's pool samples the backend, joins each GPU and MIG device with the
//! claims that hold it (from the checkpoint, read without opening the store and without the
//! plugin lock) and their pods (from [`Reservations`]) and replaces the `gpu_dra_device_*`
//! families. The same task keeps `holders.json` in step with the checkpoint and, every
//! `--holders-refresh-interval`, re-reads the pods of claims shared by several pods: a pod
//! that leaves a shared claim is dropped from its `status.reservedFor`, and the kubelet
//! does not tell the plugin. Prepare and unprepare never wait for it; `/metrics` serves the
//! last sample.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::checkpoint::Checkpoint;
use crate::devices::{gpu_device_name, mig_device_name};
use crate::hardware::GpuBackend;
use crate::hardware::telemetry::{GpuTelemetry, NodeTelemetry};
use crate::metrics::Metrics;
use crate::metrics::telemetry::{DeviceReadings, Holder};

use super::holders::{ClaimPods, Reservations};

/// Re-reading the pods of shared claims (those reserved for more than one pod) from the API
/// server, every `every` (rounded up to whole telemetry samples).
pub struct HolderRefresh {
    pub reader: crate::k8s::ClaimReader,
    pub every: Duration,
}

/// The prepared claims reserved for more than one pod: (namespace, name, uid).
fn shared_claims(checkpoint: &Checkpoint, pods: &ClaimPods) -> Vec<(String, String, String)> {
    checkpoint
        .claims
        .values()
        .filter(|record| pods.get(&record.uid).is_some_and(|p| p.len() > 1))
        .map(|record| {
            (
                record.namespace.clone(),
                record.name.clone(),
                record.uid.clone(),
            )
        })
        .collect()
}

/// Sets the pods of each claim to what the API server says now. A claim that cannot be
/// read keeps the pods it had (it is being unprepared, or the server is away); a read that
/// crosses a prepare of a new pod may set older pods, which the next refresh corrects.
async fn refresh_pods(
    reader: &crate::k8s::ClaimReader,
    reservations: &Reservations,
    claims: Vec<(String, String, String)>,
) {
    for (namespace, name, uid) in claims {
        match reader.fetch(&namespace, &name, &uid).await {
            Ok(claim) => {
                let pods = super::source::pods_of(claim.reserved_pods);
                debug!(claim = %format!("{namespace}/{name}"), pods = pods.len(), "re-read a shared claim's pods");
                reservations.set(&uid, pods);
            }
            Err(e) => {
                debug!(claim = %format!("{namespace}/{name}"), error = %crate::errors::error_chain(&e), "re-reading a shared claim's pods; kept the last ones");
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
    fn from_checkpoint(checkpoint: Option<&Checkpoint>, pods: &ClaimPods) -> Holders {
        let mut out = Holders::default();
        for record in checkpoint.into_iter().flat_map(|c| c.claims.values()) {
            let record_pods = pods.get(&record.uid).map_or(&[][..], Vec::as_slice);
            let holders: Vec<Holder> = if record_pods.is_empty() {
                vec![Holder {
                    namespace: record.namespace.clone(),
                    claim: record.name.clone(),
                    pod: String::new(),
                }]
            } else {
                record_pods
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

/// The figures NVML has per GPU only, which a MIG device row repeats from its parent (XIDs
/// are not among them: each row counts its own).
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
    row.retired_pages = gpu
        .retired_pages
        .iter()
        .map(|(cause, n)| (cause.label(), *n))
        .collect();
}

/// One row per GPU and per MIG device that exists, labelled with its holders: each claim of
/// `checkpoint` on it, with each of its `pods` (by claim UID), or with an empty pod when none
/// are known. Pure.
///
/// A full GPU's row counts every XID of the GPU; a MIG device's only the XIDs NVML attributed
/// to its GPU instance. A lost GPU keeps its row (so its series do not vanish silently) with
/// XID counts only.
pub fn rows(
    telemetry: &NodeTelemetry,
    checkpoint: Option<&Checkpoint>,
    pods: &ClaimPods,
) -> Vec<DeviceReadings> {
    let holders = Holders::from_checkpoint(checkpoint, pods);
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
            xid_errors: gpu.xid_errors.iter().map(|(x, n)| (*x, *n)).collect(),
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
                xid_errors: mig.xid_errors.iter().map(|(x, n)| (*x, *n)).collect(),
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
///
/// Each round also drops from `reservations` the claims the checkpoint no longer has and
/// rewrites `<state_dir>/holders.json` when they changed; a failed write is logged once
/// until a write works and tried again next round. With `refresh`, the pods of shared
/// claims are re-read from the API server every `refresh.every`, after a round.
pub async fn sample(
    backend: Arc<dyn GpuBackend>,
    metrics: Metrics,
    reservations: Arc<Reservations>,
    state_dir: PathBuf,
    boot_id: String,
    interval: Duration,
    refresh: Option<HolderRefresh>,
) {
    let mut ticker = crate::ticks::Ticks::every(interval);
    let (mut failing, mut saving_fails) = (false, false);
    let mut last_refresh = Instant::now();
    loop {
        ticker.tick().await;
        if let Some(refresh) = &refresh
            && last_refresh.elapsed() >= refresh.every
        {
            last_refresh = Instant::now();
            let (dir, boot) = (state_dir.clone(), boot_id.clone());
            let pods = reservations.pods();
            let shared = tokio::task::spawn_blocking(move || {
                super::usage::read_checkpoint(&dir, &boot)
                    .map(|cp| shared_claims(&cp, &pods))
                    .unwrap_or_default()
            })
            .await
            .unwrap_or_default();
            refresh_pods(&refresh.reader, &reservations, shared).await;
        }
        let (backend, metrics) = (Arc::clone(&backend), metrics.clone());
        let reservations = Arc::clone(&reservations);
        let (dir, boot) = (state_dir.clone(), boot_id.clone());
        let round = tokio::task::spawn_blocking(move || {
            let checkpoint = super::usage::read_checkpoint(&dir, &boot);
            if let Some(cp) = &checkpoint {
                reservations.prune(cp, Instant::now());
            }
            let saved = reservations.save_if_changed(&dir);
            let sampled = backend.telemetry().map(|telemetry| {
                let rows = rows(&telemetry, checkpoint.as_ref(), &reservations.pods());
                metrics.set_device_telemetry(&rows);
                rows.len()
            });
            (saved, sampled)
        })
        .await;
        let round = round.map(|(saved, sampled)| {
            match saved {
                Ok(_) if saving_fails => {
                    saving_fails = false;
                    warn!("holder pods file written again");
                }
                Err(e) if !saving_fails => {
                    saving_fails = true;
                    warn!(error = %crate::errors::error_chain(&e), "writing the holder pods file; tried again next sample");
                }
                _ => {}
            }
            sampled
        });
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
    use std::collections::BTreeMap;

    use super::*;
    use crate::checkpoint::{ClaimPhase, ClaimRecord, DeviceRecord, MigRecord};
    use crate::hardware::telemetry::{EccTelemetry, MigTelemetry};
    use crate::plugin::holders::PodRef;

    fn record(name: &str, device: &str, mig_uuid: Option<&str>) -> ClaimRecord {
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
                vfio: None,
                vgpu: None,
            }],
            updated_unix: 0,
            fabric_partition: None,
        }
    }

    fn pods(uid: &str, names: &[&str]) -> ClaimPods {
        let pods = names
            .iter()
            .map(|p| PodRef {
                name: p.to_string(),
                uid: format!("uid-{p}"),
            })
            .collect();
        ClaimPods::from([(uid.to_string(), pods)])
    }

    fn node() -> NodeTelemetry {
        let mut gpu = GpuTelemetry::new(0, 1, "GPU-1");
        gpu.power_watts = Some(300.0);
        gpu.ecc = Some(EccTelemetry {
            double_bit_volatile: 2,
            ..EccTelemetry::default()
        });
        gpu.xid_errors = BTreeMap::from([(31, 1), (79, 1)]);
        gpu.mig.push(MigTelemetry {
            uuid: "MIG-a".into(),
            profile: "1g.10gb".into(),
            placement_start: 2,
            gi_id: 9,
            sm_active: Some(0.6),
            memory_used_bytes: Some(10),
            memory_total_bytes: Some(20),
            xid_errors: BTreeMap::from([(31, 1)]),
        });
        NodeTelemetry { gpus: vec![gpu] }
    }

    #[test]
    fn each_device_is_labelled_with_the_pods_of_the_claim_that_holds_it() {
        let mut cp = Checkpoint::new("boot");
        let rec = record("train", "gpu-1-mig-1g10gb-2", Some("MIG-a"));
        let held_by = pods(&rec.uid, &["p2", "p1"]);
        cp.claims.insert(rec.uid.clone(), rec);
        let got = rows(&node(), Some(&cp), &held_by);
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
        assert_eq!(
            got[0].xid_errors,
            vec![(31, 1), (79, 1)],
            "every XID of the GPU"
        );
        assert_eq!(mig.xid_errors, vec![(31, 1)], "its instance's XIDs only");
    }

    #[test]
    fn a_claim_without_known_pods_still_names_its_namespace_and_claim() {
        let mut cp = Checkpoint::new("boot");
        let rec = record("old", "gpu-1", None);
        cp.claims.insert(rec.uid.clone(), rec);
        // Pods of a claim the checkpoint no longer has label nothing.
        let got = rows(&node(), Some(&cp), &pods("uid-gone", &["p9"]));
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
