//! The compute-domain plugin's checkpoint: which claims it prepared (or started to), for
//! which domain, so a restart neither loses nor leaks a CDI spec or a config directory.
//!
//! One small JSON file, `<state-dir>/compute-domain-claims.json`, versioned from day one
//! (`{"version": 1, "claims": {...}}`, a wire type separate from the in-memory one),
//! validated on read and on write, replaced atomically. Not fsynced: CDI specs live on a
//! tmpfs and are gone after a reboot anyway, and start-up recovery removes every spec and
//! config directory the file does not account for, so a record lost to a power
//! loss costs a re-prepare (the kubelet prepares again after a reboot), never a leak.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil;

/// File name under the state directory.
pub const FILE_NAME: &str = "compute-domain-claims.json";
const VERSION: u32 = 1;

/// The checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading failed for a reason other than the file being absent.
    #[error("reading the checkpoint {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a checkpoint this version understands.
    #[error("checkpoint {path} is not valid ({problem}); move it away to start afresh")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Writing failed.
    #[error("writing the checkpoint {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: fsutil::FsError,
    },
}

/// What a claim is to this plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClaimKind {
    /// A workload's channel claim (its node carries the domain's label).
    Channel,
    /// A daemon claim: the domain's config directory exists.
    Daemon,
}

/// How far a prepare got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Recorded before any effect; a restart undoes whatever exists.
    Preparing,
    /// Everything written; the devices were returned to the kubelet.
    Prepared,
}

/// One claim's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRecord {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Channel or daemon.
    pub kind: ClaimKind,
    /// UID of the ComputeDomain.
    #[serde(rename = "domainUID")]
    pub domain_uid: String,
    /// How far the prepare got.
    pub phase: Phase,
    /// What was returned to the kubelet: `(request, device, CDI device ID)` per device.
    #[serde(default)]
    pub devices: Vec<RecordedDevice>,
}

/// One prepared device as returned to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedDevice {
    /// The request.
    pub request: String,
    /// The device.
    pub device: String,
    /// The CDI device ID.
    pub cdi_device_id: String,
    /// The allocation's share of a device allocated to several claims (`channel-0`).
    /// Absent for the others, so a checkpoint without shares reads as before.
    #[serde(default, rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// The checkpoint in memory: claims by UID.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// Claims by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireV1 {
    version: u32,
    claims: BTreeMap<String, ClaimRecord>,
}

impl Checkpoint {
    /// Channel claims of `domain_uid` other than `except` (any phase: recovery has undone
    /// the unfinished ones before anyone counts).
    pub fn channels_of(&self, domain_uid: &str, except: &str) -> usize {
        self.count(ClaimKind::Channel, domain_uid, except)
    }

    /// Daemon claims of `domain_uid` other than `except` (any phase).
    pub fn daemons_of(&self, domain_uid: &str, except: &str) -> usize {
        self.count(ClaimKind::Daemon, domain_uid, except)
    }

    fn count(&self, kind: ClaimKind, domain_uid: &str, except: &str) -> usize {
        self.claims
            .iter()
            .filter(|(uid, r)| {
                uid.as_str() != except && r.kind == kind && r.domain_uid == domain_uid
            })
            .count()
    }

    fn check(&self) -> Result<(), String> {
        for (uid, record) in &self.claims {
            let name_ok = |s: &str| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
            };
            if !name_ok(uid) || !name_ok(&record.domain_uid) {
                return Err(format!(
                    "claim {uid:?} (domain {:?}): UIDs must be letters, digits, '-', '.' and '_'",
                    record.domain_uid
                ));
            }
            if let Some(share) = record
                .devices
                .iter()
                .filter_map(|d| d.share_id.as_deref())
                .find(|s| !name_ok(s))
            {
                return Err(format!(
                    "claim {uid:?}: share ID {share:?} must be letters, digits, '-', '.' and '_'"
                ));
            }
            if record.domain_uid.contains("..") || record.domain_uid.starts_with('.') {
                return Err(format!(
                    "domain UID {:?} could escape a directory",
                    record.domain_uid
                ));
            }
        }
        Ok(())
    }
}

/// The checkpoint file of `state_dir`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

/// Reads the checkpoint; a missing file is an empty one.
///
/// # Errors
/// [`StateError::Read`], or [`StateError::Invalid`] for a file of another version or shape.
pub fn load(state_dir: &Path) -> Result<Checkpoint, StateError> {
    let path = path(state_dir);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
        Err(source) => return Err(StateError::Read { path, source }),
    };
    crate::cost::count(crate::cost::Cost::CheckpointParse);
    let invalid = |problem: String| StateError::Invalid {
        path: path.clone(),
        problem,
    };
    let wire: WireV1 = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if wire.version != VERSION {
        return Err(invalid(format!(
            "version {} (this plugin reads version {VERSION})",
            wire.version
        )));
    }
    let checkpoint = Checkpoint {
        claims: wire.claims,
    };
    checkpoint.check().map_err(invalid)?;
    Ok(checkpoint)
}

/// Replaces the checkpoint atomically (see the module docs for why it is not fsynced).
///
/// # Errors
/// [`StateError::Invalid`] for a checkpoint that would not read back, [`StateError::Write`].
pub fn store(state_dir: &Path, checkpoint: &Checkpoint) -> Result<(), StateError> {
    let path = path(state_dir);
    checkpoint.check().map_err(|problem| StateError::Invalid {
        path: path.clone(),
        problem,
    })?;
    let wire = WireV1 {
        version: VERSION,
        claims: checkpoint.claims.clone(),
    };
    let mut bytes = serde_json::to_vec_pretty(&wire).map_err(|e| StateError::Invalid {
        path: path.clone(),
        problem: e.to_string(),
    })?;
    bytes.push(b'\n');
    fsutil::replace_atomic(&path, &bytes, 0o600)
        .map_err(|source| StateError::Write { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: ClaimKind, domain: &str) -> ClaimRecord {
        ClaimRecord {
            namespace: "ns".into(),
            name: "c".into(),
            kind,
            domain_uid: domain.into(),
            phase: Phase::Prepared,
            devices: vec![RecordedDevice {
                request: "r".into(),
                device: "channel-0".into(),
                cdi_device_id: "k8s.compute-domain.nvidia.com/claim=u-channel-0".into(),
                share_id: Some("5f0c2a9e-1d3b-4c7a-9e8f-0a1b2c3d4e5f".into()),
            }],
        }
    }

    #[test]
    fn a_stored_checkpoint_reads_back_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), Checkpoint::default());
        let mut checkpoint = Checkpoint::default();
        checkpoint
            .claims
            .insert("u1".into(), record(ClaimKind::Channel, "d1"));
        checkpoint
            .claims
            .insert("u2".into(), record(ClaimKind::Daemon, "d1"));
        store(dir.path(), &checkpoint).unwrap();
        let back = load(dir.path()).unwrap();
        assert_eq!(back, checkpoint);
        assert_eq!(back.channels_of("d1", "u9"), 1);
        assert_eq!(back.channels_of("d1", "u1"), 0);
        assert_eq!(back.daemons_of("d1", ""), 1);
        let text = std::fs::read_to_string(path(dir.path())).unwrap();
        assert!(text.contains("\"version\": 1"), "{text}");
    }

    #[test]
    fn another_version_or_an_escaping_domain_uid_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), r#"{"version": 2, "claims": {}}"#).unwrap();
        let error = crate::errors::error_chain(&load(dir.path()).unwrap_err());
        assert!(
            error.contains("version 2") && error.contains(FILE_NAME),
            "{error}"
        );
        let mut checkpoint = Checkpoint::default();
        checkpoint
            .claims
            .insert("u1".into(), record(ClaimKind::Daemon, "../etc"));
        assert!(store(dir.path(), &checkpoint).is_err());
    }
}
