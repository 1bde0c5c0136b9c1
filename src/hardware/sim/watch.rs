//! Waking the plugin when the simulated node's state file is replaced: an inotify watch on
//! the state directory, read by one thread that sleeps in `read(2)` until the kernel reports
//! a change. Faults injected by `gpu-dra sim-fault` (another process) and changes the
//! plugin's own calls make both replace the file; the thread turns each into a
//! notification, and an idle plugin wakes for nothing else.
//!
//! Each wake-up of an idle process costs far more CPU than the work it does (a cold cache:
//! about 0.3 ms a wake-up on a 2-core VM, the same whether it then stats a file or not), so
//! polling the file five times a second was most of the idle plugin's CPU.

use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::{Arc, Weak};

use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use rustix::io::Errno;
use tokio::sync::Notify;
use tracing::{debug, warn};

use super::state::STATE_FILE;

/// Starts watching `dir` for replacements (a rename into place, or a write) of the state
/// file; returns the signal notified at each one. `None` when the kernel refuses the watch
/// (no inotify, or the user's watch limit reached): the caller then polls.
///
/// The thread ends at the first change after every holder of the returned signal has
/// dropped it.
pub(super) fn state_changes(dir: &Path) -> Option<Arc<Notify>> {
    let started = inotify::init(CreateFlags::CLOEXEC).and_then(|fd| {
        inotify::add_watch(
            &fd,
            dir,
            WatchFlags::MOVED_TO | WatchFlags::CLOSE_WRITE | WatchFlags::CREATE,
        )
        .map(|_| fd)
    });
    let fd = match started {
        Ok(fd) => fd,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot watch the simulated node's state directory; polling it instead");
            return None;
        }
    };
    let signal = Arc::new(Notify::new());
    let weak = Arc::downgrade(&signal);
    let spawned = std::thread::Builder::new()
        .name("sim-state-watch".into())
        .spawn(move || read_events(&fd, &weak));
    match spawned {
        Ok(_) => Some(signal),
        Err(e) => {
            warn!(error = %e, "cannot start the simulated state watch thread; polling instead");
            None
        }
    }
}

/// Blocks on the inotify descriptor and notifies `signal` for every event naming the state
/// file, until the signal has no holder left or the descriptor fails.
fn read_events(fd: &rustix::fd::OwnedFd, signal: &Weak<Notify>) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
    let mut events = inotify::Reader::new(fd, &mut buf);
    loop {
        let named_state = match events.next() {
            Ok(event) => event
                .file_name()
                .is_some_and(|name| name.to_bytes() == STATE_FILE.as_bytes()),
            Err(Errno::INTR) => continue,
            Err(e) => {
                warn!(error = %e, "reading the simulated state watch; health changes are now found on the inventory interval only");
                return;
            }
        };
        if !named_state {
            continue;
        }
        match signal.upgrade() {
            Some(signal) => signal.notify_one(),
            None => {
                debug!("nobody waits for simulated state changes any more");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Waits up to `wait` for a notification; whether one came.
    fn notified_within(signal: &Notify, wait: Duration) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async { tokio::time::timeout(wait, signal.notified()).await.is_ok() })
    }

    const PATIENCE: Duration = Duration::from_secs(5);

    #[test]
    fn a_replaced_state_file_notifies_and_other_files_do_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let signal = state_changes(dir.path()).expect("inotify works here");
        // Another file in the directory (the lock file, say) says nothing.
        std::fs::write(dir.path().join("sim-gpu-state.lock"), b"").expect("write");
        crate::fsutil::write_atomic(&dir.path().join(STATE_FILE), b"{}", 0o644)
            .expect("write state");
        assert!(
            notified_within(&signal, PATIENCE),
            "a rename into place notifies"
        );
        // The lock file's event was skipped: no permit is left behind by it. (A permit from
        // a second event of the state file's write would be; the rename makes exactly one.)
        assert!(
            !notified_within(&signal, Duration::from_millis(200)),
            "only the state file's replacement notified"
        );
        std::fs::write(dir.path().join(STATE_FILE), b"{}").expect("rewrite in place");
        assert!(
            notified_within(&signal, PATIENCE),
            "a write in place notifies too"
        );
    }

    #[test]
    fn a_directory_that_cannot_be_watched_means_polling() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(state_changes(&dir.path().join("absent")).is_none());
    }
}
