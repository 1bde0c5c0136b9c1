//! The plugin lock: one prepare or unprepare at a time on the node, even across two plugin
//! instances running side by side during a rolling update.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::KubeletError;

/// An exclusive `flock` on a file shared by every plugin instance, fronted by an in-process
/// mutex so that waiting calls of this instance queue on the runtime rather than each parking
/// a blocking thread on the file.
#[derive(Debug, Clone)]
pub struct PluginLock {
    path: PathBuf,
    local: Arc<Mutex<()>>,
}

/// Holds the lock; dropping it closes the file, which releases the `flock`.
#[derive(Debug)]
pub struct PluginLockGuard {
    _file: File,
    _local: OwnedMutexGuard<()>,
}

impl PluginLock {
    /// A lock on `path`; the file is created on first use.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            local: Arc::new(Mutex::new(())),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until no other call of this or any other instance holds the lock, then takes it.
    ///
    /// Fails when the lock file cannot be opened or locked; nothing is held then.
    pub async fn acquire(&self) -> Result<PluginLockGuard, KubeletError> {
        let local = Arc::clone(&self.local).lock_owned().await;
        // Uncontended (no sibling instance mid-call), the usual case: taken right here, without
        // handing the wait to a blocking thread and back.
        let file = open_lock_file(&self.path)?;
        match file.try_lock() {
            Ok(()) => {
                return Ok(PluginLockGuard {
                    _file: file,
                    _local: local,
                });
            }
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(KubeletError::TakeLock {
                    path: self.path.clone(),
                    source,
                });
            }
        }
        drop(file);
        let path = self.path.clone();
        let locked = tokio::task::spawn_blocking(move || lock_file(&path)).await;
        let file = match locked {
            Ok(result) => result?,
            Err(join) => {
                return Err(KubeletError::TakeLock {
                    path: self.path.clone(),
                    source: std::io::Error::other(join),
                });
            }
        };
        Ok(PluginLockGuard {
            _file: file,
            _local: local,
        })
    }
}

fn open_lock_file(path: &Path) -> Result<File, KubeletError> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| KubeletError::OpenLock {
            path: path.to_path_buf(),
            source,
        })
}

fn lock_file(path: &Path) -> Result<File, KubeletError> {
    let file = open_lock_file(path)?;
    // Each open file description gets its own flock, so this also excludes other processes.
    file.lock().map_err(|source| KubeletError::TakeLock {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::TryLockError;

    #[tokio::test]
    async fn the_lock_file_is_locked_while_the_guard_lives() {
        let dir = tempfile::tempdir().unwrap();
        let lock = PluginLock::new(dir.path().join("plugin.lock"));
        let guard = lock.acquire().await.unwrap();

        let other = File::open(lock.path()).unwrap();
        let while_held = matches!(other.try_lock(), Err(TryLockError::WouldBlock));
        drop(guard);
        let after = other.try_lock().is_ok();
        assert_eq!((while_held, after), (true, true));
    }

    #[tokio::test]
    async fn a_lock_another_process_holds_is_waited_for_and_then_taken() {
        let dir = tempfile::tempdir().unwrap();
        let lock = PluginLock::new(dir.path().join("plugin.lock"));
        drop(lock.acquire().await.unwrap()); // creates the file
        let other = File::open(lock.path()).unwrap();
        other.lock().unwrap();
        let waiting = tokio::spawn({
            let lock = lock.clone();
            async move { lock.acquire().await.map(|_| ()) }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let waited = !waiting.is_finished();
        other.unlock().unwrap();
        let taken = waiting.await.unwrap().is_ok();
        assert_eq!((waited, taken), (true, true));
    }

    #[tokio::test]
    async fn a_lock_in_a_missing_directory_fails_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("plugin.lock");
        let got = PluginLock::new(&path).acquire().await;
        assert!(matches!(got, Err(KubeletError::OpenLock { path: p, .. }) if p == path));
    }
}
