//! The mutable state of a simulated node (MIG modes, GPU and compute instances, health) and
//! where it lives: in memory, or in a state file shared by every process that opens the same
//! directory — like real hardware, a restarted plugin finds what its predecessor created.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::SimError;
use crate::fsutil::FileVersion;

/// Version of the state file's wire format.
const STATE_VERSION: u32 = 1;
/// File name of the state inside the state directory.
pub const STATE_FILE: &str = "sim-gpu-state.json";
const LOCK_FILE: &str = "sim-gpu-state.lock";

/// Mutable hardware state of the whole node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimState {
    /// Bumped on every MIG device creation, so a re-created device gets a new UUID.
    pub serial: u64,
    /// Per-GPU state, by index.
    pub gpus: Vec<GpuState>,
    /// Sequence number of the last fault event (0: none yet).
    #[serde(default)]
    pub event_seq: u64,
    /// The most recent fault events, oldest first (bounded; see `faults`).
    #[serde(default)]
    pub events: Vec<SimEvent>,
    /// Loads set with `sim-fault load`, by GPU slot (`telemetry.rs`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub loads: std::collections::BTreeMap<u32, super::telemetry::SimLoad>,
    /// Fields a newer release wrote that this one does not know: kept as read and written
    /// back, so a rollback and a roll forward again lose nothing (docs/upgrades.md).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// Fields of a newer format version, kept verbatim.
pub type Unknown = std::collections::BTreeMap<String, serde_json::Value>;

/// Mutable state of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuState {
    /// MIG mode in effect.
    pub mig_current: bool,
    /// MIG mode after the next reset.
    pub mig_pending: bool,
    /// Health as the device reports it.
    pub healthy: bool,
    /// GPU instances that exist.
    pub instances: Vec<InstanceState>,
    /// The GPU fell off the bus (XID 79) and stays lost until recovered.
    #[serde(default)]
    pub lost: bool,
    /// ECC error counters since power-on (volatile) and over the GPU's life (aggregate).
    #[serde(default)]
    pub ecc: EccCounters,
    /// Taken off the node (`sim-fault remove-gpu`): no longer enumerated; its slot is not
    /// reused.
    #[serde(default)]
    pub removed: bool,
    /// Model key of a GPU added after power-on (`sim-fault add-gpu`); `None` for the node
    /// description's GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_model: Option<String>,
    /// Health-relevant events since the last recovery (see [`crate::hardware::health`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<crate::hardware::health::GpuFault>,
    /// Persistence mode was turned off (`nvmlDeviceSetPersistenceMode`); on by default, as
    /// on hosts running nvidia-persistenced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persistence_off: bool,
    /// Fields of a newer release, kept (see [`SimState::unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// A GPU instance and its compute instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceState {
    /// GPU instance id.
    pub gi_id: u32,
    /// Driver id of the profile.
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
    /// Compute instances inside: (ci id, MIG device UUID).
    pub compute_instances: Vec<(u32, String)>,
}

/// Unknown fields are kept at every level a newer release is likely to extend (the file, the
/// node's state, each GPU), so a file a newer release wrote is read, used and written back
/// whole; only a newer `version` (an incompatible change) is refused.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateFileV1 {
    version: u32,
    /// Identifies the node description the state belongs to.
    fingerprint: String,
    /// The node description (absent in files written before `sim-fault` existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<super::NodeSpec>,
    state: SimState,
    #[serde(flatten)]
    unknown: Unknown,
}

/// Where the state lives.
pub(super) enum Store {
    /// Process-local; gone when the process ends.
    Memory(Mutex<SimState>),
    /// A JSON file guarded by a lock file, re-read on every operation that may change it;
    /// reads ([`Store::read`]) reuse the state last seen while the file is still that version.
    File {
        dir: PathBuf,
        fingerprint: String,
        node: super::NodeSpec,
        initial: SimState,
        /// The state as last read or written under the lock, with the file's version then.
        seen: Mutex<Option<Box<(FileVersion, SimState)>>>,
    },
}

/// The state file's version now, `None` without one. Every writer (this process,
/// `sim-fault`, the simulated NVML library: all through `write_state`) replaces it under the
/// lock by renaming a new file over it stamped with the nanosecond of the write
/// ([`crate::fsutil::write_atomic_versioned`]), so a reused inode number does not pass for
/// the version before ([`FileVersion`]).
fn stamp_of(path: &Path) -> Option<FileVersion> {
    FileVersion::of(path).ok()
}

impl Store {
    /// The state directory of a file-backed store.
    pub(super) fn dir(&self) -> Option<&Path> {
        match self {
            Store::File { dir, .. } => Some(dir),
            Store::Memory(_) => None,
        }
    }

    /// Runs `op` on the current state; when it returns `Ok((value, true))` the changed state
    /// is persisted before this returns. On error nothing is written.
    pub(super) fn with<T>(
        &self,
        op: impl FnOnce(&mut SimState) -> Result<(T, bool), crate::hardware::HardwareError>,
    ) -> Result<T, crate::hardware::HardwareError> {
        match self {
            Store::Memory(state) => {
                let mut guard = state
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let mut scratch = guard.clone();
                let (value, _) = op(&mut scratch)?;
                *guard = scratch;
                Ok(value)
            }
            Store::File {
                dir,
                fingerprint,
                node,
                initial,
                seen,
            } => {
                let lock = lock_dir(dir)?;
                let (mut state, kept) = read_state(dir, fingerprint)?
                    .unwrap_or_else(|| (initial.clone(), Unknown::new()));
                let (value, changed) = op(&mut state)?;
                let path = dir.join(STATE_FILE);
                if changed || !path.exists() {
                    write_state(dir, fingerprint, node, &state, kept)?;
                }
                // Under the lock: no writer can replace the file between the read (or write)
                // and this stamp.
                *lock_seen(seen) = stamp_of(&path).map(|stamp| Box::new((stamp, state)));
                drop(lock);
                Ok(value)
            }
        }
    }

    /// The state file's version now (one `stat`); `None` in memory or without a file.
    pub(super) fn stamp(&self) -> Option<FileVersion> {
        match self {
            Store::File { dir, .. } => stamp_of(&dir.join(STATE_FILE)),
            Store::Memory(_) => None,
        }
    }

    /// Runs `op` on the current state without changing it. From a state file, one `stat`
    /// when the file is still the version last read or written here (no lock, no read:
    /// the rename that replaces it is atomic, so an unchanged version is unchanged content);
    /// otherwise as [`Store::with`].
    pub(super) fn read<T>(
        &self,
        op: impl FnOnce(&SimState) -> Result<T, crate::hardware::HardwareError>,
    ) -> Result<T, crate::hardware::HardwareError> {
        if let Store::File { dir, seen, .. } = self
            && let Some(stamp) = stamp_of(&dir.join(STATE_FILE))
        {
            let cached = lock_seen(seen);
            if let Some((at, state)) = cached.as_deref()
                && *at == stamp
            {
                return op(state);
            }
        }
        let state = self.with(|s| Ok((s.clone(), false)))?;
        op(&state)
    }
}

type Seen = Option<Box<(FileVersion, SimState)>>;

fn lock_seen(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn io_err<'a>(path: &'a Path, step: &'static str) -> impl FnOnce(std::io::Error) -> SimError + 'a {
    move |source| SimError::StateIo {
        path: path.to_path_buf(),
        step,
        source,
    }
}

/// Takes the exclusive lock that serialises every process using this state directory.
fn lock_dir(dir: &Path) -> Result<File, SimError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir, "create state directory"))?;
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path, "open lock file"))?;
    file.lock().map_err(io_err(&path, "lock"))?;
    Ok(file)
}

/// The node description and state stored in `dir`, read under the lock; `None` when there
/// is no state file. Fails when the file is unreadable or predates stored descriptions.
pub(super) fn stored(dir: &Path) -> Result<Option<(super::NodeSpec, SimState)>, SimError> {
    let path = dir.join(STATE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let lock = lock_dir(dir)?;
    let text = std::fs::read_to_string(&path).map_err(io_err(&path, "read"))?;
    drop(lock);
    let file: StateFileV1 = serde_json::from_str(&text).map_err(|e| SimError::StateCorrupt {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    match file.node {
        Some(node) => Ok(Some((node, file.state))),
        None => Err(SimError::StateCorrupt {
            path,
            detail: "it was written by an older gpu-dra and does not name its node; restart the plugin (or run `gpu-dra inventory --state-dir`) to rewrite it".into(),
        }),
    }
}

/// Reads the state; `None` when there is none yet or it belongs to another node description.
/// A file that does not parse is an error: hardware state is never silently reset.
fn read_state(dir: &Path, fingerprint: &str) -> Result<Option<(SimState, Unknown)>, SimError> {
    let path = dir.join(STATE_FILE);
    crate::cost::count(crate::cost::Cost::HardwareStateRead);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path, "read")(e)),
    };
    let file: StateFileV1 = serde_json::from_str(&text).map_err(|e| SimError::StateCorrupt {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    if file.version != STATE_VERSION {
        return Err(SimError::StateCorrupt {
            path,
            detail: format!(
                "state format version {} was written by a newer gpu-dra; this release reads \
                 version {STATE_VERSION}: run the newer release, or move the file away to power \
                 the simulated node on afresh (its MIG devices are then gone)",
                file.version
            ),
        });
    }
    if file.fingerprint != fingerprint {
        return Ok(None);
    }
    Ok(Some((file.state, file.unknown)))
}

fn write_state(
    dir: &Path,
    fingerprint: &str,
    node: &super::NodeSpec,
    state: &SimState,
    unknown: Unknown,
) -> Result<(), SimError> {
    let file = StateFileV1 {
        version: STATE_VERSION,
        fingerprint: fingerprint.to_string(),
        node: Some(node.clone()),
        state: state.clone(),
        unknown,
    };
    let mut bytes = serde_json::to_vec_pretty(&file).map_err(|e| SimError::StateCorrupt {
        path: dir.join(STATE_FILE),
        detail: e.to_string(),
    })?;
    bytes.push(b'\n');
    crate::fsutil::write_atomic_versioned(&dir.join(STATE_FILE), &bytes, 0o644)
        .map_err(SimError::StateWrite)
}

/// ECC error counters of one GPU (`nvmlDeviceGetTotalEccErrors`) and the pages retired
/// because of them (`nvmlDeviceGetRetiredPages`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EccCounters {
    /// Corrected errors since the last reset.
    pub single_volatile: u64,
    /// Uncorrected errors since the last reset.
    pub double_volatile: u64,
    /// Corrected errors over the GPU's life.
    pub single_aggregate: u64,
    /// Uncorrected errors over the GPU's life.
    pub double_aggregate: u64,
    /// Pages retired for multiple single-bit errors.
    pub retired_single: u64,
    /// Pages retired for a double-bit error.
    pub retired_double: u64,
}

/// One NVML event raised by a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimEvent {
    /// Position in the node's event sequence (1-based, increasing).
    pub seq: u64,
    /// GPU slot (minor number: stable when other GPUs are removed).
    pub gpu: u32,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// `eventData`: the XID for XID events, the recovery action for recovery events.
    pub data: u64,
    /// The GPU instance a MIG-scoped event is attributed to (`gpuInstanceId`); `None`
    /// (`0xFFFFFFFF` on the wire) for the whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
}
