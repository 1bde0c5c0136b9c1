//! The `nvidia-imex` child: started as `nvidia-imex -c <config>`, told to reload with SIGUSR1,
//! restarted only after it exited (with a doubling backoff), asked for readiness with
//! `nvidia-imex-ctl -c <config> -q`, stopped with SIGTERM.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

use super::DaemonError;
use crate::compute_domain::imex::signal::{self, Signal};

/// First wait before restarting a crashed daemon; doubles per crash up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long `nvidia-imex-ctl -q` may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// How the last `nvidia-imex` ended, for the object's reason/message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    /// Exit status as the OS reports it (`exit status: 1`, `signal: 9 (SIGKILL)`).
    pub status: String,
    /// The end of what it printed on stderr.
    pub stderr_tail: String,
    /// How many times it ended so far.
    pub count: u32,
}

/// The supervised `nvidia-imex`.
pub struct ImexProcess {
    /// This pod's IP, passed on as `POD_IP` (what the simulated tools bind and query when the
    /// config names no address).
    pod_ip: String,
    imex_bin: PathBuf,
    ctl_bin: PathBuf,
    config: PathBuf,
    child: Option<Child>,
    /// Set after an exit: when the next start may happen.
    restart_at: Option<Instant>,
    backoff: Duration,
    /// The last exit, until a start succeeds in turning Ready.
    pub last_crash: Option<Crash>,
    /// Starts so far.
    pub starts: u32,
    /// The last line the daemon printed on stderr.
    stderr_tail: std::sync::Arc<std::sync::Mutex<String>>,
    /// The task reading the running daemon's stderr.
    stderr_reader: Option<tokio::task::JoinHandle<()>>,
}

impl ImexProcess {
    /// A supervisor for `imex_bin -c config` (with `POD_IP=pod_ip`); nothing runs yet.
    pub fn new(pod_ip: &str, imex_bin: PathBuf, ctl_bin: PathBuf, config: PathBuf) -> ImexProcess {
        ImexProcess {
            pod_ip: pod_ip.to_string(),
            imex_bin,
            ctl_bin,
            config,
            child: None,
            restart_at: None,
            backoff: FIRST_BACKOFF,
            last_crash: None,
            starts: 0,
            stderr_tail: Default::default(),
            stderr_reader: None,
        }
    }

    /// The child's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Notices an exit (recording it as a crash and scheduling the restart), then starts the
    /// daemon if none runs and the backoff has passed. Fails only when it cannot be spawned
    /// (also recorded as a crash, so it is retried).
    pub async fn supervise(&mut self) -> Result<(), DaemonError> {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            // The pipe is at its end once the process is gone; let the reader catch up.
            if let Some(reader) = self.stderr_reader.take() {
                let _ = tokio::time::timeout(Duration::from_millis(200), reader).await;
            }
            let tail = self
                .stderr_tail
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            self.child = None;
            self.crashed(status.to_string(), tail);
        }
        if self.child.is_some() || self.restart_at.is_some_and(|t| Instant::now() < t) {
            return Ok(());
        }
        let spawned = Command::new(&self.imex_bin)
            .env("POD_IP", &self.pod_ip)
            .arg("-c")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Ok(mut child) => {
                self.stderr_tail
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                self.stderr_reader = child.stderr.take().map(|err| self.drain(err));
                self.child = Some(child);
                self.starts += 1;
                self.restart_at = None;
                Ok(())
            }
            Err(source) => {
                self.crashed(format!("could not start: {source}"), String::new());
                Err(DaemonError::Spawn {
                    program: self.imex_bin.clone(),
                    source,
                })
            }
        }
    }

    /// Reads the daemon's stderr to its end, so a chatty daemon never blocks on a full pipe:
    /// every line goes to this process's log, the last one is kept for a crash message.
    fn drain(&self, err: tokio::process::ChildStderr) -> tokio::task::JoinHandle<()> {
        let tail = self.stderr_tail.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(err).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "nvidia-imex", "{line}");
                *tail.lock().unwrap_or_else(|p| p.into_inner()) = line;
            }
        })
    }

    fn crashed(&mut self, status: String, stderr_tail: String) {
        let count = self.last_crash.as_ref().map_or(0, |c| c.count) + 1;
        self.last_crash = Some(Crash {
            status,
            stderr_tail,
            count,
        });
        self.restart_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// The daemon turned Ready: the next crash starts the backoff afresh.
    pub fn healthy(&mut self) {
        self.backoff = FIRST_BACKOFF;
    }

    /// Tells the running daemon to re-read its nodes config (SIGUSR1); nothing when none runs
    /// (the next start reads the file anyway).
    pub fn reload(&self) -> Result<(), DaemonError> {
        match self.pid() {
            Some(pid) => signal::send(pid, Signal::User1)
                .map_err(|source| DaemonError::Signal { pid, source }),
            None => Ok(()),
        }
    }

    /// `nvidia-imex-ctl -c <config> -q`, trimmed: `READY` when ready, else what it printed
    /// (empty when it could not run).
    pub async fn query(&self) -> String {
        let out = Command::new(&self.ctl_bin)
            .env("POD_IP", &self.pod_ip)
            .arg("-c")
            .arg(&self.config)
            .arg("-q")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(QUERY_TIMEOUT, out).await {
            Ok(Ok(out)) => String::from_utf8_lossy(&out.stdout).trim().to_string(),
            _ => String::new(),
        }
    }

    /// Stops the daemon with SIGTERM and waits up to 5 s, then kills it.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = signal::send(pid, Signal::Terminate);
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}
