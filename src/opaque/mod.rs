//! The opaque config API: what a claim or a DeviceClass says about sharing a GPU.
//!
//! Opaque parameters reach the plugin as raw JSON objects (the API server stores them
//! undecoded). This module turns them into typed configs and decides which config each of a
//! claim's devices gets; the claim lifecycle then acts on the result. Pure: no I/O, no logging.
//!
//! Two steps:
//! - [`decode`] checks one parameters object strictly: `apiVersion`
//!   (`resource.nvidia.com/v1beta1`, NVIDIA's driver's, or `gpu.nvidia.com/v1alpha1`, the
//!   seed talk's), `kind` (`GpuConfig` or `MigDeviceConfig`) and the `sharing` block. Unknown
//!   fields are rejected at every level; every error names the field path, the value and the
//!   valid choices, so a user can fix the claim from the message alone.
//! - [`resolve`] applies the precedence rules (class entries before claim entries, later
//!   entries win, per-request entries apply only to their requests, `GpuConfig` on full GPUs
//!   and MIG devices, `MigDeviceConfig` on MIG devices only) and groups the devices that share
//!   one effective config, with per-device MPS memory limits resolved and checked against each
//!   device's memory.
//!
//! The reference for users is `docs/sharing-config.md`.

mod decode;
mod error;
mod resolve;

#[cfg(test)]
mod tests;

use std::fmt;

pub use decode::decode;
pub use error::{EntryOrigin, OpaqueError};
pub use resolve::{resolve, resolve_vfio, resolve_vgpu};

/// The `apiVersion`s accepted, in the order error messages list them.
pub const API_VERSIONS: [&str; 2] = ["resource.nvidia.com/v1beta1", "gpu.nvidia.com/v1alpha1"];

/// The smallest pinned device memory limit MPS accepts: the daemon takes limits in MiB.
pub const MIN_PINNED_MEMORY_BYTES: u64 = 1 << 20;

/// Which API group/version a config was written against. Both decode to the same config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiVersion {
    /// `resource.nvidia.com/v1beta1`, as NVIDIA's driver accepts.
    ResourceNvidiaV1beta1,
    /// `gpu.nvidia.com/v1alpha1`, as the seed talk writes it.
    GpuNvidiaV1alpha1,
}

/// The config's `kind`: which devices it is meant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigKind {
    /// Full GPUs; also accepted on MIG devices (the seed talk's "MIG + MPS" claims).
    GpuConfig,
    /// MIG devices only: the precise form for MIG.
    MigDeviceConfig,
    /// VFIO devices only (`gpu-vfio-<i>`): how a VM reaches the GPU through the IOMMU.
    VfioDeviceConfig,
    /// vGPU devices only (class `vgpu.gpu.nvidia.com`): NVIDIA's draft's `profile`, `typeID`
    /// (checked against the allocated device) and `params` (the vGPU's `vgpu_params`).
    VgpuDeviceConfig,
}

impl fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigKind::GpuConfig => "GpuConfig",
            ConfigKind::MigDeviceConfig => "MigDeviceConfig",
            ConfigKind::VfioDeviceConfig => "VfioDeviceConfig",
            ConfigKind::VgpuDeviceConfig => "VgpuDeviceConfig",
        })
    }
}

/// The compute time-slice length of a GPU (`nvidia-smi compute-policy --set-timeslice`).
/// NVIDIA does not publish the durations behind the names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TimeSliceInterval {
    /// The driver's built-in slice (level 0).
    #[default]
    Default,
    /// Level 1.
    Short,
    /// Level 2.
    Medium,
    /// Level 3.
    Long,
}

impl TimeSliceInterval {
    /// Every interval, in level order (for error messages and tables).
    pub const ALL: [TimeSliceInterval; 4] = [
        TimeSliceInterval::Default,
        TimeSliceInterval::Short,
        TimeSliceInterval::Medium,
        TimeSliceInterval::Long,
    ];

    /// The value `nvidia-smi compute-policy --set-timeslice` takes: 0 to 3.
    pub fn level(self) -> u8 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TimeSliceInterval::Default => "Default",
            TimeSliceInterval::Short => "Short",
            TimeSliceInterval::Medium => "Medium",
            TimeSliceInterval::Long => "Long",
        }
    }
}

impl fmt::Display for TimeSliceInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One decoded parameters object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The `apiVersion` it was written against.
    pub api_version: ApiVersion,
    /// The `kind`.
    pub kind: ConfigKind,
    /// The sharing strategy; `None` means exclusive: the device is left as it is.
    pub sharing: Option<SharingConfig>,
    /// A `VfioDeviceConfig`'s `iommu` block (defaults when absent); `None` for other kinds.
    pub vfio: Option<VfioSettings>,
    /// A `VgpuDeviceConfig`'s fields; `None` for other kinds.
    pub vgpu: Option<VgpuSettings>,
}

/// What a `VgpuDeviceConfig` says (NVIDIA's draft's fields). Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct VgpuSettings {
    /// `profile`: the vGPU type the claim expects (`H100-4C`, or NVIDIA's full name
    /// `NVIDIA H100-4C`); a prepare whose device is another type is refused.
    pub profile: Option<String>,
    /// `typeID`: the same check by type ID (`1056`).
    pub type_id: Option<u32>,
    /// `params`: the vGPU's `vgpu_params`, `key=value` pairs separated by commas
    /// (`frame_rate_limiter=0,disable_vnc=1`), written to the mdev's `nvidia/vgpu_params`
    /// after it is created, before the VM starts.
    pub params: Option<String>,
}
/// How a VM reaches a VFIO device (`VfioDeviceConfig.iommu`, NVIDIA's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VfioSettings {
    /// `iommu.backendPolicy`.
    pub backend: IommuBackend,
    /// `iommu.enableAPIDevice`: also hand the container the VFIO API device
    /// (`/dev/vfio/vfio`, or `/dev/iommu` with iommufd). KubeVirt needs it.
    pub api_device: bool,
}

/// `iommu.backendPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IommuBackend {
    /// `LegacyOnly` (default): the VFIO group device `/dev/vfio/<group>`.
    #[default]
    LegacyOnly,
    /// `PreferIommuFD`: the VFIO device cdev `/dev/vfio/devices/vfioN` when the kernel offers
    /// iommufd, else the group device.
    PreferIommuFd,
}

/// The `sharing` block as written, before it is applied to devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharingConfig {
    /// Processes share the device by time-slicing (`Default` when no interval is given).
    TimeSlicing {
        /// The slice length.
        interval: TimeSliceInterval,
    },
    /// An MPS control daemon shares the device, with these client limits.
    Mps(MpsConfig),
}

/// The `mpsConfig` block. Memory values are bytes, validated to be at least
/// [`MIN_PINNED_MEMORY_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MpsConfig {
    /// `defaultActiveThreadPercentage`, 0 to 100.
    pub active_thread_percentage: Option<u8>,
    /// `defaultPinnedDeviceMemoryLimit`: the limit for every device of the config.
    pub pinned_memory_bytes: Option<u64>,
    /// `defaultPerDevicePinnedMemoryLimit`: key (index, UUID or device name) → limit, sorted
    /// by key. Keys are checked when the config is applied to devices.
    pub per_device_pinned_memory_bytes: Vec<(String, u64)>,
    /// `multiUser`: start the control daemon in multi-user mode (`-d -M`), so clients of any
    /// UID share its one root server. Off by default.
    pub multi_user: bool,
}

/// One opaque config entry of this driver, as the caller found it in the claim's allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// From the DeviceClass (lower precedence) rather than from the claim.
    pub from_class: bool,
    /// The requests it applies to (`req` or `req/sub`); empty means every request.
    pub requests: Vec<String>,
    /// The raw parameters object.
    pub parameters: serde_json::Value,
}

/// What sort of device a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetKind {
    /// A whole GPU.
    FullGpu,
    /// A MIG device (pre-created or carved on demand).
    Mig,
    /// A whole GPU for a VM (`gpu-vfio-<i>`).
    Vfio,
    /// A vGPU for a VM (`vgpu-<i>-<type>-<n>`).
    Vgpu,
}

impl TargetKind {
    /// A VM's device (VFIO GPU or vGPU): no sharing config applies to it.
    pub fn is_vm_device(self) -> bool {
        matches!(self, TargetKind::Vfio | TargetKind::Vgpu)
    }

    /// How error messages call it.
    pub fn describe(self) -> &'static str {
        match self {
            TargetKind::FullGpu => "a full GPU",
            TargetKind::Mig => "a MIG device",
            TargetKind::Vfio => "a VFIO device",
            TargetKind::Vgpu => "a vGPU",
        }
    }
}

/// One device of the claim that this driver prepares, in allocation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The published device name, e.g. `gpu-0` or `gpu-0-mig-1g10gb-0`.
    pub device: String,
    /// The request it satisfies: `req`, or `req/sub` for a prioritised-list request.
    pub request: String,
    /// Full GPU or MIG device.
    pub kind: TargetKind,
    /// The device's UUID; `None` for a MIG device that is not carved yet.
    pub uuid: Option<String>,
    /// The device's memory in bytes; limits above it are rejected. 0 means unknown (no check).
    pub memory_bytes: u64,
}

/// Devices that share one effective config: one group per winning entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingGroup {
    /// Indices into the targets, ascending (allocation order).
    pub devices: Vec<usize>,
    /// What to set up for them.
    pub sharing: Sharing,
}

/// The sharing a group of devices gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// Time-slicing with this interval. For MIG devices it is always `Default`: processes on a
    /// MIG device share it by time-slicing already, there is nothing to set.
    TimeSlicing {
        /// The slice length to set on the group's full GPUs.
        interval: TimeSliceInterval,
    },
    /// One MPS control daemon for the group, with these limits.
    Mps(MpsLimits),
}

/// MPS limits resolved for the devices of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsLimits {
    /// The default active thread percentage for clients, if set.
    pub active_thread_percentage: Option<u8>,
    /// Pinned device memory limit per device of the group, in the group's device order;
    /// `None` means no limit on that device.
    pub pinned_memory_bytes: Vec<Option<u64>>,
    /// The daemon runs in multi-user mode (`nvidia-cuda-mps-control -d -M`); the claim
    /// lifecycle refuses it on GPUs below compute capability 7.0.
    pub multi_user: bool,
}
