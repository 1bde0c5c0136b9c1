//! GPU sharing on the node: time-slicing (`nvidia-smi` compute mode and compute policy) and
//! MPS control daemons the plugin starts, checks, restarts and stops itself.
//!
//! Every effect is a real child process of a [`Tools`] executable (`nvidia-smi`,
//! `nvidia-cuda-mps-control`, `mount`, `unshare`, `kill`): the real ones from the driver root,
//! the simulated ones ([`simtools`], the `gpu-dra` binary under another name) or the fakes the
//! tests write. Arguments are built only from validated values (UUIDs, enums, numbers), so no
//! unchecked string ever reaches a command line.
//!
//! The module takes already-validated sharing settings (see `opaque`) and never logs: callers
//! log at their boundary with the errors returned here.

mod commands;
mod control;
mod edits;
mod exec;
mod mps;
mod procfs;
pub mod simtools;
mod spec;
mod teardown;
mod timeslice;
mod tools;

use std::path::PathBuf;
use std::time::Duration;

pub use commands::{CommandLine, MULTI_USER_FLAG};
pub use edits::{ClientEdits, Mount, client_limit_env};
pub use mps::{Ensured, MpsManager, MpsOptions, MpsStatus};
pub use spec::{MpsDaemonSpec, MpsDevice, validate_daemon_id, validate_uuid};
pub use timeslice::{ComputeMode, ResetOutcome};
pub use tools::Tools;

/// Why a sharing step failed. Each variant names the step and carries its context.
#[derive(Debug, thiserror::Error)]
pub enum SharingError {
    /// A device UUID is not of the form `GPU-…` / `MIG-…` (hex digits and dashes).
    #[error("{field}: {value:?} is not a device UUID (want GPU-<hex> or MIG-<hex>)")]
    InvalidUuid { field: &'static str, value: String },
    /// A time-slicing or compute-mode step was asked for a MIG device.
    #[error(
        "{step} on {uuid}: only full GPUs (GPU-…) take this setting; it is a whole-GPU property"
    )]
    NotAFullGpu { step: &'static str, uuid: String },
    /// A time-slice level outside 0..=3.
    #[error("time-slice level {value} is not valid (want 0 Default, 1 Short, 2 Medium or 3 Long)")]
    InvalidTimeslice { value: u8 },
    /// An MPS daemon spec field is out of range or inconsistent.
    #[error("MPS daemon {id:?}: {field}: {problem}")]
    InvalidSpec {
        id: String,
        field: &'static str,
        problem: String,
    },
    /// A tool executable was not found under the driver root.
    #[error("{tool} not found under driver root {root}; tried {}", list(tried))]
    ToolNotFound {
        tool: &'static str,
        root: PathBuf,
        tried: Vec<PathBuf>,
    },
    /// A path is not UTF-8, so it cannot be passed safely to a tool.
    #[error("path {path:?} is not valid UTF-8")]
    NonUtf8Path { path: PathBuf },
    /// Starting a tool process failed (not found, not executable, …).
    #[error("starting `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// A tool ran and exited unsuccessfully.
    #[error("`{command}` exited with {status}: {output}")]
    ToolFailed {
        command: String,
        status: String,
        output: String,
    },
    /// A tool did not finish in time and was killed.
    #[error("`{command}` did not finish within {after:?} and was killed")]
    ToolTimeout { command: String, after: Duration },
    /// Waiting for a tool or reading its output failed.
    #[error("waiting for `{command}`")]
    Wait {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// A file-system step on the daemon's directories failed.
    #[error("{step} {path}")]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing the daemon's recorded spec failed.
    #[error("recording MPS daemon spec {path}")]
    WriteSpec {
        path: PathBuf,
        #[source]
        source: crate::fsutil::FsError,
    },
    /// The recorded spec of a daemon cannot be decoded.
    #[error("decoding MPS daemon spec {path}")]
    DecodeSpec {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// `MemTotal` could not be read to size the daemon's `/dev/shm`.
    #[error("reading MemTotal from {path} to size the MPS shm: {problem}")]
    MemInfo { path: PathBuf, problem: String },
    /// The daemon did not answer the control protocol in time.
    #[error("MPS daemon {id} not ready after {waited:?}; last attempt: {last}")]
    NotReady {
        id: String,
        waited: Duration,
        last: String,
    },
    /// A limit read back from the daemon differs from the one sent.
    #[error("MPS daemon {id}: `{command}` answered {got:?}, want {want}")]
    LimitMismatch {
        id: String,
        command: String,
        want: String,
        got: String,
    },
    /// A daemon with this id runs with a different spec than the one asked for.
    #[error("MPS daemon {id} already runs with a different spec ({path}); stop it first")]
    SpecConflict { id: String, path: PathBuf },
    /// The daemon process did not exit, even after SIGKILL.
    #[error("MPS daemon {id} (pid {pid}) did not exit after quit and SIGKILL")]
    DaemonWontDie { id: String, pid: u32 },
    /// Start failed and undoing it failed too; the start error is the source.
    #[error("MPS daemon {id}: start failed and so did the cleanup ({cleanup})")]
    RollbackFailed {
        id: String,
        cleanup: String,
        #[source]
        cause: Box<SharingError>,
    },
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
