//! Sending a signal to a child process (SIGUSR1 to reload `nvidia-imex`, SIGTERM to stop it):
//! std can only SIGKILL a child, so this is libc's `kill(2)` at its C ABI.

use std::ffi::c_int;

/// The signals the IMEX daemon understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGUSR1 (10 on Linux): re-read the nodes config and restart connections.
    User1,
    /// SIGTERM (15): shut down cleanly.
    Terminate,
    /// SIGKILL (9): end at once, as a crash or an OOM kill would.
    Kill,
}

impl Signal {
    fn number(self) -> c_int {
        match self {
            Signal::User1 => 10,
            Signal::Terminate => 15,
            Signal::Kill => 9,
        }
    }
}

unsafe extern "C" {
    fn kill(pid: c_int, sig: c_int) -> c_int;
}

/// Sends `signal` to process `pid`. Fails with the OS error (e.g. ESRCH when the process is
/// gone, EPERM when it is not ours); a `pid` that does not fit a `pid_t` is refused.
pub fn send(pid: u32, signal: Signal) -> std::io::Result<()> {
    let pid = c_int::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) takes two integers and touches no memory of ours; a positive pid names
    // one process, never a group.
    let rc = unsafe { kill(pid, signal.number()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
