//! Where the NVIDIA tools are and the environment they run with.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::SharingError;
use super::commands::path_str;

/// Directories under the driver root searched for a tool, in order. `usr/bin` first (where
/// driver containers and distributions put them), then the places the NVIDIA driver checks.
const TOOL_DIRS: [&str; 6] = ["usr/bin", "", "opt/bin", "usr/sbin", "bin", "sbin"];

/// Where `libnvidia-ml.so.1` may sit under the driver root.
const NVML_DIRS: [&str; 7] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib",
];

/// The env var the simulated tools append their invocations to.
pub const SIM_LOG_ENV: &str = "GPU_DRA_SIM_TOOLS_LOG";

/// How long one tool call may take before it is killed.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// The two NVIDIA tools this module drives, the extra environment they need, and how long
/// one call may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    pub nvidia_smi: PathBuf,
    pub mps_control: PathBuf,
    /// Added to the environment of every tool call (`LD_PRELOAD`, `PATH`, …), on top of the
    /// few variables tools inherit from the plugin (see `exec::inherited_env`).
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
}

impl Tools {
    /// Tools at the given paths, with no extra environment.
    pub fn new(nvidia_smi: impl Into<PathBuf>, mps_control: impl Into<PathBuf>) -> Tools {
        Tools {
            nvidia_smi: nvidia_smi.into(),
            mps_control: mps_control.into(),
            env: Vec::new(),
            timeout: DEFAULT_TOOL_TIMEOUT,
        }
    }

    /// Finds `nvidia-smi` and `nvidia-cuda-mps-control` under the NVIDIA driver root as the
    /// plugin sees it (`/` or e.g. `/driver-root`): the first regular file (after following
    /// symlinks) among `<root>/{usr/bin,,opt/bin,usr/sbin,bin,sbin}/<tool>`.
    ///
    /// The environment gets `LD_PRELOAD=<root's libnvidia-ml.so.1>` when that library is
    /// found, and for a root other than `/` also `PATH` and `LD_LIBRARY_PATH` with the root's
    /// binary and library directories first (the MPS control daemon starts
    /// `nvidia-cuda-mps-server` from there).
    ///
    /// # Errors
    /// [`SharingError::ToolNotFound`] listing every path tried;
    /// [`SharingError::NonUtf8Path`] for a root that is not UTF-8.
    pub fn from_driver_root(root: &Path) -> Result<Tools, SharingError> {
        path_str(root)?;
        let smi = find_file(root, "nvidia-smi", &TOOL_DIRS)?;
        let mps = find_file(root, "nvidia-cuda-mps-control", &TOOL_DIRS)?;
        let mut tools = Tools::new(smi, mps);
        if let Ok(lib) = find_file(root, "libnvidia-ml.so.1", &NVML_DIRS) {
            let lib = path_str(&lib)?.to_string();
            tools
                .env
                .push(("LD_PRELOAD".into(), prepend(&[lib], "LD_PRELOAD")));
        }
        let is_host_root = fs::canonicalize(root).is_ok_and(|p| p == Path::new("/"));
        if !is_host_root {
            let under = |dirs: &[&str]| -> Vec<String> {
                dirs.iter()
                    .map(|d| root.join(d).to_string_lossy().into_owned())
                    .collect()
            };
            tools.env.push((
                "PATH".into(),
                prepend(&under(&["usr/bin", "bin", "usr/local/bin"]), "PATH"),
            ));
            tools.env.push((
                "LD_LIBRARY_PATH".into(),
                prepend(
                    &under(&["lib64", "lib", "usr/lib64", "usr/lib"]),
                    "LD_LIBRARY_PATH",
                ),
            ));
        }
        Ok(tools)
    }

    /// The simulated tools: `<dir>/bin/nvidia-smi` and `<dir>/bin/nvidia-cuda-mps-control`
    /// as symlinks to `exe` (the `gpu-dra` binary, which acts as the tool named by `argv[0]`),
    /// logging every invocation to `<dir>/tools.log` (see [`super::simtools::read_log`]).
    ///
    /// # Errors
    /// [`SharingError::Io`] when the directory or a symlink cannot be created.
    pub fn simulated(exe: &Path, dir: &Path) -> Result<Tools, SharingError> {
        let bin = dir.join("bin");
        fs::create_dir_all(&bin).map_err(|source| SharingError::Io {
            step: "creating simulated tools directory",
            path: bin.clone(),
            source,
        })?;
        let mut links = Vec::new();
        for name in ["nvidia-smi", "nvidia-cuda-mps-control"] {
            let link = bin.join(name);
            let io = |step| {
                let path = link.clone();
                move |source| SharingError::Io { step, path, source }
            };
            match fs::remove_file(&link) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io("replacing simulated tool")(e));
                }
                _ => {}
            }
            std::os::unix::fs::symlink(exe, &link).map_err(io("linking simulated tool"))?;
            links.push(link);
        }
        let log = dir.join("tools.log");
        let mut tools = Tools::new(links[0].clone(), links[1].clone());
        tools
            .env
            .push((SIM_LOG_ENV.into(), path_str(&log)?.to_string()));
        Ok(tools)
    }

    /// Runs `nvidia-smi` with `args` (a read-only query such as `--query-gpu=…`) under the
    /// tools' environment and deadline, and returns what it printed.
    ///
    /// # Errors
    /// [`SharingError::Spawn`], [`SharingError::ToolTimeout`], or [`SharingError::ToolFailed`]
    /// with the exit status and the end of its output.
    pub fn query_smi(&self, args: &[&str]) -> Result<String, SharingError> {
        let cmd = super::CommandLine {
            program: self.nvidia_smi.clone(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: self.env.clone(),
            stdin: None,
        };
        super::exec::run_checked(&cmd, self.timeout, None).map(|done| done.stdout)
    }

    /// Same tools with a different per-call deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Tools {
        self.timeout = timeout;
        self
    }
}

fn find_file(root: &Path, name: &'static str, dirs: &[&str]) -> Result<PathBuf, SharingError> {
    let mut tried = Vec::new();
    for dir in dirs {
        let candidate = root.join(dir).join(name);
        if fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
            return Ok(fs::canonicalize(&candidate).unwrap_or(candidate));
        }
        tried.push(candidate);
    }
    Err(SharingError::ToolNotFound {
        tool: name,
        root: root.to_path_buf(),
        tried,
    })
}

/// `first:…:$VAR` with the current value of `var` kept at the end when set.
fn prepend(first: &[String], var: &str) -> String {
    let mut parts = first.to_vec();
    if let Ok(old) = std::env::var(var)
        && !old.is_empty()
    {
        parts.push(old);
    }
    parts.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"").unwrap();
    }

    #[test]
    fn tools_under_usr_bin_win_over_the_root_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        touch(&root.join("nvidia-smi"));
        touch(&root.join("usr/bin/nvidia-smi"));
        touch(&root.join("sbin/nvidia-cuda-mps-control"));
        touch(&root.join("usr/lib64/libnvidia-ml.so.1"));
        let tools = Tools::from_driver_root(root).unwrap();
        let canon = fs::canonicalize(root).unwrap();
        assert_eq!(tools.nvidia_smi, canon.join("usr/bin/nvidia-smi"));
        assert_eq!(
            tools.mps_control,
            canon.join("sbin/nvidia-cuda-mps-control")
        );
        let preload = &tools.env.iter().find(|(k, _)| k == "LD_PRELOAD").unwrap().1;
        let lib = canon.join("usr/lib64/libnvidia-ml.so.1");
        assert!(preload.starts_with(lib.to_str().unwrap()), "got {preload}");
        assert!(tools.env.iter().any(|(k, _)| k == "PATH"));
    }

    #[test]
    fn missing_tool_error_lists_every_path_tried() {
        let tmp = tempfile::tempdir().unwrap();
        let err = Tools::from_driver_root(tmp.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("nvidia-smi not found under driver root"),
            "{text}"
        );
        for dir in ["usr/bin", "opt/bin", "usr/sbin", "bin", "sbin"] {
            let want = tmp.path().join(dir).join("nvidia-smi");
            assert!(text.contains(want.to_str().unwrap()), "{text}");
        }
    }
}
