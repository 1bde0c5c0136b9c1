//! IMEX: the daemon's config files ([`config`]) and the simulated `nvidia-imex` and
//! `nvidia-imex-ctl`, which the `gpu-dra` binary plays when run under those names (like the
//! simulated MPS tools), so `gpu-dra imex-daemon` drives them exactly as it drives the real
//! ones: `nvidia-imex -c <config>`, SIGUSR1 to reload the nodes config, `nvidia-imex-ctl -q`
//! for readiness.

pub mod config;
pub mod signal;
mod simctl;
mod simd;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Errors installing the simulated tools.
#[derive(Debug, thiserror::Error)]
pub enum ImexToolError {
    /// Creating the directory or a link failed.
    #[error("{step} {} failed", path.display())]
    Io {
        /// What was being done.
        step: &'static str,
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The IMEX tools the binary can play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImexTool {
    /// `nvidia-imex`, the daemon.
    Daemon,
    /// `nvidia-imex-ctl`, its query tool.
    Ctl,
}

impl ImexTool {
    /// The executable name.
    pub fn name(self) -> &'static str {
        match self {
            ImexTool::Daemon => "nvidia-imex",
            ImexTool::Ctl => "nvidia-imex-ctl",
        }
    }
}

/// The tool named by `argv[0]`'s file name, if it is one of the simulated IMEX tools.
pub fn personality(argv0: &OsStr) -> Option<ImexTool> {
    let name = Path::new(argv0).file_name()?;
    [ImexTool::Daemon, ImexTool::Ctl]
        .into_iter()
        .find(|t| name == t.name())
}

/// Runs the simulated `tool` with `args` (argv without `argv[0]`) and returns its exit code.
pub fn run(tool: ImexTool, args: Vec<String>) -> ExitCode {
    match tool {
        ImexTool::Daemon => simd::run(&args),
        ImexTool::Ctl => simctl::run(&args),
    }
}

/// Links `<dir>/nvidia-imex` and `<dir>/nvidia-imex-ctl` to `exe` (the `gpu-dra` binary),
/// replacing older links, and returns their paths (daemon, ctl).
pub fn install_simulated(exe: &Path, dir: &Path) -> Result<(PathBuf, PathBuf), ImexToolError> {
    std::fs::create_dir_all(dir).map_err(|source| ImexToolError::Io {
        step: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    let link = |tool: ImexTool| -> Result<PathBuf, ImexToolError> {
        let path = dir.join(tool.name());
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ImexToolError::Io {
                    step: "replacing",
                    path,
                    source: e,
                });
            }
            _ => {}
        }
        std::os::unix::fs::symlink(exe, &path).map_err(|source| ImexToolError::Io {
            step: "linking",
            path: path.clone(),
            source,
        })?;
        Ok(path)
    };
    Ok((link(ImexTool::Daemon)?, link(ImexTool::Ctl)?))
}
