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

/// One version of a file as one `stat` tells it: device, inode number, size, and
/// modification and change times to the nanosecond. Readers that keep what they last read
/// of a file compare these to know whether it is still that version.
///
/// A file replaced by a rename gets a new inode, but inode numbers are reused, and a file
/// written through a spare ([`replace_atomic_reusing`]) shares its inode number with the
/// version before last by design; size can repeat, and the kernel's own times come from a
/// coarse clock (a few ms). Writers for such readers therefore stamp the nanosecond of the
/// write as modification time ([`write_atomic_versioned`], [`replace_atomic_reusing`]), which
/// two writes do not share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileVersion {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileVersion {
    /// The version of the file at `path` now (following links).
    ///
    /// # Errors
    /// The `stat` error (`NotFound` when there is no file).
    pub fn of(path: &Path) -> io::Result<FileVersion> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path)?;
        Ok(FileVersion {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// The version as seven words, for opaque stamps compared for equality only.
    pub fn words(&self) -> [u64; 7] {
        [
            self.dev,
            self.ino,
            self.size,
            self.mtime.0 as u64,
            self.mtime.1 as u64,
            self.ctime.0 as u64,
            self.ctime.1 as u64,
        ]
    }
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
    replace(path, bytes, mode, Durability::PowerLoss, Mtime::Kernel)
}

/// [`write_atomic`] for a file whose readers tell its versions apart by `stat` alone: the new
/// file's modification time is set to the current time at the clock's full precision
/// (nanoseconds) before it is renamed into place. The kernel stamps a write with a coarse
/// clock (one tick, a few milliseconds), so two versions of the same size written within a
/// tick, the second on the first's freed inode number, would otherwise stat alike.
///
/// # Errors
/// As [`write_atomic`]; setting the time is a step of writing the temp file.
pub fn write_atomic_versioned(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    replace(path, bytes, mode, Durability::PowerLoss, Mtime::Precise)
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
    replace(path, bytes, mode, Durability::ProcessCrash, Mtime::Kernel)
}

/// [`replace_atomic`] through `spare`, a scratch file next to `path` that only this caller
/// writes, which is kept for the next call instead of a new temp file each time.
///
/// The new content is written over `spare` in place (no truncation to zero first), then
/// `spare` and `path` swap names in one atomic exchange: `path` names the new content, and
/// `spare` the old, whose inode the next call overwrites. Why: every new temp file is a new
/// inode, and ext4 allocates inodes by scanning for a free one it has not freed recently,
/// which under a steady stream of writes costs more than the write itself (about 0.13–0.25 ms
/// against 0.05 ms on the bench machine); truncating a file to zero and rewriting it makes
/// ext4 flush it on close (`auto_da_alloc`), which is worse.
///
/// What readers see: one who opens `path` gets the old or the new file, whole, as with
/// [`replace_atomic`]. One who opened `path` *before* the previous call's exchange and is still
/// reading when this call starts holds what is now `spare`, and may read a mix of the two
/// versions: readers must verify what they read (the checkpoint carries a checksum) and read
/// again. Durability is [`replace_atomic`]'s: a killed process leaves the old or the new file.
/// The new version's modification time is the nanosecond it was written (one `futimens`), as
/// [`write_atomic_versioned`]'s: the names trade inodes, so a version and the one before last
/// share an inode number, and readers that compare `stat` results tell them apart by it.
///
/// `spare` is created (with exactly `mode`) when missing and consumed when `path` did not
/// exist yet (it is renamed into place). It must be a name no other writer uses, in `path`'s
/// directory, and one that readers of that directory ignore (a leading dot). If it vanished
/// under us (a sweep of stale spares) or is not a file (a symlink, never followed: opened
/// with `O_NOFOLLOW`), it is removed and the call falls back to a fresh temp file.
///
/// Returns whether `spare` still names a file (the previous version) for the next call:
/// `false` when `path` was new and the spare became it.
///
/// # Errors
/// As [`replace_atomic`]; on error `path` is unchanged and `spare` removed when possible.
pub fn replace_atomic_reusing(
    path: &Path,
    spare: &Path,
    bytes: &[u8],
    mode: u32,
) -> Result<bool, FsError> {
    crate::cost::count(crate::cost::Cost::FileWrite);
    match overwrite_then_exchange(path, spare, bytes, mode) {
        Ok(kept) => Ok(kept),
        Err(e) => {
            let _ = fs::remove_file(spare);
            match e {
                Reuse::Vanished => {
                    // Not counted twice: this is the same write by another route.
                    let temp = next_temp(path)?;
                    let result = write_then_rename(
                        path,
                        &temp,
                        bytes,
                        mode,
                        Durability::ProcessCrash,
                        Mtime::Precise,
                    );
                    if result.is_err() {
                        let _ = fs::remove_file(&temp);
                    }
                    result.map(|()| false)
                }
                Reuse::Failed(e) => Err(e),
            }
        }
    }
}

/// Why writing through a spare did not complete.
enum Reuse {
    /// The spare cannot be used (its name disappeared between opening and exchanging it, or
    /// it is not a regular file we can open without following a link): write afresh.
    Vanished,
    /// A real failure, reported as is.
    Failed(FsError),
}

fn overwrite_then_exchange(
    path: &Path,
    spare: &Path,
    bytes: &[u8],
    mode: u32,
) -> Result<bool, Reuse> {
    use std::os::unix::fs::FileExt;
    let step = |step: &'static str| {
        let (path, temp) = (path.to_path_buf(), spare.to_path_buf());
        move |source| {
            Reuse::Failed(FsError::WriteTemp {
                step,
                path,
                temp,
                source,
            })
        }
    };
    let reuse = match o_nofollow() {
        Some(flag) => OpenOptions::new()
            .write(true)
            .custom_flags(flag)
            .open(spare),
        None => match fs::symlink_metadata(spare) {
            Ok(m) if m.file_type().is_symlink() => Err(io::Error::other("the spare is a link")),
            _ => OpenOptions::new().write(true).open(spare),
        },
    };
    let file = match reuse {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            write_new_temp_file(path, spare, mode).map_err(Reuse::Failed)?
        }
        // Not a file we can write in place (a link put there, or the previous version was a
        // link someone planted at `path`, now swapped to this name): it is removed, never
        // followed, and this write takes a fresh temp file.
        Err(_) => return Err(Reuse::Vanished),
    };
    file.write_all_at(bytes, 0).map_err(step("writing"))?;
    file.set_len(bytes.len() as u64)
        .map_err(step("truncating"))?;
    // The two names swap inodes on every write, so every other version has the same inode
    // number: the version before last differs from this one in size or times only, and the
    // kernel's times are a coarse clock's (a few ms). The nanosecond of this write tells
    // them apart for readers that compare `stat` results.
    file.set_modified(std::time::SystemTime::now())
        .map_err(step("setting the modification time"))?;
    drop(file);
    if exchange(spare, path) {
        // A directory at `path` swaps like a file: put it back and fail as `rename` would.
        if fs::symlink_metadata(spare).is_ok_and(|m| m.is_dir()) {
            exchange(spare, path);
            return Err(Reuse::Failed(FsError::Rename {
                path: path.to_path_buf(),
                temp: spare.to_path_buf(),
                source: io::Error::from(io::ErrorKind::IsADirectory),
            }));
        }
        return Ok(true);
    }
    match fs::rename(spare, path) {
        Ok(()) => Ok(false),
        Err(e)
            if e.kind() == io::ErrorKind::NotFound && path.parent().is_some_and(Path::exists) =>
        {
            Err(Reuse::Vanished)
        }
        Err(source) => Err(Reuse::Failed(FsError::Rename {
            path: path.to_path_buf(),
            temp: spare.to_path_buf(),
            source,
        })),
    }
}

/// `O_NOFOLLOW` (its value differs between architectures): a spare is only ever a file we
/// made, and the call must not write through a link someone put in its place. On an
/// architecture not listed, the spare is checked with `lstat` before it is opened instead.
fn o_nofollow() -> Option<i32> {
    if cfg!(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "x86")
    )) {
        Some(0o400_000)
    } else if cfg!(all(
        target_os = "linux",
        any(target_arch = "aarch64", target_arch = "arm")
    )) {
        Some(0o100_000)
    } else {
        None
    }
}

/// A name for [`replace_atomic_reusing`]'s spare of `path`, unique to this process and call:
/// `.<name>.spare-<pid>-<random>-<n>`, which readers of CDI and state directories ignore and
/// [`remove_stale_temps`] recognises.
///
/// # Errors
/// [`FsError::NotAFilePath`] when `path` names no file inside a directory.
pub fn spare_path(path: &Path) -> Result<PathBuf, FsError> {
    let (dir, name) = split(path)?;
    Ok(dir.join(format!(
        "{}{}-{:x}-{}",
        spare_prefix(name),
        process_id(),
        process_nonce(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    )))
}

fn spare_prefix(name: &str) -> String {
    format!(".{name}.spare-")
}

/// A random number fixed for the life of the process, so spares of two processes that got
/// the same PID (two pods in their own PID namespaces) never share a name.
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| RandomState::new().hash_one(process_id()) & 0xffff_ffff)
}

fn next_temp(path: &Path) -> Result<PathBuf, FsError> {
    let (dir, name) = split(path)?;
    Ok(dir.join(format!(
        "{}{}-{}",
        temp_prefix(name),
        process_id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    )))
}

/// Creates `temp` (and `path`'s directory when missing) with exactly `mode`.
fn write_new_temp_file(path: &Path, temp: &Path, mode: u32) -> Result<File, FsError> {
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
    let file = created.map_err(|source| FsError::CreateTemp {
        path: path.to_path_buf(),
        temp: temp.to_path_buf(),
        source,
    })?;
    // The umask may have cleared bits of `mode` at creation: set it again, unless the umask
    // is known to leave `mode` whole (saves a system call per write).
    if process_umask().is_none_or(|umask| mode & umask != 0) {
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|source| FsError::WriteTemp {
                step: "setting mode of",
                path: path.to_path_buf(),
                temp: temp.to_path_buf(),
                source,
            })?;
    }
    Ok(file)
}

/// The process's umask as the kernel reports it (`Umask:` in `/proc/self/status`, Linux 4.7+),
/// read once: nothing in this program changes it. `None` when it cannot be read, and callers
/// then set modes explicitly.
fn process_umask() -> Option<u32> {
    static UMASK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let status = fs::read_to_string("/proc/self/status").ok()?;
        let value = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
        u32::from_str_radix(value.trim(), 8).ok()
    })
}

/// This process's ID, asked of the kernel once (`getpid` is a system call in glibc).
fn process_id() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// What a finished replacement survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// A killed process: the rename is atomic, nothing is synced.
    ProcessCrash,
    /// A power loss too: file and directory are fsynced.
    PowerLoss,
}

/// Which modification time a replacement gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mtime {
    /// The kernel's (its coarse clock at the write).
    Kernel,
    /// The current time at full precision ([`write_atomic_versioned`]).
    Precise,
}

fn replace(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
    mtime: Mtime,
) -> Result<(), FsError> {
    let (dir, _) = split(path)?;
    let temp = next_temp(path)?;
    crate::cost::count(crate::cost::Cost::FileWrite);
    let result = write_then_rename(path, &temp, bytes, mode, durability, mtime);
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
    mtime: Mtime,
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
    let mut file = write_new_temp_file(path, temp, mode)?;
    file.write_all(bytes).map_err(step("writing"))?;
    if mtime == Mtime::Precise {
        file.set_modified(std::time::SystemTime::now())
            .map_err(step("setting the modification time"))?;
    }
    if durability == Durability::PowerLoss {
        crate::cost::count(crate::cost::Cost::Fsync);
        file.sync_all().map_err(step("syncing"))?;
    }
    drop(file);
    if durability == Durability::ProcessCrash && rename_new(temp, path) == Renamed::Done {
        return Ok(());
    }
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
    rename_with(temp, path, RenameFlag::Exchange) == Renamed::Done
}

/// Moves `temp` to `path` only if nothing is there (`renameat2(RENAME_NOREPLACE)`), the usual
/// case of a new file (a claim's first spec): one call instead of a failed exchange and a
/// rename. [`Renamed::Exists`] when `path` exists, [`Renamed::NotDone`] when it could not be
/// tried (the caller goes on as without it).
fn rename_new(temp: &Path, path: &Path) -> Renamed {
    rename_with(temp, path, RenameFlag::NoReplace)
}

/// What [`rename_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renamed {
    /// Done.
    Done,
    /// `RENAME_NOREPLACE` found a file at the target; nothing changed.
    Exists,
    /// Not done, for any other reason (no target for an exchange, not supported); nothing
    /// changed.
    NotDone,
}

/// The `renameat2` flag to use.
#[derive(Debug, Clone, Copy)]
enum RenameFlag {
    NoReplace,
    Exchange,
}

fn rename_with(temp: &Path, path: &Path, flag: RenameFlag) -> Renamed {
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
        const RENAME_NOREPLACE: c_uint = 1;
        const RENAME_EXCHANGE: c_uint = 1 << 1;
        let flags = match flag {
            RenameFlag::NoReplace => RENAME_NOREPLACE,
            RenameFlag::Exchange => RENAME_EXCHANGE,
        };
        let (Ok(old), Ok(new)) = (
            CString::new(temp.as_os_str().as_bytes()),
            CString::new(path.as_os_str().as_bytes()),
        ) else {
            return Renamed::NotDone;
        };
        // SAFETY: `renameat2` (glibc 2.28+) reads two NUL-terminated paths, which the
        // `CString`s keep alive and unchanged for the duration of the call; it writes no
        // memory of ours, and on any failure (EEXIST: a file at `path` for NOREPLACE; ENOENT:
        // no `path` for EXCHANGE; EINVAL/ENOSYS: not supported) it changes nothing and the
        // caller falls back.
        let done = unsafe { renameat2(AT_FDCWD, old.as_ptr(), AT_FDCWD, new.as_ptr(), flags) };
        match done {
            0 => Renamed::Done,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::AlreadyExists => {
                Renamed::Exists
            }
            _ => Renamed::NotDone,
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (temp, path, flag);
        Renamed::NotDone
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
/// crashed mid-write, and the spares of [`replace_atomic_reusing`] ([`spare_path`]), and
/// returns the paths it removed.
///
/// Call this while no other writer targets `path` (e.g. at start-up of the single process
/// that owns the file). Should one be writing anyway, it loses its temp file and fails, but a
/// spare removed under it only costs it a new file ([`replace_atomic_reusing`] falls back).
/// A missing directory means nothing to clean.
///
/// # Errors
/// [`FsError::ListDir`] when the directory cannot be read, [`FsError::Remove`] when a
/// leftover cannot be deleted.
pub fn remove_stale_temps(path: &Path) -> Result<Vec<PathBuf>, FsError> {
    let (dir, name) = split(path)?;
    let prefix = temp_prefix(name);
    let spares = spare_prefix(name);
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
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) || name.starts_with(&spares) {
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
    fn versioned_writes_back_to_back_differ_in_modification_time() {
        // The kernel's coarse clock gives writes within one tick (a few ms) the same mtime;
        // a versioned write stamps the nanosecond it wrote, so readers that compare `stat`
        // results tell even same-size versions apart.
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        let mut seen = Vec::new();
        for i in 0..20 {
            let bytes = format!("{{\"n\": {}}}", i % 10);
            write_atomic_versioned(&path, bytes.as_bytes(), 0o644).unwrap();
            let m = fs::metadata(&path).unwrap();
            assert_eq!(fs::read(&path).unwrap(), bytes.as_bytes());
            assert_eq!(mode_of(&path), 0o644);
            seen.push(m.modified().unwrap());
        }
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), seen.len(), "repeated mtimes: {seen:?}");
        assert!(
            fs::read_dir(tmp.path()).unwrap().count() == 1,
            "no temp file is left"
        );
    }

    #[test]
    fn writes_through_a_spare_differ_from_the_version_before_last_in_stat() {
        // Through a spare, the file's inode alternates between two, so a version shares its
        // inode number with the one before last; same-size versions written back to back
        // must still stat differently. (Kernels from 6.13 on stamp an in-place write at fine
        // grain once the file's times were read, as here, so there this holds without the
        // explicit stamp; on older kernels, which nodes run, it needs it.)
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("checkpoint.json");
        let spare = tmp.path().join(".checkpoint.json.spare");
        let mut stats = Vec::new();
        for i in 0..20 {
            let bytes = format!("{{\"n\": {}}}", i % 10);
            replace_atomic_reusing(&path, &spare, bytes.as_bytes(), 0o600).unwrap();
            assert_eq!(fs::read(&path).unwrap(), bytes.as_bytes());
            let m = fs::metadata(&path).unwrap();
            stats.push((m.ino(), m.size(), m.mtime(), m.mtime_nsec()));
        }
        for pair in stats.windows(3) {
            assert_ne!(pair[0], pair[2], "two versions stat alike: {stats:?}");
        }
        let inodes: std::collections::BTreeSet<u64> = stats.iter().map(|s| s.0).collect();
        assert!(inodes.len() <= 3, "the spare is reused: {inodes:?}");
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

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replacing_through_a_spare_reuses_the_previous_versions_inode() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state/checkpoint.json");
        let spare = spare_path(&path).unwrap();
        assert!(
            spare
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".checkpoint.json.spare-"),
            "{spare:?}"
        );
        // The first write has nothing to swap with: the spare becomes the file.
        replace_atomic_reusing(&path, &spare, b"first version, long", 0o600).unwrap();
        assert_eq!(names_in(path.parent().unwrap()), vec!["checkpoint.json"]);
        let first = fs::metadata(&path).unwrap().ino();

        replace_atomic_reusing(&path, &spare, b"second", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(
            fs::read(&spare).unwrap(),
            b"first version, long",
            "the old version"
        );
        let second = fs::metadata(&path).unwrap().ino();

        // The third write goes into the first version's inode, cut to the new length.
        replace_atomic_reusing(&path, &spare, b"third", 0o600).unwrap();
        assert_eq!(
            (fs::read(&path).unwrap(), mode_of(&path)),
            (b"third".to_vec(), 0o600)
        );
        assert_eq!(fs::metadata(&path).unwrap().ino(), first);
        assert_eq!(fs::metadata(&spare).unwrap().ino(), second);
        assert_eq!(
            names_in(path.parent().unwrap()).len(),
            2,
            "the file and its spare"
        );
    }

    #[test]
    fn a_spare_that_vanished_or_is_a_link_is_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("checkpoint.json");
        let spare = spare_path(&path).unwrap();
        replace_atomic_reusing(&path, &spare, b"one", 0o600).unwrap();
        replace_atomic_reusing(&path, &spare, b"two", 0o600).unwrap();

        // Swept meanwhile: the next write makes a new one.
        fs::remove_file(&spare).unwrap();
        replace_atomic_reusing(&path, &spare, b"three", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"three");

        // Replaced by a link to another file: that file is left alone, the link goes and the
        // write lands through a fresh temp file.
        let victim = tmp.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        fs::remove_file(&spare).unwrap();
        std::os::unix::fs::symlink(&victim, &spare).unwrap();
        replace_atomic_reusing(&path, &spare, b"four", 0o600).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::read(&path).unwrap(), b"four");
        assert!(
            fs::symlink_metadata(&spare).is_err(),
            "the link was removed"
        );

        // A link planted at the file itself is swapped to the spare's name by the next write
        // and removed by the one after; neither writes through it.
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        replace_atomic_reusing(&path, &spare, b"five", 0o600).unwrap();
        replace_atomic_reusing(&path, &spare, b"six", 0o600).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::read(&path).unwrap(), b"six");
        assert!(
            !fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn replacing_a_directory_through_a_spare_fails_and_leaves_it_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("spec.json");
        fs::create_dir_all(path.join("blocker")).unwrap();
        let spare = spare_path(&path).unwrap();
        assert!(matches!(
            replace_atomic_reusing(&path, &spare, b"x", 0o644),
            Err(FsError::Rename { .. })
        ));
        assert!(path.join("blocker").is_dir());
        assert_eq!(names_in(tmp.path()), vec!["spec.json"]);
    }

    #[test]
    fn the_sweep_removes_spares_and_a_write_whose_spare_was_swept_still_lands() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("checkpoint.json");
        let (ours, gone) = (spare_path(&path).unwrap(), spare_path(&path).unwrap());
        replace_atomic_reusing(&path, &ours, b"a", 0o600).unwrap();
        assert!(replace_atomic_reusing(&path, &ours, b"b", 0o600).unwrap());
        fs::write(&gone, b"left by a process that is gone").unwrap();
        let mut want = vec![ours.clone(), gone.clone()];
        want.sort();
        assert_eq!(remove_stale_temps(&path).unwrap(), want);
        assert_eq!(names_in(tmp.path()), vec!["checkpoint.json"]);
        replace_atomic_reusing(&path, &ours, b"c", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"c");
    }

    #[test]
    fn the_umask_read_once_is_the_one_the_kernel_applies() {
        let tmp = tempfile::tempdir().unwrap();
        let probe = tmp.path().join("probe");
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o777)
            .open(&probe)
            .unwrap();
        let umask = process_umask().expect("Linux reports the umask in /proc/self/status");
        assert_eq!(mode_of(&probe), 0o777 & !umask);
        // A mode the umask would cut is set again: 0o666 with a umask of 0o022 or more.
        let path = tmp.path().join("wide");
        replace_atomic(&path, b"x", 0o666).unwrap();
        assert_eq!(mode_of(&path), 0o666);
    }

    #[test]
    fn a_new_file_is_moved_into_place_and_an_existing_one_exchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("spec.json");
        let temp = tmp.path().join(".spec.json.tmp-1");
        fs::write(&temp, b"new").unwrap();
        assert_eq!(rename_new(&temp, &path), Renamed::Done);
        fs::write(&temp, b"newer").unwrap();
        assert_eq!(rename_new(&temp, &path), Renamed::Exists);
        assert_eq!(
            fs::read(&path).unwrap(),
            b"new",
            "NOREPLACE changed nothing"
        );
        replace_atomic(&path, b"newest", 0o644).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"newest");
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

/// A scratch directory under the system's temp directory, removed (with what it holds) when
/// dropped: for verbs that simulate a node's state for one run (`inventory --passthrough`,
/// `explain --passthrough` on a simulated node).
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `<temp>/gpu-dra-<purpose>-<pid>-<n>`.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn new(purpose: &str) -> std::io::Result<ScratchDir> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("gpu-dra-{purpose}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(ScratchDir(dir))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
