//! What an MPS daemon is asked to be, its validation, and its record on disk.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::SharingError;

/// One MiB: pinned-memory limits are sent as `<bytes / 1 MiB>M`.
pub const MIB: u64 = 1024 * 1024;

/// Longest daemon id (a DNS label, so it fits in names and paths).
const MAX_ID_LEN: usize = 63;

/// One device an MPS daemon serves: a full GPU (`GPU-…`, `full_gpu: true`, its compute mode
/// is set) or a MIG device (`MIG-…`, `full_gpu: false`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsDevice {
    pub uuid: String,
    pub full_gpu: bool,
}

/// One MPS control daemon: its id (`[a-z0-9-]`, at most 63 characters, e.g. derived from the
/// claim UID), its devices in `CUDA_VISIBLE_DEVICES` order, and the default limits for the
/// servers it spawns. `pinned_memory_bytes` is empty (no limits) or has one entry per device.
/// `multi_user` starts it as `nvidia-cuda-mps-control -d -M`: one root server for clients of
/// every UID (the caller checks the GPUs support it: compute capability 7.0 or newer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsDaemonSpec {
    pub id: String,
    pub devices: Vec<MpsDevice>,
    pub active_thread_percentage: Option<u8>,
    pub pinned_memory_bytes: Vec<Option<u64>>,
    #[serde(default)]
    pub multi_user: bool,
}

/// Checks `^(GPU|MIG)-[0-9a-fA-F-]+$`.
///
/// # Errors
/// [`SharingError::InvalidUuid`] naming `field` and the value.
pub fn validate_uuid(field: &'static str, value: &str) -> Result<(), SharingError> {
    let rest = value
        .strip_prefix("GPU-")
        .or_else(|| value.strip_prefix("MIG-"));
    match rest {
        Some(r) if !r.is_empty() && r.chars().all(|c| c.is_ascii_hexdigit() || c == '-') => Ok(()),
        _ => Err(SharingError::InvalidUuid {
            field,
            value: value.to_string(),
        }),
    }
}

/// Checks a daemon id: 1 to 63 characters of `[a-z0-9-]`.
///
/// # Errors
/// [`SharingError::InvalidSpec`] for field `id`.
pub fn validate_daemon_id(id: &str) -> Result<(), SharingError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(SharingError::InvalidSpec {
            id: id.to_string(),
            field: "id",
            problem: format!("want 1 to {MAX_ID_LEN} characters of a-z, 0-9 and -"),
        })
    }
}

impl MpsDaemonSpec {
    /// Checks every field; nothing is started for a spec that fails.
    ///
    /// # Errors
    /// [`SharingError::InvalidSpec`] or [`SharingError::InvalidUuid`] naming the field.
    pub fn validate(&self) -> Result<(), SharingError> {
        validate_daemon_id(&self.id)?;
        let bad = |field, problem: String| SharingError::InvalidSpec {
            id: self.id.clone(),
            field,
            problem,
        };
        if self.devices.is_empty() {
            return Err(bad("devices", "at least one device is needed".into()));
        }
        for (i, d) in self.devices.iter().enumerate() {
            validate_uuid("devices[].uuid", &d.uuid)?;
            if d.full_gpu != d.uuid.starts_with("GPU-") {
                return Err(bad(
                    "devices[].full_gpu",
                    format!(
                        "{} has full_gpu {}; GPU- UUIDs are full GPUs",
                        d.uuid, d.full_gpu
                    ),
                ));
            }
            if self.devices[..i].iter().any(|o| o.uuid == d.uuid) {
                return Err(bad("devices", format!("{} is listed twice", d.uuid)));
            }
        }
        if let Some(p) = self.active_thread_percentage
            && p > 100
        {
            return Err(bad(
                "active_thread_percentage",
                format!("{p} is outside 0–100"),
            ));
        }
        let n = self.pinned_memory_bytes.len();
        if n != 0 && n != self.devices.len() {
            return Err(bad(
                "pinned_memory_bytes",
                format!(
                    "{n} entries for {} devices; want one per device or none",
                    self.devices.len()
                ),
            ));
        }
        for b in self.pinned_memory_bytes.iter().flatten() {
            if *b < MIB {
                return Err(bad(
                    "pinned_memory_bytes",
                    format!("{b} bytes is below the 1 MiB minimum"),
                ));
            }
        }
        Ok(())
    }

    /// UUIDs in `CUDA_VISIBLE_DEVICES` order, comma-joined.
    pub fn visible_devices(&self) -> String {
        let uuids: Vec<&str> = self.devices.iter().map(|d| d.uuid.as_str()).collect();
        uuids.join(",")
    }

    /// UUIDs of the full GPUs (whose compute mode the daemon owns).
    pub fn full_gpus(&self) -> Vec<String> {
        full_gpus(&self.devices)
    }
}

pub(crate) fn full_gpus(devices: &[MpsDevice]) -> Vec<String> {
    devices
        .iter()
        .filter(|d| d.full_gpu)
        .map(|d| d.uuid.clone())
        .collect()
}

/// On-disk record, version 1. Kept apart from [`MpsDaemonSpec`] so the file format only
/// changes on purpose.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFileV1 {
    version: String,
    id: String,
    devices: Vec<MpsDevice>,
    active_thread_percentage: Option<u8>,
    pinned_memory_bytes: Vec<Option<u64>>,
    /// Absent (single-user) in files written before multi-user mode existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    multi_user: bool,
}

const SPEC_VERSION: &str = "v1";

/// Writes the spec atomically (temp file, rename). Not fsynced: a daemon does not outlive a
/// reboot, and start-up recovery stops and removes daemons no claim records (see
/// `docs/architecture.md`, "Durability").
pub(crate) fn write(path: &Path, spec: &MpsDaemonSpec) -> Result<(), SharingError> {
    let wire = SpecFileV1 {
        version: SPEC_VERSION.into(),
        id: spec.id.clone(),
        devices: spec.devices.clone(),
        active_thread_percentage: spec.active_thread_percentage,
        pinned_memory_bytes: spec.pinned_memory_bytes.clone(),
        multi_user: spec.multi_user,
    };
    // Serialising plain owned data cannot fail.
    let bytes = serde_json::to_vec_pretty(&wire).unwrap_or_default();
    crate::fsutil::replace_atomic(path, &bytes, 0o644).map_err(|source| SharingError::WriteSpec {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads and validates a recorded spec; `Ok(None)` when there is none.
pub(crate) fn read(path: &Path) -> Result<Option<MpsDaemonSpec>, SharingError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SharingError::Io {
                step: "reading MPS daemon spec",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let wire: SpecFileV1 =
        serde_json::from_slice(&bytes).map_err(|source| SharingError::DecodeSpec {
            path: path.to_path_buf(),
            source,
        })?;
    let spec = MpsDaemonSpec {
        id: wire.id,
        devices: wire.devices,
        active_thread_percentage: wire.active_thread_percentage,
        pinned_memory_bytes: wire.pinned_memory_bytes,
        multi_user: wire.multi_user,
    };
    if wire.version != SPEC_VERSION {
        return Err(SharingError::InvalidSpec {
            id: spec.id,
            field: "version",
            problem: format!(
                "{:?} in {} is not {SPEC_VERSION}",
                wire.version,
                path.display()
            ),
        });
    }
    spec.validate()?;
    Ok(Some(spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MpsDaemonSpec {
        MpsDaemonSpec {
            id: "claim-1".into(),
            devices: vec![MpsDevice {
                uuid: "GPU-0a".into(),
                full_gpu: true,
            }],
            active_thread_percentage: Some(50),
            pinned_memory_bytes: vec![Some(MIB)],
            multi_user: false,
        }
    }

    #[test]
    fn uuid_validation_accepts_gpu_and_mig_and_rejects_the_rest() {
        let got: Vec<bool> = [
            "GPU-0a-1B",
            "MIG-ff",
            "GPU-",
            "gpu-0a",
            "GPU-0a/..",
            "MIG-1 2",
        ]
        .iter()
        .map(|u| validate_uuid("uuid", u).is_ok())
        .collect();
        assert_eq!(got, vec![true, true, false, false, false, false]);
    }

    #[test]
    fn daemon_id_with_uppercase_or_slash_is_rejected() {
        let got: Vec<bool> = ["a-1", "A", "a/b", "", &"a".repeat(64)]
            .iter()
            .map(|id| validate_daemon_id(id).is_ok())
            .collect();
        assert_eq!(got, vec![true, false, false, false, false]);
    }

    #[test]
    fn percentage_above_100_is_rejected_naming_the_range() {
        let mut s = spec();
        s.active_thread_percentage = Some(150);
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("active_thread_percentage: 150 is outside 0–100"),
            "{err}"
        );
    }

    #[test]
    fn mig_uuid_marked_full_gpu_is_rejected() {
        let mut s = spec();
        s.devices[0].uuid = "MIG-0a".into();
        assert!(s.validate().is_err());
    }

    #[test]
    fn pinned_limit_below_one_mib_or_wrong_count_is_rejected() {
        let mut s = spec();
        s.pinned_memory_bytes = vec![Some(MIB - 1)];
        assert!(s.validate().is_err());
        s.pinned_memory_bytes = vec![None, None];
        assert!(s.validate().is_err());
    }

    #[test]
    fn spec_file_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("spec.json");
        write(&path, &spec()).unwrap();
        assert_eq!(read(&path).unwrap(), Some(spec()));
        assert_eq!(read(&tmp.path().join("none.json")).unwrap(), None);
        let multi = MpsDaemonSpec {
            multi_user: true,
            ..spec()
        };
        write(&path, &multi).unwrap();
        assert_eq!(read(&path).unwrap(), Some(multi));
    }

    #[test]
    fn a_spec_file_from_before_multi_user_reads_as_single_user() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("spec.json");
        let old = r#"{"version":"v1","id":"claim-1","devices":[{"uuid":"GPU-0a","full_gpu":true}],"active_thread_percentage":50,"pinned_memory_bytes":[1048576]}"#;
        std::fs::write(&path, old).unwrap();
        assert_eq!(read(&path).unwrap(), Some(spec()));
    }
}
