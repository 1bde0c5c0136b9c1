//! The node's boot ID, which tells the checkpoint whether hardware state could have survived.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The boot ID could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BootIdError {
    /// The file is missing or unreadable.
    #[error("reading boot ID from {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The file is empty.
    #[error("boot ID file {path} is empty")]
    Empty { path: PathBuf },
}

/// Reads `<proc_root>/sys/kernel/random/boot_id` (a UUID the kernel picks at each boot),
/// trimmed. `proc_root` is the proc filesystem, usually `/proc`.
///
/// # Errors
/// [`BootIdError`] naming the file.
pub fn boot_id(proc_root: &Path) -> Result<String, BootIdError> {
    let path = proc_root.join("sys/kernel/random/boot_id");
    let text = fs::read_to_string(&path).map_err(|source| BootIdError::Read {
        path: path.clone(),
        source,
    })?;
    let id = text.trim();
    if id.is_empty() {
        return Err(BootIdError::Empty { path });
    }
    Ok(id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_id_is_read_and_trimmed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sys/kernel/random");
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("boot_id"),
            "2b0c9a5e-1f4d-4c52-9d7e-0a1b2c3d4e5f\n",
        )
        .unwrap();
        assert_eq!(
            boot_id(tmp.path()).unwrap(),
            "2b0c9a5e-1f4d-4c52-9d7e-0a1b2c3d4e5f"
        );
    }

    #[test]
    fn missing_or_empty_boot_id_names_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = boot_id(tmp.path()).unwrap_err().to_string();
        let dir = tmp.path().join("sys/kernel/random");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("boot_id"), "\n").unwrap();
        let empty = boot_id(tmp.path()).unwrap_err().to_string();
        for err in [missing, empty] {
            assert!(err.contains("sys/kernel/random/boot_id"), "got {err}");
        }
    }

    #[test]
    fn the_real_boot_id_is_readable() {
        // Every Linux machine running these tests has one; it is a 36-char UUID.
        assert_eq!(boot_id(Path::new("/proc")).unwrap().len(), 36);
    }
}
