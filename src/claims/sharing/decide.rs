//! Deciding every device's sharing before anything is touched: the claim's opaque config
//! against what the node allows, and consumable-capacity shares turned into client limits.

use std::str::FromStr;

use crate::claims::plan::{Action, PlannedDevice};
use crate::claims::{ClaimAllocation, ClaimError, ClaimId};
use crate::devices::DeviceModel;
use crate::opaque::{self, Sharing as Strategy, TargetKind};
use crate::quantity::Quantity;

use super::daemons::Member;
use super::{DeviceSharing, SharingSetup, claim_daemon_id, config_error, share_daemon_id};

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
pub(in crate::claims) fn decide(
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
                    // A VM's devices: no sharing config applies to them.
                    Action::Vfio { .. } => TargetKind::Vfio,
                    Action::Vgpu { .. } => TargetKind::Vgpu,
                    _ => TargetKind::Mig,
                },
                uuid: match &p.action {
                    Action::FullGpu { .. } | Action::Vfio { .. } => Some(p.record.gpu_uuid.clone()),
                    Action::StaticMig { uuid, .. } => Some(uuid.clone()),
                    Action::CarveMig { .. } | Action::Vgpu { .. } => None,
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
    let vfio = opaque::resolve_vfio(&targets, &entries)
        .map_err(|e| config_error(id, crate::errors::error_chain(&e)))?;
    let vgpu = opaque::resolve_vgpu(&targets, &entries)
        .map_err(|e| config_error(id, crate::errors::error_chain(&e)))?;
    for ((p, settings), vgpu) in planned.iter_mut().zip(vfio).zip(vgpu) {
        p.vfio_settings = settings;
        p.vgpu_settings = vgpu;
    }
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
                if limits.multi_user {
                    multi_user_supported(id, model, &targets, &group.devices)?;
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
                            multi_user: limits.multi_user,
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

/// The oldest compute capability multi-user MPS supports (Volta). Older GPUs accept the
/// control daemon's `-M`, but their non-root clients then fail `cuInit` with
/// `CUDA_ERROR_NOT_PERMITTED`, so the claim is refused before anything starts.
pub(in crate::claims) const MULTI_USER_MIN_CC: (u32, u32) = (7, 0);

/// Refuses `multiUser` when a full GPU of the group is below compute capability 7.0 (or does
/// not publish it), naming the device, its product and its capability. MIG devices exist only
/// on compute capability 8.0 and newer, so only full GPUs are checked, as NVIDIA's driver does.
fn multi_user_supported(
    id: &ClaimId,
    model: &DeviceModel,
    targets: &[opaque::Target],
    group: &[usize],
) -> Result<(), ClaimError> {
    for &i in group {
        let target = &targets[i];
        if target.kind != TargetKind::FullGpu {
            continue;
        }
        let attributes = model
            .device(&target.device)
            .and_then(|d| d.device.attributes.as_ref());
        let attribute = |name: &str| {
            attributes
                .and_then(|a| a.get(name))
                .and_then(|v| v.version.clone().or_else(|| v.string.clone()))
        };
        let product = attribute("productName").unwrap_or_else(|| "unknown product".into());
        let capability = attribute("cudaComputeCapability");
        let parsed = capability.as_deref().and_then(parse_capability);
        if parsed.is_some_and(|cc| cc >= MULTI_USER_MIN_CC) {
            continue;
        }
        let (major, minor) = MULTI_USER_MIN_CC;
        let found = match (parsed, capability) {
            (Some((ma, mi)), _) => format!("compute capability {ma}.{mi}"),
            (None, Some(text)) => format!("compute capability {text:?}, which is not major.minor"),
            (None, None) => "no published compute capability".to_owned(),
        };
        return Err(config_error(
            id,
            format!(
                "sharing.mpsConfig.multiUser: GPU {} ({product}, {found}) does not support multi-user MPS, which needs compute capability {major}.{minor} (Volta) or newer; drop multiUser or request a newer GPU",
                target.device
            ),
        ));
    }
    Ok(())
}

/// `8.9.0` or `8.9` → (8, 9).
fn parse_capability(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
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
