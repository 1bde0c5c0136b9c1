//! Crash-safe file replacement shared by the CDI writer and the checkpoint store.
//!
//! A reader (a container runtime watching its CDI directory with inotify, or the plugin itself
//! after a crash) must only ever see the old file or the complete new one. The temp file lives
//! in the target's directory so the final `rename` stays on one filesystem and is atomic, and
//! its name starts with a dot and does not end in `.json`/`.yaml`, so CDI caches ignore it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a file could not be written, replaced or removed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The target path has no parent directory or no file name (e.g. `/` or `..`).
    #[error("cannot write {path}: the path must name a file inside a directory")]
    NotAFilePath { path: PathBuf },
    /// Creating the directory that holds the target failed.
    #[error("creating directory {dir}")]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Creating the temp file next to the target failed.
    #[error("creating temp file {temp} for {path}")]
    CreateTemp {
        path: PathBuf,
        temp: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Writing, chmod-ing or fsync-ing the temp file failed.
    #[error("{step} temp file {temp} for {path}")]
    WriteTemp {
        step: &'static str,
        path: PathBuf,
        temp: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Renaming the temp file over the target failed.
    #[error("renaming {temp} to {path}")]
    Rename {
        path: PathBuf,
        temp: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Fsync of the directory (making the rename durable) failed.
    #[error("syncing directory {dir} after replacing {path}")]
    SyncDir {
        dir: PathBuf,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Removing a file failed for a reason other than it being absent.
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Listing a directory (to find leftover temp files) failed.
    #[error("listing directory {dir}")]
    ListDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Distinguishes temp files of concurrent writers inside one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `bytes` so that no reader and no crash ever observes a partial file,
/// and makes the replacement durable across a power loss.
///
/// Creates the parent directory if it is missing. The file gets exactly `mode` (e.g. `0o644`)
/// whatever the umask. On return the new content and the directory entry are on stable
/// storage (file and directory fsynced). On error the target is unchanged and the temp file
/// is removed when possible; a temp file left by a crash is found by [`remove_stale_temps`].
///
/// # Errors
/// [`FsError`] naming the target, the temp file and the step that failed.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    replace(path, bytes, mode, Durability::PowerLoss)
}

/// [`write_atomic`] without the two fsyncs: a killed process (or a crashed container) still
/// never leaves a torn file, because the rename is atomic in the kernel's page cache, but a
/// power loss or kernel crash before the kernel writes the pages back may lose the new
/// content or leave the file empty.
///
/// Only for files that a reboot invalidates anyway: the checkpoint (its records belong to one
/// boot ID) and CDI specs of prepared claims (removed by start-up recovery after a reboot).
/// `docs/architecture.md` ("Durability") has the argument for each.
///
/// # Errors
/// As [`write_atomic`], without [`FsError::SyncDir`].
pub fn replace_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    replace(path, bytes, mode, Durability::ProcessCrash)
}

/// What a finished replacement survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// A killed process: the rename is atomic, nothing is synced.
    ProcessCrash,
    /// A power loss too: file and directory are fsynced.
    PowerLoss,
}

fn replace(path: &Path, bytes: &[u8], mode: u32, durability: Durability) -> Result<(), FsError> {
    let (dir, name) = split(path)?;
    let temp = dir.join(format!(
        "{}{}-{}",
        temp_prefix(name),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    crate::cost::count(crate::cost::Cost::FileWrite);
    let result = write_then_rename(path, &temp, bytes, mode, durability);
    if result.is_err() {
        // Best effort: the original error is what the caller needs to see.
        let _ = fs::remove_file(&temp);
    }
    result?;
    if durability == Durability::ProcessCrash {
        return Ok(());
    }
    sync_dir(dir).map_err(|source| FsError::SyncDir {
        dir: dir.to_path_buf(),
        path: path.to_path_buf(),
        source,
    })
}

fn write_then_rename(
    path: &Path,
    temp: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> Result<(), FsError> {
    let step = |step: &'static str| {
        let (path, temp) = (path.to_path_buf(), temp.to_path_buf());
        move |source| FsError::WriteTemp {
            step,
            path,
            temp,
            source,
        }
    };
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(temp)
    };
    // The directory usually exists: create it only when the temp file cannot be created
    // for want of it, which saves two system calls per write.
    let created = match create() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = temp.parent().unwrap_or(Path::new("."));
            fs::create_dir_all(dir).map_err(|source| FsError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
            create()
        }
        other => other,
    };
    let mut file = created.map_err(|source| FsError::CreateTemp {
        path: path.to_path_buf(),
        temp: temp.to_path_buf(),
        source,
    })?;
    // The umask may have cleared bits of `mode` at creation.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(step("setting mode of"))?;
    file.write_all(bytes).map_err(step("writing"))?;
    if durability == Durability::PowerLoss {
        crate::cost::count(crate::cost::Cost::Fsync);
        file.sync_all().map_err(step("syncing"))?;
    }
    drop(file);
    if durability == Durability::ProcessCrash && exchange(temp, path) {
        // `temp` now names the old content, which nobody needs: a reader that opened it
        // keeps its open file. Left behind by a crash, [`remove_stale_temps`] finds it.
        match fs::remove_file(temp) {
            Ok(()) => return Ok(()),
            Err(_) if fs::symlink_metadata(temp).is_ok_and(|m| m.is_dir()) => {
                // `path` was a directory, which `rename` refuses to replace: swap back and
                // fail as `rename` would (the caller removes the temp file).
                exchange(temp, path);
                return Err(FsError::Rename {
                    path: path.to_path_buf(),
                    temp: temp.to_path_buf(),
                    source: io::Error::from(io::ErrorKind::IsADirectory),
                });
            }
            Err(_) => return Ok(()),
        }
    }
    fs::rename(temp, path).map_err(|source| FsError::Rename {
        path: path.to_path_buf(),
        temp: temp.to_path_buf(),
        source,
    })
}

/// Swaps the directory entries of `temp` and `path` in one atomic step
/// (`renameat2(RENAME_EXCHANGE)`, Linux 3.15+); `false` when that is not possible (no file at
/// `path` yet, a file system or kernel without it), and the caller renames instead.
///
/// Why not a plain `rename` over the old file: ext4 (mounted with its default
/// `auto_da_alloc`) treats replace-by-rename as a request to push the new file's delayed
/// allocation to disk, and does that inside `rename` — 0.1 ms typically and several
/// milliseconds at the 90th percentile on the machine the prepare bench runs on, on the
/// kubelet's request path, for files ([`replace_atomic`]) that a power loss invalidates
/// anyway. An exchange is not a replace, so it costs what a rename into a new name costs
/// (about 15 µs). Readers still see the old file or the new one, never neither.
fn exchange(temp: &Path, path: &Path) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::ffi::{CString, c_char, c_int, c_uint};
        use std::os::unix::ffi::OsStrExt;
        unsafe extern "C" {
            fn renameat2(
                olddirfd: c_int,
                oldpath: *const c_char,
                newdirfd: c_int,
                newpath: *const c_char,
                flags: c_uint,
            ) -> c_int;
        }
        const AT_FDCWD: c_int = -100;
        const RENAME_EXCHANGE: c_uint = 1 << 1;
        let (Ok(old), Ok(new)) = (
            CString::new(temp.as_os_str().as_bytes()),
            CString::new(path.as_os_str().as_bytes()),
        ) else {
            return false;
        };
        // SAFETY: `renameat2` (glibc 2.28+) reads two NUL-terminated paths, which the
        // `CString`s keep alive and unchanged for the duration of the call; it writes no
        // memory of ours, and on any failure (ENOENT: no `path` yet; EINVAL/ENOSYS: not
        // supported) it changes nothing and we fall back to `rename`.
        let done = unsafe {
            renameat2(
                AT_FDCWD,
                old.as_ptr(),
                AT_FDCWD,
                new.as_ptr(),
                RENAME_EXCHANGE,
            )
        };
        done == 0
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (temp, path);
        false
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    crate::cost::count(crate::cost::Cost::Fsync);
    File::open(dir)?.sync_all()
}

/// Removes `path`; a file that is already gone is success.
///
/// Returns whether a file was actually removed, so callers can report idempotent repeats.
///
/// # Errors
/// [`FsError::Remove`] when `path` exists and cannot be removed (e.g. permission denied, a
/// read-only file system, or `path` is a directory). A file that does not exist is never an
/// error, whatever `unlink` said.
pub fn remove_if_exists(path: &Path) -> Result<bool, FsError> {
    crate::cost::count(crate::cost::Cost::FileRemove);
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        // Linux checks for a writable mount before it looks the name up, so unlinking a file
        // that does not exist on a read-only file system fails with EROFS, not ENOENT.
        Err(_) if matches!(fs::symlink_metadata(path), Err(e) if e.kind() == io::ErrorKind::NotFound) => {
            Ok(false)
        }
        Err(source) => Err(FsError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Deletes temp files that [`write_atomic`] left next to `path` when a previous process
/// crashed mid-write, and returns the paths it removed.
///
/// Only call this while no other writer targets `path` (e.g. at start-up of the single
/// process that owns the file). A missing directory means nothing to clean.
///
/// # Errors
/// [`FsError::ListDir`] when the directory cannot be read, [`FsError::Remove`] when a
/// leftover cannot be deleted.
pub fn remove_stale_temps(path: &Path) -> Result<Vec<PathBuf>, FsError> {
    let (dir, name) = split(path)?;
    let prefix = temp_prefix(name);
    crate::cost::count(crate::cost::Cost::DirectoryList);
    let list_err = |source| FsError::ListDir {
        dir: dir.to_path_buf(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(list_err(e)),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(list_err)?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let leftover = entry.path();
            if remove_if_exists(&leftover)? {
                removed.push(leftover);
            }
        }
    }
    removed.sort();
    Ok(removed)
}

fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

fn split(path: &Path) -> Result<(&Path, &str), FsError> {
    let not_a_file = || FsError::NotAFilePath {
        path: path.to_path_buf(),
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(not_a_file)?;
    let dir = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return Err(not_a_file()),
    };
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn write_atomic_creates_missing_directory_and_sets_exact_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b/spec.json");
        write_atomic(&path, b"{}", 0o644).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{}".to_vec());
        assert_eq!(mode_of(&path), 0o644);
    }

    #[test]
    fn write_atomic_replaces_content_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        write_atomic(&path, b"old", 0o600).unwrap();
        write_atomic(&path, b"new", 0o600).unwrap();
        let names: Vec<String> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["state.json".to_string()]);
        assert_eq!(fs::read(&path).unwrap(), b"new".to_vec());
        assert_eq!(mode_of(&path), 0o600);
    }

    #[test]
    fn write_atomic_onto_a_directory_fails_naming_the_path_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("taken");
        fs::create_dir(&path).unwrap();
        let err = write_atomic(&path, b"x", 0o644).unwrap_err();
        assert!(matches!(err, FsError::Rename { .. }), "got {err:?}");
        assert!(err.to_string().contains("taken"), "got {err}");
        assert_eq!(remove_stale_temps(&path).unwrap(), Vec::<PathBuf>::new());
    }

    #[test]
    fn replace_atomic_replaces_content_with_the_exact_mode_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("new/checkpoint.json");
        replace_atomic(&path, b"old", 0o600).unwrap();
        replace_atomic(&path, b"new", 0o600).unwrap();
        let names: Vec<String> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["checkpoint.json".to_string()]);
        assert_eq!(
            (fs::read(&path).unwrap(), mode_of(&path)),
            (b"new".to_vec(), 0o600)
        );
    }

    #[test]
    fn a_reader_of_the_old_file_keeps_reading_it_whole_while_the_path_gets_the_new_one() {
        use std::io::Read;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("checkpoint.json");
        replace_atomic(&path, b"old content", 0o600).unwrap();
        let mut reader = File::open(&path).unwrap();
        replace_atomic(&path, b"new", 0o644).unwrap();
        replace_atomic(&path, b"newer", 0o644).unwrap();
        let mut seen = String::new();
        reader.read_to_string(&mut seen).unwrap();
        assert_eq!(seen, "old content");
        assert_eq!(
            (fs::read(&path).unwrap(), mode_of(&path)),
            (b"newer".to_vec(), 0o644)
        );
        assert_eq!(remove_stale_temps(&path).unwrap(), Vec::<PathBuf>::new());
    }

    #[test]
    fn replace_atomic_onto_a_directory_fails_and_leaves_the_directory_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("spec.json");
        fs::create_dir_all(path.join("blocker")).unwrap();
        assert!(matches!(
            replace_atomic(&path, b"new", 0o644),
            Err(FsError::Rename { .. })
        ));
        assert!(path.join("blocker").is_dir());
        assert_eq!(remove_stale_temps(&path).unwrap(), Vec::<PathBuf>::new());
    }

    #[test]
    fn an_exchange_swaps_two_files_and_refuses_a_missing_target() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::write(&a, "A").unwrap();
        assert!(!exchange(&a, &b), "no target: the caller must rename");
        assert_eq!(fs::read_to_string(&a).unwrap(), "A");
        fs::write(&b, "B").unwrap();
        if exchange(&a, &b) {
            assert_eq!(fs::read_to_string(&a).unwrap(), "B");
            assert_eq!(fs::read_to_string(&b).unwrap(), "A");
        }
    }

    #[test]
    fn remove_if_exists_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        fs::write(&path, b"x").unwrap();
        let got = (
            remove_if_exists(&path).unwrap(),
            remove_if_exists(&path).unwrap(),
        );
        assert_eq!(got, (true, false));
    }

    #[test]
    fn remove_stale_temps_deletes_only_this_files_leftovers() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("checkpoint.json");
        let leftover = tmp.path().join(".checkpoint.json.tmp-42-0");
        let other = tmp.path().join(".other.json.tmp-42-0");
        fs::write(&leftover, b"partial").unwrap();
        fs::write(&other, b"partial").unwrap();
        assert_eq!(remove_stale_temps(&path).unwrap(), vec![leftover.clone()]);
        assert!(!leftover.exists());
        assert!(other.exists());
    }

    #[test]
    fn path_without_file_name_is_rejected() {
        let err = write_atomic(Path::new("/"), b"x", 0o644).unwrap_err();
        assert!(matches!(err, FsError::NotAFilePath { .. }), "got {err:?}");
    }
}
