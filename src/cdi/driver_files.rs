//! Finds the driver's user-space files under a driver root, the way NVIDIA's container
//! toolkit (`nvcdi`, nvml mode) does, so containers get the same files either way.
//!
//! Covered: versioned libraries next to `libcuda` (and `vdpau/`), GSP firmware, the driver
//! binaries, the persistenced/fabricmanager sockets, EGL/Vulkan/X11 config files, and the
//! symlinks the `create-symlinks` hook recreates. Not covered: the `ld.so.cache` fallback
//! (used only when no fixed library directory holds `libcuda`), Xorg modules, DRM nodes.

use std::io;
use std::path::{Path, PathBuf};

use super::input::HostLayout;
use super::rootfs::{RootFs, Want, wildcard_match};

/// Library directories searched, in order, for `libcuda.so.<version>`.
const LIBRARY_DIRS: [&str; 11] = [
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
];

const BINARY_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

const BINARIES: [&str; 7] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
];

const SOCKETS: [[&str; 2]; 2] = [
    [
        "/run/nvidia-persistenced/socket",
        "/var/run/nvidia-persistenced/socket",
    ],
    [
        "/run/nvidia-fabricmanager/socket",
        "/var/run/nvidia-fabricmanager/socket",
    ],
];

/// Config directories: `/etc`, then the default `$XDG_DATA_DIRS`.
const CONFIG_DIRS: [&str; 3] = ["/etc", "/usr/local/share", "/usr/share"];

const CONFIGS: [&str; 7] = [
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "egl/egl_external_platform.d/09_nvidia_wayland2.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
];

/// Driver files could not be discovered.
#[derive(Debug, thiserror::Error)]
pub enum DriverFilesError {
    /// No `libcuda.so.<version>` in any library directory: the driver root is wrong or the
    /// driver is not installed.
    #[error(
        "no {pattern} under driver root {root} (searched {searched}); check the driver root \
         setting, that the NVIDIA driver is installed there, and that its version is the one \
         NVML reports"
    )]
    LibcudaNotFound {
        root: PathBuf,
        pattern: String,
        searched: String,
    },
    /// A lookup under the driver root failed with an I/O error.
    #[error("looking up {path} under driver root {root}")]
    Lookup {
        root: PathBuf,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How a discovered file is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Library,
    Firmware,
    Binary,
    Config,
    /// IPC sockets are mounted writable and `noexec`.
    Socket,
}

/// One file to mount: where it is (root-relative, symlinks resolved) and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFile {
    pub found: PathBuf,
    pub container_path: PathBuf,
    pub kind: FileKind,
}

/// A symlink to recreate in the container: `link` (container path) pointing at `target`
/// (as written on the host, usually relative).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub target: String,
    pub link: PathBuf,
}

/// The driver installation as containers need to see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFiles {
    /// Driver version, e.g. `580.65.06`.
    pub version: String,
    /// Root-relative directory of `libcuda`, e.g. `/usr/lib/x86_64-linux-gnu`.
    pub libcuda_dir: PathBuf,
    pub files: Vec<DriverFile>,
    pub links: Vec<Link>,
}

/// Discovers the driver's files under `layout.driver_root`. Firmware directories named
/// after the running kernel use `<proc_root>/sys/kernel/osrelease`.
///
/// `version` (from NVML) selects `libcuda.so.<version>`; without it the version is taken
/// from the first `libcuda.so.*.*` found.
///
/// # Errors
/// [`DriverFilesError::LibcudaNotFound`] when the root has no libcuda (a wrong root), and
/// [`DriverFilesError::Lookup`] for I/O errors other than missing optional files.
pub fn discover_driver_files(
    layout: &HostLayout,
    version: Option<&str>,
) -> Result<DriverFiles, DriverFilesError> {
    let root = RootFs::new(&layout.driver_root);
    let lookup = |path: &Path| {
        let (root, path) = (layout.driver_root.clone(), path.to_path_buf());
        move |source| DriverFilesError::Lookup { root, path, source }
    };
    let pattern = match version {
        Some(v) => format!("libcuda.so.{v}"),
        None => "libcuda.so.*.*".to_string(),
    };
    let mut libcuda = None;
    for dir in LIBRARY_DIRS.map(Path::new) {
        let hits = root.glob(dir, &pattern).map_err(lookup(dir))?;
        if let Some(first) = hits.into_iter().next() {
            libcuda = Some(first);
            break;
        }
    }
    let not_found = || DriverFilesError::LibcudaNotFound {
        root: layout.driver_root.clone(),
        pattern: pattern.clone(),
        searched: LIBRARY_DIRS.join(", "),
    };
    let libcuda = libcuda.ok_or_else(not_found)?;
    let file_name = libcuda.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let version = match version {
        Some(v) => v.to_string(),
        None => file_name.trim_start_matches("libcuda.so.").to_string(),
    };
    let libcuda_dir = libcuda.parent().unwrap_or(Path::new("/")).to_path_buf();

    let mut found = Found::default();
    let lib_pattern = format!("*.so.{version}");
    for dir in [libcuda_dir.clone(), libcuda_dir.join("vdpau")] {
        for lib in root.glob(&dir, &lib_pattern).map_err(lookup(&dir))? {
            found.push(lib, FileKind::Library);
        }
    }
    for dir in firmware_dirs(layout) {
        let dir = dir.join("nvidia").join(&version);
        for fw in root.glob(&dir, "gsp*.bin").map_err(lookup(&dir))? {
            found.push(fw, FileKind::Firmware);
        }
    }
    for name in BINARIES {
        let candidates = BINARY_DIRS.map(|d| Path::new(d).join(name));
        if let Some(bin) =
            first(&root, &candidates, Want::Executable).map_err(lookup(Path::new(name)))?
        {
            found.push(bin, FileKind::Binary);
        }
    }
    for pair in SOCKETS {
        let candidates = pair.map(PathBuf::from);
        if let Some(sock) =
            first(&root, &candidates, Want::NonDir).map_err(lookup(&candidates[0]))?
        {
            found.push(sock, FileKind::Socket);
        }
    }
    for config in CONFIGS {
        let candidates = CONFIG_DIRS.map(|d| Path::new(d).join(config));
        if let Some(cfg) =
            first(&root, &candidates, Want::NonDir).map_err(lookup(Path::new(config)))?
        {
            found.push(cfg, FileKind::Config);
        }
    }
    for icd in vulkan_files() {
        // GKE keeps these directly under the driver root; containers look in /etc.
        let mut candidates: Vec<PathBuf> = CONFIG_DIRS
            .iter()
            .map(|d| Path::new(d).join(&icd))
            .collect();
        candidates.push(Path::new("/").join(&icd));
        if let Some(file) =
            first(&root, &candidates, Want::NonDir).map_err(lookup(Path::new(&icd)))?
        {
            found.push_at(file, Path::new("/etc").join(&icd), FileKind::Config);
        }
    }
    let links = library_links(&root, &found.files).map_err(lookup(&libcuda_dir))?;
    Ok(DriverFiles {
        version,
        libcuda_dir,
        files: found.files,
        links,
    })
}

/// Collects files once each (merged-/usr hosts reach the same file through two dirs).
#[derive(Default)]
struct Found {
    files: Vec<DriverFile>,
}

impl Found {
    fn push(&mut self, found: PathBuf, kind: FileKind) {
        self.push_at(found.clone(), found, kind);
    }

    fn push_at(&mut self, found: PathBuf, container_path: PathBuf, kind: FileKind) {
        if !self.files.iter().any(|f| f.found == found) {
            self.files.push(DriverFile {
                found,
                container_path,
                kind,
            });
        }
    }
}

fn first(root: &RootFs<'_>, candidates: &[PathBuf], want: Want) -> io::Result<Option<PathBuf>> {
    for candidate in candidates {
        if let Some(found) = root.find(candidate, want)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

fn firmware_dirs(layout: &HostLayout) -> Vec<PathBuf> {
    let release = std::fs::read_to_string(layout.proc_path("sys/kernel/osrelease"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut dirs = Vec::new();
    if !release.is_empty() {
        dirs.push(PathBuf::from(format!("/lib/firmware/updates/{release}")));
    }
    dirs.push(PathBuf::from("/lib/firmware/updates"));
    if !release.is_empty() {
        dirs.push(PathBuf::from(format!("/lib/firmware/{release}")));
    }
    dirs.push(PathBuf::from("/lib/firmware"));
    dirs
}

fn vulkan_files() -> Vec<String> {
    let mut files = vec![
        "vulkan/icd.d/nvidia_icd.json".to_string(),
        "vulkan/icd.d/nvidia_layers.json".to_string(),
        "vulkan/implicit_layer.d/nvidia_layers.json".to_string(),
    ];
    match std::env::consts::ARCH {
        "x86_64" => files.push("vulkan/icd.d/nvidia_icd.x86_64.json".to_string()),
        "aarch64" => files.push("vulkan/icd.d/nvidia_icd.aarch64.json".to_string()),
        _ => {}
    }
    files
}

/// Links the container needs next to the mounted libraries: the host's own links that lead
/// to a mounted library (SONAME and `.so` links), plus the fixed ones NVIDIA always adds.
fn library_links(root: &RootFs<'_>, files: &[DriverFile]) -> io::Result<Vec<Link>> {
    let mut links: Vec<Link> = Vec::new();
    let mut add = |target: String, link: PathBuf| {
        if !links.iter().any(|l| l.link == link) {
            links.push(Link { target, link });
        }
    };
    let libraries = files.iter().filter(|f| f.kind == FileKind::Library);
    for lib in libraries {
        let (Some(dir), Some(name)) = (
            lib.found.parent(),
            lib.found.file_name().and_then(|n| n.to_str()),
        ) else {
            continue;
        };
        if wildcard_match("libcuda.so.*.*", name) {
            add("libcuda.so.1".into(), dir.join("libcuda.so"));
        }
        if wildcard_match("libGLX_nvidia.so.*.*", name) {
            add(name.into(), dir.join("libGLX_indirect.so.0"));
        }
        if wildcard_match("libnvidia-opticalflow.so.*.*", name) {
            add(
                "libnvidia-opticalflow.so.1".into(),
                dir.join("libnvidia-opticalflow.so"),
            );
        }
        // Follow host links backwards: libfoo.so.1 -> libfoo.so.V, then libfoo.so -> libfoo.so.1.
        let host_links = root.symlinks_in(dir)?;
        let mut wanted = vec![name.to_string()];
        let mut seen = vec![name.to_string()];
        while let Some(target) = wanted.pop() {
            for (link_name, text) in &host_links {
                if text.as_os_str() == target.as_str() && !seen.contains(link_name) {
                    add(target.clone(), dir.join(link_name));
                    seen.push(link_name.clone());
                    wanted.push(link_name.clone());
                }
            }
        }
    }
    Ok(links)
}
