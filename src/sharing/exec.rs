//! Runs one [`CommandLine`] as a child process with a deadline and captures what it printed.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use super::SharingError;
use super::commands::{self, CommandLine};

/// How much of a failing tool's output goes into the error.
const OUTPUT_TAIL: usize = 2000;

/// What a finished tool printed.
#[derive(Debug)]
pub(crate) struct Finished {
    pub success: bool,
    pub status: String,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The output for an error message: stderr then stdout, trimmed to the last bytes.
    pub fn tail(&self) -> String {
        let joined = format!("{}{}", self.stderr, self.stdout);
        let text = joined.trim();
        let start = text
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| text.len() - i <= OUTPUT_TAIL)
            .unwrap_or(0);
        if text.is_empty() {
            "(no output)".to_string()
        } else {
            text[start..].to_string()
        }
    }
}

/// Variables of the plugin's own environment a tool (and the MPS daemons it starts, which
/// outlive the call and serve every client of a claim) gets: what finds and loads the NVIDIA
/// binaries and libraries, the locale, and the NVIDIA/CUDA and simulator settings. Nothing
/// else — not the service-account or API-server settings, not the plugin's own options —
/// crosses into processes that run beside user workloads.
const INHERITED_VARS: [&str; 7] = [
    "PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
];

/// Prefixes of inherited variables (see [`INHERITED_VARS`]).
const INHERITED_PREFIXES: [&str; 4] = ["CUDA_", "NVIDIA_", "__NV_", "GPU_DRA_SIM"];

/// The part of `vars` (the plugin's environment) a tool inherits; the tool's own variables
/// are added on top by the caller.
pub(crate) fn inherited_env(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    vars.into_iter()
        .filter(|(key, _)| {
            key.to_str().is_some_and(|key| {
                INHERITED_VARS.contains(&key)
                    || INHERITED_PREFIXES.iter().any(|p| key.starts_with(p))
            })
        })
        .collect()
}

/// Runs `cmd` and waits at most `timeout`; on timeout the child is killed. The child's
/// environment is [`inherited_env`] of ours plus `cmd.env`.
///
/// With `output_file`, stdout and stderr go to that file instead of pipes: a daemonising
/// tool may leave a grandchild holding its stdout, which would make a pipe read block.
///
/// # Errors
/// [`SharingError::Spawn`], [`SharingError::Wait`] or [`SharingError::ToolTimeout`]; an
/// unsuccessful exit is *not* an error here (see [`run_checked`]).
pub(crate) fn run(
    cmd: &CommandLine,
    timeout: Duration,
    output_file: Option<&Path>,
) -> Result<Finished, SharingError> {
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.args);
    c.env_clear();
    c.envs(inherited_env(std::env::vars_os()));
    c.envs(cmd.env.iter().map(|(k, v)| (k, v)));
    c.stdin(if cmd.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let io_err = |step, path: &Path| {
        let path = path.to_path_buf();
        move |source| SharingError::Io { step, path, source }
    };
    if let Some(path) = output_file {
        let file = File::create(path).map_err(io_err("creating output file", path))?;
        let err = file
            .try_clone()
            .map_err(io_err("duplicating output file", path))?;
        c.stdout(file).stderr(err);
    } else {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = c.spawn().map_err(|source| SharingError::Spawn {
        command: cmd.to_string(),
        source,
    })?;
    if let (Some(input), Some(mut pipe)) = (&cmd.stdin, child.stdin.take()) {
        // A tool that exits without reading stdin closes the pipe; its exit status says more.
        let _ = pipe.write_all(input.as_bytes());
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(timeout) {
        Ok(Ok(out)) => out,
        Ok(Err(source)) => {
            return Err(SharingError::Wait {
                command: cmd.to_string(),
                source,
            });
        }
        Err(_) => {
            // Best effort: the timeout is the error to report.
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            return Err(SharingError::ToolTimeout {
                command: cmd.to_string(),
                after: timeout,
            });
        }
    };
    let mut stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if let Some(path) = output_file {
        let mut text = String::new();
        if let Ok(mut f) = File::open(path) {
            let _ = f.read_to_string(&mut text);
        }
        stdout = text;
    }
    Ok(Finished {
        success: out.status.success(),
        status: out.status.to_string(),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Like [`run`], and an unsuccessful exit becomes [`SharingError::ToolFailed`] naming the
/// command line, the exit status and the output tail.
pub(crate) fn run_checked(
    cmd: &CommandLine,
    timeout: Duration,
    output_file: Option<&Path>,
) -> Result<Finished, SharingError> {
    let done = run(cmd, timeout, output_file)?;
    if done.success {
        Ok(done)
    } else {
        Err(failed(cmd, &done))
    }
}

pub(crate) fn failed(cmd: &CommandLine, done: &Finished) -> SharingError {
    SharingError::ToolFailed {
        command: cmd.to_string(),
        status: done.status.clone(),
        output: done.tail(),
    }
}

/// Sends SIGKILL to `pid` with the `kill` command.
pub(crate) fn kill(pid: u32, timeout: Duration) -> Result<(), SharingError> {
    run_checked(&commands::kill(pid), timeout, None).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn tools_inherit_only_what_finds_and_runs_the_nvidia_binaries() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("LD_LIBRARY_PATH", "/usr/lib"),
            ("CUDA_MPS_LOG_DIRECTORY", "/var/log/mps"),
            ("NVIDIA_DRIVER_ROOT", "/driver-root"),
            ("GPU_DRA_SIM_TOOLS_LOG", "/tmp/tools.log"),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBECONFIG", "/etc/kubeconfig"),
            ("GPU_DRA_LOG", "debug"),
            ("AWS_SECRET_ACCESS_KEY", "hunter2"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let got: Vec<String> = inherited_env(vars)
            .into_iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            vec![
                "PATH",
                "LD_LIBRARY_PATH",
                "CUDA_MPS_LOG_DIRECTORY",
                "NVIDIA_DRIVER_ROOT",
                "GPU_DRA_SIM_TOOLS_LOG"
            ],
            got
        );
    }
}
