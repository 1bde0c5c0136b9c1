//! Simulated `nvidia-smi` and `nvidia-cuda-mps-control`: the `gpu-dra` binary run under those
//! names (see [`crate::sharing::Tools::simulated`]). They speak the same command lines and
//! control protocol as the real tools, run as real processes (the MPS daemon detaches and
//! listens on `<pipe>/control`), keep per-UUID compute mode and time-slice in a state file,
//! and append every invocation to the log named by `GPU_DRA_SIM_TOOLS_LOG`, so the demo can
//! show the commands the tools received.

mod mpsd;
pub mod query;
mod smi;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

pub use smi::SmiGpuState;

use crate::sharing::tools::SIM_LOG_ENV;

/// What `nvidia-smi` answers (exit 2) to a command line it does not take; both its query and
/// its compute-mode halves use it, so it lives here rather than in either.
const BAD_ARGS: &str =
    "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.";

/// Set on the detached daemon copy so its internal `-f` start is not logged as a call.
const INTERNAL_ENV: &str = "GPU_DRA_SIM_TOOLS_INTERNAL";

/// Env vars recorded with each invocation.
const RECORDED_ENV: [&str; 4] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "LD_PRELOAD",
];

/// Which tool the binary plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    NvidiaSmi,
    MpsControl,
}

impl Tool {
    /// The executable name.
    pub fn name(self) -> &'static str {
        match self {
            Tool::NvidiaSmi => "nvidia-smi",
            Tool::MpsControl => "nvidia-cuda-mps-control",
        }
    }
}

/// The tool named by `argv[0]`'s file name, if it is one of the simulated tools.
pub fn personality(argv0: &OsStr) -> Option<Tool> {
    let name = Path::new(argv0).file_name()?;
    [Tool::NvidiaSmi, Tool::MpsControl]
        .into_iter()
        .find(|t| name == t.name())
}

/// Runs the simulated `tool` with `args` (argv without `argv[0]`) and returns its exit code;
/// prints what the real tool prints.
pub fn run(tool: Tool, args: Vec<String>) -> ExitCode {
    match tool {
        Tool::NvidiaSmi => {
            record(tool, &args, Vec::new());
            smi::run(&args, state_dir().as_deref())
        }
        Tool::MpsControl => mpsd::run(&args),
    }
}

/// One recorded tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invocation {
    pub tool: String,
    pub args: Vec<String>,
    /// The recorded env vars that were set (`CUDA_VISIBLE_DEVICES`, `CUDA_MPS_*`, …).
    pub env: BTreeMap<String, String>,
    /// Control commands read from stdin (client mode of `nvidia-cuda-mps-control`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stdin: Vec<String>,
}

impl Invocation {
    /// Shell-like rendering, e.g. `echo quit | nvidia-cuda-mps-control`.
    pub fn command_line(&self) -> String {
        let mut line = String::new();
        if !self.stdin.is_empty() {
            line.push_str(&format!("echo {} | ", self.stdin.join("; ")));
        }
        line.push_str(&self.tool);
        for a in &self.args {
            line.push(' ');
            line.push_str(a);
        }
        line
    }
}

/// The invocations recorded in `<dir>/tools.log`, oldest first; unreadable lines skipped.
pub fn read_log(dir: &Path) -> Vec<Invocation> {
    let text = std::fs::read_to_string(dir.join("tools.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The simulated `nvidia-smi` state in `dir`: compute mode and time-slice per UUID.
pub fn read_state(dir: &Path) -> BTreeMap<String, SmiGpuState> {
    smi::load(dir)
}

/// Sets the compute mode (`DEFAULT`, `EXCLUSIVE_PROCESS`, `PROHIBITED`) of `uuid` in the
/// simulated `nvidia-smi` state in `dir`, under its lock, as `nvidia-smi -c` does: the
/// simulated NVML library's `nvmlDeviceSetComputeMode` shares this one truth.
pub fn set_compute_mode(dir: &Path, uuid: &str, mode: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    smi::update(Some(dir), |state| {
        state.entry(uuid.to_string()).or_default().compute_mode = mode.to_string();
        String::new()
    })
    .map(|_| ())
}

/// The directory of the invocation log, which also holds the `nvidia-smi` state.
fn state_dir() -> Option<PathBuf> {
    let log = std::env::var_os(SIM_LOG_ENV)?;
    Path::new(&log).parent().map(Path::to_path_buf)
}

/// Appends one JSON line to the invocation log; a tool without a log just runs.
fn record(tool: Tool, args: &[String], stdin: Vec<String>) {
    if std::env::var_os(INTERNAL_ENV).is_some() {
        return;
    }
    let Some(log) = std::env::var_os(SIM_LOG_ENV) else {
        return;
    };
    let env = RECORDED_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    let inv = Invocation {
        tool: tool.name().into(),
        args: args.to_vec(),
        env,
        stdin,
    };
    let Ok(mut line) = serde_json::to_string(&inv) else {
        return;
    };
    line.push('\n');
    // One write of an O_APPEND file: concurrent tools do not interleave lines.
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = f.write_all(line.as_bytes());
    }
}
