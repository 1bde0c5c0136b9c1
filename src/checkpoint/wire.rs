//! The checkpoint file format, version `v1`.
//!
//! ```json
//! {"version": "v1", "checksum": "sha256:<hex>", "payload": {"nodeBootId": "…", "claims": {…}}}
//! ```
//! The checksum covers the payload in canonical form (object keys sorted, no whitespace), so
//! it does not depend on how the file is formatted (written compact, in canonical form). The version is read before
//! anything else, so a file from a newer plugin is recognised as such, not as garbage.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::model::{
    Checkpoint, ClaimPhase, ClaimRecord, DeviceRecord, InvalidCheckpoint, MigRecord, VfioRecord,
    VgpuRecord,
};
use crate::hardware::vgpu::VgpuFramework;

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

// The wire structs declare their fields in the order of their JSON names, so that serde
// writes every object with its keys sorted: the compact serialization of a payload is its
// canonical form, and [`encode`] hashes what it writes in one pass. The test
// `encoded_payload_is_canonical` holds every struct to it.
//
// Their strings are `Cow`s: a write borrows them from the model (no copy of every record
// per write), a read owns what it parsed.

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PayloadV1<'a> {
    claims: BTreeMap<Cow<'a, str>, ClaimV1<'a>>,
    node_boot_id: Cow<'a, str>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimV1<'a> {
    devices: Vec<DeviceV1<'a>>,
    /// Absent unless the claim holds a Fabric Manager partition, so files of nodes without
    /// FM stay readable by releases that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fabric_partition: Option<u32>,
    name: Cow<'a, str>,
    namespace: Cow<'a, str>,
    phase: PhaseV1,
    uid: Cow<'a, str>,
    updated_unix: i64,
}

#[derive(Serialize, Deserialize)]
enum PhaseV1 {
    PrepareStarted,
    PrepareCompleted,
    UnprepareStarted,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DeviceV1<'a> {
    cdi_device_ids: Cow<'a, [String]>,
    device: Cow<'a, str>,
    gpu_uuid: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mig: Option<MigV1<'a>>,
    pool: Cow<'a, str>,
    request_names: Cow<'a, [String]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    share_id: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sharing: Option<Cow<'a, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vfio: Option<VfioV1<'a>>,
    /// Absent unless the device is a vGPU, so files of nodes without vGPUs stay readable by
    /// releases that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vgpu: Option<VgpuV1<'a>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VgpuV1<'a> {
    framework: FrameworkV1,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mdev_uuid: Option<Cow<'a, str>>,
    parent: Cow<'a, str>,
    type_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vf: Option<Cow<'a, str>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FrameworkV1 {
    Mdev,
    Vdev,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VfioV1<'a> {
    address: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    restore_persistence: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MigV1<'a> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ci_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gi_id: Option<u32>,
    parent_minor: u32,
    placement_size: u32,
    placement_start: u32,
    profile: Cow<'a, str>,
    profile_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uuid: Option<Cow<'a, str>>,
}

/// Serializes a valid checkpoint into the current format: compact JSON, the envelope's
/// `version`, `checksum` and `payload` in that order, and a trailing newline. The payload is
/// written in its canonical form (keys sorted, no whitespace), so the checksum is the hash
/// of the bytes written, computed in the same pass. `jq . checkpoint.json` shows it indented.
///
/// # Errors
/// [`DecodeError::Invalid`] when `cp` breaks an invariant (nothing invalid is ever written).
pub fn encode(cp: &Checkpoint) -> Result<Vec<u8>, DecodeError> {
    cp.validate()
        .map_err(|source| DecodeError::Invalid { source })?;
    let wire = to_wire(cp);
    let payload = if maps_are_sorted() {
        serde_json::to_vec(&wire)
    } else {
        serde_json::to_value(&wire).map(|value| canonical(&value))
    }
    .map_err(|source| DecodeError::Payload {
        version: CURRENT_VERSION,
        source,
    })?;
    Ok(envelope_around(&payload))
}

/// The file's bytes around a payload in canonical form.
fn envelope_around(payload: &[u8]) -> Vec<u8> {
    let sum = checksum_of(payload);
    let mut bytes = Vec::with_capacity(payload.len() + 128);
    bytes.extend_from_slice(b"{\"version\":\"");
    bytes.extend_from_slice(CURRENT_VERSION.as_bytes());
    bytes.extend_from_slice(b"\",\"checksum\":\"");
    bytes.extend_from_slice(sum.as_bytes());
    bytes.extend_from_slice(b"\",\"payload\":");
    bytes.extend_from_slice(payload);
    bytes.extend_from_slice(b"}\n");
    bytes
}

/// Each claim's JSON as the last [`encode_reusing`] wrote it, with the record it was made
/// from, so the next write serialises only the records that changed.
#[derive(Debug, Default)]
pub struct EncodeCache {
    claims: std::collections::HashMap<String, (ClaimRecord, Vec<u8>)>,
}

/// [`encode`], byte for byte, serialising only the records that differ from those `cache`
/// holds (a prepare changes one or a few records of many; each write serialised all of
/// them: about 7,500 instructions a record, once or twice a call). `cache` then holds exactly the
/// records of `cp`.
///
/// # Errors
/// As [`encode`]. `cache` may then hold fewer records (it is only a shortcut).
pub fn encode_reusing(cp: &Checkpoint, cache: &mut EncodeCache) -> Result<Vec<u8>, DecodeError> {
    if !maps_are_sorted() {
        return encode(cp);
    }
    cp.validate()
        .map_err(|source| DecodeError::Invalid { source })?;
    let failed = |source| DecodeError::Payload {
        version: CURRENT_VERSION,
        source,
    };
    // The compact form of `PayloadV1`: its fields in name order, the claims by key.
    let mut payload = Vec::with_capacity(
        64 + cache
            .claims
            .values()
            .map(|(_, json)| json.len() + 48)
            .sum::<usize>(),
    );
    let mut kept = std::collections::HashMap::with_capacity(cp.claims.len());
    payload.extend_from_slice(b"{\"claims\":{");
    for (i, (key, record)) in cp.claims.iter().enumerate() {
        if i > 0 {
            payload.push(b',');
        }
        serde_json::to_writer(&mut payload, key.as_str()).map_err(failed)?;
        payload.push(b':');
        let entry = match cache.claims.remove(key) {
            Some((cached, json)) if cached == *record => (cached, json),
            _ => (
                record.clone(),
                serde_json::to_vec(&claim_to_wire(record)).map_err(failed)?,
            ),
        };
        payload.extend_from_slice(&entry.1);
        kept.insert(key.clone(), entry);
    }
    payload.extend_from_slice(b"},\"nodeBootId\":");
    serde_json::to_writer(&mut payload, cp.node_boot_id.as_str()).map_err(failed)?;
    payload.push(b'}');
    cache.claims = kept;
    Ok(envelope_around(&payload))
}

/// Parses and verifies file content: envelope, version, checksum, shape, invariants.
///
/// # Errors
/// [`DecodeError`] saying which check failed.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, DecodeError> {
    crate::cost::count(crate::cost::Cost::CheckpointParse);
    if let Some(checkpoint) = decode_as_written(bytes) {
        return Ok(checkpoint);
    }
    decode_any_form(bytes)
}

/// The file as [`encode`] writes it, in one pass: the payload's own bytes hashed (they are
/// its canonical form) and parsed straight into the wire structs. `None` when anything is
/// not so (another layout, escapes in the envelope, a mismatch, a broken invariant): then
/// [`decode_any_form`] decides, and names what is wrong. It never accepts what that would
/// refuse: a payload whose own bytes hash to the stored checksum is the canonical form the
/// writer hashed, which is what [`decode_any_form`] would rebuild and hash.
///
/// Why: the plugin's background readers (inventory, usage, supervision) read the whole
/// file every round; through a `Value`, re-serialised to hash it, a 50-claim file cost
/// about 2.5 million instructions a read (counted under callgrind).
fn decode_as_written(bytes: &[u8]) -> Option<Checkpoint> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        version: &'a str,
        #[serde(borrow)]
        checksum: &'a str,
        #[serde(borrow)]
        payload: &'a serde_json::value::RawValue,
    }
    let envelope: Envelope<'_> = serde_json::from_slice(bytes).ok()?;
    if !SUPPORTED_VERSIONS.contains(&envelope.version)
        || checksum_of(envelope.payload.get().as_bytes()) != envelope.checksum
    {
        return None;
    }
    let wire: PayloadV1<'_> = serde_json::from_str(envelope.payload.get()).ok()?;
    let cp = from_wire(wire);
    cp.validate().ok()?;
    Some(cp)
}

/// Any JSON layout of the file (a hand-formatted one too): the payload canonicalised
/// before it is hashed, and every failure named.
fn decode_any_form(bytes: &[u8]) -> Result<Checkpoint, DecodeError> {
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
    let wire = PayloadV1::deserialize(payload).map_err(|source| DecodeError::Payload {
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
    checksum_of(&canonical(payload))
}

/// `sha256:<hex>` of `canonical`, bytes already in canonical form.
fn checksum_of(canonical: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(canonical);
    let mut text = String::with_capacity(7 + 2 * digest.len());
    text.push_str("sha256:");
    for b in digest {
        let _ = write!(text, "{b:02x}");
    }
    text
}

/// The canonical form of `value`: compact JSON with object keys sorted at every level.
fn canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    if maps_are_sorted() {
        // serde_json's map is a BTreeMap unless some crate in the build turns on its
        // `preserve_order` feature: then its compact form is the canonical one.
        if serde_json::to_writer(&mut out, value).is_ok() {
            return out;
        }
        out.clear();
    }
    write_canonical(value, &mut out);
    out
}

/// Whether `serde_json::Map` iterates in key order in this build (it does unless a crate
/// enables serde_json's `preserve_order` feature, which makes it keep insertion order).
fn maps_are_sorted() -> bool {
    static SORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SORTED.get_or_init(|| {
        let mut map = serde_json::Map::new();
        map.insert("b".into(), Value::Null);
        map.insert("a".into(), Value::Null);
        map.keys().next().map(String::as_str) == Some("a")
    })
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
                let _ = serde_json::to_writer(&mut *out, key);
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
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

fn to_wire(cp: &Checkpoint) -> PayloadV1<'_> {
    let claims = cp
        .claims
        .iter()
        .map(|(uid, c)| (Cow::Borrowed(uid.as_str()), claim_to_wire(c)))
        .collect();
    PayloadV1 {
        node_boot_id: Cow::Borrowed(&cp.node_boot_id),
        claims,
    }
}

fn claim_to_wire(c: &ClaimRecord) -> ClaimV1<'_> {
    ClaimV1 {
        uid: Cow::Borrowed(&c.uid),
        namespace: Cow::Borrowed(&c.namespace),
        name: Cow::Borrowed(&c.name),
        phase: match c.phase {
            ClaimPhase::PrepareStarted => PhaseV1::PrepareStarted,
            ClaimPhase::PrepareCompleted => PhaseV1::PrepareCompleted,
            ClaimPhase::UnprepareStarted => PhaseV1::UnprepareStarted,
        },
        devices: c.devices.iter().map(device_to_wire).collect(),
        updated_unix: c.updated_unix,
        fabric_partition: c.fabric_partition,
    }
}

fn device_to_wire(d: &DeviceRecord) -> DeviceV1<'_> {
    DeviceV1 {
        request_names: Cow::Borrowed(&d.request_names),
        pool: Cow::Borrowed(&d.pool),
        device: Cow::Borrowed(&d.device),
        share_id: d.share_id.as_deref().map(Cow::Borrowed),
        cdi_device_ids: Cow::Borrowed(&d.cdi_device_ids),
        gpu_uuid: Cow::Borrowed(&d.gpu_uuid),
        mig: d.mig.as_ref().map(|m| MigV1 {
            parent_minor: m.parent_minor,
            profile_id: m.profile_id,
            profile: Cow::Borrowed(&m.profile),
            placement_start: m.placement_start,
            placement_size: m.placement_size,
            gi_id: m.gi_id,
            ci_id: m.ci_id,
            uuid: m.uuid.as_deref().map(Cow::Borrowed),
        }),
        sharing: d
            .sharing
            .as_ref()
            .filter(|v| !v.is_null())
            .map(Cow::Borrowed),
        vfio: d.vfio.as_ref().map(|v| VfioV1 {
            address: Cow::Borrowed(&v.address),
            restore_persistence: v.restore_persistence,
        }),
        vgpu: d.vgpu.as_ref().map(|v| VgpuV1 {
            framework: match v.framework {
                VgpuFramework::Mdev => FrameworkV1::Mdev,
                VgpuFramework::Vdev => FrameworkV1::Vdev,
            },
            mdev_uuid: v.mdev_uuid.as_deref().map(Cow::Borrowed),
            parent: Cow::Borrowed(&v.parent),
            type_id: v.type_id,
            vf: v.vf.as_deref().map(Cow::Borrowed),
        }),
    }
}

fn from_wire(wire: PayloadV1<'_>) -> Checkpoint {
    let claims = wire
        .claims
        .into_iter()
        .map(|(uid, c)| {
            let claim = ClaimRecord {
                uid: c.uid.into_owned(),
                namespace: c.namespace.into_owned(),
                name: c.name.into_owned(),
                phase: match c.phase {
                    PhaseV1::PrepareStarted => ClaimPhase::PrepareStarted,
                    PhaseV1::PrepareCompleted => ClaimPhase::PrepareCompleted,
                    PhaseV1::UnprepareStarted => ClaimPhase::UnprepareStarted,
                },
                devices: c.devices.into_iter().map(device_from_wire).collect(),
                updated_unix: c.updated_unix,
                fabric_partition: c.fabric_partition,
            };
            (uid.into_owned(), claim)
        })
        .collect();
    Checkpoint {
        node_boot_id: wire.node_boot_id.into_owned(),
        claims,
    }
}

fn device_from_wire(d: DeviceV1<'_>) -> DeviceRecord {
    DeviceRecord {
        request_names: d.request_names.into_owned(),
        pool: d.pool.into_owned(),
        device: d.device.into_owned(),
        share_id: d.share_id.map(Cow::into_owned),
        cdi_device_ids: d.cdi_device_ids.into_owned(),
        gpu_uuid: d.gpu_uuid.into_owned(),
        mig: d.mig.map(|m| MigRecord {
            parent_minor: m.parent_minor,
            profile_id: m.profile_id,
            profile: m.profile.into_owned(),
            placement_start: m.placement_start,
            placement_size: m.placement_size,
            gi_id: m.gi_id,
            ci_id: m.ci_id,
            uuid: m.uuid.map(Cow::into_owned),
        }),
        sharing: d.sharing.map(Cow::into_owned),
        vfio: d.vfio.map(|v| VfioRecord {
            address: v.address.into_owned(),
            restore_persistence: v.restore_persistence,
        }),
        vgpu: d.vgpu.map(|v| VgpuRecord {
            type_id: v.type_id,
            framework: match v.framework {
                FrameworkV1::Mdev => VgpuFramework::Mdev,
                FrameworkV1::Vdev => VgpuFramework::Vdev,
            },
            parent: v.parent.into_owned(),
            vf: v.vf.map(Cow::into_owned),
            mdev_uuid: v.mdev_uuid.map(Cow::into_owned),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint with every optional field set, and a `sharing` value whose keys were
    /// inserted out of order.
    fn everything() -> Checkpoint {
        let mut sharing = serde_json::Map::new();
        sharing.insert("strategy".into(), Value::from("MPS"));
        sharing.insert(
            "mps".into(),
            serde_json::json!({"pipeDir": "/p", "activeThreadPercentage": 50}),
        );
        let device = |name: &str| DeviceRecord {
            request_names: vec!["gpu".into(), "other".into()],
            pool: "node-a".into(),
            device: name.into(),
            share_id: Some("share-1".into()),
            cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim=uid-{name}")],
            gpu_uuid: "GPU-1".into(),
            mig: None,
            sharing: None,
            vfio: None,
            vgpu: None,
        };
        let mig = DeviceRecord {
            mig: Some(MigRecord {
                parent_minor: 0,
                profile_id: 19,
                profile: "1g.10gb".into(),
                placement_start: 6,
                placement_size: 1,
                gi_id: Some(13),
                ci_id: Some(0),
                uuid: Some("MIG-1".into()),
            }),
            sharing: Some(Value::Object(sharing)),
            ..device("gpu-0-mig-1g10gb-6")
        };
        let vfio = DeviceRecord {
            vfio: Some(VfioRecord {
                address: "0000:1b:00.0".into(),
                restore_persistence: true,
            }),
            ..device("gpu-vfio-1")
        };
        let vdev = DeviceRecord {
            vgpu: Some(VgpuRecord {
                type_id: 1056,
                framework: VgpuFramework::Vdev,
                parent: "0000:18:00.0".into(),
                vf: Some("0000:18:00.4".into()),
                mdev_uuid: None,
            }),
            ..device("vgpu-0-4c-0")
        };
        let mdev = DeviceRecord {
            vgpu: Some(VgpuRecord {
                type_id: 232,
                framework: VgpuFramework::Mdev,
                parent: "0000:2a:00.0".into(),
                vf: None,
                mdev_uuid: Some("3b1a5e2c-0000-4000-8000-000000000001".into()),
            }),
            ..device("vgpu-1-4q-0")
        };
        let claim = |uid: &str, phase, devices| ClaimRecord {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
            phase,
            devices,
            updated_unix: 1_700_000_000,
            fabric_partition: Some(3),
        };
        Checkpoint {
            node_boot_id: "boot".into(),
            claims: [
                (
                    "b".into(),
                    claim("b", ClaimPhase::PrepareCompleted, vec![mig]),
                ),
                (
                    "a".into(),
                    claim("a", ClaimPhase::UnprepareStarted, vec![vfio]),
                ),
                (
                    "c".into(),
                    claim("c", ClaimPhase::PrepareStarted, vec![vdev, mdev]),
                ),
            ]
            .into_iter()
            .collect(),
        }
    }

    fn envelope(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).expect("the file is JSON")
    }

    #[test]
    fn encoded_payload_is_canonical() {
        let bytes = encode(&everything()).expect("encodes");
        let text = std::str::from_utf8(&bytes).expect("utf-8");
        let payload = envelope(&bytes)["payload"].clone();
        let mut slow = Vec::new();
        write_canonical(&payload, &mut slow);
        let written = text
            .split_once("\"payload\":")
            .and_then(|(_, rest)| rest.strip_suffix("}\n"))
            .expect("payload last, then the closing brace and a newline");
        assert_eq!(
            written.as_bytes(),
            &slow[..],
            "written payload is canonical"
        );
        assert_eq!(
            envelope(&bytes)["checksum"],
            Value::from(checksum_of(&slow))
        );
        assert!(text.starts_with("{\"version\":\"v1\",\"checksum\":\"sha256:"));
    }

    #[test]
    fn everything_round_trips() {
        let cp = everything();
        let back = decode(&encode(&cp).expect("encodes")).expect("decodes");
        assert_eq!(back, cp);
    }

    #[test]
    fn an_indented_file_of_an_earlier_release_still_reads() {
        let cp = everything();
        let mut indented = serde_json::to_vec_pretty(&envelope(&encode(&cp).unwrap())).unwrap();
        indented.push(b'\n');
        assert_eq!(decode(&indented).expect("decodes"), cp);
    }

    #[test]
    fn a_vgpu_record_must_name_what_undo_deletes() {
        let mut cp = everything();
        let vgpu = |cp: &mut Checkpoint| {
            cp.claims.get_mut("c").unwrap().devices[0]
                .vgpu
                .as_mut()
                .unwrap()
                .clone()
        };
        let set = |cp: &mut Checkpoint, record: VgpuRecord| {
            cp.claims.get_mut("c").unwrap().devices[0].vgpu = Some(record);
        };
        let good = vgpu(&mut cp);
        set(
            &mut cp,
            VgpuRecord {
                vf: None,
                ..good.clone()
            },
        );
        let Err(DecodeError::Invalid { source }) = encode(&cp) else {
            panic!("a vdev record without its VF is invalid");
        };
        assert_eq!("vgpu.vf", source.field);
        set(
            &mut cp,
            VgpuRecord {
                framework: VgpuFramework::Mdev,
                mdev_uuid: Some("not-a-uuid".into()),
                ..good.clone()
            },
        );
        let Err(DecodeError::Invalid { source }) = encode(&cp) else {
            panic!("an mdev record without a UUID is invalid");
        };
        assert_eq!("vgpu.mdevUuid", source.field);
        set(&mut cp, VgpuRecord { type_id: 0, ..good });
        assert!(encode(&cp).is_err());
    }

    #[test]
    fn a_checkpoint_without_vgpus_is_written_as_releases_before_them_read_it() {
        let mut cp = everything();
        cp.claims.remove("c");
        let bytes = encode(&cp).unwrap();
        assert!(
            !String::from_utf8(bytes).unwrap().contains("vgpu"),
            "no vgpu key unless a device is a vGPU"
        );
    }

    #[test]
    fn the_file_as_written_takes_the_one_pass_path_and_any_other_layout_reads_the_same() {
        let cp = everything();
        let bytes = encode(&cp).unwrap();
        assert_eq!(decode_as_written(&bytes), Some(cp.clone()));
        assert_eq!(decode_any_form(&bytes).unwrap(), cp);
        let mut indented = serde_json::to_vec_pretty(&envelope(&bytes)).unwrap();
        indented.push(b'\n');
        assert_eq!(
            decode_as_written(&indented),
            None,
            "not the canonical bytes"
        );
        assert_eq!(decode(&indented).unwrap(), cp);
        // An envelope with its fields in another order and an extra field still reads in
        // one pass: only the payload's bytes are hashed.
        let text = String::from_utf8(bytes.clone()).unwrap();
        let (head, payload) = text.split_once(",\"payload\":").unwrap();
        let reordered = format!(
            "{{\"payload\":{},\"note\":1,{}}}",
            payload.trim_end().strip_suffix('}').unwrap(),
            head.strip_prefix('{').unwrap()
        );
        assert_eq!(decode_as_written(reordered.as_bytes()), Some(cp));
    }

    #[test]
    fn the_one_pass_path_refuses_what_the_full_one_refuses() {
        let bytes = encode(&everything()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        let changed = text.replace("claim-a", "claim-z");
        let other_version = text.replace("\"v1\"", "\"v9\"");
        let cut = &text[..text.len() / 2];
        for (name, input) in [
            ("changed payload", changed.as_str()),
            ("unknown version", other_version.as_str()),
            ("truncated", cut),
        ] {
            assert_eq!(decode_as_written(input.as_bytes()), None, "{name}");
            assert!(decode(input.as_bytes()).is_err(), "{name}");
        }
    }

    #[test]
    fn reusing_the_records_json_writes_the_same_bytes_through_every_change() {
        let mut cp = everything();
        let mut cache = EncodeCache::default();
        let same = |cp: &Checkpoint, cache: &mut EncodeCache| {
            assert_eq!(
                encode_reusing(cp, cache).unwrap(),
                encode(cp).unwrap(),
                "{cp:?}"
            );
            assert_eq!(cache.claims.len(), cp.claims.len());
        };
        same(&cp, &mut cache);
        same(&cp, &mut cache);
        cp.claims.get_mut("b").unwrap().phase = ClaimPhase::UnprepareStarted;
        same(&cp, &mut cache);
        cp.claims.get_mut("a").unwrap().devices[0].device = "gpu-\"quoted\"\n".into();
        same(&cp, &mut cache);
        let mut added = cp.claims["a"].clone();
        added.uid = "0-first".into();
        cp.claims.insert(added.uid.clone(), added);
        same(&cp, &mut cache);
        cp.claims.remove("b");
        same(&cp, &mut cache);
        cp.node_boot_id = "another \\ boot".into();
        same(&cp, &mut cache);
        cp.claims.clear();
        same(&cp, &mut cache);
        // A changed record is serialised again, not taken from the cache.
        let cp = everything();
        encode_reusing(&cp, &mut cache).unwrap();
        let mut changed = cp.clone();
        changed.claims.get_mut("c").unwrap().updated_unix += 1;
        assert_eq!(
            decode(&encode_reusing(&changed, &mut cache).unwrap()).unwrap(),
            changed
        );
    }

    #[test]
    fn a_changed_payload_fails_its_checksum() {
        let bytes = encode(&everything()).unwrap();
        let text = String::from_utf8(bytes)
            .unwrap()
            .replace("claim-a", "claim-z");
        assert!(matches!(
            decode(text.as_bytes()),
            Err(DecodeError::Checksum { .. })
        ));
    }
}
