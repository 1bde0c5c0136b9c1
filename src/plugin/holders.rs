//! Who holds each prepared claim's devices: the pods of its `status.reservedFor`, for the
//! telemetry's `pod` label. Kept out of the checkpoint on purpose (a released plugin's
//! decoder refuses unknown fields, and a rollback that refused the checkpoint would destroy
//! running pods' MIG devices as orphans), in memory and in `<state-dir>/holders.json`:
//!
//! ```json
//! {"version": "v1", "claims": {"<claim uid>": [{"name": "pod-a", "uid": "…"}]}}
//! ```
//!
//! The claim source records the pods each time it reads a claim for prepare (a mutex insert
//! on the request path, nothing more); the telemetry sampling task drops claims that left the
//! checkpoint and rewrites the file, off the request path, only when the map changed. The
//! file is only labels: one that cannot be read is moved aside and the plugin carries on.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::checkpoint::Checkpoint;

/// The file's name in the state directory.
pub const HOLDERS_FILE: &str = "holders.json";

/// The only version this code reads and writes.
pub const HOLDERS_VERSION: &str = "v1";

/// How long pods read for a claim that has not reached the checkpoint yet are kept: a
/// prepare between its read of the claim and its intent record, well beyond the kubelet's
/// timeout for a prepare call. A prepare that failed before its record leaves its pods
/// behind for this long.
pub const PENDING_GRACE: Duration = Duration::from_secs(300);

/// A pod a claim is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodRef {
    /// Pod name (in the claim's namespace).
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// Pods by claim UID.
pub type ClaimPods = BTreeMap<String, Vec<PodRef>>;

/// Reading or writing `holders.json` failed.
#[derive(Debug, thiserror::Error)]
pub enum HoldersError {
    /// The file exists but cannot be read.
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON of the expected shape.
    #[error("{path} is not a holders file of version {HOLDERS_VERSION}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The file has another version (written by another plugin release).
    #[error("{path}: version is {found:?}; valid: {HOLDERS_VERSION:?}")]
    Version { path: PathBuf, found: String },
    /// A claim UID or pod name is empty.
    #[error("{path}: {field} is empty; valid: a non-empty string")]
    Empty { path: PathBuf, field: String },
    /// Writing the file failed.
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: crate::fsutil::FsError,
    },
}

#[derive(Deserialize)]
struct VersionOnly {
    version: String,
}

/// Fields a later `v1` adds are ignored rather than refused: the file is only labels.
#[derive(Serialize, Deserialize)]
struct FileV1 {
    version: String,
    claims: ClaimPods,
}

/// Reads `path`; a missing file is empty.
///
/// # Errors
/// [`HoldersError`] when the file cannot be read, is not JSON of the `v1` shape, has another
/// version, or names an empty claim UID or pod name.
pub fn load(path: &Path) -> Result<ClaimPods, HoldersError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ClaimPods::new()),
        Err(source) => {
            return Err(HoldersError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let decode = |source| HoldersError::Decode {
        path: path.to_path_buf(),
        source,
    };
    let version: VersionOnly = serde_json::from_slice(&bytes).map_err(decode)?;
    if version.version != HOLDERS_VERSION {
        return Err(HoldersError::Version {
            path: path.to_path_buf(),
            found: version.version,
        });
    }
    let file: FileV1 = serde_json::from_slice(&bytes).map_err(decode)?;
    let empty = |field: String| HoldersError::Empty {
        path: path.to_path_buf(),
        field,
    };
    for (uid, pods) in &file.claims {
        if uid.is_empty() {
            return Err(empty("claims key (a claim UID)".into()));
        }
        for (i, pod) in pods.iter().enumerate() {
            if pod.name.is_empty() {
                return Err(empty(format!("claims.{uid}[{i}].name")));
            }
        }
    }
    Ok(file.claims)
}

/// Writes `claims` to `path` atomically ([`crate::fsutil::replace_atomic`]: a reader sees
/// the old file or the new one; a power loss may lose it, which only loses labels).
///
/// # Errors
/// [`HoldersError::Write`] naming the file.
pub fn save(path: &Path, claims: &ClaimPods) -> Result<(), HoldersError> {
    let file = FileV1 {
        version: HOLDERS_VERSION.to_string(),
        claims: claims.clone(),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).expect("holders serialize to JSON");
    bytes.push(b'\n');
    crate::fsutil::replace_atomic(path, &bytes, 0o600).map_err(|source| HoldersError::Write {
        path: path.to_path_buf(),
        source,
    })
}

struct Entry {
    pods: Vec<PodRef>,
    /// Whether the claim was in a checkpoint since its pods were set: if it leaves the
    /// checkpoint afterwards it was unprepared.
    seen: bool,
    set_at: Instant,
}

#[derive(Default)]
struct Inner {
    claims: HashMap<String, Entry>,
    /// The claims or their pods changed since the file was last written.
    changed: bool,
}

/// The pods of prepared claims, by claim UID: shared by the claim source (which sets them)
/// and the telemetry sampling task (which reads, prunes and saves them).
#[derive(Default)]
pub struct Reservations(Mutex<Inner>);

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Reservations").field(&self.pods()).finish()
    }
}

impl Reservations {
    /// Starts from `claims` (as saved by an earlier run): each is dropped at the first prune
    /// whose checkpoint does not have it.
    pub fn new(claims: ClaimPods) -> Reservations {
        let now = Instant::now();
        let claims = claims
            .into_iter()
            .map(|(uid, pods)| {
                let entry = Entry {
                    pods,
                    seen: true,
                    set_at: now,
                };
                (uid, entry)
            })
            .collect();
        Reservations(Mutex::new(Inner {
            claims,
            changed: false,
        }))
    }

    /// Loads `<state_dir>/holders.json`. Never fails: a missing file is empty; one that
    /// cannot be read is logged (warn, with its path), moved aside to `holders.json.bad` and
    /// the plugin starts with no pods (labels come back as claims are prepared again).
    pub fn load(state_dir: &Path) -> Reservations {
        let path = state_dir.join(HOLDERS_FILE);
        match load(&path) {
            Ok(claims) => Reservations::new(claims),
            Err(e) => {
                let aside = path.with_extension("json.bad");
                let moved = std::fs::rename(&path, &aside).is_ok();
                warn!(
                    path = %path.display(),
                    error = %crate::errors::error_chain(&e),
                    moved_to = %aside.display(),
                    moved,
                    "holder pods file unreadable; telemetry names no pods until claims are prepared again"
                );
                Reservations::default()
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claim `uid` is reserved for `pods` now.
    pub fn set(&self, uid: &str, pods: Vec<PodRef>) {
        self.set_at(uid, pods, Instant::now());
    }

    fn set_at(&self, uid: &str, mut pods: Vec<PodRef>, now: Instant) {
        pods.sort();
        pods.dedup();
        let mut inner = self.lock();
        let entry = Entry {
            pods,
            seen: false,
            set_at: now,
        };
        let old = inner.claims.insert(uid.to_string(), entry);
        if old.is_none_or(|o| o.pods != inner.claims[uid].pods) {
            inner.changed = true;
        }
    }

    /// The pods of every claim known.
    pub fn pods(&self) -> ClaimPods {
        self.lock()
            .claims
            .iter()
            .map(|(uid, e)| (uid.clone(), e.pods.clone()))
            .collect()
    }

    /// Drops the claims `checkpoint` no longer has: those it had since their pods were set
    /// (unprepared), and those it never had for [`PENDING_GRACE`] (a prepare that failed
    /// before recording them). Claims that `checkpoint` has are kept.
    pub fn prune(&self, checkpoint: &Checkpoint, now: Instant) {
        let mut inner = self.lock();
        let before = inner.claims.len();
        inner.claims.retain(|uid, entry| {
            if checkpoint.claims.contains_key(uid) {
                entry.seen = true;
                true
            } else {
                !entry.seen && now.saturating_duration_since(entry.set_at) < PENDING_GRACE
            }
        });
        if inner.claims.len() != before {
            inner.changed = true;
        }
    }

    /// Writes `<state_dir>/holders.json` if the pods changed since it was last written;
    /// `Ok(true)` when it wrote. A failed write is tried again at the next call.
    ///
    /// # Errors
    /// [`HoldersError::Write`] naming the file.
    pub fn save_if_changed(&self, state_dir: &Path) -> Result<bool, HoldersError> {
        let claims = {
            let mut inner = self.lock();
            if !inner.changed {
                return Ok(false);
            }
            inner.changed = false;
            inner
                .claims
                .iter()
                .map(|(uid, e)| (uid.clone(), e.pods.clone()))
                .collect()
        };
        save(&state_dir.join(HOLDERS_FILE), &claims).inspect_err(|_| self.lock().changed = true)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{ClaimPhase, ClaimRecord};

    fn pod(name: &str) -> PodRef {
        PodRef {
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn checkpoint(uids: &[&str]) -> Checkpoint {
        let mut cp = Checkpoint::new("boot");
        for uid in uids {
            let record = ClaimRecord {
                uid: uid.to_string(),
                namespace: "ns".into(),
                name: format!("claim-{uid}"),
                phase: ClaimPhase::PrepareCompleted,
                devices: vec![],
                updated_unix: 0,
                fabric_partition: None,
            };
            cp.claims.insert(uid.to_string(), record);
        }
        cp
    }

    #[test]
    fn the_file_round_trips_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HOLDERS_FILE);
        assert_eq!(load(&path).unwrap(), ClaimPods::new());
        let claims = ClaimPods::from([("c1".to_string(), vec![pod("a"), pod("b")])]);
        save(&path, &claims).unwrap();
        assert_eq!(load(&path).unwrap(), claims);
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"version": "v1", "claims": {"c1": [
                {"name": "a", "uid": "uid-a"}, {"name": "b", "uid": "uid-b"}]}})
        );
    }

    #[test]
    fn another_version_or_an_empty_pod_name_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HOLDERS_FILE);
        std::fs::write(&path, r#"{"version": "v2", "claims": 7}"#).unwrap();
        let text = crate::errors::error_chain(&load(&path).unwrap_err());
        assert!(text.contains("\"v2\"") && text.contains("\"v1\""), "{text}");
        std::fs::write(
            &path,
            r#"{"version": "v1", "claims": {"c1": [{"name": "", "uid": "u"}]}}"#,
        )
        .unwrap();
        let text = crate::errors::error_chain(&load(&path).unwrap_err());
        assert!(text.contains("claims.c1[0].name"), "{text}");
    }

    #[test]
    fn a_corrupt_file_is_moved_aside_and_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HOLDERS_FILE);
        std::fs::write(&path, b"{not json").unwrap();
        let reservations = Reservations::load(dir.path());
        assert_eq!(reservations.pods(), ClaimPods::new());
        assert!(!path.exists());
        let aside = std::fs::read(dir.path().join("holders.json.bad")).unwrap();
        assert_eq!(aside, b"{not json");
    }

    #[test]
    fn the_file_is_written_only_when_the_pods_change() {
        let dir = tempfile::tempdir().unwrap();
        let r = Reservations::default();
        assert!(!r.save_if_changed(dir.path()).unwrap(), "nothing set yet");
        r.set("c1", vec![pod("b"), pod("a")]);
        assert!(r.save_if_changed(dir.path()).unwrap());
        assert!(!r.save_if_changed(dir.path()).unwrap());
        // The same pods read again (another prepare of the claim): no write.
        r.set("c1", vec![pod("a"), pod("b")]);
        assert!(!r.save_if_changed(dir.path()).unwrap());
        r.set("c1", vec![pod("a")]);
        assert!(r.save_if_changed(dir.path()).unwrap());
        let loaded = Reservations::load(dir.path());
        assert_eq!(loaded.pods(), r.pods());
        assert!(!loaded.save_if_changed(dir.path()).unwrap(), "as loaded");
    }

    #[test]
    fn a_failed_write_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let r = Reservations::default();
        r.set("c1", vec![pod("a")]);
        let text = crate::errors::error_chain(&r.save_if_changed(&not_a_dir).unwrap_err());
        assert!(text.contains("holders.json"), "{text}");
        assert!(r.save_if_changed(dir.path()).unwrap());
    }

    #[test]
    fn claims_that_leave_the_checkpoint_are_dropped_and_pending_ones_kept_for_a_while() {
        let start = Instant::now();
        let r = Reservations::new(ClaimPods::from([
            ("prepared".to_string(), vec![pod("a")]),
            ("gone".to_string(), vec![pod("b")]),
        ]));
        // Read for a prepare that has not written its intent record yet.
        r.set_at("pending", vec![pod("c")], start);
        r.prune(&checkpoint(&["prepared"]), start);
        let uids: Vec<String> = r.pods().into_keys().collect();
        assert_eq!(uids, ["pending", "prepared"]);

        // The prepare records the claim; later it is unprepared.
        r.prune(&checkpoint(&["prepared", "pending"]), start);
        r.prune(&checkpoint(&["prepared"]), start);
        assert_eq!(r.pods().into_keys().collect::<Vec<_>>(), ["prepared"]);

        // A prepare that failed before its record: kept for the grace, then dropped.
        r.set_at("failed", vec![pod("d")], start);
        r.prune(&checkpoint(&["prepared"]), start + PENDING_GRACE / 2);
        assert!(r.pods().contains_key("failed"));
        r.prune(&checkpoint(&["prepared"]), start + PENDING_GRACE);
        assert_eq!(r.pods().into_keys().collect::<Vec<_>>(), ["prepared"]);
    }
}
