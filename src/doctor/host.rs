//! Checks of the node's files: the driver root, `/dev/nvidia*`, the CDI directory, the
//! kubelet's plugin and registry directories, and the NVIDIA tools.
//!
//! Each check is a pure function of a small fact; `probe_*` functions read the fact.

use std::path::{Path, PathBuf};

use super::report::Check;
use crate::cdi::HostLayout;
use crate::errors::error_chain;

/// What a directory the plugin needs looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    /// Missing.
    Missing,
    /// The path is there but not a directory.
    NotADirectory,
    /// A directory a file can be created in.
    Writable,
    /// A directory creating a file in fails, with the error.
    ReadOnly(String),
}

/// Looks at `dir`: creates and removes a dot file to prove it is writable (a read-only mount
/// shows as EROFS even to root, which mode bits do not).
pub fn probe_dir(dir: &Path) -> DirState {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(dir) {
        Err(_) => return DirState::Missing,
        Ok(m) if !m.is_dir() => return DirState::NotADirectory,
        // Root writes through missing write bits, but an admin who took them away meant the
        // directory to be read-only, and a plugin not running as root could not write.
        Ok(m) if m.permissions().readonly() => {
            let mode = m.permissions().mode() & 0o7777;
            return DirState::ReadOnly(format!("mode {mode:04o} has no write permission"));
        }
        Ok(_) => {}
    }
    let probe = dir.join(format!(".gpu-dra-doctor-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            DirState::Writable
        }
        Err(e) => DirState::ReadOnly(e.to_string()),
    }
}

/// A directory check: `needs_write` says whether read-only is a failure.
fn dir_check(
    name: &str,
    dir: &Path,
    state: &DirState,
    role: &str,
    fix_missing: &str,
    needs_write: bool,
) -> Check {
    let d = dir.display();
    match state {
        DirState::Writable => Check::ok(name, format!("{d}: writable ({role})")),
        DirState::ReadOnly(_) if !needs_write => Check::ok(name, format!("{d}: present ({role})")),
        DirState::ReadOnly(why) => Check::fail(
            name,
            format!("{d}: not writable ({why})"),
            &format!(
                "Mount {d} read-write into the plugin's pod (hostPath, not readOnly) and make sure the host file system is writable"
            ),
            name,
        ),
        DirState::Missing => Check::fail(name, format!("{d}: missing ({role})"), fix_missing, name),
        DirState::NotADirectory => Check::fail(
            name,
            format!("{d}: not a directory"),
            &format!("Remove {d} and let it be created as a directory"),
            name,
        ),
    }
}

/// `cdi-root`: the directory CDI specs are written to must be a writable directory.
pub fn check_cdi_root(dir: &Path, state: &DirState) -> Check {
    dir_check(
        "cdi-root",
        dir,
        state,
        "CDI specs are written here",
        "Create the directory (the chart mounts it with DirectoryOrCreate) and point --cdi-root and the runtime's cdi_spec_dirs at it",
        true,
    )
}

/// `plugin-dir`: the DRA socket's directory, created by the plugin at start.
pub fn check_plugin_dir(dir: &Path, state: &DirState) -> Check {
    dir_check(
        "plugin-dir",
        dir,
        state,
        "the DRA socket and checkpoint live here",
        "Start the plugin with this --plugin-dir (it creates it), or pass doctor the --plugin-dir the plugin uses",
        true,
    )
}

/// `registry-dir`: the directory the kubelet watches for registration sockets; the kubelet
/// creates it, so a missing one means the kubelet looks elsewhere.
pub fn check_registry_dir(dir: &Path, state: &DirState) -> Check {
    dir_check(
        "registry-dir",
        dir,
        state,
        "the kubelet watches it for plugins",
        "Set --registry-dir (chart: kubeletPlugin.kubeletDir) to the kubelet's root dir + /plugins_registry",
        true,
    )
}

/// The driver files CDI specs mount, as found under the driver root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverRootFacts {
    /// A simulated node: specs name simulated device nodes and need no driver files.
    Simulated,
    /// Found: the driver version, how many files, and libcuda's directory.
    Found {
        version: String,
        files: usize,
        libcuda_dir: PathBuf,
    },
    /// Discovery failed, with the error chain.
    Failed(String),
}

/// Reads the driver files under `layout.driver_root` for driver `version` (from NVML).
pub fn probe_driver_root(layout: &HostLayout, version: Option<&str>) -> DriverRootFacts {
    match crate::cdi::discover_driver_files(layout, version) {
        Ok(found) => DriverRootFacts::Found {
            version: found.version,
            files: found.files.len(),
            libcuda_dir: found.libcuda_dir,
        },
        Err(e) => DriverRootFacts::Failed(error_chain(&e)),
    }
}

/// `driver-root`: the files our CDI specs mount are there.
pub fn check_driver_root(root: &Path, facts: &DriverRootFacts) -> Check {
    const NAME: &str = "driver-root";
    match facts {
        DriverRootFacts::Simulated => {
            Check::ok(NAME, "simulated host: CDI specs need no driver files")
        }
        DriverRootFacts::Found {
            version,
            files,
            libcuda_dir,
        } => Check::ok(
            NAME,
            format!(
                "{}: driver {version}, {files} files to mount, libcuda in {}",
                root.display(),
                libcuda_dir.display()
            ),
        ),
        DriverRootFacts::Failed(why) => Check::fail(
            NAME,
            why.clone(),
            "Set --driver-root (chart: driverRoot) to where the NVIDIA driver is installed: / for a host install, /run/nvidia/driver for the GPU Operator",
            NAME,
        ),
    }
}

/// Device nodes CUDA containers need: the control nodes and one per GPU minor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevFacts {
    /// A simulated node: the runtime creates the nodes from the spec.
    Simulated,
    /// Paths that are present and paths that are missing (or not device nodes).
    Probed {
        present: Vec<PathBuf>,
        missing: Vec<(PathBuf, String)>,
    },
}

/// Stats `/dev/nvidiactl`, `/dev/nvidia-uvm` and `/dev/nvidia<minor>` for each minor under
/// the layout's dev root.
pub fn probe_dev(layout: &HostLayout, minors: &[u32]) -> DevFacts {
    let mut paths = vec!["/dev/nvidiactl".to_string(), "/dev/nvidia-uvm".to_string()];
    paths.extend(minors.iter().map(|m| format!("/dev/nvidia{m}")));
    let mut present = Vec::new();
    let mut missing = Vec::new();
    for p in paths {
        let path = layout.dev_path(&p);
        match crate::cdi::stat_node(&path) {
            Ok(Some(_)) => present.push(path),
            Ok(None) => missing.push((path, "missing".into())),
            Err(e) => missing.push((path, e.to_string())),
        }
    }
    DevFacts::Probed { present, missing }
}

/// `device-nodes`: `/dev/nvidia*` present.
pub fn check_dev(facts: &DevFacts) -> Check {
    const NAME: &str = "device-nodes";
    match facts {
        DevFacts::Simulated => Check::ok(
            NAME,
            "simulated host: the runtime creates the device nodes the specs name",
        ),
        DevFacts::Probed { present, missing } if missing.is_empty() => {
            let names: Vec<String> = present.iter().map(|p| p.display().to_string()).collect();
            Check::ok(NAME, names.join(" "))
        }
        DevFacts::Probed { missing, .. } => {
            let names: Vec<String> = missing
                .iter()
                .map(|(p, why)| format!("{} ({why})", p.display()))
                .collect();
            Check::fail(
                NAME,
                names.join(", "),
                "Load the NVIDIA kernel modules (nvidia-smi creates the nodes, nvidia-modprobe -u -c=0 the UVM ones), and with a containerised plugin set --dev-root to where the host's /dev is mounted",
                NAME,
            )
        }
    }
}

/// Where the sharing tools are, or why they are missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolsFacts {
    /// The simulated tools (the `gpu-dra` binary under the tools' names).
    Simulated,
    /// Found at these paths.
    Found {
        nvidia_smi: PathBuf,
        mps_control: PathBuf,
    },
    /// Not found, with the error listing the paths tried.
    Missing(String),
}

/// `tools`: `nvidia-smi` and `nvidia-cuda-mps-control` found.
pub fn check_tools(facts: &ToolsFacts) -> Check {
    const NAME: &str = "tools";
    match facts {
        ToolsFacts::Simulated => Check::ok(
            NAME,
            "simulated nvidia-smi and nvidia-cuda-mps-control (the gpu-dra binary)",
        ),
        ToolsFacts::Found {
            nvidia_smi,
            mps_control,
        } => Check::ok(
            NAME,
            format!("{} {}", nvidia_smi.display(), mps_control.display()),
        ),
        ToolsFacts::Missing(why) => Check::warn(
            NAME,
            why.clone(),
            "Install the driver's utilities under the driver root; without them claims asking for MPS or time-slicing are refused, everything else works",
            NAME,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    #[test]
    fn directories_are_probed_as_missing_not_a_directory_or_writable() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "").unwrap();
        let got = [
            probe_dir(&tmp.path().join("nope")),
            probe_dir(&file),
            probe_dir(tmp.path()),
        ];
        assert_eq!(
            got,
            [
                DirState::Missing,
                DirState::NotADirectory,
                DirState::Writable
            ]
        );
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            1,
            "the probe file is removed"
        );
        use std::os::unix::fs::PermissionsExt;
        let locked = tmp.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
        assert_eq!(
            probe_dir(&locked),
            DirState::ReadOnly("mode 0555 has no write permission".into())
        );
    }

    #[test]
    fn a_read_only_or_missing_cdi_root_fails_naming_the_directory() {
        let dir = Path::new("/var/run/cdi");
        let ro = check_cdi_root(
            dir,
            &DirState::ReadOnly("Read-only file system (os error 30)".into()),
        );
        let missing = check_cdi_root(dir, &DirState::Missing);
        assert_eq!((ro.status, missing.status), (Status::Fail, Status::Fail));
        assert_eq!(
            ro.found,
            "/var/run/cdi: not writable (Read-only file system (os error 30))"
        );
        assert!(
            ro.fix
                .unwrap()
                .ends_with("(docs/troubleshooting.md#cdi-root)")
        );
    }

    #[test]
    fn missing_device_nodes_fail_and_list_each_path() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = HostLayout {
            dev_root: tmp.path().to_path_buf(),
            ..HostLayout::default()
        };
        std::fs::create_dir(tmp.path().join("dev")).unwrap();
        std::fs::write(tmp.path().join("dev/nvidia0"), "").unwrap();
        let c = check_dev(&probe_dev(&layout, &[0]));
        assert_eq!(c.status, Status::Fail);
        for name in [
            "nvidiactl (missing)",
            "nvidia-uvm (missing)",
            "nvidia0 is a regular file",
        ] {
            assert!(c.found.contains(name), "{name} in {}", c.found);
        }
        assert_eq!(check_dev(&DevFacts::Simulated).status, Status::Ok);
    }

    #[test]
    fn a_driver_root_without_libcuda_fails_with_the_discovery_error() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = HostLayout {
            driver_root: tmp.path().to_path_buf(),
            ..HostLayout::default()
        };
        let facts = probe_driver_root(&layout, Some("580.95.05"));
        let c = check_driver_root(tmp.path(), &facts);
        assert_eq!(c.status, Status::Fail);
        assert!(c.found.contains("libcuda.so.580.95.05"), "{}", c.found);
    }

    #[test]
    fn missing_tools_are_a_warning() {
        let c = check_tools(&ToolsFacts::Missing("nvidia-smi not found".into()));
        assert_eq!(c.status, Status::Warn);
    }
}
