//! The hardware layer: everything gpu-dra knows about, or does to, GPUs goes through
//! [`GpuBackend`].
//!
//! Two backends implement it side by side: [`sim::SimBackend`], a simulated node that behaves
//! like the hardware (a product feature: users run it in kind clusters and CI), and
//! [`nvml::NvmlBackend`], the real one over NVML. Callers never know which one they hold.
//!
//! The vocabulary follows NVML: a *GPU instance* (GI) is created from a GPU-instance profile at a
//! placement counted in memory slices; a *compute instance* (CI) inside it makes the MIG device
//! CUDA sees. Profiles carry two identifiers, exactly as NVML does: the constant
//! [`MigProfile::index`] (`NVML_GPU_INSTANCE_PROFILE_*`) and the driver's [`MigProfile::id`]
//! (`info.id`, what `nvidia-smi mig -lgip` prints and what creation calls take).

pub mod catalog;
pub mod fabric;
pub mod geometry;
pub mod health;
pub mod nvml;
pub mod passthrough;
pub mod policy_flag;
pub mod sim;
pub mod telemetry;
pub mod vgpu;

use serde::{Deserialize, Serialize};

/// What the backend reports about the node: driver versions and every GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    /// NVIDIA kernel driver version as NVML reports it, e.g. `580.95.05`.
    pub driver_version: String,
    /// Highest CUDA version the driver supports, e.g. `13.0`.
    pub cuda_driver_version: String,
    /// GPUs ordered by NVML index.
    pub gpus: Vec<GpuInfo>,
    /// The host's PCI view for VFIO passthrough (every NVIDIA GPU on the bus, whichever
    /// driver has it); `None` unless passthrough is on ([`passthrough::PassthroughBackend`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<passthrough::PciHostFacts>,
    /// The host's vGPU view from sysfs (virtual functions, mdev types, the vGPUs that exist);
    /// `None` unless vGPU is on (`--vgpu-types`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_host: Option<vgpu::VgpuHostFacts>,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index (enumeration order).
    pub index: u32,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// NVML product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// NVML brand as NVIDIA's driver prints it (`Nvidia`, `GeForce`, …).
    pub brand: String,
    /// Architecture name (`Ampere`, `Hopper`, `Ada Lovelace`, `Blackwell`).
    pub architecture: Architecture,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Total framebuffer memory in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU.
    pub multiprocessors: u32,
    /// PCI bus ID in extended BDF form, e.g. `0000:18:00.0`.
    pub pci_bus_id: String,
    /// PCIe root complex, e.g. `pci0000:15`.
    pub pcie_root: String,
    /// NUMA node, when the platform reports one.
    pub numa_node: Option<i64>,
    /// MIG support and mode.
    pub mig: MigModeState,
    /// Number of memory slices a GPU instance placement is counted in (8, or 4 on A30);
    /// 0 when the GPU does not support MIG.
    pub memory_slices: u32,
    /// Every GPU-instance profile the GPU supports, with its possible placements.
    pub mig_profiles: Vec<MigProfile>,
    /// MIG devices (GPU instance + compute instance) that exist now.
    pub mig_devices: Vec<MigDevice>,
    /// GPU instances without a compute instance (left by an interrupted creation or
    /// cleanup); nobody can use them, recovery destroys them.
    pub empty_gpu_instances: Vec<GpuInstanceRef>,
    /// Whether the device is healthy by the built-in verdict
    /// ([`health::health_after`]): no fatal event since the last recovery. The plugin judges
    /// `faults` with its configurable policy instead.
    pub healthy: bool,
    /// Health-relevant events since the last recovery, one entry per kind (and MIG instance),
    /// oldest first ([`health::record_fault`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<health::GpuFault>,
    /// Multi-node NVLink fabric membership (`nvmlDeviceGetGpuFabricInfoV`); `None` when the
    /// GPU or driver does not support fabric queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<fabric::FabricInfo>,
    /// NVML module ID (`nvmlDeviceGetModuleId`): the GPU's slot on an NVSwitch baseboard
    /// (1–8 on HGX), which Fabric Manager calls `physicalId`; 0 when NVML cannot say.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub module_id: u32,
    /// vGPU support as NVML reports it (types, homogeneity, host mode); `None` when the GPU
    /// or its driver (no vGPU manager) supports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu: Option<vgpu::GpuVgpu>,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

impl GpuInfo {
    /// The profile with driver id `id`, if the GPU has it.
    pub fn profile_by_id(&self, id: u32) -> Option<&MigProfile> {
        self.mig_profiles.iter().find(|p| p.id == id)
    }

    /// The profile named `name` (e.g. `1g.10gb`), if the GPU has it.
    pub fn profile_by_name(&self, name: &str) -> Option<&MigProfile> {
        self.mig_profiles.iter().find(|p| p.name == name)
    }
}

/// GPU architecture families gpu-dra distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Architecture {
    /// Pascal or older (no MIG).
    Pascal,
    /// Volta (no MIG).
    Volta,
    /// Turing (no MIG).
    Turing,
    /// Ampere: GA100 supports MIG; toggling MIG mode needs a GPU reset.
    Ampere,
    /// Ada Lovelace (no MIG).
    AdaLovelace,
    /// Hopper: MIG mode toggles at once when the GPU is idle.
    Hopper,
    /// Blackwell: MIG mode toggles at once when the GPU is idle.
    Blackwell,
}

impl Architecture {
    /// The name NVIDIA's driver publishes in the `architecture` attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            Architecture::Pascal => "Pascal",
            Architecture::Volta => "Volta",
            Architecture::Turing => "Turing",
            Architecture::Ampere => "Ampere",
            Architecture::AdaLovelace => "Ada Lovelace",
            Architecture::Hopper => "Hopper",
            Architecture::Blackwell => "Blackwell",
        }
    }

    /// Whether a MIG mode change needs a GPU reset to take effect (Ampere) rather than
    /// applying at once on an idle GPU (Hopper and later).
    pub fn mig_toggle_needs_reset(self) -> bool {
        matches!(self, Architecture::Ampere)
    }
}

/// How gpu-dra publishes the MIG capabilities of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MigPolicy {
    /// MIG off: the full GPU only.
    #[default]
    Disabled,
    /// MIG devices that exist are published as they are; nothing is carved.
    Static,
    /// Every profile at every placement is published as a partitionable device and carved on
    /// demand when a claim is prepared.
    Dynamic,
}

impl MigPolicy {
    /// The name used in node files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            MigPolicy::Disabled => "disabled",
            MigPolicy::Static => "static",
            MigPolicy::Dynamic => "dynamic",
        }
    }
}

/// MIG capability and mode of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigModeState {
    /// The GPU supports MIG at all.
    pub capable: bool,
    /// MIG mode in effect now.
    pub current: bool,
    /// MIG mode after the next activation (a reset on Ampere); equals `current` otherwise.
    pub pending: bool,
}

/// One GPU-instance profile, as `nvmlDeviceGetGpuInstanceProfileInfo` and
/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// Profile name derived as NVIDIA's tools do, e.g. `1g.10gb`, `1g.10gb+me`.
    pub name: String,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` constant (profile index).
    pub index: u32,
    /// The driver's `info.id`: what creation and placement calls take.
    pub id: u32,
    /// Memory of a MIG device of this profile, MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders (NVDEC).
    pub decoders: u32,
    /// Video encoders (NVENC).
    pub encoders: u32,
    /// JPEG engines (NVJPG).
    pub jpeg_engines: u32,
    /// Optical-flow accelerators (OFA).
    pub ofa_engines: u32,
    /// How many instances of this profile the GPU can hold at most.
    pub max_instances: u32,
    /// Compute slices (the `Ng` in the name).
    pub compute_slices: u32,
    /// Memory slices a placement of this profile occupies.
    pub memory_slices: u32,
    /// Allowed placement starts (in memory slices); each placement is
    /// `start..start + memory_slices`.
    pub placement_starts: Vec<u32>,
}

impl MigProfile {
    /// Whether a placement starting at `start` is one this profile allows.
    pub fn allows_start(&self, start: u32) -> bool {
        self.placement_starts.contains(&start)
    }
}

/// A GPU-instance placement: `size` memory slices from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl Placement {
    /// Whether two placements share a memory slice.
    pub fn overlaps(&self, other: &Placement) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }

    /// Bit mask of the memory slices the placement occupies.
    pub fn mask(&self) -> u32 {
        (((1u64 << self.size) - 1) << self.start) as u32
    }
}

/// A MIG device that exists on the GPU: a GPU instance and the compute instance in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Driver id of the GPU-instance profile.
    pub profile_id: u32,
    /// Profile name, e.g. `3g.40gb`.
    pub profile_name: String,
    /// GPU instance id (unique per GPU).
    pub gi_id: u32,
    /// Compute instance id (unique per GPU instance).
    pub ci_id: u32,
    /// Where the GPU instance sits.
    pub placement: Placement,
}

/// A GPU instance identified by id, without a compute instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInstanceRef {
    /// GPU instance id.
    pub gi_id: u32,
    /// Driver id of its profile.
    pub profile_id: u32,
    /// Where it sits.
    pub placement: Placement,
}

/// What happened when the MIG mode of a GPU was asked to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigModeChange {
    /// The GPU already was in the requested mode.
    Unchanged,
    /// The new mode is in effect.
    Applied,
    /// The new mode is pending until the GPU is reset (Ampere).
    PendingReset,
}

/// Errors of the hardware layer. The NVML-shaped variants carry the return code a real GPU
/// gives in the same situation, so callers handle the simulator and the hardware alike.
#[derive(Debug, thiserror::Error)]
pub enum HardwareError {
    /// The NVML library could not be loaded or initialised.
    #[error(
        "NVML is not available ({detail}); is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path? Use --gpu-backend sim to run without a GPU"
    )]
    NvmlUnavailable {
        /// What NVML or the loader said.
        detail: String,
    },
    /// The library `--nvml-lib` named could not be loaded or initialised.
    #[error(
        "the NVML library {} could not be used ({detail}); check --nvml-lib (GPU_DRA_NVML_LIB), and for the simulated library GPU_DRA_SIM_NODE (a preset or node file) and GPU_DRA_SIM_STATE_DIR",
        path.display()
    )]
    NvmlLibraryUnusable {
        /// The library given.
        path: std::path::PathBuf,
        /// What the loader or NVML said.
        detail: String,
    },
    /// No GPU with that index.
    #[error("no GPU with index {index} on this node (it has {count})")]
    NoSuchGpu {
        /// Requested index.
        index: u32,
        /// GPUs present.
        count: usize,
    },
    /// The GPU has no profile with that driver id.
    #[error("GPU {index} has no MIG profile with id {profile_id} (valid ids: {valid})")]
    NoSuchProfile {
        /// GPU index.
        index: u32,
        /// Requested profile id.
        profile_id: u32,
        /// Comma-separated valid `id (name)` pairs.
        valid: String,
    },
    /// An NVML call returned an error code.
    #[error("{operation} on GPU {index}: {code}")]
    Nvml {
        /// The NVML call or step, e.g. `create GPU instance 3g.40gb at 0:4`.
        operation: String,
        /// GPU index.
        index: u32,
        /// NVML return code.
        code: NvmlCode,
    },
    /// The simulated node description or state is invalid or unreadable.
    #[error(transparent)]
    Sim(#[from] sim::SimError),
    /// The host's PCI bus (sysfs) could not be read for passthrough.
    #[error("reading the PCI bus for passthrough")]
    Passthrough(#[source] passthrough::PassthroughError),
    /// The host's vGPU files (VFs, mdev types, mdevs) could not be read.
    #[error("reading the host's vGPU files")]
    Vgpu(#[source] Box<vgpu::VgpuHostError>),
}

/// NVML return codes the hardware layer distinguishes (values from `nvml.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmlCode {
    /// `NVML_ERROR_INVALID_ARGUMENT` (2).
    InvalidArgument,
    /// `NVML_ERROR_NOT_SUPPORTED` (3): e.g. MIG mode is off.
    NotSupported,
    /// `NVML_ERROR_NO_PERMISSION` (4).
    NoPermission,
    /// `NVML_ERROR_NOT_FOUND` (6).
    NotFound,
    /// `NVML_ERROR_IN_USE` (19): processes or compute instances are active.
    InUse,
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES` (23): e.g. the placement is occupied.
    InsufficientResources,
    /// `NVML_ERROR_RESET_REQUIRED` (16).
    ResetRequired,
    /// `NVML_ERROR_GPU_IS_LOST` (15).
    GpuIsLost,
    /// Any other code, kept raw.
    Other(u32),
}

impl NvmlCode {
    /// Maps a raw `nvmlReturn_t` to a code; `None` for `NVML_SUCCESS`.
    pub fn from_raw(raw: u32) -> Option<NvmlCode> {
        Some(match raw {
            0 => return None,
            2 => NvmlCode::InvalidArgument,
            3 => NvmlCode::NotSupported,
            4 => NvmlCode::NoPermission,
            6 => NvmlCode::NotFound,
            15 => NvmlCode::GpuIsLost,
            16 => NvmlCode::ResetRequired,
            19 => NvmlCode::InUse,
            23 => NvmlCode::InsufficientResources,
            other => NvmlCode::Other(other),
        })
    }

    /// The raw `nvmlReturn_t` value.
    pub fn raw(self) -> u32 {
        match self {
            NvmlCode::InvalidArgument => 2,
            NvmlCode::NotSupported => 3,
            NvmlCode::NoPermission => 4,
            NvmlCode::NotFound => 6,
            NvmlCode::GpuIsLost => 15,
            NvmlCode::ResetRequired => 16,
            NvmlCode::InUse => 19,
            NvmlCode::InsufficientResources => 23,
            NvmlCode::Other(raw) => raw,
        }
    }
}

impl std::fmt::Display for NvmlCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            NvmlCode::InvalidArgument => "NVML_ERROR_INVALID_ARGUMENT",
            NvmlCode::NotSupported => "NVML_ERROR_NOT_SUPPORTED",
            NvmlCode::NoPermission => "NVML_ERROR_NO_PERMISSION",
            NvmlCode::NotFound => "NVML_ERROR_NOT_FOUND",
            NvmlCode::GpuIsLost => "NVML_ERROR_GPU_IS_LOST",
            NvmlCode::ResetRequired => "NVML_ERROR_RESET_REQUIRED",
            NvmlCode::InUse => "NVML_ERROR_IN_USE",
            NvmlCode::InsufficientResources => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            NvmlCode::Other(raw) => return write!(f, "NVML error {raw}"),
        };
        write!(f, "{name} ({})", self.raw())
    }
}

/// A backend's stamp of its inventory ([`GpuBackend::inventory_stamp`]): opaque words that
/// only the backend that made them gives meaning to; compare two for equality only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InventoryStamp(pub [u64; 7]);

/// The hardware operations gpu-dra needs. Implementations must be safe to call from several
/// threads; each call is one consistent step (a failed create leaves nothing behind).
pub trait GpuBackend: Send + Sync {
    /// A short name for logs and `inventory` output (`sim`, `nvml`).
    fn name(&self) -> &'static str;

    /// Everything the node has now: GPUs, MIG modes, profiles and existing MIG devices.
    ///
    /// Fails when the backend cannot be queried (NVML gone, simulated state unreadable).
    fn inventory(&self) -> Result<NodeInventory, HardwareError>;

    /// The inventory a kubelet call plans with: [`GpuBackend::inventory`] (the default), or,
    /// for a backend whose full read is costly and rarely changes, what it keeps from its
    /// last full read brought up to date with every change this process made since
    /// ([`crate::hardware::vgpu::VgpuBackend`]). What such a backend may show out of date is
    /// documented by it; the hardware's own checks at the write refuse what it got wrong.
    ///
    /// Fails as [`GpuBackend::inventory`] does.
    fn request_inventory(&self) -> Result<NodeInventory, HardwareError> {
        self.inventory()
    }

    /// A stamp of everything [`GpuBackend::request_inventory`] reads, taken before reading
    /// it: while a later stamp is equal, the inventory is equal too, and a kubelet call may
    /// plan with the model it built last time instead of reading the node again. `None`
    /// (the default) promises nothing, and every call reads the inventory: a backend whose
    /// hardware other processes change without a trace it can stamp (NVML: an admin's
    /// `nvidia-smi mig`) or whose inventory adds views of its own (the VFIO and vGPU
    /// wrappers) keeps the default.
    ///
    /// Costs at most a `stat`; never fails (a backend that cannot stamp returns `None`).
    fn inventory_stamp(&self) -> Option<InventoryStamp> {
        None
    }

    /// A number that changes whenever a health event arrives or a GPU is added or removed,
    /// cheap enough to poll several times a second: the plugin re-reads the inventory as soon
    /// as it changes instead of waiting for its next interval. The value means nothing
    /// else. Backends that cannot tell return a constant (the default), and changes are then
    /// found on the regular interval only. Called on an async thread: answer from memory or
    /// a stat, never wait on the device or a lock another process holds for long.
    fn health_generation(&self) -> u64 {
        0
    }

    /// A signal notified (from any thread) whenever [`GpuBackend::health_generation`] may
    /// have moved for a reason outside this process's own calls (a health event, a GPU
    /// coming or going, another process rewriting simulated state), so the plugin can wait
    /// for it instead of polling: an idle plugin then wakes only on its regular intervals.
    /// A notification may be spurious (the generation is compared before anything is
    /// read); one sent while nobody waits is kept for the next wait. `None` (the default)
    /// means the backend cannot signal and the plugin polls the generation
    /// ([`crate::plugin::inventory_watch::HEALTH_POLL`]).
    fn health_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }

    /// Switches MIG mode on GPU `index`. On Ampere the change stays pending until a reset;
    /// on Hopper and later it applies at once, or fails with [`NvmlCode::InUse`] when MIG
    /// devices still exist.
    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<MigModeChange, HardwareError>;

    /// Creates a MIG device: the GPU instance of profile `profile_id` (driver id) at
    /// exactly `placement_start`, and its default (whole-GI) compute instance. Fails with
    /// [`NvmlCode::InsufficientResources`] when the placement overlaps an existing GPU
    /// instance or the profile has no capacity left, [`NvmlCode::InvalidArgument`] when the
    /// profile does not allow that placement, and [`NvmlCode::NotSupported`] when MIG mode is
    /// off. Nothing is left behind on failure.
    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, HardwareError>;

    /// Destroys the compute instance `ci_id` and then the GPU instance `gi_id` on GPU `index`.
    /// Fails with [`NvmlCode::NotFound`] when the GPU instance does not exist (callers that
    /// clean up treat that as done) and [`NvmlCode::InUse`] when processes still run on it.
    fn destroy_mig_device(&self, index: u32, gi_id: u32, ci_id: u32) -> Result<(), HardwareError>;

    /// One telemetry sample of every GPU and every MIG device that exists now (power, SM
    /// activity, memory, temperature, ECC, XID counts, retired pages). Readings the hardware
    /// does not offer, or that fail to read, are `None`; a GPU that fell off the bus is
    /// listed as lost. May take
    /// tens of milliseconds per GPU: call it off the request path.
    ///
    /// Fails only when the node cannot be enumerated at all. The default reports no GPUs
    /// (a backend without telemetry exports none).
    fn telemetry(&self) -> Result<telemetry::NodeTelemetry, HardwareError> {
        Ok(telemetry::NodeTelemetry::default())
    }

    /// Whether persistence mode is on for GPU `index` (`nvmlDeviceGetPersistenceMode`).
    /// The default answers [`NvmlCode::NotSupported`].
    fn persistence_mode(&self, index: u32) -> Result<bool, HardwareError> {
        Err(HardwareError::Nvml {
            operation: "get persistence mode".into(),
            index,
            code: NvmlCode::NotSupported,
        })
    }

    /// Turns persistence mode on or off for GPU `index` (`nvmlDeviceSetPersistenceMode`;
    /// needs root). Passthrough turns it off before the GPU leaves `nvidia` and back on
    /// when it returns. The default answers [`NvmlCode::NotSupported`].
    fn set_persistence_mode(&self, index: u32, enabled: bool) -> Result<(), HardwareError> {
        let _ = enabled;
        Err(HardwareError::Nvml {
            operation: "set persistence mode".into(),
            index,
            code: NvmlCode::NotSupported,
        })
    }
}

/// The [`GpuBackend`] operations a wrapping backend (VFIO, vGPU) passes to the backend it
/// wraps unchanged, as the `inner: Arc<dyn GpuBackend>` field of the type it is expanded in:
/// its name, its health signal, MIG writes, telemetry and persistence mode. Expand it inside
/// `impl GpuBackend for <Wrapper>`, beside the operations the wrapper changes (its
/// inventories and health generation); it guarantees only what the inner backend does.
macro_rules! forward_to_inner {
    () => {
        fn name(&self) -> &'static str {
            self.inner.name()
        }

        /// The inner backend's signal; this process's own writes are caught after each call
        /// (the plugin re-checks the generation when a call ends).
        fn health_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
            self.inner.health_signal()
        }

        fn set_mig_mode(
            &self,
            index: u32,
            enabled: bool,
        ) -> Result<$crate::hardware::MigModeChange, $crate::hardware::HardwareError> {
            self.inner.set_mig_mode(index, enabled)
        }

        fn create_mig_device(
            &self,
            index: u32,
            profile_id: u32,
            placement_start: u32,
        ) -> Result<$crate::hardware::MigDevice, $crate::hardware::HardwareError> {
            self.inner
                .create_mig_device(index, profile_id, placement_start)
        }

        fn destroy_mig_device(
            &self,
            index: u32,
            gi_id: u32,
            ci_id: u32,
        ) -> Result<(), $crate::hardware::HardwareError> {
            self.inner.destroy_mig_device(index, gi_id, ci_id)
        }

        fn telemetry(
            &self,
        ) -> Result<$crate::hardware::telemetry::NodeTelemetry, $crate::hardware::HardwareError> {
            self.inner.telemetry()
        }

        fn persistence_mode(&self, index: u32) -> Result<bool, $crate::hardware::HardwareError> {
            self.inner.persistence_mode(index)
        }

        fn set_persistence_mode(
            &self,
            index: u32,
            enabled: bool,
        ) -> Result<(), $crate::hardware::HardwareError> {
            self.inner.set_persistence_mode(index, enabled)
        }
    };
}
pub(crate) use forward_to_inner;
