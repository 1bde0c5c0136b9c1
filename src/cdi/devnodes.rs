//! Device nodes a container needs for a GPU or MIG device, read from the host.
//!
//! GPU and control nodes are stat-ed so the spec carries their real numbers and the runtime
//! can check them; MIG capability nodes come from the driver's proc files because they may
//! not exist under `/dev` at all (the runtime creates them from `type` + `major`).

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::input::{GpuDeviceRef, HostLayout};
use super::spec::{ContainerEdits, DeviceNode};

/// Control nodes every CUDA container wants; each is added only if the host has it.
const CONTROL_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// A host device node or driver proc file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DevNodeError {
    /// A required node is missing, or stat failed.
    #[error("device node {path} is missing or unreadable")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The path exists but is not a character or block device.
    #[error("{path} is a {found}, not a device node")]
    NotADevice { path: PathBuf, found: &'static str },
    /// A driver proc file is missing or unreadable.
    #[error("reading {path}")]
    ReadProc {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A driver proc file lacks an expected entry.
    #[error("{path} has no valid {field} entry")]
    ProcEntry { path: PathBuf, field: &'static str },
}

/// What stat says about a host device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    pub major: u32,
    pub minor: u32,
    /// Permission bits only, e.g. `0o666`.
    pub mode: u32,
    pub gid: u32,
}

/// The spec entry for a stat-ed host node, and the group to add to the container's
/// supplementary groups when the node is only group-accessible (NVIDIA's rule: gid set and
/// not world read-write).
pub fn node_edit(
    container_path: &str,
    host_path: &Path,
    info: NodeInfo,
) -> (DeviceNode, Option<u32>) {
    let node = DeviceNode {
        path: container_path.to_string(),
        host_path: Some(host_path.to_string_lossy().into_owned()),
        kind: None,
        major: Some(i64::from(info.major)),
        minor: Some(i64::from(info.minor)),
        file_mode: Some(info.mode),
        permissions: Some("rwm".to_string()),
        uid: None,
        gid: (info.gid != 0).then_some(info.gid),
    };
    let extra_gid = (info.gid != 0 && info.mode & 0o006 != 0o006).then_some(info.gid);
    (node, extra_gid)
}

/// Stats a node (following symlinks). `Ok(None)` when it does not exist.
///
/// # Errors
/// [`DevNodeError::Stat`] for other stat failures, [`DevNodeError::NotADevice`] when the path
/// is not a character or block device.
pub fn stat_node(path: &Path) -> Result<Option<NodeInfo>, DevNodeError> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DevNodeError::Stat {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let file_type = meta.file_type();
    if !file_type.is_char_device() && !file_type.is_block_device() {
        let found = if file_type.is_dir() {
            "directory"
        } else if file_type.is_file() {
            "regular file"
        } else {
            "non-device file"
        };
        return Err(DevNodeError::NotADevice {
            path: path.to_path_buf(),
            found,
        });
    }
    let (major, minor) = split_dev(meta.rdev());
    Ok(Some(NodeInfo {
        major,
        minor,
        mode: meta.mode() & 0o777,
        gid: meta.gid(),
    }))
}

/// Linux `dev_t` encoding (glibc `gnu_dev_major`/`gnu_dev_minor`).
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    // Both fit in 32 bits by construction of the encoding.
    (major as u32, minor as u32)
}

/// Spec-level control nodes (`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`,
/// `nvidia-modeset`), each only if present on the host.
///
/// # Errors
/// [`DevNodeError`] when a present path cannot be stat-ed or is not a device.
pub fn control_node_edits(layout: &HostLayout) -> Result<ContainerEdits, DevNodeError> {
    let mut edits = ContainerEdits::default();
    for path in CONTROL_NODES {
        let host = layout.dev_path(path);
        if let Some(info) = stat_node(&host)? {
            push_node(&mut edits, path, &host, info);
        }
    }
    Ok(edits)
}

/// Device-level nodes for one GPU or MIG device: `/dev/nvidia<minor>` (of the parent for
/// MIG) and, for MIG, the GI and CI capability nodes.
///
/// # Errors
/// [`DevNodeError`] naming the path when the GPU node, a capability `access` file or the
/// `nvidia-caps` entry of `<proc>/devices` is missing or malformed.
pub fn gpu_node_edits(
    layout: &HostLayout,
    gpu: &GpuDeviceRef,
) -> Result<ContainerEdits, DevNodeError> {
    let mut edits = ContainerEdits::default();
    let path = format!("/dev/nvidia{}", gpu.gpu_minor());
    let host = layout.dev_path(&path);
    let info = stat_node(&host)?.ok_or_else(|| DevNodeError::Stat {
        path: host.clone(),
        source: io::Error::from(io::ErrorKind::NotFound),
    })?;
    push_node(&mut edits, &path, &host, info);
    if let GpuDeviceRef::Mig {
        parent_minor,
        gi,
        ci,
        ..
    } = gpu
    {
        let major = caps_major(layout)?;
        let gi_dir = format!("driver/nvidia/capabilities/gpu{parent_minor}/mig/gi{gi}");
        for access in [
            format!("{gi_dir}/access"),
            format!("{gi_dir}/ci{ci}/access"),
        ] {
            let cap = read_cap_access(&layout.proc_path(&access))?;
            edits.device_nodes.push(cap_node(major, cap));
        }
    }
    Ok(edits)
}

fn push_node(edits: &mut ContainerEdits, path: &str, host: &Path, info: NodeInfo) {
    let (node, gid) = node_edit(path, host, info);
    edits.device_nodes.push(node);
    if let Some(gid) = gid.filter(|g| !edits.additional_gids.contains(g)) {
        edits.additional_gids.push(gid);
    }
}

/// A MIG capability as described by its `access` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapAccess {
    /// `DeviceFileMinor`: N in `/dev/nvidia-caps/nvidia-cap<N>`.
    pub minor: u32,
    /// `DeviceFileMode`: permission bits, e.g. `292` (`0444`).
    pub mode: u32,
}

/// The spec entry of a capability node: typed and numbered so the runtime creates it even
/// when the host has no `/dev/nvidia-caps` directory.
pub fn cap_node(major: u32, cap: CapAccess) -> DeviceNode {
    DeviceNode {
        path: format!("/dev/nvidia-caps/nvidia-cap{}", cap.minor),
        kind: Some("c".to_string()),
        major: Some(i64::from(major)),
        minor: Some(i64::from(cap.minor)),
        file_mode: Some(cap.mode),
        ..DeviceNode::default()
    }
}

/// Parses an `access` file (`DeviceFileMinor: <n>`, `DeviceFileMode: <decimal>`, …).
pub fn parse_cap_access(text: &str) -> Result<CapAccess, &'static str> {
    let field = |name: &'static str| {
        text.lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(key, _)| key.trim() == name)
            .and_then(|(_, value)| value.trim().parse::<u32>().ok())
            .ok_or(name)
    };
    Ok(CapAccess {
        minor: field("DeviceFileMinor")?,
        mode: field("DeviceFileMode")?,
    })
}

fn read_cap_access(path: &Path) -> Result<CapAccess, DevNodeError> {
    let text = read_proc(path)?;
    parse_cap_access(&text).map_err(|field| DevNodeError::ProcEntry {
        path: path.to_path_buf(),
        field,
    })
}

/// The major of `name` in the "Character devices:" section of a `/proc/devices` text.
pub fn parse_char_major(text: &str, name: &str) -> Option<u32> {
    text.lines()
        .skip_while(|line| line.trim() != "Character devices:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty() && line.trim() != "Block devices:")
        .filter_map(|line| line.split_once(char::is_whitespace))
        .find(|(_, dev)| dev.trim() == name)
        .and_then(|(major, _)| major.trim().parse().ok())
}

fn caps_major(layout: &HostLayout) -> Result<u32, DevNodeError> {
    let path = layout.proc_path("devices");
    let text = read_proc(&path)?;
    parse_char_major(&text, "nvidia-caps").ok_or(DevNodeError::ProcEntry {
        path,
        field: "nvidia-caps character device",
    })
}

fn read_proc(path: &Path) -> Result<String, DevNodeError> {
    fs::read_to_string(path).map_err(|source| DevNodeError::ReadProc {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_accessible_node_gets_no_extra_group() {
        let info = NodeInfo {
            major: 195,
            minor: 0,
            mode: 0o666,
            gid: 0,
        };
        let (node, gid) = node_edit("/dev/nvidia0", Path::new("/dev/nvidia0"), info);
        let want = DeviceNode {
            path: "/dev/nvidia0".into(),
            host_path: Some("/dev/nvidia0".into()),
            major: Some(195),
            minor: Some(0),
            file_mode: Some(438),
            permissions: Some("rwm".into()),
            ..DeviceNode::default()
        };
        assert_eq!((node, gid), (want, None));
    }

    #[test]
    fn group_only_node_adds_its_gid_as_supplementary_group() {
        let card = NodeInfo {
            major: 226,
            minor: 2,
            mode: 0o660,
            gid: 44,
        };
        let render = NodeInfo {
            major: 226,
            minor: 129,
            mode: 0o666,
            gid: 993,
        };
        let got = (
            node_edit("/dev/dri/card2", Path::new("/dev/dri/card2"), card).1,
            node_edit(
                "/dev/dri/renderD129",
                Path::new("/dev/dri/renderD129"),
                render,
            )
            .1,
        );
        assert_eq!(got, (Some(44), None));
    }

    #[test]
    fn access_file_is_parsed() {
        let text = "DeviceFileMinor: 84\nDeviceFileMode: 292\nDeviceFileModify: 1\n";
        assert_eq!(
            parse_cap_access(text),
            Ok(CapAccess {
                minor: 84,
                mode: 292
            })
        );
        assert_eq!(
            parse_cap_access("DeviceFileMode: 292\n"),
            Err("DeviceFileMinor")
        );
    }

    #[test]
    fn caps_major_is_taken_from_character_devices_only() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-caps\n510 nvidia-uvm\n\n\
                    Block devices:\n  7 loop\n";
        let block_only = "Character devices:\n  1 mem\n\nBlock devices:\n509 nvidia-caps\n";
        let got = (
            parse_char_major(text, "nvidia-caps"),
            parse_char_major(text, "nvidia"),
            parse_char_major(block_only, "nvidia-caps"),
        );
        assert_eq!(got, (Some(508), Some(195), None));
    }

    #[test]
    fn dev_t_is_split_like_glibc() {
        // makedev(508, 84), and makedev(4096, 259) which needs the high-bit encoding.
        assert_eq!(split_dev((508 << 8) | 84), (508, 84));
        assert_eq!(split_dev((1 << 44) | (1 << 20) | 3), (4096, 259));
    }
}
