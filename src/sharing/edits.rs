//! What a client container of an MPS daemon needs: pure values, no I/O.

use std::path::PathBuf;

use super::spec::MIB;

/// Where a client sees the daemon's pipe directory.
pub const CLIENT_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// A bind mount into the client container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host_path: PathBuf,
    pub container_path: String,
    pub options: Vec<String>,
}

/// Env and mounts a client container of one MPS daemon gets (added to its CDI edits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientEdits {
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
}

pub(crate) fn client_edits(pipe_dir: PathBuf, shm_dir: PathBuf) -> ClientEdits {
    let options: Vec<String> = ["rw", "nosuid", "nodev", "bind"].map(String::from).to_vec();
    ClientEdits {
        env: vec![("CUDA_MPS_PIPE_DIRECTORY".into(), CLIENT_PIPE_DIR.into())],
        mounts: vec![
            Mount {
                host_path: pipe_dir,
                container_path: CLIENT_PIPE_DIR.into(),
                options: options.clone(),
            },
            Mount {
                host_path: shm_dir,
                container_path: "/dev/shm".into(),
                options,
            },
        ],
    }
}

/// Per-client limit env: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<pct>` when given and
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<n>M,1=<n>M` for the devices with a limit (ordinals in
/// the daemon's `CUDA_VISIBLE_DEVICES` order, n = bytes / 1 MiB). Empty when nothing is set.
/// A client value can only tighten the daemon's default.
pub fn client_limit_env(active_pct: Option<u8>, pinned: &[Option<u64>]) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(p) = active_pct {
        env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), p.to_string()));
    }
    let limits: Vec<String> = pinned
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.map(|b| format!("{i}={}M", b / MIB)))
        .collect();
    if !limits.is_empty() {
        env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(",")));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn limit_env_lists_only_devices_with_a_limit_by_ordinal() {
        let got = client_limit_env(Some(25), &[Some(4096 * MIB), None, Some(512 * MIB)]);
        let want = vec![
            pair("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"),
            pair("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4096M,2=512M"),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn limit_env_is_empty_without_limits() {
        assert_eq!(client_limit_env(None, &[None]), Vec::new());
    }
}
