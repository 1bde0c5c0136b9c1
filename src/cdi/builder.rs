//! The pure part: a claim's devices plus already-discovered host facts → one CDI spec.

use std::collections::BTreeMap;

use super::input::ClaimDevice;
use super::naming::{ClaimNaming, NameError};
use super::spec::{ContainerEdits, Device, Spec};
use super::validate::{SpecError, validate_spec};
use super::version::minimum_version;

/// Prefix of the per-device env var carrying the device's UUID; the rest of the name is the
/// DRA device name (and share ID), so several devices in one container never overwrite each
/// other (CDI env entries with the same name replace each other).
pub const DEVICE_UUID_ENV_PREFIX: &str = "DRA_GPU_UUID_";

/// The spec-level `NVIDIA_VISIBLE_DEVICES` entry, on real and simulated nodes alike.
///
/// `void`, as NVIDIA's tooling writes: the devices come from CDI, and a legacy-mode
/// nvidia-container-runtime hook must not inject anything on top. A spec-level value is seen
/// by every container given any device of the claim, so listing UUIDs there would tell a
/// container given one request of a multi-request claim about the others' devices; which
/// devices a container got is in its `DRA_GPU_UUID_*` variables, which compose per device.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES=void";

/// Everything the builder needs from the host, discovered beforehand (or given by the
/// simulated node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// Spec-level edits shared by all devices: control nodes, driver files, hooks, env.
    pub common: ContainerEdits,
    /// Device-level edits (device nodes, extra groups) keyed by GPU or MIG UUID.
    pub per_device: BTreeMap<String, ContainerEdits>,
}

/// A claim spec could not be built from its inputs.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The claim has no devices; CDI specs must list at least one.
    #[error("claim {claim_uid} has no devices to put in a CDI spec")]
    NoDevices { claim_uid: String },
    /// A name (claim UID, device name, share ID) breaks the CDI grammar.
    #[error("naming CDI device for claim {claim_uid}")]
    Name {
        claim_uid: String,
        #[source]
        source: NameError,
    },
    /// The host facts lack the device's UUID (discovery was run for other devices).
    #[error("no host facts for device {device} (UUID {uuid}) of claim {claim_uid}")]
    MissingFacts {
        claim_uid: String,
        device: String,
        uuid: String,
    },
    /// An extra env entry has an empty name or a name containing `=`.
    #[error(
        "env name {name:?} of device {device} in claim {claim_uid} is invalid: it must be non-empty and contain no '='"
    )]
    EnvName {
        claim_uid: String,
        device: String,
        name: String,
    },
    /// The assembled spec fails CDI validation.
    #[error("CDI spec for claim {claim_uid} is invalid")]
    Invalid {
        claim_uid: String,
        #[source]
        source: SpecError,
    },
}

/// Builds the claim's spec: one CDI device per [`ClaimDevice`] (its nodes from `facts`, its
/// UUID env, its extra env and mounts), the shared edits at spec level, and the lowest
/// `cdiVersion` that covers what the spec uses.
///
/// Guarantees the result passes [`validate_spec`] and that its device names are exactly
/// those of [`ClaimNaming::device_name`], in input order.
///
/// # Errors
/// [`BuildError`] naming the claim and device at fault.
pub fn build_claim_spec(
    naming: &ClaimNaming,
    claim_uid: &str,
    devices: &[ClaimDevice],
    facts: &HostFacts,
) -> Result<Spec, BuildError> {
    if devices.is_empty() {
        return Err(BuildError::NoDevices {
            claim_uid: claim_uid.to_string(),
        });
    }
    let mut spec_devices = Vec::with_capacity(devices.len());
    for device in devices {
        let name = naming
            .device_name(claim_uid, &device.device_name, device.share_id.as_deref())
            .map_err(|source| BuildError::Name {
                claim_uid: claim_uid.to_string(),
                source,
            })?;
        let uuid = device.gpu.uuid();
        let mut edits =
            facts
                .per_device
                .get(uuid)
                .cloned()
                .ok_or_else(|| BuildError::MissingFacts {
                    claim_uid: claim_uid.to_string(),
                    device: device.device_name.clone(),
                    uuid: uuid.to_string(),
                })?;
        edits.env.push(format!("{}={uuid}", uuid_env_name(device)));
        for (key, value) in &device.env {
            if key.is_empty() || key.contains('=') {
                return Err(BuildError::EnvName {
                    claim_uid: claim_uid.to_string(),
                    device: device.device_name.clone(),
                    name: key.clone(),
                });
            }
            edits.env.push(format!("{key}={value}"));
        }
        edits.mounts.extend(device.mounts.iter().cloned());
        spec_devices.push(Device {
            name,
            annotations: BTreeMap::new(),
            container_edits: edits,
        });
    }
    let mut common = facts.common.clone();
    common.env.push(VISIBLE_DEVICES_ENV.to_string());
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: naming.kind(),
        annotations: BTreeMap::new(),
        devices: spec_devices,
        container_edits: common,
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    validate_spec(&spec).map_err(|source| BuildError::Invalid {
        claim_uid: claim_uid.to_string(),
        source,
    })?;
    Ok(spec)
}

/// `DRA_GPU_UUID_<DEVICE>[_<SHARE ID>]`, upper-cased, every other character `_`.
pub fn uuid_env_name(device: &ClaimDevice) -> String {
    let mut key = device.device_name.clone();
    if let Some(share) = &device.share_id {
        key.push('_');
        key.push_str(share);
    }
    let key: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{DEVICE_UUID_ENV_PREFIX}{key}")
}

/// The CDI device IDs the kubelet gets for a claim's devices, one per device, in order.
///
/// # Errors
/// [`NameError`] when a name breaks the CDI grammar.
pub fn device_ids(
    naming: &ClaimNaming,
    claim_uid: &str,
    devices: &[ClaimDevice],
) -> Result<Vec<String>, NameError> {
    devices
        .iter()
        .map(|d| naming.device_id(claim_uid, &d.device_name, d.share_id.as_deref()))
        .collect()
}

#[cfg(test)]
#[path = "builder_tests.rs"]
mod tests;
