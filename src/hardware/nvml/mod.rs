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

use std::ffi::CStr;
use std::mem::MaybeUninit;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t,
};

use super::{
    GpuBackend, GpuInfo, HardwareError, MigDevice, MigModeChange, MigModeState, MigProfile,
    NodeInventory, NvmlCode, Placement,
};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in nvml.h.
const GI_PROFILE_COUNT: u32 = 0x12;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_PROFILE_SHARED: u32 = 0;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;
/// `NVML_ERROR_NOT_SUPPORTED` as returned by raw calls.
const RAW_NOT_SUPPORTED: u32 = 3;

/// A GPU node seen through NVML.
pub struct NvmlBackend {
    nvml: Nvml,
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
        let nvml = Nvml::init().map_err(|e| HardwareError::NvmlUnavailable {
            detail: one_line(&e.to_string()),
        })?;
        Ok(NvmlBackend { nvml })
    }

    fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, HardwareError> {
        self.nvml.device_by_index(index).map_err(|e| match e {
            NvmlError::InvalidArg | NvmlError::NotFound => HardwareError::NoSuchGpu {
                index,
                count: self.nvml.device_count().unwrap_or(0) as usize,
            },
            other => wrap("get device handle", index)(other),
        })
    }

    fn gpu_info(&self, index: u32) -> Result<GpuInfo, HardwareError> {
        let dev = self.device(index)?;
        let cc = dev
            .cuda_compute_capability()
            .map_err(wrap("get compute capability", index))?;
        let (major, minor) = (cc.major as u32, cc.minor as u32);
        let memory_mib = dev
            .memory_info()
            .map_err(wrap("get memory info", index))?
            .total
            / (1024 * 1024);
        let pci = dev.pci_info().map_err(wrap("get PCI info", index))?;
        let pci_bus_id = convert::pci_bus_id(&pci.bus_id);
        let mig = match dev.mig_mode() {
            Ok(m) => MigModeState {
                capable: true,
                current: m.current == 1,
                pending: m.pending == 1,
            },
            Err(NvmlError::NotSupported) => MigModeState {
                capable: false,
                current: false,
                pending: false,
            },
            Err(e) => return Err(wrap("get MIG mode", index)(e)),
        };
        // SAFETY: the handle is only passed to NVML calls below while `dev` (and `self.nvml`)
        // are alive; it is never freed by us.
        let handle = unsafe { dev.handle() };
        let mig_profiles = if mig.capable {
            self.profiles(handle, index, memory_mib)?
        } else {
            Vec::new()
        };
        let mig_devices = if mig.current {
            self.mig_devices(&dev, handle, index, &mig_profiles)?
        } else {
            Vec::new()
        };
        Ok(GpuInfo {
            index,
            minor: dev
                .minor_number()
                .map_err(wrap("get minor number", index))?,
            uuid: dev.uuid().map_err(wrap("get UUID", index))?,
            product_name: dev.name().map_err(wrap("get name", index))?,
            brand: convert::brand_name(&dev.brand().map_err(wrap("get brand", index))?),
            architecture: convert::architecture_from_cc(major, minor),
            compute_capability: (major, minor),
            memory_mib,
            multiprocessors: dev
                .attributes()
                .map(|a| a.multiprocessor_count)
                .unwrap_or(0),
            pcie_root: convert::pcie_root_from_bus_id(&pci_bus_id),
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
            empty_gpu_instances: Vec::new(),
            healthy: true,
        })
    }

    /// Every GPU-instance profile with its placements (raw `_v2` placement query).
    fn profiles(
        &self,
        handle: nvmlDevice_t,
        index: u32,
        total_mib: u64,
    ) -> Result<Vec<MigProfile>, HardwareError> {
        let lib = self.nvml.lib();
        let get_info = symbol(
            &lib.nvmlDeviceGetGpuInstanceProfileInfo,
            "nvmlDeviceGetGpuInstanceProfileInfo",
        )?;
        let get_placements = symbol(
            &lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2,
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        )?;
        let mut profiles = Vec::new();
        for profile_index in 0..GI_PROFILE_COUNT {
            let mut info = MaybeUninit::<nvmlGpuInstanceProfileInfo_t>::zeroed();
            // SAFETY: `handle` is a live device handle; `info` points to writable memory of the
            // struct's size, which NVML fills on success.
            let ret = unsafe { get_info(handle, profile_index, info.as_mut_ptr()) };
            if ret == RAW_NOT_SUPPORTED || ret == 2 {
                continue; // the GPU lacks this profile
            }
            check(ret, "get GPU instance profile info", index)?;
            // SAFETY: NVML returned success, so the struct is initialised (and it was zeroed).
            let info = unsafe { info.assume_init() };
            let mut count: u32 = 0;
            // SAFETY: a null buffer with a count pointer asks NVML for the number of placements.
            let ret = unsafe { get_placements(handle, info.id, std::ptr::null_mut(), &mut count) };
            if ret != 0 && ret != 7 {
                check(ret, "count GPU instance placements", index)?;
            }
            let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
            // SAFETY: `buf` holds `count` elements and NVML writes at most `count` of them,
            // updating `count` to the number written.
            let ret = unsafe { get_placements(handle, info.id, buf.as_mut_ptr(), &mut count) };
            check(ret, "get GPU instance placements", index)?;
            buf.truncate(count as usize);
            let memory_slices = buf.first().map(|p| p.size).unwrap_or(0);
            profiles.push(MigProfile {
                name: convert::profile_name(
                    profile_index,
                    info.sliceCount,
                    info.memorySizeMB,
                    total_mib,
                ),
                index: profile_index,
                id: info.id,
                memory_mib: info.memorySizeMB,
                multiprocessors: info.multiprocessorCount,
                copy_engines: info.copyEngineCount,
                decoders: info.decoderCount,
                encoders: info.encoderCount,
                jpeg_engines: info.jpegCount,
                ofa_engines: info.ofaCount,
                max_instances: info.instanceCount,
                compute_slices: info.sliceCount,
                memory_slices,
                placement_starts: buf.iter().map(|p| p.start).collect(),
            });
        }
        Ok(profiles)
    }

    /// MIG devices that exist, with their GI/CI ids and placements.
    fn mig_devices(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        handle: nvmlDevice_t,
        index: u32,
        profiles: &[MigProfile],
    ) -> Result<Vec<MigDevice>, HardwareError> {
        let lib = self.nvml.lib();
        let gi_id_of = symbol(
            &lib.nvmlDeviceGetGpuInstanceId,
            "nvmlDeviceGetGpuInstanceId",
        )?;
        let ci_id_of = symbol(
            &lib.nvmlDeviceGetComputeInstanceId,
            "nvmlDeviceGetComputeInstanceId",
        )?;
        let gi_by_id = symbol(
            &lib.nvmlDeviceGetGpuInstanceById,
            "nvmlDeviceGetGpuInstanceById",
        )?;
        let gi_info = symbol(&lib.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
        let max = dev
            .mig_device_count()
            .map_err(wrap("get MIG device count", index))?;
        let mut out = Vec::new();
        for i in 0..max {
            let mig = match dev.mig_device_by_index(i) {
                Ok(m) => m,
                Err(NvmlError::NotFound) | Err(NvmlError::InvalidArg) => continue,
                Err(e) => return Err(wrap("get MIG device handle", index)(e)),
            };
            // SAFETY: the MIG handle is live while `mig` is; passed only to NVML below.
            let mig_handle = unsafe { mig.handle() };
            let (mut gi_id, mut ci_id) = (0u32, 0u32);
            // SAFETY: live MIG handle and valid out-pointers to u32.
            check(
                unsafe { gi_id_of(mig_handle, &mut gi_id) },
                "get GPU instance id",
                index,
            )?;
            // SAFETY: as above.
            check(
                unsafe { ci_id_of(mig_handle, &mut ci_id) },
                "get compute instance id",
                index,
            )?;
            let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
            // SAFETY: parent handle is live; `gi` receives an NVML-owned handle.
            check(
                unsafe { gi_by_id(handle, gi_id, &mut gi) },
                "get GPU instance",
                index,
            )?;
            let mut info = MaybeUninit::<nvmlGpuInstanceInfo_t>::zeroed();
            // SAFETY: `gi` was just returned by NVML; `info` is writable and sized for the struct.
            check(
                unsafe { gi_info(gi, info.as_mut_ptr()) },
                "get GPU instance info",
                index,
            )?;
            // SAFETY: NVML returned success, so the struct is initialised.
            let info = unsafe { info.assume_init() };
            let profile = profiles.iter().find(|p| p.id == info.profileId);
            out.push(MigDevice {
                uuid: mig.uuid().map_err(wrap("get MIG UUID", index))?,
                profile_id: info.profileId,
                profile_name: profile.map(|p| p.name.clone()).unwrap_or_default(),
                gi_id,
                ci_id,
                placement: Placement {
                    start: info.placement.start,
                    size: info.placement.size,
                },
            });
        }
        out.sort_by_key(|d| (d.placement.start, d.gi_id));
        Ok(out)
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Result<NodeInventory, HardwareError> {
        let count = self.nvml.device_count().map_err(wrap("count devices", 0))?;
        let gpus = (0..count)
            .map(|i| self.gpu_info(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NodeInventory {
            driver_version: self
                .nvml
                .sys_driver_version()
                .map_err(wrap("get driver version", 0))?,
            cuda_driver_version: convert::cuda_version(
                self.nvml
                    .sys_cuda_driver_version()
                    .map_err(wrap("get CUDA version", 0))?,
            ),
            gpus,
        })
    }

    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<MigModeChange, HardwareError> {
        let dev = self.device(index)?;
        let mode = dev.mig_mode().map_err(wrap("get MIG mode", index))?;
        let want = u32::from(enabled);
        if mode.current == want && mode.pending == want {
            return Ok(MigModeChange::Unchanged);
        }
        let status = dev
            .set_mig_mode(enabled)
            .map_err(wrap("set MIG mode", index))?;
        if let Some(code) = NvmlCode::from_raw(status) {
            return match code {
                NvmlCode::ResetRequired => Ok(MigModeChange::PendingReset),
                code => Err(HardwareError::Nvml {
                    operation: "activate MIG mode".into(),
                    index,
                    code,
                }),
            };
        }
        let after = dev.mig_mode().map_err(wrap("get MIG mode", index))?;
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
        let info = self.gpu_info(index)?;
        let profile = info.profile_by_id(profile_id).cloned().ok_or_else(|| {
            HardwareError::NoSuchProfile {
                index,
                profile_id,
                valid: info
                    .mig_profiles
                    .iter()
                    .map(|p| format!("{} ({})", p.id, p.name))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })?;
        let op = format!(
            "create GPU instance {} at {}:{}",
            profile.name, placement_start, profile.memory_slices
        );
        let dev = self.device(index)?;
        let lib = self.nvml.lib();
        let create_gi = symbol(
            &lib.nvmlDeviceCreateGpuInstanceWithPlacement,
            "nvmlDeviceCreateGpuInstanceWithPlacement",
        )?;
        let gi_info = symbol(&lib.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
        let ci_profile = symbol(
            &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        )?;
        let create_ci = symbol(
            &lib.nvmlGpuInstanceCreateComputeInstance,
            "nvmlGpuInstanceCreateComputeInstance",
        )?;
        let ci_info = symbol(
            &lib.nvmlComputeInstanceGetInfo_v2,
            "nvmlComputeInstanceGetInfo_v2",
        )?;
        let destroy_gi = symbol(&lib.nvmlGpuInstanceDestroy, "nvmlGpuInstanceDestroy")?;
        let get_uuid = symbol(&lib.nvmlDeviceGetUUID, "nvmlDeviceGetUUID")?;

        let placement = nvmlGpuInstancePlacement_t {
            start: placement_start,
            size: profile.memory_slices,
        };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: the device handle is live for this call (`dev` outlives it); `placement` is a
        // valid struct read by NVML; `gi` receives an NVML-owned handle.
        check(
            unsafe { create_gi(dev.handle(), profile_id, &placement, &mut gi) },
            &op,
            index,
        )?;
        let destroy_on_err = |e: HardwareError| {
            // SAFETY: `gi` is the instance created above and not yet destroyed.
            let _ = unsafe { destroy_gi(gi) };
            e
        };
        let mut gi_out = MaybeUninit::<nvmlGpuInstanceInfo_t>::zeroed();
        // SAFETY: `gi` is live; `gi_out` is writable memory of the struct's size.
        check(
            unsafe { gi_info(gi, gi_out.as_mut_ptr()) },
            "get GPU instance info",
            index,
        )
        .map_err(destroy_on_err)?;
        // SAFETY: success above means NVML initialised the struct.
        let gi_out = unsafe { gi_out.assume_init() };
        let ci_index =
            convert::default_ci_profile_index(profile.compute_slices).ok_or_else(|| {
                destroy_on_err(HardwareError::Nvml {
                    operation: format!(
                        "pick compute instance profile for {} compute slices",
                        profile.compute_slices
                    ),
                    index,
                    code: NvmlCode::NotSupported,
                })
            })?;
        let mut cip = MaybeUninit::<nvmlComputeInstanceProfileInfo_t>::zeroed();
        // SAFETY: `gi` is live; `cip` is writable memory of the struct's size.
        check(
            unsafe { ci_profile(gi, ci_index, CI_ENGINE_PROFILE_SHARED, cip.as_mut_ptr()) },
            "get compute instance profile",
            index,
        )
        .map_err(destroy_on_err)?;
        // SAFETY: success above means NVML initialised the struct.
        let cip = unsafe { cip.assume_init() };
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is live; `ci` receives an NVML-owned handle.
        check(
            unsafe { create_ci(gi, cip.id, &mut ci) },
            "create compute instance",
            index,
        )
        .map_err(destroy_on_err)?;
        let mut ci_out = MaybeUninit::<nvmlComputeInstanceInfo_t>::zeroed();
        // SAFETY: `ci` is live; `ci_out` is writable memory of the struct's size.
        check(
            unsafe { ci_info(ci, ci_out.as_mut_ptr()) },
            "get compute instance info",
            index,
        )?;
        // SAFETY: success above means NVML initialised the struct.
        let ci_out = unsafe { ci_out.assume_init() };
        let mut buf = [0 as std::ffi::c_char; UUID_BUFFER];
        // SAFETY: `ci_out.device` is the MIG device handle NVML returned for the new compute
        // instance (as NVIDIA's driver relies on); `buf` holds UUID_BUFFER bytes.
        check(
            unsafe { get_uuid(ci_out.device, buf.as_mut_ptr(), UUID_BUFFER as u32) },
            "get MIG device UUID",
            index,
        )?;
        // SAFETY: NVML wrote a NUL-terminated string into `buf` on success.
        let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(MigDevice {
            uuid,
            profile_id,
            profile_name: profile.name.clone(),
            gi_id: gi_out.id,
            ci_id: ci_out.id,
            placement: Placement {
                start: gi_out.placement.start,
                size: gi_out.placement.size,
            },
        })
    }

    fn destroy_mig_device(&self, index: u32, gi_id: u32, ci_id: u32) -> Result<(), HardwareError> {
        let dev = self.device(index)?;
        let lib = self.nvml.lib();
        let gi_by_id = symbol(
            &lib.nvmlDeviceGetGpuInstanceById,
            "nvmlDeviceGetGpuInstanceById",
        )?;
        let ci_by_id = symbol(
            &lib.nvmlGpuInstanceGetComputeInstanceById,
            "nvmlGpuInstanceGetComputeInstanceById",
        )?;
        let destroy_ci = symbol(
            &lib.nvmlComputeInstanceDestroy,
            "nvmlComputeInstanceDestroy",
        )?;
        let destroy_gi = symbol(&lib.nvmlGpuInstanceDestroy, "nvmlGpuInstanceDestroy")?;
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: live device handle; `gi` receives an NVML-owned handle.
        check(
            unsafe { gi_by_id(dev.handle(), gi_id, &mut gi) },
            &format!("find GPU instance {gi_id}"),
            index,
        )?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is live; `ci` receives an NVML-owned handle.
        let found = unsafe { ci_by_id(gi, ci_id, &mut ci) };
        if found == 0 {
            // SAFETY: `ci` was returned by NVML just above and is destroyed once.
            check(
                unsafe { destroy_ci(ci) },
                &format!("destroy compute instance {ci_id}"),
                index,
            )?;
        }
        // A CI already gone (a partial earlier cleanup) is fine; the GI still goes.
        // SAFETY: `gi` is live and destroyed once.
        check(
            unsafe { destroy_gi(gi) },
            &format!("destroy GPU instance {gi_id}"),
            index,
        )
    }
}

/// NVML and loader messages can span lines; logs and CLI errors want one.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
