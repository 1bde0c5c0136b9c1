//! What the caller tells the CDI layer: the devices of a claim and where the host's files are.

use std::path::{Path, PathBuf};

use super::spec::Mount;

/// The GPU hardware behind one allocated DRA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuDeviceRef {
    /// A whole GPU: its minor number (`/dev/nvidia<minor>`) and UUID (`GPU-…`).
    Full { minor: u32, uuid: String },
    /// A MIG device: the parent GPU's minor and UUID, the GPU-instance and compute-instance
    /// IDs (which select its capability files) and its own UUID (`MIG-…`).
    Mig {
        parent_minor: u32,
        parent_uuid: String,
        gi: u32,
        ci: u32,
        uuid: String,
    },
}

impl GpuDeviceRef {
    /// The UUID a workload sees for this device (the MIG UUID for a MIG device).
    pub fn uuid(&self) -> &str {
        match self {
            GpuDeviceRef::Full { uuid, .. } | GpuDeviceRef::Mig { uuid, .. } => uuid,
        }
    }

    /// Minor number of the GPU whose `/dev/nvidia<minor>` node the container needs.
    pub fn gpu_minor(&self) -> u32 {
        match self {
            GpuDeviceRef::Full { minor, .. } => *minor,
            GpuDeviceRef::Mig { parent_minor, .. } => *parent_minor,
        }
    }
}

/// One allocated device of a claim, as it goes into the claim's CDI spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDevice {
    /// The DRA device name from the allocation result, e.g. `gpu-0`.
    pub device_name: String,
    /// Set when the device is shared through consumable capacity; becomes part of the CDI
    /// device name so each share gets its own entry.
    pub share_id: Option<String>,
    pub gpu: GpuDeviceRef,
    /// Extra environment for containers using this device (e.g. `CUDA_MPS_PIPE_DIRECTORY`).
    pub env: Vec<(String, String)>,
    /// Extra mounts for containers using this device (e.g. the MPS pipe dir and `/dev/shm`).
    pub mounts: Vec<Mount>,
}

/// Where the plugin finds the host's files. Each root is what the plugin sees; a root of
/// `/` means the real host paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayout {
    /// Root that holds `dev/nvidia*` (usually `/`).
    pub dev_root: PathBuf,
    /// The proc filesystem itself (usually `/proc`): `devices`,
    /// `driver/nvidia/capabilities/…`, `sys/kernel/osrelease`.
    pub proc_root: PathBuf,
    /// Root of the driver installation: `/` for a host install, or where the plugin sees the
    /// GPU Operator's driver container root.
    pub driver_root: PathBuf,
    /// Where `driver_root` is on the host, when the plugin sees it elsewhere (e.g. plugin
    /// path `/driver-root`, host path `/run/nvidia/driver`). Mount `hostPath`s use it.
    /// `None` means the same path.
    pub host_driver_root: Option<PathBuf>,
}

impl Default for HostLayout {
    fn default() -> Self {
        HostLayout {
            dev_root: PathBuf::from("/"),
            proc_root: PathBuf::from("/proc"),
            driver_root: PathBuf::from("/"),
            host_driver_root: None,
        }
    }
}

impl HostLayout {
    /// The plugin-visible path of a standard device path such as `/dev/nvidia0`.
    pub fn dev_path(&self, container_path: &str) -> PathBuf {
        under(&self.dev_root, container_path)
    }

    /// The plugin-visible path of a file under the proc root, e.g. `devices`.
    pub fn proc_path(&self, relative: &str) -> PathBuf {
        under(&self.proc_root, relative)
    }

    /// The host path of a file found at `relative` under the driver root.
    pub fn driver_host_path(&self, relative: &Path) -> PathBuf {
        let root = self.host_driver_root.as_ref().unwrap_or(&self.driver_root);
        under(root, &relative.to_string_lossy())
    }
}

/// Joins an absolute-looking path below `root` (`/` + `/dev/x` = `/dev/x`).
pub(crate) fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Host facts the CDI layer needs about the driver installation that it cannot read from
/// files: which hook binary to reference and the driver version NVML reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverOptions {
    /// Host path of `nvidia-cdi-hook` (or `nvidia-ctk`). `None` emits no hooks, so no
    /// container creation depends on a binary that is not there; libraries then rely on the
    /// image's own loader configuration.
    pub cdi_hook_path: Option<PathBuf>,
    /// Driver version from NVML, e.g. `580.65.06`. `None` infers it from the
    /// `libcuda.so.<version>` file name.
    pub driver_version: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_of_slash_give_real_paths_and_host_driver_root_rewrites_mounts() {
        let real = HostLayout::default();
        let operator = HostLayout {
            driver_root: "/driver-root".into(),
            host_driver_root: Some("/run/nvidia/driver".into()),
            ..HostLayout::default()
        };
        let got = (
            real.dev_path("/dev/nvidia0"),
            real.proc_path("devices"),
            real.driver_host_path(Path::new("/usr/bin/nvidia-smi")),
            operator.driver_host_path(Path::new("/usr/bin/nvidia-smi")),
        );
        let want = (
            PathBuf::from("/dev/nvidia0"),
            PathBuf::from("/proc/devices"),
            PathBuf::from("/usr/bin/nvidia-smi"),
            PathBuf::from("/run/nvidia/driver/usr/bin/nvidia-smi"),
        );
        assert_eq!(got, want);
    }
}
