//! Pure command-line builders: what each step would run, decided before anything runs, so the
//! exact argv and env are unit-tested without executing them.

use std::fmt;
use std::path::{Path, PathBuf};

use super::SharingError;

/// One process to run: program, argv (without `argv[0]`), extra env on top of the inherited
/// environment, and optional stdin text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<String>,
}

impl CommandLine {
    /// A command with no extra env and no stdin.
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>) -> CommandLine {
        CommandLine {
            program: program.into(),
            args,
            env: Vec::new(),
            stdin: None,
        }
    }
}

impl fmt::Display for CommandLine {
    /// Shell-like rendering for error messages: `[echo … |] K=V program args`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(input) = &self.stdin {
            write!(f, "echo {:?} | ", input.trim_end())?;
        }
        for (k, v) in &self.env {
            write!(f, "{k}={v} ")?;
        }
        write!(f, "{}", self.program.display())?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}

/// `path` as a string, or an error: non-UTF-8 paths are never passed to a tool.
pub(crate) fn path_str(path: &Path) -> Result<&str, SharingError> {
    path.to_str().ok_or_else(|| SharingError::NonUtf8Path {
        path: path.to_path_buf(),
    })
}

/// The inner script run under `unshare`: bind the daemon's own shm dir on `/dev/shm` in the
/// new mount namespace, then become the control daemon. Paths arrive as positional
/// parameters, never spliced into the script text.
pub const SHM_SCRIPT: &str = "mount --bind \"$1\" /dev/shm && exec \"$2\" -d";

/// [`SHM_SCRIPT`] for a multi-user daemon: the same, with [`MULTI_USER_FLAG`].
pub const SHM_SCRIPT_MULTI_USER: &str = "mount --bind \"$1\" /dev/shm && exec \"$2\" -d -M";

/// The `nvidia-cuda-mps-control` flag that starts the control daemon in multi-user mode, as
/// NVIDIA's DRA driver passes it (`-d -M`, their PR #1153). The CUDA MPS documentation names
/// the mode `-multiuser-server`; the simulated tool accepts only this spelling.
pub const MULTI_USER_FLAG: &str = "-M";

/// `mount -t tmpfs -o rw,nosuid,nodev,noexec,relatime,size=<size> shm <dir>`.
pub fn shm_mount(shm_dir: &Path, size: &str) -> Result<CommandLine, SharingError> {
    Ok(CommandLine::new(
        "mount",
        vec![
            "-t".into(),
            "tmpfs".into(),
            "-o".into(),
            format!("rw,nosuid,nodev,noexec,relatime,size={size}"),
            "shm".into(),
            path_str(shm_dir)?.into(),
        ],
    ))
}

/// `umount <dir>`.
pub fn shm_unmount(shm_dir: &Path) -> Result<CommandLine, SharingError> {
    Ok(CommandLine::new("umount", vec![path_str(shm_dir)?.into()]))
}

/// `kill -KILL <pid>`.
pub fn kill(pid: u32) -> CommandLine {
    CommandLine::new("kill", vec!["-KILL".into(), pid.to_string()])
}

/// Half of `MemTotal` from a `/proc/meminfo` text, keeping the unit letter (`kB` → `k`), as
/// the NVIDIA components size the MPS `/dev/shm`. `None` when the line is missing or odd.
pub fn half_mem_total(meminfo: &str) -> Option<String> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let unit = parts.next().unwrap_or("");
    let letter = unit.chars().next().map(|c| c.to_ascii_lowercase());
    match letter {
        Some(c @ ('k' | 'm' | 'g')) => Some(format!("{}{c}", value / 2)),
        None => Some(format!("{}", value / 2)),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_mount_command_matches_the_nvidia_components() {
        let got = shm_mount(Path::new("/p/mps/a/shm"), "32927966k").unwrap();
        let want = CommandLine::new(
            "mount",
            [
                "-t",
                "tmpfs",
                "-o",
                "rw,nosuid,nodev,noexec,relatime,size=32927966k",
                "shm",
                "/p/mps/a/shm",
            ]
            .map(String::from)
            .to_vec(),
        );
        assert_eq!(got, want);
    }

    #[test]
    fn half_mem_total_keeps_the_unit_letter() {
        let meminfo = "MemFree: 1 kB\nMemTotal:       65855932 kB\n";
        assert_eq!(half_mem_total(meminfo), Some("32927966k".to_string()));
        assert_eq!(half_mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn display_shows_stdin_env_and_argv() {
        let mut cmd = CommandLine::new("/bin/nvidia-cuda-mps-control", vec![]);
        cmd.env
            .push(("CUDA_MPS_PIPE_DIRECTORY".into(), "/p".into()));
        cmd.stdin = Some("quit\n".into());
        assert_eq!(
            cmd.to_string(),
            "echo \"quit\" | CUDA_MPS_PIPE_DIRECTORY=/p /bin/nvidia-cuda-mps-control"
        );
    }
}
