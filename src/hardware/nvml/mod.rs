//! The real backend over NVML (`libnvidia-ml.so.1`, loaded at run time by nvml-wrapper).
//!
//! nvml-wrapper covers queries; GPU- and compute-instance lifecycle calls (and the placement
//! query, whose safe wrapper returns an empty list) exist only as raw functions in
//! nvml-wrapper-sys, so they are called here through `Nvml::lib()`. This module is the only
//! place in gpu-dra with `unsafe`; each block states why it is sound.
//!
//! Without a GPU driver on the machine, [`NvmlBackend::open`] fails at once with
//! [`HardwareError::NvmlUnavailable`], a one-line message that says what to do.

pub mod convert;
mod events;
mod fabric;
mod mig;
mod telemetry;
mod vgpu;

use std::path::Path;
use std::sync::Arc;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use super::{
    GpuBackend, GpuInfo, HardwareError, MigDevice, MigModeChange, MigModeState, NodeInventory,
    NvmlCode,
};

/// A GPU node seen through NVML.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    /// Health from the NVML event set, kept by a dedicated thread; stopped on drop.
    health: events::HealthWatch,
    /// XID counts and GPM samples for telemetry.
    telemetry: telemetry::Telemetry,
    /// Each GPU as its last full read found it, for [`GpuBackend::request_inventory`].
    known: std::sync::Mutex<Known>,
}

/// How long what a full read of a GPU found serves [`GpuBackend::inventory`] too (a kubelet
/// call's inventory uses it at any age): past it, the next inventory reads the GPU in full.
pub const FACTS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// What full reads found that a kubelet call's inventory, and an inventory round within
/// [`FACTS_MAX_AGE`], reuse instead of asking NVML again.
///
/// A GPU's entry is reused only while the GPU at that index answers with the same UUID and
/// the same MIG mode (capable, current). Its product, PCI address and root, NUMA node, module
/// ID, MIG profile table with placements and supported vGPU types do not change while it
/// does: they are the GPU's and the driver's (a driver reload ends this process's NVML
/// session), and the profile table follows the MIG mode. Its memory size can, after a GPU
/// reset that applies a pending ECC mode change on a GPU that reserves memory for ECC: an
/// entry older than [`FACTS_MAX_AGE`] is read in full again by the next
/// [`GpuBackend::inventory`] (an inventory round), so that size is seen within about a minute
/// and an inventory round.
#[derive(Default)]
struct Known {
    /// By NVML index: the GPU as last read in full, and when.
    gpus: std::collections::BTreeMap<u32, (GpuInfo, std::time::Instant)>,
    /// The driver's and CUDA driver's versions, once read (they change only with a driver
    /// reload).
    versions: Option<(String, String)>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

/// Maps a wrapper error of step `operation` on GPU `index`.
fn wrap(operation: &str, index: u32) -> impl FnOnce(NvmlError) -> HardwareError + '_ {
    move |e| HardwareError::Nvml {
        operation: operation.to_string(),
        index,
        code: wrapper_code(&e),
    }
}

/// The NVML return code behind a wrapper error.
fn wrapper_code(e: &NvmlError) -> NvmlCode {
    match e {
        NvmlError::InvalidArg => NvmlCode::InvalidArgument,
        NvmlError::NotSupported => NvmlCode::NotSupported,
        NvmlError::NoPermission => NvmlCode::NoPermission,
        NvmlError::NotFound => NvmlCode::NotFound,
        NvmlError::InUse => NvmlCode::InUse,
        NvmlError::ResetRequired => NvmlCode::ResetRequired,
        NvmlError::GpuLost => NvmlCode::GpuIsLost,
        NvmlError::Uninitialized => NvmlCode::Other(1),
        NvmlError::InsufficientSize(_) => NvmlCode::Other(7),
        NvmlError::InsufficientPower => NvmlCode::Other(8),
        NvmlError::DriverNotLoaded => NvmlCode::Other(9),
        NvmlError::Timeout => NvmlCode::Other(10),
        NvmlError::IrqIssue => NvmlCode::Other(11),
        NvmlError::LibraryNotFound => NvmlCode::Other(12),
        NvmlError::FunctionNotFound => NvmlCode::Other(13),
        NvmlError::CorruptedInfoROM => NvmlCode::Other(14),
        NvmlError::OperatingSystem => NvmlCode::Other(17),
        NvmlError::LibRmVersionMismatch => NvmlCode::Other(18),
        NvmlError::InsufficientMemory => NvmlCode::Other(20),
        NvmlError::NoData => NvmlCode::Other(21),
        NvmlError::VgpuEccNotSupported => NvmlCode::Other(22),
        NvmlError::Unknown => NvmlCode::Other(999),
        NvmlError::UnexpectedVariant(raw) => {
            NvmlCode::from_raw(*raw).unwrap_or(NvmlCode::Other(*raw))
        }
        _ => NvmlCode::Other(999),
    }
}

/// Turns a raw `nvmlReturn_t` into a result for step `operation`.
fn check(raw: u32, operation: &str, index: u32) -> Result<(), HardwareError> {
    match NvmlCode::from_raw(raw) {
        None => Ok(()),
        Some(code) => Err(HardwareError::Nvml {
            operation: operation.to_string(),
            index,
            code,
        }),
    }
}

/// A symbol an old driver's library lacks is a clear error, not a crash.
fn symbol<T: Copy, E: std::fmt::Display>(
    sym: &Result<T, E>,
    name: &str,
) -> Result<T, HardwareError> {
    sym.as_ref().copied().map_err(|e| HardwareError::NvmlUnavailable {
        detail: format!("{name} is missing from libnvidia-ml ({e}); the driver is too old for MIG management"),
    })
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` and initialises NVML.
    ///
    /// Fails with [`HardwareError::NvmlUnavailable`] when the library is absent or the driver
    /// is not loaded.
    pub fn open() -> Result<NvmlBackend, HardwareError> {
        NvmlBackend::open_with(None)
    }

    /// Loads NVML from `lib` (`--nvml-lib`, e.g. the simulated library) or, without it, the
    /// system's `libnvidia-ml.so.1`, initialises it and starts watching its events for health
    /// (a dedicated thread, stopped when the backend is dropped).
    ///
    /// Fails with [`HardwareError::NvmlLibraryUnusable`] (naming the library) or, for the
    /// system's, [`HardwareError::NvmlUnavailable`] when it cannot be loaded or initialised.
    pub fn open_with(lib: Option<&Path>) -> Result<NvmlBackend, HardwareError> {
        let init = match lib {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::init(),
        };
        let nvml = Arc::new(init.map_err(|e| match lib {
            Some(path) => HardwareError::NvmlLibraryUnusable {
                path: path.to_path_buf(),
                detail: one_line(&e.to_string()),
            },
            None => HardwareError::NvmlUnavailable {
                detail: one_line(&e.to_string()),
            },
        })?);
        let health = events::HealthWatch::start(nvml.clone());
        let telemetry = telemetry::Telemetry::new(nvml.clone());
        Ok(NvmlBackend {
            nvml,
            health,
            telemetry,
            known: Default::default(),
        })
    }

    fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, HardwareError> {
        self.nvml.device_by_index(index).map_err(|e| match e {
            NvmlError::InvalidArg | NvmlError::NotFound => HardwareError::NoSuchGpu {
                index,
                count: self.nvml.device_count().unwrap_or(0) as usize,
            },
            other => wrap("nvmlDeviceGetHandleByIndex_v2", index)(other),
        })
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        // The map holds plain values; one a panic interrupted is replaced by the next read.
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// GPU `index` for a kubelet call: what can change (MIG mode, MIG devices and empty GPU
    /// instances, fabric state, creatable vGPU types and heterogeneous mode, health) read
    /// afresh, the rest taken from the last full read of the same GPU ([`Known`]). A GPU
    /// with another UUID or MIG mode than that read, or one not read yet, is read in full.
    ///
    /// Fails as [`NvmlBackend::gpu_info`] does, naming the NVML call.
    fn request_gpu_info(&self, index: u32) -> Result<GpuInfo, HardwareError> {
        self.kept_gpu_info(index, None)
    }

    /// [`NvmlBackend::request_gpu_info`] with kept facts no older than `max_age` (any age
    /// for `None`); older ones are read in full again.
    fn kept_gpu_info(
        &self,
        index: u32,
        max_age: Option<std::time::Duration>,
    ) -> Result<GpuInfo, HardwareError> {
        let dev = self.device(index)?;
        let (uuid, mig, known) = self.known_gpu(&dev, index, max_age)?;
        let Some(mut info) = known else {
            return self.gpu_info(&dev, index, uuid, mig);
        };
        self.health.saw(&uuid);
        // SAFETY: the handle is only passed to NVML calls below while `dev` (and `self.nvml`)
        // are alive; it is never freed by us.
        let handle = unsafe { dev.handle() };
        (info.mig_devices, info.empty_gpu_instances) = if mig.current {
            self.mig_state(&dev, handle, index, &info.mig_profiles)?
        } else {
            (Vec::new(), Vec::new())
        };
        info.mig = mig;
        info.fabric = self.fabric(handle, index)?;
        if let Some(vgpu) = info.vgpu.as_mut() {
            self.refresh_vgpu(&dev, handle, index, vgpu)?;
        }
        info.healthy = self.health.healthy(&uuid);
        info.faults = self.health.faults(&uuid);
        Ok(info)
    }

    /// GPU `index`'s UUID and MIG mode now, and its last full read if that was of the same
    /// GPU in the same MIG mode ([`Known`]).
    fn known_gpu(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        index: u32,
        max_age: Option<std::time::Duration>,
    ) -> Result<(String, MigModeState, Option<GpuInfo>), HardwareError> {
        let uuid = dev.uuid().map_err(wrap("nvmlDeviceGetUUID", index))?;
        let mig = mig_mode(dev, index)?;
        let known = self
            .known()
            .gpus
            .get(&index)
            .filter(|(k, at)| {
                k.uuid == uuid
                    && k.mig.capable == mig.capable
                    && k.mig.current == mig.current
                    && max_age.is_none_or(|max| at.elapsed() < max)
            })
            .map(|(k, _)| k.clone());
        Ok((uuid, mig, known))
    }

    /// GPU `index` for a caller that reads only what cannot change (its MIG profile table,
    /// for a creation): the last full read of the same GPU in the same MIG mode, whose MIG
    /// devices, fabric state and health may be out of date; a full read when there is none.
    ///
    /// Fails as [`NvmlBackend::gpu_info`] does, naming the NVML call.
    pub(super) fn gpu_facts(&self, index: u32) -> Result<GpuInfo, HardwareError> {
        let dev = self.device(index)?;
        match self.known_gpu(&dev, index, None)? {
            (_, _, Some(known)) => Ok(known),
            (uuid, mig, None) => self.gpu_info(&dev, index, uuid, mig),
        }
    }

    /// The MIG profile table the last full read of GPU `index` kept, if that read was of the
    /// GPU with `uuid` in MIG mode: no NVML call, for callers that know both already.
    pub(super) fn kept_profiles(
        &self,
        index: u32,
        uuid: &str,
    ) -> Option<Vec<crate::hardware::MigProfile>> {
        self.known()
            .gpus
            .get(&index)
            .filter(|(k, _)| k.uuid == uuid && k.mig.current)
            .map(|(k, _)| k.mig_profiles.clone())
    }

    /// The MIG devices of a GPU in MIG mode, and its GPU instances without one.
    fn mig_state(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        handle: nvml_wrapper_sys::bindings::nvmlDevice_t,
        index: u32,
        profiles: &[crate::hardware::MigProfile],
    ) -> Result<(Vec<MigDevice>, Vec<crate::hardware::GpuInstanceRef>), HardwareError> {
        let gis = self.gpu_instances(handle, index, profiles)?;
        let devices = self.mig_devices(dev, handle, index, profiles, &gis)?;
        let empty = self.empty_gpu_instances(index, &gis, &devices)?;
        Ok((devices, empty))
    }

    /// Every GPU NVML enumerates, each read by `gpu`, with the driver's versions.
    fn read_inventory(
        &self,
        gpu: impl Fn(u32) -> Result<GpuInfo, HardwareError>,
    ) -> Result<NodeInventory, HardwareError> {
        let count = self
            .nvml
            .device_count()
            .map_err(wrap("nvmlDeviceGetCount_v2", 0))?;
        let gpus = (0..count).map(gpu).collect::<Result<Vec<_>, _>>()?;
        let known = self.known().versions.clone();
        let (driver_version, cuda_driver_version) = match known {
            Some(versions) => versions,
            None => {
                let versions = (
                    self.nvml
                        .sys_driver_version()
                        .map_err(wrap("nvmlSystemGetDriverVersion", 0))?,
                    convert::cuda_version(
                        self.nvml
                            .sys_cuda_driver_version()
                            .map_err(wrap("nvmlSystemGetCudaDriverVersion_v2", 0))?,
                    ),
                );
                self.known().versions = Some(versions.clone());
                versions
            }
        };
        Ok(NodeInventory {
            driver_version,
            cuda_driver_version,
            gpus,
            passthrough: None,
            vgpu_host: None,
        })
    }

    /// GPU `index` (`dev`, whose UUID and MIG mode were just read) read in full, remembered
    /// for [`NvmlBackend::request_gpu_info`].
    fn gpu_info(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        index: u32,
        uuid: String,
        mig: MigModeState,
    ) -> Result<GpuInfo, HardwareError> {
        let cc = dev
            .cuda_compute_capability()
            .map_err(wrap("nvmlDeviceGetCudaComputeCapability", index))?;
        let (major, minor) = (cc.major as u32, cc.minor as u32);
        let memory_mib = dev
            .memory_info()
            .map_err(wrap("nvmlDeviceGetMemoryInfo_v2", index))?
            .total
            / (1024 * 1024);
        let pci = dev
            .pci_info()
            .map_err(wrap("nvmlDeviceGetPciInfo_v3", index))?;
        let pci_bus_id = convert::pci_bus_id(&pci.bus_id);
        // SAFETY: the handle is only passed to NVML calls below while `dev` (and `self.nvml`)
        // are alive; it is never freed by us.
        let handle = unsafe { dev.handle() };
        let mig_profiles = if mig.capable {
            self.profiles(handle, index, memory_mib)?
        } else {
            Vec::new()
        };
        let (mig_devices, empty_gpu_instances) = if mig.current {
            self.mig_state(dev, handle, index, &mig_profiles)?
        } else {
            (Vec::new(), Vec::new())
        };
        self.health.saw(&uuid);
        let fabric = self.fabric(handle, index)?;
        let module_id = self.module_id(handle, index)?;
        let vgpu = self.vgpu(dev, handle, index, &mig_profiles)?;
        let info = GpuInfo {
            healthy: self.health.healthy(&uuid),
            faults: self.health.faults(&uuid),
            uuid,
            index,
            minor: dev
                .minor_number()
                .map_err(wrap("nvmlDeviceGetMinorNumber", index))?,
            product_name: dev.name().map_err(wrap("nvmlDeviceGetName", index))?,
            brand: convert::brand_name(&dev.brand().map_err(wrap("nvmlDeviceGetBrand", index))?),
            architecture: convert::architecture_from_cc(major, minor),
            compute_capability: (major, minor),
            memory_mib,
            // NVML answers attributes for MIG handles only; a full GPU's SMs follow from its
            // CUDA cores.
            multiprocessors: dev
                .attributes()
                .map(|a| a.multiprocessor_count)
                .or_else(|_| {
                    dev.num_cores()
                        .map(|c| c / convert::cores_per_sm(major, minor))
                })
                .unwrap_or(0),
            pcie_root: pcie_root(&pci_bus_id),
            pci_bus_id,
            numa_node: dev.numa_node_id().ok().map(i64::from),
            mig,
            memory_slices: mig_profiles
                .iter()
                .map(|p| p.memory_slices)
                .max()
                .unwrap_or(0),
            mig_profiles,
            mig_devices,
            empty_gpu_instances,
            fabric,
            module_id,
            vgpu,
        };
        self.known()
            .gpus
            .insert(index, (info.clone(), std::time::Instant::now()));
        Ok(info)
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    /// Bumped by the event thread on every event and every GPU it newly registers.
    fn health_generation(&self) -> u64 {
        self.health.generation()
    }

    /// Notified by the event thread with every generation change.
    fn health_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        self.health.signal()
    }

    /// Each GPU read in full when what is kept of it is older than [`FACTS_MAX_AGE`] (or of
    /// another GPU or MIG mode), else as a kubelet call reads it: every inventory round
    /// asks NVML everything that can change, and the rest once a minute.
    fn inventory(&self) -> Result<NodeInventory, HardwareError> {
        self.read_inventory(|i| self.kept_gpu_info(i, Some(FACTS_MAX_AGE)))
    }

    /// [`GpuBackend::inventory`] with what cannot change taken from the last full read of
    /// each GPU (`request_gpu_info`): about a quarter of the NVML calls on a
    /// node of MIG GPUs. MIG mode, MIG devices, empty GPU instances, fabric state, creatable
    /// vGPU types, heterogeneous mode and health are read afresh, as a full read would.
    fn request_inventory(&self) -> Result<NodeInventory, HardwareError> {
        self.read_inventory(|i| self.request_gpu_info(i))
    }

    fn persistence_mode(&self, index: u32) -> Result<bool, HardwareError> {
        self.device(index)?
            .is_in_persistent_mode()
            .map_err(wrap("nvmlDeviceGetPersistenceMode", index))
    }

    fn set_persistence_mode(&self, index: u32, enabled: bool) -> Result<(), HardwareError> {
        self.device(index)?
            .set_persistent(enabled)
            .map_err(wrap("nvmlDeviceSetPersistenceMode", index))
    }

    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<MigModeChange, HardwareError> {
        let dev = self.device(index)?;
        let mode = dev
            .mig_mode()
            .map_err(wrap("nvmlDeviceGetMigMode", index))?;
        let want = u32::from(enabled);
        if mode.current == want && mode.pending == want {
            return Ok(MigModeChange::Unchanged);
        }
        let status = dev
            .set_mig_mode(enabled)
            .map_err(wrap("nvmlDeviceSetMigMode", index))?;
        if let Some(code) = NvmlCode::from_raw(status) {
            return match code {
                NvmlCode::ResetRequired => Ok(MigModeChange::PendingReset),
                code => Err(HardwareError::Nvml {
                    operation: "nvmlDeviceSetMigMode (activation status)".into(),
                    index,
                    code,
                }),
            };
        }
        let after = dev
            .mig_mode()
            .map_err(wrap("nvmlDeviceGetMigMode", index))?;
        Ok(if after.current == want {
            MigModeChange::Applied
        } else {
            MigModeChange::PendingReset
        })
    }

    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, HardwareError> {
        self.create_mig(index, profile_id, placement_start)
    }

    fn destroy_mig_device(&self, index: u32, gi_id: u32, ci_id: u32) -> Result<(), HardwareError> {
        self.destroy_mig(index, gi_id, ci_id)
    }

    fn telemetry(&self) -> Result<super::telemetry::NodeTelemetry, HardwareError> {
        self.sample_telemetry()
    }
}

/// A GPU's MIG mode; a GPU without MIG (`NOT_SUPPORTED`) is not capable.
fn mig_mode(dev: &nvml_wrapper::Device<'_>, index: u32) -> Result<MigModeState, HardwareError> {
    match dev.mig_mode() {
        Ok(m) => Ok(MigModeState {
            capable: true,
            current: m.current == 1,
            pending: m.pending == 1,
        }),
        Err(NvmlError::NotSupported) => Ok(MigModeState {
            capable: false,
            current: false,
            pending: false,
        }),
        Err(e) => Err(wrap("nvmlDeviceGetMigMode", index)(e)),
    }
}

/// The PCIe root complex of an NVIDIA device as sysfs shows it (`/sys/bus/pci/devices/<id>`
/// resolves to `/sys/devices/pci0000:15/…/<id>`); when sysfs has no NVIDIA device at that
/// address (a simulated library), the root derived from the bus ID.
fn pcie_root(bus_id: &str) -> String {
    let dev = Path::new("/sys/bus/pci/devices").join(bus_id);
    let nvidia = std::fs::read_to_string(dev.join("vendor")).is_ok_and(|v| v.trim() == "0x10de");
    let from_sysfs = nvidia
        .then(|| std::fs::canonicalize(&dev).ok())
        .flatten()
        .and_then(|path| {
            path.components()
                .filter_map(|c| c.as_os_str().to_str())
                .find(|c| c.starts_with("pci"))
                .map(str::to_string)
        });
    from_sysfs.unwrap_or_else(|| convert::pcie_root_from_bus_id(bus_id))
}

/// NVML and loader messages can span lines; logs and CLI errors want one.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
