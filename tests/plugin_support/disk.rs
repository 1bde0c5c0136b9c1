//! Disk faults for a node's directories: a small tmpfs mounted over one of them that the test
//! turns read-only (EROFS) or fills up (ENOSPC), and back.
//!
//! Mounting needs root. Without it (or in a sandbox that forbids mounts) a test skips with one
//! line saying why — except under `CI=true`, where the fault tests must run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted over a directory; unmounted (lazily) when dropped.
pub struct Tmpfs {
    dir: PathBuf,
    filler: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (a `mount` size such as `256k`) over `dir`, creating it.
    /// `None` (after printing why) when mounting is impossible and `CI` is not `true`.
    pub fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).expect("mount point");
        let tried = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .output();
        let why = match tried {
            Ok(out) if out.status.success() => {
                return Some(Tmpfs {
                    dir: dir.to_path_buf(),
                    // A dot file: neither the CDI directory listing nor the checkpoint's temp
                    // clean-up takes it for one of theirs.
                    filler: dir.join(".disk-filler"),
                });
            }
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
            Err(e) => format!("cannot run mount: {e}"),
        };
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: the disk-fault tests must run, but mounting a tmpfs failed: {why}"
        );
        eprintln!("skipped: mounting a tmpfs needs root and a mount namespace ({why})");
        None
    }

    /// Remounts read-only (`true`) or read-write.
    pub fn set_read_only(&self, read_only: bool) {
        let option = if read_only {
            "remount,ro"
        } else {
            "remount,rw"
        };
        let status = Command::new("mount")
            .args(["-o", option])
            .arg(&self.dir)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -o {option} {}", self.dir.display());
    }

    /// Writes a filler file until the file system is full (ENOSPC).
    pub fn fill(&self) {
        let mut file = std::fs::File::create(&self.filler).expect("filler file");
        let block = vec![0u8; 4096];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling {}: {e}", self.dir.display()),
            }
        }
        // Small writes may still fit in the last partial page: use it up byte by byte.
        while file.write(&[0]).is_ok_and(|n| n == 1) {}
    }

    /// Removes the filler: space again.
    pub fn free(&self) {
        std::fs::remove_file(&self.filler).expect("remove filler");
    }

    /// File names in the directory other than the filler.
    pub fn files(&self) -> Vec<String> {
        super::state::dir_names(&self.dir)
            .into_iter()
            .filter(|n| n != ".disk-filler")
            .collect()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
