//! Fabric Manager through `fmpm`: `-l` (list as JSON), `-a <id>` (activate), `-d <id>`
//! (deactivate), each with `--unix-domain-socket <path>` or `--hostname <address>`.
//!
//! `fmpm` returns FM's `fmReturn_t` as its exit status (so `-24` exits 232) and prints
//! `Failed to … fmReturn: <n>` on stdout; this client reads the code from either.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::partitions::PartitionTable;
use super::{FabricError, codes};

/// Where FM listens for API clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `FM_CMD_UNIX_SOCKET_PATH` (NVIDIA's default `/run/nvidia-fabricmanager/socket`).
    Unix(PathBuf),
    /// `FM_CMD_BIND_INTERFACE` address (port 6666).
    Tcp(String),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Tcp(host) => write!(f, "tcp:{host}"),
        }
    }
}

/// NVIDIA's default FM socket, under the driver root.
pub const DEFAULT_SOCKET: &str = "run/nvidia-fabricmanager/socket";

/// Directories under the driver root searched for `fmpm`, in order.
const FMPM_DIRS: [&str; 7] = [
    "usr/bin",
    "usr/local/bin",
    "usr/sbin",
    "opt/bin",
    "bin",
    "sbin",
    "",
];

/// How long one `fmpm` call may take (its own connect timeout is 1 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `fmpm` against one FM endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmClient {
    /// The `fmpm` executable.
    pub program: PathBuf,
    /// FM's endpoint.
    pub endpoint: Endpoint,
    /// Extra environment of every call (the simulated tool's state directory).
    pub env: Vec<(String, String)>,
    /// Deadline of one call.
    pub timeout: Duration,
}

impl FmClient {
    /// A client running `program` against `endpoint`.
    pub fn new(program: impl Into<PathBuf>, endpoint: Endpoint) -> FmClient {
        FmClient {
            program: program.into(),
            endpoint,
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// `fmpm` under the driver root as the plugin sees it: the first file among
    /// `<root>/{usr/bin,usr/local/bin,usr/sbin,opt/bin,bin,sbin,}/fmpm`.
    ///
    /// # Errors
    /// [`FabricError::ToolNotFound`] listing every path tried.
    pub fn find(root: &Path) -> Result<PathBuf, FabricError> {
        let mut tried = Vec::new();
        for dir in FMPM_DIRS {
            let candidate = root.join(dir).join("fmpm");
            if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
                return Ok(candidate);
            }
            tried.push(candidate.display().to_string());
        }
        Err(FabricError::ToolNotFound { tried })
    }

    /// FM's partition list (`fmpm -l`), validated.
    ///
    /// # Errors
    /// [`FabricError::Unreachable`], [`FabricError::BadList`], or
    /// [`FabricError::Failed`] / [`FabricError::Spawn`].
    pub fn list(&self) -> Result<PartitionTable, FabricError> {
        let out = self.run(&["-l".to_string()])?;
        PartitionTable::parse(&out)
    }

    /// Activates partition `id` (`fmpm -a <id>`).
    ///
    /// # Errors
    /// [`FabricError::PartitionBusy`] when its GPUs are in another active partition;
    /// [`FabricError::Unreachable`]; otherwise [`FabricError::Failed`] with FM's code.
    pub fn activate(&self, id: u32) -> Result<(), FabricError> {
        self.run(&["-a".to_string(), id.to_string()])
            .map(|_| ())
            .map_err(|e| match e {
                FabricError::Failed { code, detail, .. }
                    if code == codes::RESOURCE_USED_IN_ANOTHER_PARTITION =>
                {
                    FabricError::PartitionBusy {
                        partition: id,
                        detail,
                    }
                }
                other => other,
            })
    }

    /// Deactivates partition `id` (`fmpm -d <id>`).
    ///
    /// # Errors
    /// [`FabricError::Unreachable`]; otherwise [`FabricError::Failed`] with FM's code
    /// (`FM_ST_UNINITIALIZED` for a partition that is not active).
    pub fn deactivate(&self, id: u32) -> Result<(), FabricError> {
        self.run(&["-d".to_string(), id.to_string()]).map(|_| ())
    }

    fn endpoint_args(&self) -> Vec<String> {
        match &self.endpoint {
            Endpoint::Unix(path) => vec![
                "--unix-domain-socket".into(),
                path.to_string_lossy().into_owned(),
            ],
            Endpoint::Tcp(host) => vec!["--hostname".into(), host.clone()],
        }
    }

    /// Runs `fmpm <args> <endpoint>` and returns its stdout.
    fn run(&self, args: &[String]) -> Result<String, FabricError> {
        if let Endpoint::Unix(path) = &self.endpoint
            && std::fs::symlink_metadata(path).is_err()
        {
            return Err(FabricError::Unreachable {
                endpoint: self.endpoint.to_string(),
                detail: format!("the socket {} does not exist", path.display()),
            });
        }
        let mut all = args.to_vec();
        all.extend(self.endpoint_args());
        let spawn_err = |detail: String| FabricError::Spawn {
            program: self.program.display().to_string(),
            detail,
        };
        let mut child = Command::new(&self.program)
            .args(&all)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| spawn_err(e.to_string()))?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(spawn_err(format!("no answer within {:?}", self.timeout)));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(spawn_err(e.to_string())),
            }
        };
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        if status.success() {
            return Ok(stdout);
        }
        let said = format!("{}{}", stdout.trim(), stderr.trim())
            .trim()
            .to_string();
        let code = fm_return(&stdout)
            .or_else(|| status.code().map(|c| i32::from(c as u8 as i8)))
            .unwrap_or(-2);
        if code == codes::CONNECTION_NOT_VALID || said.contains("Failed to connect") {
            return Err(FabricError::Unreachable {
                endpoint: self.endpoint.to_string(),
                detail: said,
            });
        }
        Err(FabricError::Failed {
            args: all.join(" "),
            code,
            detail: said,
        })
    }
}

/// The `fmReturn: <n>` fmpm prints on failure.
fn fm_return(stdout: &str) -> Option<i32> {
    let (_, rest) = stdout.rsplit_once("fmReturn:")?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_return_code_is_read_from_fmpms_message() {
        assert_eq!(
            fm_return("Failed to activate partition. fmReturn: -24\n"),
            Some(-24)
        );
        assert_eq!(fm_return("nothing"), None);
    }

    #[test]
    fn a_missing_socket_is_unreachable_without_running_anything() {
        let client = FmClient::new(
            "/nonexistent/fmpm",
            Endpoint::Unix("/nonexistent/socket".into()),
        );
        let err = client.list().unwrap_err();
        assert!(matches!(err, FabricError::Unreachable { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("/nonexistent/socket does not exist"),
            "{err}"
        );
    }

    #[test]
    fn fmpm_is_looked_for_under_the_driver_root_naming_every_path_tried() {
        let tmp = tempfile::tempdir().unwrap();
        let err = FmClient::find(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("usr/local/bin/fmpm"), "{err}");
        std::fs::create_dir_all(tmp.path().join("usr/local/bin")).unwrap();
        std::fs::write(tmp.path().join("usr/local/bin/fmpm"), b"").unwrap();
        assert_eq!(
            FmClient::find(tmp.path()).unwrap(),
            tmp.path().join("usr/local/bin/fmpm")
        );
    }
}
