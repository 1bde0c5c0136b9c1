//! Taking an MPS daemon down: quit (then SIGKILL), compute mode back to DEFAULT, shm
//! unmounted, directory removed. Shared by `stop` and the rollback of a failed `start`.

use std::fs;
use std::thread;
use std::time::Instant;

use super::commands::shm_unmount;
use super::control::DaemonDirs;
use super::exec;
use super::mps::{FIRST_PROBE_DELAY, MAX_PROBE_DELAY, MpsManager};
use super::procfs::{daemon_alive, is_mount_point, read_pid};
use super::{ComputeMode, SharingError};

impl MpsManager {
    /// Ends the daemon, restores compute mode, unmounts shm; removes the directory only if
    /// all of that worked, so a retry can redo what failed.
    pub(super) fn teardown(
        &self,
        id: &str,
        dirs: &DaemonDirs,
        gpus: &[String],
    ) -> Result<(), SharingError> {
        let mut first_error = self.end_daemon(id, dirs).err();
        for uuid in gpus {
            if let Err(e) = self.tools.set_compute_mode(uuid, ComputeMode::Default) {
                first_error.get_or_insert(e);
            }
        }
        if is_mount_point(&self.options.proc_root, &dirs.shm)
            && let Err(e) = shm_unmount(&dirs.shm)
                .and_then(|cmd| exec::run_checked(&cmd, self.tools.timeout, None))
        {
            first_error.get_or_insert(e);
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        match fs::remove_dir_all(&dirs.base) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SharingError::Io {
                step: "removing MPS daemon directory",
                path: dirs.base.clone(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    fn end_daemon(&self, id: &str, dirs: &DaemonDirs) -> Result<(), SharingError> {
        let Some(pid) = read_pid(&dirs.pid_file()) else {
            return Ok(());
        };
        // Only a process that is this daemon is asked to quit or killed: the pid file may
        // name a dead daemon's pid, reused since by anything.
        if !daemon_alive(&self.options.proc_root, pid, &dirs.pipe) {
            return Ok(());
        }
        // A daemon that cannot take `quit` is killed below; its answer does not matter.
        let _ = self.tools.control(dirs, "quit");
        if self.wait_exit(pid, &dirs.pipe) {
            return Ok(());
        }
        // It may have exited between the check and the kill.
        let _ = exec::kill(pid, self.tools.timeout);
        if self.wait_exit(pid, &dirs.pipe) {
            Ok(())
        } else {
            Err(SharingError::DaemonWontDie {
                id: id.to_string(),
                pid,
            })
        }
    }

    fn wait_exit(&self, pid: u32, pipe_dir: &std::path::Path) -> bool {
        let deadline = Instant::now() + self.options.stop_timeout;
        let mut delay = FIRST_PROBE_DELAY;
        while daemon_alive(&self.options.proc_root, pid, pipe_dir) {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            thread::sleep(delay.min(deadline - now));
            delay = (delay * 2).min(MAX_PROBE_DELAY);
        }
        true
    }
}
