//! Turns discovered driver files into the spec-level edits shared by every device of a
//! claim: mounts, the NVIDIA CDI hooks, and the env NVIDIA's tooling sets.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::driver_files::{DriverFiles, FileKind};
use super::input::HostLayout;
use super::spec::{ContainerEdits, Hook, Mount};

/// Mount options of IPC sockets: writable, never executable.
const SOCKET_OPTIONS: [&str; 5] = ["nosuid", "nodev", "rbind", "rprivate", "noexec"];

/// Spec-level edits for `files`: one read-only bind per file (sockets writable), then, if a
/// hook binary is given, the `createContainer` hooks in NVIDIA's order (create-symlinks,
/// enable-cuda-compat, update-ldcache, disable-device-node-modification), and the env
/// `NVIDIA_CTK_LIBCUDA_DIR`.
///
/// The hook binary must understand those subcommands (nvidia-cdi-hook from container
/// toolkit 1.17 or later); without one, no hook is emitted.
pub fn driver_edits(
    files: &DriverFiles,
    layout: &HostLayout,
    hook_path: Option<&Path>,
) -> ContainerEdits {
    let mut edits = ContainerEdits {
        env: vec![format!(
            "NVIDIA_CTK_LIBCUDA_DIR={}",
            files.libcuda_dir.display()
        )],
        ..ContainerEdits::default()
    };
    for file in &files.files {
        let host = layout
            .driver_host_path(&file.found)
            .to_string_lossy()
            .into_owned();
        let container = file.container_path.to_string_lossy().into_owned();
        let mount = match file.kind {
            FileKind::Socket => Mount {
                host_path: host,
                container_path: container,
                kind: None,
                options: SOCKET_OPTIONS.map(String::from).to_vec(),
            },
            _ => Mount::read_only_bind(host, container),
        };
        edits.mounts.push(mount);
    }
    if let Some(hook_path) = hook_path {
        edits.hooks = hooks(files, hook_path);
    }
    edits
}

fn hooks(files: &DriverFiles, hook_path: &Path) -> Vec<Hook> {
    let hook = |args: Vec<String>| {
        let binary = hook_path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("nvidia-cdi-hook");
        // `nvidia-ctk` takes its hooks as `nvidia-ctk hook <name>`.
        let mut all = match binary {
            "nvidia-ctk" => vec!["nvidia-ctk".to_string(), "hook".to_string()],
            other => vec![other.to_string()],
        };
        all.extend(args);
        Hook {
            hook_name: "createContainer".to_string(),
            path: hook_path.to_string_lossy().into_owned(),
            args: all,
            env: vec!["NVIDIA_CTK_DEBUG=false".to_string()],
            timeout: None,
        }
    };
    let mut hooks = Vec::new();
    if !files.links.is_empty() {
        let mut args = vec!["create-symlinks".to_string()];
        for link in &files.links {
            args.push("--link".to_string());
            args.push(format!("{}::{}", link.target, link.link.display()));
        }
        hooks.push(hook(args));
    }
    // A `*` in the version means it was not pinned down; the hook would compare nonsense.
    if !files.version.contains('*') {
        hooks.push(hook(vec![
            "enable-cuda-compat".to_string(),
            format!("--host-driver-version={}", files.version),
        ]));
    }
    let folders: BTreeSet<PathBuf> = files
        .files
        .iter()
        .filter(|f| f.kind == FileKind::Library)
        .filter_map(|f| f.container_path.parent().map(Path::to_path_buf))
        .collect();
    if !folders.is_empty() {
        let mut args = vec!["update-ldcache".to_string()];
        for folder in folders {
            args.push("--folder".to_string());
            args.push(folder.display().to_string());
        }
        hooks.push(hook(args));
    }
    hooks.push(hook(vec!["disable-device-node-modification".to_string()]));
    hooks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::driver_files::{DriverFile, Link};

    fn files() -> DriverFiles {
        let lib = PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06");
        let sock = PathBuf::from("/run/nvidia-persistenced/socket");
        DriverFiles {
            version: "580.65.06".into(),
            libcuda_dir: "/usr/lib/x86_64-linux-gnu".into(),
            files: vec![
                DriverFile {
                    found: lib.clone(),
                    container_path: lib,
                    kind: FileKind::Library,
                },
                DriverFile {
                    found: sock.clone(),
                    container_path: sock,
                    kind: FileKind::Socket,
                },
            ],
            links: vec![Link {
                target: "libcuda.so.1".into(),
                link: "/usr/lib/x86_64-linux-gnu/libcuda.so".into(),
            }],
        }
    }

    #[test]
    fn operator_driver_root_prefixes_host_paths_only() {
        let layout = HostLayout {
            driver_root: "/driver-root".into(),
            host_driver_root: Some("/run/nvidia/driver".into()),
            ..HostLayout::default()
        };
        let got = driver_edits(&files(), &layout, None);
        let want = ContainerEdits {
            env: vec!["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu".into()],
            mounts: vec![
                Mount::read_only_bind(
                    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".into(),
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".into(),
                ),
                Mount {
                    host_path: "/run/nvidia/driver/run/nvidia-persistenced/socket".into(),
                    container_path: "/run/nvidia-persistenced/socket".into(),
                    kind: None,
                    options: SOCKET_OPTIONS.map(String::from).to_vec(),
                },
            ],
            ..ContainerEdits::default()
        };
        assert_eq!(got, want);
    }

    #[test]
    fn hooks_follow_nvidias_order_and_argument_form() {
        let hook_path = Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook");
        let got: Vec<Vec<String>> = driver_edits(&files(), &HostLayout::default(), Some(hook_path))
            .hooks
            .into_iter()
            .map(|h| h.args)
            .collect();
        let want: Vec<Vec<String>> = [
            &[
                "nvidia-cdi-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
            ][..],
            &[
                "nvidia-cdi-hook",
                "enable-cuda-compat",
                "--host-driver-version=580.65.06",
            ],
            &[
                "nvidia-cdi-hook",
                "update-ldcache",
                "--folder",
                "/usr/lib/x86_64-linux-gnu",
            ],
            &["nvidia-cdi-hook", "disable-device-node-modification"],
        ]
        .iter()
        .map(|args| args.iter().map(|s| s.to_string()).collect())
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn nvidia_ctk_binary_gets_the_hook_subcommand() {
        let edits = driver_edits(
            &files(),
            &HostLayout::default(),
            Some(Path::new("/usr/bin/nvidia-ctk")),
        );
        let got = &edits.hooks[edits.hooks.len() - 1].args;
        assert_eq!(
            got,
            &["nvidia-ctk", "hook", "disable-device-node-modification"]
        );
    }
}
