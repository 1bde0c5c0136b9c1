//! Which config each device of a claim gets, and the groups of devices sharing one config.

use super::{
    Config, ConfigKind, Entry, EntryOrigin, MpsConfig, MpsLimits, OpaqueError, Sharing,
    SharingConfig, SharingGroup, Target, TargetKind, TimeSliceInterval, decode,
};

const PER_DEVICE_PATH: &str = "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit";
const DEFAULT_LIMIT_PATH: &str = "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit";

/// Decides the sharing of a claim's devices from this driver's opaque config entries.
///
/// `targets` are the claim's devices of this driver in allocation order; `entries` its config
/// entries, class entries before claim entries (class entries keep lower precedence even if
/// they come later). Rules:
/// - an entry applies to a device when its `requests` is empty or names the device's request;
///   a `req/sub` device also matches an entry naming `req`;
/// - of the entries that apply to a device, the last one wins, whole: a winning entry without
///   `sharing` leaves the device exclusive, even if an earlier entry shared it;
/// - `GpuConfig` applies to full GPUs and MIG devices; `MigDeviceConfig` only to MIG devices
///   (without requests it skips full GPUs; naming a request that got a full GPU is an error);
/// - on a MIG device, time-slicing needs nothing and only the `Default` interval is valid.
///
/// Guarantees on success: one group per winning entry that has `sharing`, ordered by its
/// first device, each listing its devices in allocation order; devices no entry shares are in
/// no group. MIG devices only appear in time-slicing groups as `Default`. MPS limits hold one
/// entry per group device, none above that device's memory. Every entry was decoded and
/// validated, including those that apply to no device.
///
/// # Errors
/// [`OpaqueError::Entry`] naming the entry (index within its origin, class or claim, and its
/// requests), with the cause as its source: a decoding error, a `MigDeviceConfig` naming a
/// full GPU's request, a non-Default interval on a MIG device, a per-device limit key that
/// names no device of the group (or the same device twice), or a limit above a device's memory.
pub fn resolve(targets: &[Target], entries: &[Entry]) -> Result<Vec<SharingGroup>, OpaqueError> {
    let located = locate(entries);
    let mut configs = Vec::with_capacity(entries.len());
    for (entry, at) in entries.iter().zip(&located) {
        let config = decode(&entry.parameters).map_err(|e| at.wrap(entry, e))?;
        check_mig_kind(&config, entry, targets).map_err(|e| at.wrap(entry, e))?;
        configs.push(config);
    }

    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| !entries[i].from_class);
    let mut winner: Vec<Option<usize>> = vec![None; targets.len()];
    for &e in &order {
        for (t, target) in targets.iter().enumerate() {
            if applies(&entries[e], &configs[e], target) {
                winner[t] = Some(e);
            }
        }
    }

    // Group by winning entry, in the order of each group's first device.
    let mut members: Vec<(usize, Vec<usize>)> = Vec::new();
    for (t, won) in winner.iter().enumerate() {
        let Some(e) = *won else { continue };
        match members.iter_mut().find(|(entry, _)| *entry == e) {
            Some((_, devices)) => devices.push(t),
            None => members.push((e, vec![t])),
        }
    }
    let mut groups = Vec::with_capacity(members.len());
    for (e, devices) in members {
        let Some(sharing) = &configs[e].sharing else {
            continue;
        };
        let group: Vec<&Target> = devices.iter().map(|&t| &targets[t]).collect();
        let sharing = apply(sharing, &group).map_err(|err| located[e].wrap(&entries[e], err))?;
        groups.push(SharingGroup { devices, sharing });
    }
    Ok(groups)
}

/// Where an entry sits, for error messages: its position among entries of the same origin.
struct Located {
    index: usize,
    origin: EntryOrigin,
}

impl Located {
    fn wrap(&self, entry: &Entry, source: OpaqueError) -> OpaqueError {
        OpaqueError::Entry {
            index: self.index,
            origin: self.origin,
            requests: entry.requests.clone(),
            source: Box::new(source),
        }
    }
}

fn locate(entries: &[Entry]) -> Vec<Located> {
    let (mut class, mut claim) = (0, 0);
    entries
        .iter()
        .map(|entry| {
            let counter = if entry.from_class {
                &mut class
            } else {
                &mut claim
            };
            let index = *counter;
            *counter += 1;
            Located {
                index,
                origin: if entry.from_class {
                    EntryOrigin::Class
                } else {
                    EntryOrigin::Claim
                },
            }
        })
        .collect()
}

/// Whether an entry naming `named` covers a device of request `request`.
fn names(named: &str, request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    named == request || named == parent
}

fn applies(entry: &Entry, config: &Config, target: &Target) -> bool {
    let requested =
        entry.requests.is_empty() || entry.requests.iter().any(|r| names(r, &target.request));
    let fits = match config.kind {
        ConfigKind::GpuConfig => !target.kind.is_vm_device(),
        ConfigKind::MigDeviceConfig => target.kind == TargetKind::Mig,
        // A vGPU is reached through VFIO too; its iommu settings are accepted and, today,
        // change nothing (it always gets its group node and /dev/vfio/vfio).
        ConfigKind::VfioDeviceConfig => target.kind.is_vm_device(),
        ConfigKind::VgpuDeviceConfig => target.kind == TargetKind::Vgpu,
    };
    requested && fits
}

/// Decides the VFIO settings of a claim's devices: for each target, the `iommu` of the last
/// `VfioDeviceConfig` that applies to it (class entries first, as in [`resolve`]), defaults
/// when none does, and `None` for targets that are not a VM's devices (VFIO GPUs, vGPUs).
///
/// # Errors
/// [`OpaqueError::Entry`] naming the entry: a decoding error, or a config naming a request
/// whose device it cannot configure ([`OpaqueError::KindMismatch`]): a `VfioDeviceConfig`
/// on a GPU or MIG device, a `GpuConfig` / `MigDeviceConfig` on a VM's device (a VM's GPU
/// has no sharing), a `VgpuDeviceConfig` on anything but a vGPU.
pub fn resolve_vfio(
    targets: &[Target],
    entries: &[Entry],
) -> Result<Vec<Option<super::VfioSettings>>, OpaqueError> {
    let mut settings: Vec<Option<super::VfioSettings>> = targets
        .iter()
        .map(|t| t.kind.is_vm_device().then(super::VfioSettings::default))
        .collect();
    // At most one VfioDeviceConfig in the claim (a class's may come with it, as defaults).
    let located = locate(entries);
    let mut first = None;
    for (e, entry) in entries.iter().enumerate() {
        if entry.from_class {
            continue;
        }
        let Ok(config) = decode(&entry.parameters) else {
            continue; // named with its own error below
        };
        if config.kind != ConfigKind::VfioDeviceConfig {
            continue;
        }
        match first {
            None => first = Some(located[e].index),
            Some(first) => {
                return Err(located[e].wrap(entry, OpaqueError::SecondVfioConfig { first }));
            }
        }
    }
    walk_vm_configs(targets, entries, |config, t| {
        if let Some(vfio) = config.vfio {
            settings[t] = Some(vfio);
        }
    })?;
    Ok(settings)
}

/// Decides the `VgpuDeviceConfig` of a claim's devices: for each vGPU target, the last one
/// that applies to it (class entries first, as in [`resolve`]), whole; `None` when none
/// does, and for every other target.
///
/// # Errors
/// As [`resolve_vfio`].
pub fn resolve_vgpu(
    targets: &[Target],
    entries: &[Entry],
) -> Result<Vec<Option<super::VgpuSettings>>, OpaqueError> {
    let mut settings: Vec<Option<super::VgpuSettings>> = vec![None; targets.len()];
    walk_vm_configs(targets, entries, |config, t| {
        if let Some(vgpu) = &config.vgpu {
            settings[t] = Some(vgpu.clone());
        }
    })?;
    Ok(settings)
}

/// Decodes every entry, class entries first, checks that no entry names a request whose
/// device its kind cannot configure, and calls `apply` with each entry's config and each
/// target it applies to, in precedence order (the last call for a target wins).
fn walk_vm_configs(
    targets: &[Target],
    entries: &[Entry],
    mut apply: impl FnMut(&Config, usize),
) -> Result<(), OpaqueError> {
    let located = locate(entries);
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| !entries[i].from_class);
    for e in order {
        let entry = &entries[e];
        let config = decode(&entry.parameters).map_err(|err| located[e].wrap(entry, err))?;
        for request in &entry.requests {
            let clash = targets
                .iter()
                .filter(|t| names(request, &t.request))
                .map(|t| t.kind)
                .find(|kind| match config.kind {
                    ConfigKind::VfioDeviceConfig => !kind.is_vm_device(),
                    ConfigKind::VgpuDeviceConfig => *kind != TargetKind::Vgpu,
                    ConfigKind::GpuConfig | ConfigKind::MigDeviceConfig => kind.is_vm_device(),
                });
            if let Some(kind) = clash {
                return Err(located[e].wrap(
                    entry,
                    OpaqueError::KindMismatch {
                        kind: config.kind,
                        request: request.clone(),
                        device_kind: kind.describe(),
                    },
                ));
            }
        }
        for (t, target) in targets.iter().enumerate() {
            if applies(entry, &config, target) {
                apply(&config, t);
            }
        }
    }
    Ok(())
}

fn check_mig_kind(config: &Config, entry: &Entry, targets: &[Target]) -> Result<(), OpaqueError> {
    if config.kind != ConfigKind::MigDeviceConfig {
        return Ok(());
    }
    for request in &entry.requests {
        let full = targets
            .iter()
            .find(|t| t.kind == TargetKind::FullGpu && names(request, &t.request));
        if let Some(full) = full {
            return Err(OpaqueError::MigConfigOnFullGpu {
                request: request.clone(),
                device: full.device.clone(),
            });
        }
    }
    Ok(())
}

fn apply(sharing: &SharingConfig, group: &[&Target]) -> Result<Sharing, OpaqueError> {
    match sharing {
        SharingConfig::TimeSlicing { interval } => {
            if *interval != TimeSliceInterval::Default
                && let Some(mig) = group.iter().find(|t| t.kind == TargetKind::Mig)
            {
                return Err(OpaqueError::IntervalOnMig {
                    interval: *interval,
                    device: Some(mig.device.clone()),
                });
            }
            Ok(Sharing::TimeSlicing {
                interval: *interval,
            })
        }
        SharingConfig::Mps(config) => Ok(Sharing::Mps(mps_limits(config, group)?)),
    }
}

fn mps_limits(config: &MpsConfig, group: &[&Target]) -> Result<MpsLimits, OpaqueError> {
    let mut limits = vec![config.pinned_memory_bytes; group.len()];
    let mut set_by: Vec<Option<&str>> = vec![None; group.len()];
    for (key, bytes) in &config.per_device_pinned_memory_bytes {
        let at = device_for_key(key, group)?;
        if let Some(first) = set_by[at] {
            return Err(OpaqueError::DuplicateDeviceKey {
                first: first.to_owned(),
                second: key.clone(),
                device: group[at].device.clone(),
            });
        }
        set_by[at] = Some(key);
        limits[at] = Some(*bytes);
    }
    for (at, target) in group.iter().enumerate() {
        let Some(limit) = limits[at] else { continue };
        if target.memory_bytes != 0 && limit > target.memory_bytes {
            let path = match set_by[at] {
                Some(key) => format!("{PER_DEVICE_PATH}.{key}"),
                None => DEFAULT_LIMIT_PATH.to_owned(),
            };
            return Err(OpaqueError::LimitAboveMemory {
                path,
                limit,
                device: target.device.clone(),
                memory: target.memory_bytes,
            });
        }
    }
    Ok(MpsLimits {
        active_thread_percentage: config.active_thread_percentage,
        pinned_memory_bytes: limits,
        multi_user: config.multi_user,
    })
}

/// The group position a per-device key names: an index into the group, a UUID, or a device
/// name (stable before a MIG device is carved and has a UUID).
fn device_for_key(key: &str, group: &[&Target]) -> Result<usize, OpaqueError> {
    let by_index = key.parse::<usize>().ok().filter(|i| *i < group.len());
    let by_identity = || {
        group
            .iter()
            .position(|t| t.uuid.as_deref() == Some(key) || t.device == key)
    };
    by_index
        .or_else(by_identity)
        .ok_or_else(|| OpaqueError::UnknownDeviceKey {
            key: key.to_owned(),
            valid: valid_keys(group),
        })
}

fn valid_keys(group: &[&Target]) -> String {
    let indices = (0..group.len()).map(|i| i.to_string());
    let uuids = group.iter().filter_map(|t| t.uuid.clone());
    let names = group.iter().map(|t| t.device.clone());
    indices
        .chain(uuids)
        .chain(names)
        .collect::<Vec<_>>()
        .join(", ")
}
