//! Where a bench puts what a node keeps on a tmpfs (`/var/run/cdi`, the chart's device
//! metadata directory).

use std::path::{Path, PathBuf};

/// The file system type holding `path` (longest mount point that prefixes it).
pub fn fs_type(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let mount = Path::new(*fields.get(4)?);
            let dash = fields.iter().position(|f| *f == "-")?;
            let kind = fields.get(dash + 1)?.to_string();
            path.starts_with(mount)
                .then_some((mount.as_os_str().len(), kind))
        })
        .max()
        .map_or_else(|| "unknown".to_string(), |(_, kind)| kind)
}

/// Where the CDI specs go: `GPU_DRA_BENCH_CDI_DIR`, else the first of `/run` and `/dev/shm`
/// that is a tmpfs (where a node's `/var/run/cdi` is), else `root`.
pub fn parent(root: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("GPU_DRA_BENCH_CDI_DIR") {
        return PathBuf::from(dir);
    }
    ["/run", "/dev/shm"]
        .iter()
        .map(Path::new)
        .find(|dir| {
            fs_type(dir) == "tmpfs"
                && tempfile::tempdir_in(dir).is_ok_and(|probe| probe.close().is_ok())
        })
        .map_or_else(|| root.to_path_buf(), Path::to_path_buf)
}
