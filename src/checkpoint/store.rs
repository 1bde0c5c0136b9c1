//! The checkpoint file: loaded once at start, rewritten atomically on every change.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::PoisonError;
use std::time::{SystemTime, UNIX_EPOCH};

use super::model::{Checkpoint, ClaimRecord};
use super::wire::{self, DecodeError};
use crate::errors::error_chain;
use crate::fsutil::FileVersion;
use crate::fsutil::{self, FsError};

/// File name of the checkpoint inside the state directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

/// Only the plugin needs to read its own state.
const CHECKPOINT_MODE: u32 = 0o600;

/// What [`CheckpointStore::open`] found. Every case leaves a usable store; the caller logs
/// [`LoadOutcome::message`] and, for the last two, runs recovery.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadOutcome {
    /// No checkpoint file: first start on this node (or state dir wiped).
    Fresh,
    /// The file was read and verified; its records are in the store.
    Loaded { claims: usize },
    /// The file belongs to an earlier boot. Claims prepared then hold no hardware now (MIG
    /// devices and MPS daemons do not survive a reboot), so the store starts without them;
    /// their records are handed over so recovery can delete the files they left (CDI specs,
    /// MPS directories). The file is rewritten only on the next update, so a crash before
    /// cleanup hands the same records over again.
    BootChanged {
        previous_boot_id: String,
        dropped: BTreeMap<String, ClaimRecord>,
    },
    /// The file could not be used (garbage, truncated, checksum mismatch, unknown format
    /// version). It was moved aside, unchanged, and the store starts empty.
    Corrupt { moved_to: PathBuf, reason: String },
}

impl LoadOutcome {
    /// A one-line, operator-facing description of the outcome.
    pub fn message(&self) -> String {
        match self {
            LoadOutcome::Fresh => "no checkpoint found; starting with an empty one".to_string(),
            LoadOutcome::Loaded { claims } => format!("checkpoint loaded with {claims} claim(s)"),
            LoadOutcome::BootChanged {
                previous_boot_id,
                dropped,
            } => format!(
                "node rebooted since the checkpoint was written (boot ID was {previous_boot_id}): \
                 dropped {} claim record(s) whose hardware state is gone; they are kept only to \
                 clean up their leftover files",
                dropped.len()
            ),
            LoadOutcome::Corrupt { moved_to, reason } => format!(
                "checkpoint unusable ({reason}); moved it to {} and started empty: claims it \
                 recorded are unknown until the kubelet prepares them again, and their leftover \
                 CDI specs are found by listing the CDI directory",
                moved_to.display()
            ),
        }
    }
}

/// Failures of the checkpoint file that recovery cannot work around (the plugin should
/// report them and stop, rather than run with state it cannot save).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The boot ID given is empty.
    #[error("current boot ID is empty; pass the content of /proc/sys/kernel/random/boot_id")]
    EmptyBootId,
    /// The state directory could not be created.
    #[error("creating checkpoint directory {dir}")]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading the file failed for a reason other than absence (e.g. permission denied).
    #[error("reading checkpoint {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Moving an unusable file aside failed; continuing would overwrite it.
    #[error("moving unusable checkpoint {path} to {to}")]
    MoveAside {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The file has a format version this release does not read: a newer release wrote it.
    /// Moving it aside would forget every claim prepared on the node (and start-up recovery
    /// would then destroy their MIG devices), so the file is left as it is and nothing runs.
    #[error(
        "checkpoint {path} has format version {found:?}, which this release does not read \
         (it reads {supported}): it was written by a newer gpu-dra. Roll forward to that \
         release again; to downgrade anyway, drain the node's GPU pods and delete the file"
    )]
    UnsupportedVersion {
        path: PathBuf,
        found: String,
        supported: String,
    },
    /// Temp files of an interrupted write could not be removed.
    #[error("cleaning leftovers of an interrupted checkpoint write")]
    CleanTemps {
        #[source]
        source: FsError,
    },
    /// The change would make the checkpoint invalid; nothing was written.
    #[error("refusing to store checkpoint {path}")]
    Encode {
        path: PathBuf,
        #[source]
        source: DecodeError,
    },
    /// An earlier failed update could not restore the state it changed (the bytes it keeps
    /// did not decode), so this store refuses further updates: the next call's check-out
    /// reads the file, which the failed write left as it was.
    #[error(
        "checkpoint {path} in memory is not what is on disk after a failed write; it is read again at the next call"
    )]
    Poisoned { path: PathBuf },
    /// Writing the file failed; the store keeps the previous state.
    #[error("writing checkpoint")]
    Write {
        #[source]
        source: FsError,
    },
}

/// The plugin's single checkpoint file and its current content.
///
/// Not internally synchronised: wrap it in a mutex when several tasks update it.
#[derive(Debug)]
pub struct CheckpointStore {
    path: PathBuf,
    current: Checkpoint,
    /// The version of the file `current` was read from or last written as.
    seen: Seen,
    /// The scratch file this store writes through ([`fsutil::replace_atomic_reusing`]), named
    /// at its first update and removed when the store is dropped.
    spare: Option<PathBuf>,
    /// `current` as last read or written (verified bytes), from which a failed update
    /// restores it; `None` while `current` is the fresh checkpoint of its boot ID.
    written: Option<Written>,
    /// A failed update could not restore `current`: every further update fails.
    poisoned: bool,
    /// The records' JSON as the last write made it: a write serialises only what changed.
    encoded: wire::EncodeCache,
}

/// The bytes of a checkpoint file, shown by length only.
struct Written(Vec<u8>);

impl std::fmt::Debug for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

impl Drop for CheckpointStore {
    fn drop(&mut self) {
        if let Some(spare) = &self.spare {
            // Best effort: a spare left behind is swept by a later `open`.
            let _ = fs::remove_file(spare);
        }
    }
}

/// What a reader that takes no lock ([`read_unlocked`]) found.
#[derive(Debug, Clone, PartialEq)]
pub enum Snapshot {
    /// The checkpoint of the current boot, verified.
    Current(Checkpoint),
    /// No checkpoint file, or one of an earlier boot: nothing is prepared in this boot.
    Empty,
    /// The file could not be read or did not verify, even read again: the caller knows
    /// nothing and must not act as if no claim were prepared.
    Unreadable,
}

impl Snapshot {
    /// The checkpoint when there is one of this boot.
    pub fn current(self) -> Option<Checkpoint> {
        match self {
            Snapshot::Current(checkpoint) => Some(checkpoint),
            Snapshot::Empty | Snapshot::Unreadable => None,
        }
    }
}

/// How many times [`read_unlocked`] reads a file that does not verify before giving up.
const UNLOCKED_READS: usize = 3;

/// Reads the checkpoint in `state_dir` for boot `boot_id` without opening a store or taking
/// the plugin lock (telemetry, usage accounting, orphan checks), so it may race a write.
///
/// A reader that opened the file just before a write's exchange can read a mix of two
/// versions ([`fsutil::replace_atomic_reusing`]); the checksum catches that, and the file is
/// read again, afresh, up to three times. Never moves a bad file aside (that is
/// [`CheckpointStore::open`]'s job, under the lock).
///
/// The last snapshot read of each file is kept with the file version it was read from:
/// while a `stat` finds the file still that version, it is returned without reading the
/// file. The plugin's inventory, usage and telemetry rounds each read the checkpoint;
/// between two writes they read it once, not once each.
pub fn read_unlocked(state_dir: &Path, boot_id: &str) -> Snapshot {
    let path = state_dir.join(CHECKPOINT_FILE);
    for _ in 0..UNLOCKED_READS {
        let before = version_of(&path);
        if let Some(snapshot) = UNLOCKED_LAST.get(&path, before, boot_id) {
            return snapshot;
        }
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Snapshot::Empty,
            Err(_) => continue,
        };
        let snapshot = match wire::decode(&bytes) {
            Ok(checkpoint) if checkpoint.node_boot_id == boot_id => Snapshot::Current(checkpoint),
            Ok(_) => Snapshot::Empty,
            Err(_) => continue,
        };
        // Kept only when the file did not change while it was read: the content is then
        // that of version `before`.
        if version_of(&path) == before {
            UNLOCKED_LAST.put(&path, before, boot_id, &snapshot);
        }
        return snapshot;
    }
    Snapshot::Unreadable
}

/// [`read_unlocked`]'s last verified snapshot of each checkpoint file, by file version.
static UNLOCKED_LAST: LastRead = LastRead(std::sync::Mutex::new(Vec::new()));

/// How many files' snapshots are kept: a plugin has one state directory; tests run several
/// in one process, each with its own.
const LAST_READ_FILES: usize = 8;

struct LastRead(std::sync::Mutex<Vec<LastSnapshot>>);

struct LastSnapshot {
    path: PathBuf,
    version: FileVersion,
    boot_id: String,
    snapshot: Snapshot,
}

impl LastRead {
    fn get(&self, path: &Path, seen: Seen, boot_id: &str) -> Option<Snapshot> {
        let Seen::File(version) = seen else {
            return None;
        };
        let last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        last.iter()
            .find(|l| l.path == path)
            .filter(|l| l.version == version && l.boot_id == boot_id)
            .map(|l| l.snapshot.clone())
    }

    fn put(&self, path: &Path, seen: Seen, boot_id: &str, snapshot: &Snapshot) {
        let Seen::File(version) = seen else {
            return;
        };
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        last.retain(|l| l.path != path);
        if last.len() >= LAST_READ_FILES {
            last.remove(0);
        }
        last.push(LastSnapshot {
            path: path.to_path_buf(),
            version,
            boot_id: boot_id.to_string(),
            snapshot: snapshot.clone(),
        });
    }
}

/// Which version of the checkpoint file a store's content corresponds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// No file (fresh, or a corrupt one moved aside).
    Absent,
    /// This version of the file.
    File(FileVersion),
    /// Not known (the file could not be examined): the next check says "changed".
    Unknown,
}

/// The checkpoint file's version now. Every write swaps a rewritten spare with the file
/// ([`crate::fsutil::replace_atomic_reusing`]), so its inode number alternates between two
/// and only the modification time stamped at each write tells a version from the one before
/// last ([`FileVersion`]).
fn version_of(path: &Path) -> Seen {
    match FileVersion::of(path) {
        Ok(version) => Seen::File(version),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Seen::Absent,
        Err(_) => Seen::Unknown,
    }
}

impl CheckpointStore {
    /// Opens (or starts) the checkpoint in `state_dir` for the node's current boot.
    ///
    /// Never fails because of the file's content: see [`LoadOutcome`]. Removes temp files
    /// left by a write that a crash interrupted (the real file is intact by construction).
    ///
    /// # Errors
    /// [`StoreError`] for real I/O problems (directory not creatable, file unreadable, a bad
    /// file that cannot be moved aside) and an empty boot ID.
    pub fn open(
        state_dir: &Path,
        current_boot_id: &str,
    ) -> Result<(Self, LoadOutcome), StoreError> {
        if current_boot_id.is_empty() {
            return Err(StoreError::EmptyBootId);
        }
        fs::create_dir_all(state_dir).map_err(|source| StoreError::CreateDir {
            dir: state_dir.to_path_buf(),
            source,
        })?;
        let path = state_dir.join(CHECKPOINT_FILE);
        fsutil::remove_stale_temps(&path).map_err(|source| StoreError::CleanTemps { source })?;
        let fresh = Checkpoint::new(current_boot_id);
        // A file replaced while it was read may have been read torn (a writer reuses the
        // previous version's inode, `update`): read it again rather than call it corrupt.
        let mut attempt = 0;
        let (decoded, seen) = loop {
            attempt += 1;
            let before = version_of(&path);
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Ok((
                        Self {
                            path,
                            current: fresh,
                            seen: Seen::Absent,
                            spare: None,
                            written: None,
                            poisoned: false,
                            encoded: wire::EncodeCache::default(),
                        },
                        LoadOutcome::Fresh,
                    ));
                }
                Err(source) => return Err(StoreError::Read { path, source }),
            };
            let decoded = wire::decode(&bytes).map(|c| (c, bytes));
            // A file replaced while it was read is read again at the next check.
            match version_of(&path) {
                after if after == before => break (decoded, after),
                _ if decoded.is_err() && attempt < UNLOCKED_READS => continue,
                _ => break (decoded, Seen::Unknown),
            }
        };
        let outcome = match decoded {
            Ok((loaded, bytes)) if loaded.node_boot_id == current_boot_id => {
                let claims = loaded.claims.len();
                return Ok((
                    Self {
                        path,
                        current: loaded,
                        seen,
                        spare: None,
                        written: Some(Written(bytes)),
                        poisoned: false,
                        encoded: wire::EncodeCache::default(),
                    },
                    LoadOutcome::Loaded { claims },
                ));
            }
            Ok((stale, _)) => LoadOutcome::BootChanged {
                previous_boot_id: stale.node_boot_id,
                dropped: stale.claims,
            },
            Err(wire::DecodeError::UnsupportedVersion { found, supported }) => {
                return Err(StoreError::UnsupportedVersion {
                    path,
                    found,
                    supported,
                });
            }
            Err(reason) => LoadOutcome::Corrupt {
                moved_to: move_aside(&path)?,
                reason: error_chain(&reason),
            },
        };
        // A file of an earlier boot stays until the next update: its version is what this
        // (fresh) content stands for. A corrupt one was moved away.
        let seen = match outcome {
            LoadOutcome::Corrupt { .. } => version_of(&path),
            _ => seen,
        };
        Ok((
            Self {
                path,
                current: fresh,
                seen,
                spare: None,
                written: None,
                poisoned: false,
                encoded: wire::EncodeCache::default(),
            },
            outcome,
        ))
    }

    /// Whether the file is still the version this store read or last wrote, so its content
    /// in memory is what [`CheckpointStore::open`] would load now. One `stat`; `false` when
    /// another writer (a second plugin instance, start-up recovery, the MPS supervisor's own
    /// store) replaced the file since, or when the file cannot be examined.
    pub fn is_current(&self) -> bool {
        self.seen != Seen::Unknown && version_of(&self.path) == self.seen
    }

    /// The current state (always equal to what is on disk, or to what the next update
    /// writes after a boot change).
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.current
    }

    /// Path of the checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies `change` to the state, validates it and replaces the file atomically. When
    /// this returns `Ok`, the change survives a crash of the process; a power loss may lose
    /// it, which costs nothing because the reboot that follows invalidates every record (boot
    /// ID) — see `docs/architecture.md`, "Durability". When this returns `Err`, neither disk
    /// nor memory changed: the state is restored from the bytes last read or written.
    ///
    /// The change is made in place, not on a copy: the cost of an update is the records it
    /// touches plus one encoding, not a copy of every claim the node holds. A `change` that
    /// panics leaves the state half changed; callers own the store for one call
    /// ([`crate::claims`] checks it out by value), so unwinding drops it and the next call
    /// reads the file.
    ///
    /// # Errors
    /// [`StoreError::Encode`] when the change breaks an invariant, [`StoreError::Write`] when
    /// the file could not be written.
    pub fn update<R>(
        &mut self,
        change: impl FnOnce(&mut Checkpoint) -> R,
    ) -> Result<R, StoreError> {
        if self.poisoned {
            return Err(StoreError::Poisoned {
                path: self.path.clone(),
            });
        }
        let fresh_boot_id = self
            .written
            .is_none()
            .then(|| self.current.node_boot_id.clone());
        let result = change(&mut self.current);
        self.current.normalize();
        match self.write_current() {
            Ok(bytes) => {
                self.written = Some(Written(bytes));
                self.seen = version_of(&self.path);
                Ok(result)
            }
            Err(e) => {
                self.restore(fresh_boot_id);
                Err(e)
            }
        }
    }

    fn write_current(&mut self) -> Result<Vec<u8>, StoreError> {
        let bytes = wire::encode_reusing(&self.current, &mut self.encoded).map_err(|source| {
            StoreError::Encode {
                path: self.path.clone(),
                source,
            }
        })?;
        let spare = match self.spare.take() {
            Some(spare) => spare,
            None => {
                fsutil::spare_path(&self.path).map_err(|source| StoreError::Write { source })?
            }
        };
        let written = fsutil::replace_atomic_reusing(&self.path, &spare, &bytes, CHECKPOINT_MODE);
        self.spare = Some(spare);
        written.map_err(|source| StoreError::Write { source })?;
        Ok(bytes)
    }

    /// Puts back the state of before a failed update: the fresh checkpoint of
    /// `fresh_boot_id` when it was one, else decoded from the bytes last read or written.
    fn restore(&mut self, fresh_boot_id: Option<String>) {
        if let Some(boot_id) = fresh_boot_id {
            self.current = Checkpoint::new(&boot_id);
            return;
        }
        match self.written.as_ref().map(|w| wire::decode(&w.0)) {
            Some(Ok(checkpoint)) => self.current = checkpoint,
            failed => {
                // Bytes this store verified or encoded always decode. Should they not, this
                // store takes no more updates (they would write the failed change), and the
                // file, which the failed write left as it was, is read afresh at the next
                // check-out.
                tracing::error!(
                    error = failed.and_then(Result::err).map(|e| error_chain(&e)),
                    path = %self.path.display(),
                    "restoring the checkpoint after a failed update; it will be read again"
                );
                self.seen = Seen::Unknown;
                self.poisoned = true;
            }
        }
    }
}

/// Renames a bad file to `<name>.corrupt-<unix seconds>[-<n>]` without replacing an earlier
/// one, so every bad file stays available for diagnosis.
fn move_aside(path: &Path) -> Result<PathBuf, StoreError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{}.corrupt-{now}", path.display());
    let mut to = PathBuf::from(&base);
    let mut n = 1;
    while to.exists() {
        to = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    fs::rename(path, &to).map_err(|source| StoreError::MoveAside {
        path: path.to_path_buf(),
        to: to.clone(),
        source,
    })?;
    Ok(to)
}
