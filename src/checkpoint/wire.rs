//! The checkpoint file format, version `v1`.
//!
//! ```json
//! {"version": "v1", "checksum": "sha256:<hex>", "payload": {"nodeBootId": "…", "claims": {…}}}
//! ```
//! The checksum covers the payload in canonical form (object keys sorted, no whitespace), so
//! it does not depend on how the file was pretty-printed. The version is read before
//! anything else, so a file from a newer plugin is recognised as such, not as garbage.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::model::{
    Checkpoint, ClaimPhase, ClaimRecord, DeviceRecord, InvalidCheckpoint, MigRecord, VfioRecord,
};

/// The format version this code writes.
pub const CURRENT_VERSION: &str = "v1";
/// Every format version this code reads.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1"];

/// Why file content is not a usable checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON at all (garbage, truncated, empty).
    #[error("not valid JSON")]
    NotJson {
        #[source]
        source: serde_json::Error,
    },
    /// JSON, but without the envelope fields.
    #[error("missing or non-{kind} field {field:?} in the checkpoint envelope")]
    Envelope {
        field: &'static str,
        kind: &'static str,
    },
    /// Written by a plugin version with a format this one does not know.
    #[error("checkpoint format version {found:?} is not supported (supported: {supported})")]
    UnsupportedVersion { found: String, supported: String },
    /// The payload changed after it was written (bit rot, partial write, hand edit).
    #[error("checksum mismatch: file says {stored}, payload hashes to {computed}")]
    Checksum { stored: String, computed: String },
    /// The payload does not have the `v1` shape.
    #[error("payload does not match checkpoint format {version}")]
    Payload {
        version: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The payload has the right shape but breaks an invariant.
    #[error("payload is inconsistent")]
    Invalid {
        #[source]
        source: InvalidCheckpoint,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PayloadV1 {
    node_boot_id: String,
    claims: BTreeMap<String, ClaimV1>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimV1 {
    uid: String,
    namespace: String,
    name: String,
    phase: PhaseV1,
    devices: Vec<DeviceV1>,
    updated_unix: i64,
    /// Absent unless the claim holds a Fabric Manager partition, so files of nodes without
    /// FM stay readable by releases that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fabric_partition: Option<u32>,
}

#[derive(Serialize, Deserialize)]
enum PhaseV1 {
    PrepareStarted,
    PrepareCompleted,
    UnprepareStarted,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DeviceV1 {
    request_names: Vec<String>,
    pool: String,
    device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    share_id: Option<String>,
    cdi_device_ids: Vec<String>,
    gpu_uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mig: Option<MigV1>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sharing: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vfio: Option<VfioV1>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VfioV1 {
    address: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    restore_persistence: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MigV1 {
    parent_minor: u32,
    profile_id: u32,
    profile: String,
    placement_start: u32,
    placement_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gi_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ci_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uuid: Option<String>,
}

/// Serializes a valid checkpoint into the current format (pretty JSON, trailing newline).
///
/// # Errors
/// [`DecodeError::Invalid`] when `cp` breaks an invariant (nothing invalid is ever written).
pub fn encode(cp: &Checkpoint) -> Result<Vec<u8>, DecodeError> {
    cp.validate()
        .map_err(|source| DecodeError::Invalid { source })?;
    let payload = serde_json::to_value(to_wire(cp)).map_err(|source| DecodeError::Payload {
        version: CURRENT_VERSION,
        source,
    })?;
    let envelope = serde_json::json!({
        "version": CURRENT_VERSION,
        "checksum": checksum(&payload),
        "payload": payload,
    });
    let mut bytes =
        serde_json::to_vec_pretty(&envelope).map_err(|source| DecodeError::Payload {
            version: CURRENT_VERSION,
            source,
        })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Parses and verifies file content: envelope, version, checksum, shape, invariants.
///
/// # Errors
/// [`DecodeError`] saying which check failed.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, DecodeError> {
    crate::cost::count(crate::cost::Cost::CheckpointParse);
    let envelope: Value =
        serde_json::from_slice(bytes).map_err(|source| DecodeError::NotJson { source })?;
    let field = |name: &'static str| envelope.get(name);
    let version = field("version")
        .and_then(Value::as_str)
        .ok_or(DecodeError::Envelope {
            field: "version",
            kind: "string",
        })?;
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(DecodeError::UnsupportedVersion {
            found: version.to_string(),
            supported: SUPPORTED_VERSIONS.join(", "),
        });
    }
    let stored = field("checksum")
        .and_then(Value::as_str)
        .ok_or(DecodeError::Envelope {
            field: "checksum",
            kind: "string",
        })?;
    let payload = field("payload")
        .filter(|p| p.is_object())
        .ok_or(DecodeError::Envelope {
            field: "payload",
            kind: "object",
        })?;
    let computed = checksum(payload);
    if stored != computed {
        return Err(DecodeError::Checksum {
            stored: stored.to_string(),
            computed,
        });
    }
    let wire: PayloadV1 =
        serde_json::from_value(payload.clone()).map_err(|source| DecodeError::Payload {
            version: CURRENT_VERSION,
            source,
        })?;
    let cp = from_wire(wire);
    cp.validate()
        .map_err(|source| DecodeError::Invalid { source })?;
    Ok(cp)
}

/// `sha256:<hex>` of the canonical form of `payload`.
pub fn checksum(payload: &Value) -> String {
    let mut canonical = Vec::new();
    write_canonical(payload, &mut canonical);
    let digest = Sha256::digest(&canonical);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Compact JSON with object keys sorted at every level, whatever map type serde_json uses.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(Value::String(key.clone()).to_string().into_bytes());
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend(scalar.to_string().into_bytes()),
    }
}

fn to_wire(cp: &Checkpoint) -> PayloadV1 {
    let claims = cp
        .claims
        .iter()
        .map(|(uid, c)| {
            let claim = ClaimV1 {
                uid: c.uid.clone(),
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                phase: match c.phase {
                    ClaimPhase::PrepareStarted => PhaseV1::PrepareStarted,
                    ClaimPhase::PrepareCompleted => PhaseV1::PrepareCompleted,
                    ClaimPhase::UnprepareStarted => PhaseV1::UnprepareStarted,
                },
                devices: c.devices.iter().map(device_to_wire).collect(),
                updated_unix: c.updated_unix,
                fabric_partition: c.fabric_partition,
            };
            (uid.clone(), claim)
        })
        .collect();
    PayloadV1 {
        node_boot_id: cp.node_boot_id.clone(),
        claims,
    }
}

fn device_to_wire(d: &DeviceRecord) -> DeviceV1 {
    DeviceV1 {
        request_names: d.request_names.clone(),
        pool: d.pool.clone(),
        device: d.device.clone(),
        share_id: d.share_id.clone(),
        cdi_device_ids: d.cdi_device_ids.clone(),
        gpu_uuid: d.gpu_uuid.clone(),
        mig: d.mig.as_ref().map(|m| MigV1 {
            parent_minor: m.parent_minor,
            profile_id: m.profile_id,
            profile: m.profile.clone(),
            placement_start: m.placement_start,
            placement_size: m.placement_size,
            gi_id: m.gi_id,
            ci_id: m.ci_id,
            uuid: m.uuid.clone(),
        }),
        sharing: d.sharing.clone().filter(|v| !v.is_null()),
        vfio: d.vfio.as_ref().map(|v| VfioV1 {
            address: v.address.clone(),
            restore_persistence: v.restore_persistence,
        }),
    }
}

fn from_wire(wire: PayloadV1) -> Checkpoint {
    let claims = wire
        .claims
        .into_iter()
        .map(|(uid, c)| {
            let claim = ClaimRecord {
                uid: c.uid,
                namespace: c.namespace,
                name: c.name,
                phase: match c.phase {
                    PhaseV1::PrepareStarted => ClaimPhase::PrepareStarted,
                    PhaseV1::PrepareCompleted => ClaimPhase::PrepareCompleted,
                    PhaseV1::UnprepareStarted => ClaimPhase::UnprepareStarted,
                },
                devices: c.devices.into_iter().map(device_from_wire).collect(),
                updated_unix: c.updated_unix,
                fabric_partition: c.fabric_partition,
            };
            (uid, claim)
        })
        .collect();
    Checkpoint {
        node_boot_id: wire.node_boot_id,
        claims,
    }
}

fn device_from_wire(d: DeviceV1) -> DeviceRecord {
    DeviceRecord {
        request_names: d.request_names,
        pool: d.pool,
        device: d.device,
        share_id: d.share_id,
        cdi_device_ids: d.cdi_device_ids,
        gpu_uuid: d.gpu_uuid,
        mig: d.mig.map(|m| MigRecord {
            parent_minor: m.parent_minor,
            profile_id: m.profile_id,
            profile: m.profile,
            placement_start: m.placement_start,
            placement_size: m.placement_size,
            gi_id: m.gi_id,
            ci_id: m.ci_id,
            uuid: m.uuid,
        }),
        sharing: d.sharing,
        vfio: d.vfio.map(|v| VfioRecord {
            address: v.address,
            restore_persistence: v.restore_persistence,
        }),
    }
}
