//! Applying and undoing the recorded sharing decisions once the devices exist: time-slices
//! and MPS daemons, their CDI edits, and the daemons the checkpoint calls for.

use std::collections::{BTreeMap, BTreeSet};

use super::{DeviceSharing, SharingSetup};
use crate::cdi;
use crate::checkpoint::{Checkpoint, ClaimRecord, DeviceRecord};
use crate::claims::ClaimError;
use crate::sharing::{MpsDaemonSpec, MpsDevice, ResetOutcome, SharingError, client_limit_env};

/// The UUID a device has now: the GPU's, or the MIG device's once it exists.
fn device_uuid(record: &DeviceRecord) -> Option<(String, bool)> {
    match &record.mig {
        None => Some((record.gpu_uuid.clone(), true)),
        Some(m) => m.uuid.clone().map(|u| (u, false)),
    }
}

/// A device of a config group: its position in the group and its index among the targets.
pub(super) type Member = (usize, usize);

/// One device of a daemon: ordinal, device, default thread %, pinned limit, multi-user.
type DaemonDevice = (usize, MpsDevice, Option<u8>, Option<u64>, bool);

/// CDI edits of one device: env and mounts.
pub(in crate::claims) type DeviceEdits = (Vec<(String, String)>, Vec<cdi::Mount>);

/// The MPS daemons a claim's records call for, with their devices in ordinal order. A
/// device whose MIG instance does not exist (yet) leaves its daemon out.
pub(in crate::claims) fn daemon_specs(rec: &ClaimRecord) -> Result<Vec<MpsDaemonSpec>, String> {
    let mut specs: BTreeMap<String, Vec<DaemonDevice>> = BTreeMap::new();
    let mut incomplete = BTreeSet::new();
    for d in &rec.devices {
        let Some(sharing) = DeviceSharing::of(d)? else {
            continue;
        };
        let (daemon, ordinal, pct, pinned, multi_user) = match &sharing {
            DeviceSharing::TimeSlicing { .. } => continue,
            DeviceSharing::Mps {
                daemon,
                ordinal,
                active_thread_percentage,
                pinned_memory_bytes,
                multi_user,
            } => (
                daemon,
                *ordinal,
                *active_thread_percentage,
                *pinned_memory_bytes,
                *multi_user,
            ),
            // Shares' daemons have no default limits: each client carries its own.
            DeviceSharing::Share { daemon, .. } => (daemon, 0, None, None, false),
        };
        let Some((uuid, full_gpu)) = device_uuid(d) else {
            incomplete.insert(daemon.clone());
            continue;
        };
        let devices = specs.entry(daemon.clone()).or_default();
        if devices.iter().any(|(_, dev, ..)| dev.uuid == uuid) {
            continue; // two shares of one device in one claim: one daemon device
        }
        devices.push((
            ordinal,
            MpsDevice { uuid, full_gpu },
            pct,
            pinned,
            multi_user,
        ));
    }
    Ok(specs
        .into_iter()
        .filter(|(id, _)| !incomplete.contains(id))
        .map(|(id, mut devices)| {
            devices.sort_by_key(|(o, ..)| *o);
            let pct = devices.first().and_then(|d| d.2);
            let multi_user = devices.first().is_some_and(|d| d.4);
            let pinned: Vec<Option<u64>> = devices.iter().map(|d| d.3).collect();
            MpsDaemonSpec {
                id,
                active_thread_percentage: pct,
                multi_user,
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
pub(in crate::claims) fn apply(
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
pub(in crate::claims) fn undo(
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
pub(in crate::claims) fn wanted_daemons(
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
