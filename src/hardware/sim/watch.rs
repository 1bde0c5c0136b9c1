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
use std::time::{Duration, Instant};

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
            Ok(event) => names_state(&event),
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

/// A watch of the state file's replacements for a caller that waits on its own thread: the
/// simulated NVML library's `nvmlEventSetWait_v2`, which blocks as a real driver's wait does
/// instead of polling the state. Made before the caller looks at the state, so a change made
/// between the look and the wait still ends the wait.
pub struct StateWatch {
    fd: rustix::fd::OwnedFd,
}

impl StateWatch {
    /// Watches `dir`; `None` when the kernel refuses the watch (the caller then polls).
    ///
    /// Only renames into the directory are watched: every writer of the state replaces the
    /// file by renaming a new one over it, while the lock file is opened and closed by every
    /// operation of every process, reads included, and would wake the waiter each time.
    pub fn new(dir: &Path) -> Option<StateWatch> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()?;
        inotify::add_watch(&fd, dir, WatchFlags::MOVED_TO).ok()?;
        Some(StateWatch { fd })
    }

    /// Blocks until the state file is replaced, or `timeout` passes; whether it was
    /// replaced. Changes of other files in the directory do not end the wait. A failing
    /// descriptor ends it early as a change, so the caller looks again rather than sleeps.
    pub fn wait(&self, timeout: Duration) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let until = Timespec::try_from(left).unwrap_or(Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            });
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match poll(&mut fds, Some(&until)) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(_) => return true,
            }
            if self.drain() {
                return true;
            }
            if left.is_zero() {
                return false;
            }
        }
    }

    /// Reads every queued event; whether one named the state file.
    fn drain(&self) -> bool {
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut events = inotify::Reader::new(&self.fd, &mut buf);
        let mut named_state = false;
        loop {
            match events.next() {
                Ok(event) => named_state |= names_state(&event),
                Err(Errno::INTR) => continue,
                // EAGAIN: nothing more queued; any other error: nothing more to read.
                Err(_) => return named_state,
            }
        }
    }
}

/// Whether an inotify event is about the state file.
fn names_state(event: &inotify::Event<'_>) -> bool {
    event
        .file_name()
        .is_some_and(|name| name.to_bytes() == STATE_FILE.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_blocking_watch_ends_at_a_state_change_and_not_at_other_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let watch = StateWatch::new(dir.path()).expect("inotify works here");
        assert!(StateWatch::new(&dir.path().join("absent")).is_none());
        // Nothing changed: the wait times out.
        assert!(!watch.wait(Duration::from_millis(50)));
        // Another file does not end the wait, nor does the lock file's use.
        std::fs::write(dir.path().join("sim-gpu-state.lock"), b"").expect("write");
        crate::fsutil::write_atomic(&dir.path().join("other.json"), b"{}", 0o644)
            .expect("write other");
        assert!(!watch.wait(Duration::from_millis(50)));
        // A change made before the wait (after the watch was made) ends it at once.
        crate::fsutil::write_atomic(&dir.path().join(STATE_FILE), b"{}", 0o644)
            .expect("write state");
        let started = std::time::Instant::now();
        assert!(watch.wait(PATIENCE));
        assert!(started.elapsed() < PATIENCE / 2, "{:?}", started.elapsed());
        // A change from another thread while waiting ends it too.
        let path = dir.path().join(STATE_FILE);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            crate::fsutil::write_atomic(&path, b"{}", 0o644).expect("replace");
        });
        assert!(watch.wait(PATIENCE));
        writer.join().expect("writer");
    }
}
