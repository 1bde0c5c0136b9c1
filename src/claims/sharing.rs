//! Sharing in the claim lifecycle: the claim's opaque config (time-slicing, MPS with limits)
//! and consumable-capacity shares (one MPS daemon per shared device, per-client limits), decided
//! before anything is touched, applied after the MIG devices exist, and undone on unprepare.
//!
//! What each device got is recorded in its checkpoint record (`DeviceRecord::sharing`, the
//! [`DeviceSharing`] JSON), so unprepare, start-up recovery and the MPS supervisor work from
//! the checkpoint alone.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::plan::{Action, PlannedDevice};
use super::{ClaimAllocation, ClaimError, ClaimId};
use crate::cdi;
use crate::checkpoint::{Checkpoint, ClaimRecord, DeviceRecord};
use crate::devices::DeviceModel;
use crate::opaque::{self, Sharing as Strategy, TargetKind};
use crate::quantity::Quantity;
use crate::sharing::{
    MpsDaemonSpec, MpsDevice, MpsManager, ResetOutcome, SharingError, client_limit_env,
};

/// How this node shares GPUs: the MPS manager (its tools also set time-slices) and which
/// strategies the administrator allows.
pub struct SharingSetup {
    /// MPS daemons (and, through its tools, `nvidia-smi`).
    pub mps: MpsManager,
    /// `--mps`: MPS (opaque config and consumable-capacity shares) allowed.
    pub mps_enabled: bool,
    /// `--time-slicing`: the TimeSlicing strategy allowed.
    pub time_slicing_enabled: bool,
}

/// What one device of a claim got, as stored in its checkpoint record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "camelCase", deny_unknown_fields)]
pub enum DeviceSharing {
    /// A full GPU whose time-slice was set (reset to Default on unprepare).
    #[serde(rename = "TimeSlicing")]
    TimeSlicing {
        /// `nvidia-smi compute-policy --set-timeslice` level.
        level: u8,
    },
    /// A device of the claim's own MPS daemon (opaque config).
    #[serde(rename = "MPS", rename_all = "camelCase")]
    Mps {
        /// Daemon id.
        daemon: String,
        /// Position in the daemon's `CUDA_VISIBLE_DEVICES`.
        ordinal: usize,
        /// Default active-thread percentage of the daemon.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        active_thread_percentage: Option<u8>,
        /// Pinned-memory limit of this device.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned_memory_bytes: Option<u64>,
    },
    /// A consumable-capacity share of a device whose MPS daemon all its shares use.
    #[serde(rename = "Share", rename_all = "camelCase")]
    Share {
        /// Daemon id (one per shared device).
        daemon: String,
        /// This client's active-thread percentage.
        active_thread_percentage: u8,
        /// This client's pinned-memory limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned_memory_bytes: Option<u64>,
    },
}

impl DeviceSharing {
    /// The record of a device, if it has one; an unreadable record is reported, not ignored.
    pub fn of(record: &DeviceRecord) -> Result<Option<DeviceSharing>, String> {
        match &record.sharing {
            None => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| format!("device {}: sharing record {v}: {e}", record.device)),
        }
    }

    fn daemon(&self) -> Option<&str> {
        match self {
            DeviceSharing::TimeSlicing { .. } => None,
            DeviceSharing::Mps { daemon, .. } | DeviceSharing::Share { daemon, .. } => Some(daemon),
        }
    }
}

fn config_error(id: &ClaimId, detail: impl Into<String>) -> ClaimError {
    ClaimError::Config {
        claim: id.to_string(),
        detail: detail.into(),
    }
}

/// The id of a claim's own MPS daemon: the claim UID and a digest of its device names, so
/// two config groups of one claim get two daemons and a retry gets the same one.
fn claim_daemon_id(uid: &str, devices: &[&str]) -> String {
    let digest = Sha256::digest(devices.join(",").as_bytes());
    let hex: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
    let uid: String = uid
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(50)
        .collect();
    format!("{uid}-{}", &hex[..5])
}

/// The id of the daemon all shares of one device use.
fn share_daemon_id(device: &str) -> String {
    let mut id = format!("share-{device}");
    id.truncate(63);
    id
}

fn capacity_bytes(device: &k8s_openapi::api::resource::v1::Device, name: &str) -> Option<u64> {
    let value = device.capacity.as_ref()?.get(name)?;
    let q = Quantity::from_str(&value.value.0).ok()?;
    q.as_i64().ok().and_then(|v| u64::try_from(v).ok())
}

/// Decides every device's sharing before anything is touched: resolves the opaque config,
/// checks it against what the node allows, turns consumable-capacity shares into client
/// limits, and writes the decision into the devices' intent records.
///
/// # Errors
/// [`ClaimError::Config`] naming the entry, field, value and valid choices.
pub(super) fn decide(
    setup: Option<&SharingSetup>,
    id: &ClaimId,
    allocation: &ClaimAllocation,
    model: &DeviceModel,
    planned: &mut [PlannedDevice],
) -> Result<(), ClaimError> {
    let targets: Vec<opaque::Target> = planned
        .iter()
        .map(|p| {
            let published = model.device(&p.allocated.device);
            opaque::Target {
                device: p.allocated.device.clone(),
                request: p.allocated.request.clone(),
                kind: match p.action {
                    Action::FullGpu { .. } => TargetKind::FullGpu,
                    _ => TargetKind::Mig,
                },
                uuid: match &p.action {
                    Action::FullGpu { .. } => Some(p.record.gpu_uuid.clone()),
                    Action::StaticMig { uuid, .. } => Some(uuid.clone()),
                    Action::CarveMig { .. } => None,
                },
                memory_bytes: published
                    .and_then(|d| capacity_bytes(&d.device, "memory"))
                    .unwrap_or(0),
            }
        })
        .collect();
    let entries: Vec<opaque::Entry> = allocation
        .config
        .iter()
        .map(|e| opaque::Entry {
            from_class: e.from_class,
            requests: e.requests.clone(),
            parameters: e.parameters.clone(),
        })
        .collect();
    let groups = opaque::resolve(&targets, &entries)
        .map_err(|e| config_error(id, crate::errors::error_chain(&e)))?;
    let mut decided: Vec<Option<DeviceSharing>> = vec![None; planned.len()];
    for group in &groups {
        // Admin access may use a device another claim holds, so it must never change it.
        if let Some(&i) = group
            .devices
            .iter()
            .find(|&&i| planned[i].allocated.admin_access)
        {
            return Err(config_error(
                id,
                format!(
                    "device {} of request {} is allocated with admin access, which must not change the device; remove the sharing config for that request",
                    planned[i].allocated.device, planned[i].allocated.request
                ),
            ));
        }
        if let Some(&i) = group
            .devices
            .iter()
            .find(|&&i| planned[i].allocated.share_id.is_some())
        {
            return Err(config_error(
                id,
                format!(
                    "device {} is a consumable-capacity share (shareID {}): its limits come from the claim's capacity requests; remove the sharing config for request {}",
                    planned[i].allocated.device,
                    planned[i].allocated.share_id.as_deref().unwrap_or(""),
                    planned[i].allocated.request
                ),
            ));
        }
        match &group.sharing {
            Strategy::TimeSlicing { interval } => {
                let full: Vec<usize> = group
                    .devices
                    .iter()
                    .copied()
                    .filter(|&i| targets[i].kind == TargetKind::FullGpu)
                    .collect();
                if full.is_empty() {
                    continue; // MIG devices: processes share them anyway
                }
                unavailable(setup, id, "TimeSlicing")?;
                if !setup.is_some_and(|s| s.time_slicing_enabled) {
                    return Err(config_error(
                        id,
                        format!(
                            "sharing.strategy: TimeSlicing is disabled on this node (kubelet-plugin --time-slicing=false); devices {}",
                            names(&targets, &full)
                        ),
                    ));
                }
                for i in full {
                    decided[i] = Some(DeviceSharing::TimeSlicing {
                        level: interval.level(),
                    });
                }
            }
            Strategy::Mps(limits) => {
                unavailable(setup, id, "MPS")?;
                if !setup.is_some_and(|s| s.mps_enabled) {
                    return Err(config_error(
                        id,
                        format!(
                            "sharing.strategy: MPS is disabled on this node (kubelet-plugin --mps=false); devices {}",
                            names(&targets, &group.devices)
                        ),
                    ));
                }
                // Full GPUs of the group share one daemon; each MIG device gets its own, as
                // MPS on MIG needs one daemon per MIG device (reference/mps.md §7).
                let (gpus, migs): (Vec<Member>, Vec<Member>) = group
                    .devices
                    .iter()
                    .copied()
                    .enumerate()
                    .partition(|(_, i)| targets[*i].kind == TargetKind::FullGpu);
                let daemons = std::iter::once(gpus)
                    .filter(|g| !g.is_empty())
                    .chain(migs.into_iter().map(|m| vec![m]));
                for members in daemons {
                    let device_names: Vec<&str> = members
                        .iter()
                        .map(|&(_, i)| targets[i].device.as_str())
                        .collect();
                    let daemon = claim_daemon_id(&id.uid, &device_names);
                    for (ordinal, &(in_group, i)) in members.iter().enumerate() {
                        decided[i] = Some(DeviceSharing::Mps {
                            daemon: daemon.clone(),
                            ordinal,
                            active_thread_percentage: limits.active_thread_percentage,
                            pinned_memory_bytes: limits
                                .pinned_memory_bytes
                                .get(in_group)
                                .copied()
                                .flatten(),
                        });
                    }
                }
            }
        }
    }
    for (i, p) in planned.iter().enumerate() {
        if p.allocated.share_id.is_none() {
            continue;
        }
        unavailable(setup, id, "MPS (consumable-capacity shares)")?;
        if !setup.is_some_and(|s| s.mps_enabled) {
            return Err(config_error(
                id,
                format!(
                    "device {} is a consumable-capacity share; shares are enforced with MPS, which is disabled on this node (kubelet-plugin --mps=false)",
                    p.allocated.device
                ),
            ));
        }
        let published =
            model
                .device(&p.allocated.device)
                .ok_or_else(|| ClaimError::UnknownDevice {
                    claim: id.to_string(),
                    device: p.allocated.device.clone(),
                })?;
        let limits =
            crate::devices::share_limits(&published.device, &p.allocated.consumed_capacity)
                .map_err(|e| {
                    config_error(
                        id,
                        format!(
                            "device {} share {}: {}",
                            p.allocated.device,
                            p.allocated.share_id.as_deref().unwrap_or(""),
                            crate::errors::error_chain(&e)
                        ),
                    )
                })?;
        decided[i] = Some(DeviceSharing::Share {
            daemon: share_daemon_id(&p.allocated.device),
            active_thread_percentage: limits.active_thread_percentage,
            pinned_memory_bytes: limits.pinned_memory_bytes,
        });
    }
    for (p, d) in planned.iter_mut().zip(decided) {
        p.record.sharing = d
            .map(|d| serde_json::to_value(d).map_err(|e| config_error(id, e.to_string())))
            .transpose()?;
    }
    Ok(())
}

fn unavailable(setup: Option<&SharingSetup>, id: &ClaimId, what: &str) -> Result<(), ClaimError> {
    match setup {
        Some(_) => Ok(()),
        None => Err(config_error(
            id,
            format!(
                "sharing.strategy: {what} is unavailable on this node: the plugin found no nvidia-smi / nvidia-cuda-mps-control under its driver root (see its start-up log)"
            ),
        )),
    }
}

fn names(targets: &[opaque::Target], indices: &[usize]) -> String {
    indices
        .iter()
        .map(|&i| targets[i].device.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The UUID a device has now: the GPU's, or the MIG device's once it exists.
fn device_uuid(record: &DeviceRecord) -> Option<(String, bool)> {
    match &record.mig {
        None => Some((record.gpu_uuid.clone(), true)),
        Some(m) => m.uuid.clone().map(|u| (u, false)),
    }
}

/// A device of a config group: its position in the group and its index among the targets.
type Member = (usize, usize);

/// One device of a daemon: ordinal, device, default thread %, pinned limit.
type DaemonDevice = (usize, MpsDevice, Option<u8>, Option<u64>);

/// CDI edits of one device: env and mounts.
pub(super) type DeviceEdits = (Vec<(String, String)>, Vec<cdi::Mount>);

/// The MPS daemons a claim's records call for, with their devices in ordinal order. A
/// device whose MIG instance does not exist (yet) leaves its daemon out.
pub(super) fn daemon_specs(rec: &ClaimRecord) -> Result<Vec<MpsDaemonSpec>, String> {
    let mut specs: BTreeMap<String, Vec<DaemonDevice>> = BTreeMap::new();
    let mut incomplete = BTreeSet::new();
    for d in &rec.devices {
        let Some(sharing) = DeviceSharing::of(d)? else {
            continue;
        };
        let (daemon, ordinal, pct, pinned) = match &sharing {
            DeviceSharing::TimeSlicing { .. } => continue,
            DeviceSharing::Mps {
                daemon,
                ordinal,
                active_thread_percentage,
                pinned_memory_bytes,
            } => (
                daemon,
                *ordinal,
                *active_thread_percentage,
                *pinned_memory_bytes,
            ),
            // Shares' daemons have no default limits: each client carries its own.
            DeviceSharing::Share { daemon, .. } => (daemon, 0, None, None),
        };
        let Some((uuid, full_gpu)) = device_uuid(d) else {
            incomplete.insert(daemon.clone());
            continue;
        };
        let devices = specs.entry(daemon.clone()).or_default();
        if devices.iter().any(|(_, dev, ..)| dev.uuid == uuid) {
            continue; // two shares of one device in one claim: one daemon device
        }
        devices.push((ordinal, MpsDevice { uuid, full_gpu }, pct, pinned));
    }
    Ok(specs
        .into_iter()
        .filter(|(id, _)| !incomplete.contains(id))
        .map(|(id, mut devices)| {
            devices.sort_by_key(|(o, ..)| *o);
            let pct = devices.first().and_then(|d| d.2);
            let pinned: Vec<Option<u64>> = devices.iter().map(|d| d.3).collect();
            MpsDaemonSpec {
                id,
                active_thread_percentage: pct,
                pinned_memory_bytes: if pinned.iter().all(Option::is_none) {
                    Vec::new()
                } else {
                    pinned
                },
                devices: devices.into_iter().map(|d| d.1).collect(),
            }
        })
        .collect())
}

/// Applies the recorded decisions once the devices exist: time-slices, then MPS daemons.
/// Returns the CDI edits (env, mounts) per device, in `rec.devices` order.
pub(super) fn apply(
    setup: Option<&SharingSetup>,
    claim: &str,
    rec: &ClaimRecord,
) -> Result<Vec<DeviceEdits>, ClaimError> {
    let mut edits = vec![(Vec::new(), Vec::new()); rec.devices.len()];
    let decided: Vec<Option<DeviceSharing>> = rec
        .devices
        .iter()
        .map(DeviceSharing::of)
        .collect::<Result<_, _>>()
        .map_err(|detail| ClaimError::Config {
            claim: claim.to_string(),
            detail,
        })?;
    if decided.iter().all(Option::is_none) {
        return Ok(edits);
    }
    let Some(setup) = setup else {
        let devices: Vec<&str> = rec
            .devices
            .iter()
            .zip(&decided)
            .filter(|(_, d)| d.is_some())
            .map(|(d, _)| d.device.as_str())
            .collect();
        return Err(ClaimError::Config {
            claim: claim.to_string(),
            detail: format!(
                "devices {} need time-slicing or MPS, but the plugin has no sharing tools",
                devices.join(", ")
            ),
        });
    };
    let step_error = |device: &str, step: &'static str, source: SharingError| ClaimError::Sharing {
        claim: claim.to_string(),
        device: device.to_string(),
        step,
        source: Box::new(source),
    };
    for (d, sharing) in rec.devices.iter().zip(&decided) {
        if let Some(DeviceSharing::TimeSlicing { level }) = sharing {
            setup
                .mps
                .tools
                .set_timeslice(&d.gpu_uuid, *level)
                .map_err(|e| step_error(&d.device, "set the time-slice", e))?;
        }
    }
    let specs = daemon_specs(rec).map_err(|detail| ClaimError::Config {
        claim: claim.to_string(),
        detail,
    })?;
    for spec in &specs {
        setup
            .mps
            .start(spec)
            .map_err(|e| step_error(&spec.id, "start the MPS control daemon", e))?;
    }
    crate::crashpoint::hit("prepare-sharing-applied");
    for (sharing, out) in decided.iter().zip(edits.iter_mut()) {
        let (daemon, client_env) = match sharing {
            Some(DeviceSharing::Mps { daemon, .. }) => {
                let spec = specs.iter().find(|s| &s.id == daemon);
                let env = spec
                    .map(|s| client_limit_env(s.active_thread_percentage, &s.pinned_memory_bytes))
                    .unwrap_or_default();
                (daemon, env)
            }
            Some(DeviceSharing::Share {
                daemon,
                active_thread_percentage,
                pinned_memory_bytes,
            }) => (
                daemon,
                client_limit_env(Some(*active_thread_percentage), &[*pinned_memory_bytes]),
            ),
            _ => continue,
        };
        let client = setup.mps.client_edits(daemon);
        out.0.extend(client.env);
        out.0.extend(client_env);
        out.1.extend(client.mounts.into_iter().map(|m| cdi::Mount {
            host_path: m.host_path.display().to_string(),
            container_path: m.container_path,
            kind: None,
            options: m.options,
        }));
    }
    Ok(edits)
}

/// Undoes a claim's sharing: its own MPS daemons, the daemons of shared devices no other claim
/// still uses, and time-slices. Best effort to the end: every step is tried, and the failures
/// come back (empty: all done). Each step tolerates work already done, so a repeat finishes
/// what failed.
pub(super) fn undo(
    setup: Option<&SharingSetup>,
    claim: &str,
    rec: &ClaimRecord,
    checkpoint: &Checkpoint,
) -> Vec<ClaimError> {
    let mut failures = Vec::new();
    let mut daemons = BTreeSet::new();
    let mut time_sliced = Vec::new();
    for d in &rec.devices {
        let sharing = match DeviceSharing::of(d) {
            Ok(sharing) => sharing,
            Err(detail) => {
                failures.push(ClaimError::Config {
                    claim: claim.to_string(),
                    detail,
                });
                continue;
            }
        };
        match sharing {
            None => {}
            Some(DeviceSharing::TimeSlicing { .. }) => time_sliced.push(d),
            Some(s @ DeviceSharing::Mps { .. }) => {
                daemons.insert(s.daemon().unwrap_or_default().to_string());
            }
            Some(s @ DeviceSharing::Share { .. }) => {
                let daemon = s.daemon().unwrap_or_default().to_string();
                if !daemon_used_by_others(checkpoint, &rec.uid, &daemon) {
                    daemons.insert(daemon);
                }
            }
        }
    }
    if daemons.is_empty() && time_sliced.is_empty() {
        return failures;
    }
    let Some(setup) = setup else {
        // Without tools nothing can be stopped or reset; refusing would keep the claim (and
        // its CDI spec and MIG devices) forever. The daemons' directories stay for a plugin
        // that has the tools to stop them (start-up recovery stops daemons no claim uses).
        tracing::warn!(claim, daemons = ?daemons, time_sliced = time_sliced.len(), "the claim was shared, but this plugin has no sharing tools: MPS daemons and time-slices left as they are");
        return failures;
    };
    for daemon in &daemons {
        if let Err(source) = setup.mps.stop(daemon, &[]) {
            failures.push(ClaimError::Sharing {
                claim: claim.to_string(),
                device: daemon.clone(),
                step: "stop the MPS control daemon",
                source: Box::new(source),
            });
        }
    }
    for d in time_sliced {
        match setup.mps.tools.reset_timeslice(&d.gpu_uuid) {
            Ok(ResetOutcome::Reset) => {}
            Ok(ResetOutcome::NotSupported { command, .. }) => {
                tracing::warn!(claim, device = %d.device, %command, "time-slice reset not supported by this GPU");
            }
            Err(source) => failures.push(ClaimError::Sharing {
                claim: claim.to_string(),
                device: d.device.clone(),
                step: "reset the time-slice",
                source: Box::new(source),
            }),
        }
    }
    crate::crashpoint::hit("unprepare-sharing-undone");
    failures
}

fn daemon_used_by_others(checkpoint: &Checkpoint, uid: &str, daemon: &str) -> bool {
    checkpoint
        .claims
        .values()
        .filter(|c| c.uid != uid)
        .flat_map(|c| c.devices.iter())
        // An unreadable record may name this daemon: keep it rather than cut off its clients.
        .any(|d| match DeviceSharing::of(d) {
            Ok(s) => s.as_ref().and_then(DeviceSharing::daemon) == Some(daemon),
            Err(_) => true,
        })
}

/// Every daemon the checkpoint's claims call for (shares once), with the claim that wants it,
/// for recovery and supervision.
///
/// # Errors
/// A record that cannot be read: its daemons are unknown, so callers must not treat any
/// daemon as unused.
pub(super) fn wanted_daemons(
    checkpoint: &Checkpoint,
) -> Result<Vec<(String, MpsDaemonSpec)>, String> {
    let mut out: BTreeMap<String, (String, MpsDaemonSpec)> = BTreeMap::new();
    for c in checkpoint.claims.values() {
        let claim = format!("{}/{} ({})", c.namespace, c.name, c.uid);
        for s in daemon_specs(c).map_err(|e| format!("claim {claim}: {e}"))? {
            out.entry(s.id.clone()).or_insert((claim.clone(), s));
        }
    }
    Ok(out.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_daemon_ids_are_dns_labels_and_stable() {
        let id = claim_daemon_id("0b3e9f6c-1a2b-4c5d-8e9f-001122334455", &["gpu-0", "gpu-1"]);
        assert_eq!(
            id,
            claim_daemon_id("0b3e9f6c-1a2b-4c5d-8e9f-001122334455", &["gpu-0", "gpu-1"])
        );
        assert!(crate::sharing::validate_daemon_id(&id).is_ok(), "{id}");
        assert_ne!(
            id,
            claim_daemon_id("0b3e9f6c-1a2b-4c5d-8e9f-001122334455", &["gpu-0"])
        );
    }

    #[test]
    fn share_daemon_ids_are_dns_labels() {
        let id = share_daemon_id("gpu-7-mig-1g20gb-me-6");
        assert_eq!(id, "share-gpu-7-mig-1g20gb-me-6");
        assert!(crate::sharing::validate_daemon_id(&id).is_ok());
    }

    #[test]
    fn sharing_records_round_trip_as_json() {
        let want = DeviceSharing::Mps {
            daemon: "abc-12345".into(),
            ordinal: 1,
            active_thread_percentage: Some(50),
            pinned_memory_bytes: Some(1 << 30),
        };
        let v = serde_json::to_value(&want).unwrap();
        assert_eq!(v["strategy"], "MPS");
        assert_eq!(v["activeThreadPercentage"], 50);
        let got: DeviceSharing = serde_json::from_value(v).unwrap();
        assert_eq!(got, want);
    }
}
