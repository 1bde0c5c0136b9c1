//! MPS control daemons supervised by the plugin: start with verified limits, check, restart,
//! stop. Each daemon lives in `<root>/<id>/{pipe,log,shm}` with its spec in `spec.json`, so a
//! restarted plugin finds (or cleans) what an earlier one started.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use super::commands::{half_mem_total, shm_mount};
use super::control::{DaemonDirs, parse_mib, parse_percentage};
use super::edits::{ClientEdits, client_edits};
use super::exec;
use super::procfs::{daemon_alive, read_pid};
use super::spec::{self, MIB, MpsDaemonSpec, MpsDevice, full_gpus, validate_daemon_id};
use super::{ComputeMode, SharingError, Tools};

/// How the manager runs daemons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsOptions {
    /// Mount a tmpfs on `<id>/shm` and give it to the daemon as `/dev/shm` in a private mount
    /// namespace (real GPUs, needs root). Off: a plain directory (simulation, tests).
    pub isolate_shm: bool,
    /// Where `meminfo`, `<pid>/stat` and `self/mountinfo` are read.
    pub proc_root: PathBuf,
    /// How long a new daemon may take to answer the control protocol.
    pub ready_timeout: Duration,
    /// How long `quit` (and then SIGKILL) may take to end a daemon.
    pub stop_timeout: Duration,
}

impl Default for MpsOptions {
    fn default() -> MpsOptions {
        MpsOptions {
            isolate_shm: false,
            proc_root: PathBuf::from("/proc"),
            ready_timeout: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(5),
        }
    }
}

/// A running daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsStatus {
    pub id: String,
    pub pid: u32,
    pub pipe_dir: PathBuf,
    /// True when `start` found it already running with the same spec.
    pub already_running: bool,
}

/// What [`MpsManager::ensure_running`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    /// Alive and answering; nothing done.
    Running(MpsStatus),
    /// Was dead or silent; started again with its limits re-sent and verified.
    Restarted(MpsStatus),
}

/// Starts, checks and stops MPS control daemons under one root (`<plugin-dir>/mps`).
#[derive(Debug, Clone)]
pub struct MpsManager {
    pub tools: Tools,
    pub root: PathBuf,
    pub options: MpsOptions,
}

/// Backoff between readiness and exit probes: short first, capped, never a fixed sleep.
pub(super) const FIRST_PROBE_DELAY: Duration = Duration::from_millis(1);
pub(super) const MAX_PROBE_DELAY: Duration = Duration::from_millis(50);

impl MpsManager {
    pub fn new(tools: Tools, root: impl Into<PathBuf>, options: MpsOptions) -> MpsManager {
        MpsManager {
            tools,
            root: root.into(),
            options,
        }
    }

    fn dirs(&self, id: &str) -> DaemonDirs {
        DaemonDirs::new(&self.root, id)
    }

    /// Starts the daemon `spec` describes and returns once it answers the control protocol
    /// with its limits set and read back. Idempotent: a daemon with this id that is alive,
    /// answering and recorded with the same spec is returned as is; leftovers of a dead one
    /// are cleaned first.
    ///
    /// Steps: directories (0755), spec record, shm tmpfs (with `isolate_shm`), compute mode
    /// EXCLUSIVE_PROCESS on each full GPU, `nvidia-cuda-mps-control -d`, readiness, limits.
    ///
    /// # Errors
    /// An invalid spec (nothing run); [`SharingError::SpecConflict`] when the id runs with
    /// another spec; otherwise the failing step's error, after everything this call did was
    /// undone ([`SharingError::RollbackFailed`] if undoing failed too).
    pub fn start(&self, spec: &MpsDaemonSpec) -> Result<MpsStatus, SharingError> {
        spec.validate()?;
        let dirs = self.dirs(&spec.id);
        if dirs.base.exists() {
            if let Some(status) = self.healthy(&dirs, &spec.id) {
                return match spec::read(&dirs.spec) {
                    Ok(Some(recorded)) if recorded == *spec => Ok(status),
                    _ => Err(SharingError::SpecConflict {
                        id: spec.id.clone(),
                        path: dirs.spec,
                    }),
                };
            }
            self.stop(&spec.id, &spec.devices)?;
        }
        self.start_fresh(spec, &dirs)
    }

    /// Supervision: if the daemon is alive and answers, `Running`; otherwise its leftovers are
    /// stopped and it is started again from `spec` (limits re-sent and verified):
    /// `Restarted`. Call periodically while the claim is prepared.
    ///
    /// # Errors
    /// As [`MpsManager::start`] and [`MpsManager::stop`].
    pub fn ensure_running(&self, spec: &MpsDaemonSpec) -> Result<Ensured, SharingError> {
        spec.validate()?;
        let dirs = self.dirs(&spec.id);
        if let Some(status) = self.healthy(&dirs, &spec.id) {
            return Ok(Ensured::Running(status));
        }
        // Alive but not answering (busy, or short of memory for the client it forks): its
        // clients are still served, so it is reported, never killed on one failed probe.
        if let Some(pid) = read_pid(&dirs.pid_file())
            && daemon_alive(&self.options.proc_root, pid, &dirs.pipe)
        {
            return Err(SharingError::NotReady {
                id: spec.id.clone(),
                waited: self.tools.timeout,
                last: format!("process {pid} is alive but its control pipe did not answer"),
            });
        }
        self.stop(&spec.id, &spec.devices)?;
        self.start_fresh(spec, &dirs).map(Ensured::Restarted)
    }

    /// Stops daemon `id`: `quit` over the control pipe, SIGKILL if it has not exited within
    /// the stop timeout, compute mode DEFAULT on its full GPUs (`devices`, or the recorded
    /// ones when `devices` is empty), shm unmounted, `<root>/<id>` removed. Every step
    /// tolerates work already done; an unknown id is success.
    ///
    /// # Errors
    /// The first failing step's error; the directory is then kept so a retry redoes the rest.
    pub fn stop(&self, id: &str, devices: &[MpsDevice]) -> Result<(), SharingError> {
        validate_daemon_id(id)?;
        let dirs = self.dirs(id);
        if !dirs.base.exists() {
            return Ok(());
        }
        let gpus = if devices.is_empty() {
            match spec::read(&dirs.spec) {
                Ok(Some(recorded)) => recorded.full_gpus(),
                _ => Vec::new(),
            }
        } else {
            full_gpus(devices)
        };
        self.teardown(id, &dirs, &gpus)
    }

    /// Ids of daemons with state on disk (running or not), sorted: compare with the prepared
    /// claims to stop orphans after a restart.
    ///
    /// # Errors
    /// [`SharingError::Io`] when the root cannot be listed (a missing root is empty).
    pub fn list(&self) -> Result<Vec<String>, SharingError> {
        let io = |source| SharingError::Io {
            step: "listing MPS daemons in",
            path: self.root.clone(),
            source,
        };
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && validate_daemon_id(&name).is_ok() {
                ids.push(name);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// The mounts and env a client container of daemon `id` needs: the pipe dir at
    /// `/tmp/nvidia-mps`, the shm dir at `/dev/shm`, `CUDA_MPS_PIPE_DIRECTORY`.
    pub fn client_edits(&self, id: &str) -> ClientEdits {
        let dirs = self.dirs(id);
        client_edits(dirs.pipe, dirs.shm)
    }

    /// Alive (pid file, live process) and answering the control protocol.
    fn healthy(&self, dirs: &DaemonDirs, id: &str) -> Option<MpsStatus> {
        let pid = read_pid(&dirs.pid_file())?;
        if !daemon_alive(&self.options.proc_root, pid, &dirs.pipe) {
            return None;
        }
        let answer = self
            .tools
            .control(dirs, "get_default_active_thread_percentage")
            .ok()?;
        parse_percentage(&answer)?;
        Some(MpsStatus {
            id: id.to_string(),
            pid,
            pipe_dir: dirs.pipe.clone(),
            already_running: true,
        })
    }

    fn start_fresh(
        &self,
        spec: &MpsDaemonSpec,
        dirs: &DaemonDirs,
    ) -> Result<MpsStatus, SharingError> {
        let mut exclusive = Vec::new();
        match self.try_start(spec, dirs, &mut exclusive) {
            Ok(status) => Ok(status),
            Err(cause) => match self.teardown(&spec.id, dirs, &exclusive) {
                Ok(()) => Err(cause),
                Err(cleanup) => Err(SharingError::RollbackFailed {
                    id: spec.id.clone(),
                    cleanup: cleanup.to_string(),
                    cause: Box::new(cause),
                }),
            },
        }
    }

    /// The start steps; `exclusive` collects the GPUs whose compute mode was changed, so a
    /// rollback restores exactly those.
    fn try_start(
        &self,
        spec: &MpsDaemonSpec,
        dirs: &DaemonDirs,
        exclusive: &mut Vec<String>,
    ) -> Result<MpsStatus, SharingError> {
        for dir in [&dirs.base, &dirs.pipe, &dirs.log, &dirs.shm] {
            make_dir(dir)?;
        }
        spec::write(&dirs.spec, spec)?;
        if self.options.isolate_shm {
            let size = self.shm_size()?;
            exec::run_checked(&shm_mount(&dirs.shm, &size)?, self.tools.timeout, None)?;
        }
        for uuid in spec.full_gpus() {
            self.tools
                .set_compute_mode(&uuid, ComputeMode::ExclusiveProcess)?;
            exclusive.push(uuid);
        }
        let daemon = self
            .tools
            .daemon_command(dirs, spec, self.options.isolate_shm)?;
        let startup = dirs.startup_output();
        exec::run_checked(&daemon, self.tools.timeout, Some(&startup))?;
        self.wait_ready(dirs, &spec.id)?;
        self.apply_limits(dirs, spec)?;
        let pid = read_pid(&dirs.pid_file()).ok_or_else(|| SharingError::NotReady {
            id: spec.id.clone(),
            waited: Duration::ZERO,
            last: format!("no pid in {}", dirs.pid_file().display()),
        })?;
        Ok(MpsStatus {
            id: spec.id.clone(),
            pid,
            pipe_dir: dirs.pipe.clone(),
            already_running: false,
        })
    }

    fn shm_size(&self) -> Result<String, SharingError> {
        let path = self.options.proc_root.join("meminfo");
        let text = fs::read_to_string(&path).map_err(|e| SharingError::MemInfo {
            path: path.clone(),
            problem: e.to_string(),
        })?;
        half_mem_total(&text).ok_or_else(|| SharingError::MemInfo {
            path,
            problem: "no `MemTotal: <n> kB` line".into(),
        })
    }

    /// Polls `get_default_active_thread_percentage` with a growing backoff until it answers
    /// or the ready timeout passes.
    fn wait_ready(&self, dirs: &DaemonDirs, id: &str) -> Result<(), SharingError> {
        let started = Instant::now();
        let deadline = started + self.options.ready_timeout;
        let mut delay = FIRST_PROBE_DELAY;
        loop {
            let last = match self
                .tools
                .control(dirs, "get_default_active_thread_percentage")
            {
                Ok(answer) if parse_percentage(&answer).is_some() => return Ok(()),
                Ok(answer) => format!("unexpected answer {answer:?}"),
                Err(e) => e.to_string(),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(SharingError::NotReady {
                    id: id.to_string(),
                    waited: now - started,
                    last,
                });
            }
            thread::sleep(delay.min(deadline - now));
            delay = (delay * 2).min(MAX_PROBE_DELAY);
        }
    }

    /// Sends the default limits and reads each one back.
    fn apply_limits(&self, dirs: &DaemonDirs, spec: &MpsDaemonSpec) -> Result<(), SharingError> {
        let mismatch = |command: String, want: String, got: String| SharingError::LimitMismatch {
            id: spec.id.clone(),
            command,
            want,
            got,
        };
        if let Some(pct) = spec.active_thread_percentage {
            let tools = &self.tools;
            tools.control(dirs, &format!("set_default_active_thread_percentage {pct}"))?;
            let get = "get_default_active_thread_percentage";
            let got = tools.control(dirs, get)?;
            if parse_percentage(&got) != Some(f64::from(pct)) {
                return Err(mismatch(get.into(), pct.to_string(), got));
            }
        }
        for (ordinal, bytes) in spec.pinned_memory_bytes.iter().enumerate() {
            let Some(bytes) = bytes else { continue };
            let mib = bytes / MIB;
            let set = format!("set_default_device_pinned_mem_limit {ordinal} {mib}M");
            self.tools.control(dirs, &set)?;
            let get = format!("get_default_device_pinned_mem_limit {ordinal}");
            let got = self.tools.control(dirs, &get)?;
            if parse_mib(&got) != Some(mib) {
                return Err(mismatch(get, format!("{mib}M"), got));
            }
        }
        Ok(())
    }
}

/// Creates `dir` with mode 0755 whatever the umask: clients of any UID must reach the pipe.
fn make_dir(dir: &Path) -> Result<(), SharingError> {
    let io = |step| {
        move |source| SharingError::Io {
            step,
            path: dir.to_path_buf(),
            source,
        }
    };
    fs::create_dir_all(dir).map_err(io("creating MPS directory"))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(io("setting mode of"))
}
