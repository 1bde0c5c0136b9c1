//! A GPU's vGPU support through NVML: the supported types with their framebuffer, instance
//! count, homogeneity caps and GPU-instance profile, the creatable types, the host vGPU mode
//! and the heterogeneous mode. nvml-wrapper wraps all of these but the heterogeneous mode,
//! which is called raw (`nvmlDeviceGetVgpuHeterogeneousMode` with a v1 struct).

use std::mem::MaybeUninit;

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{HostVgpuMode, VgpuCapability};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    INVALID_GPU_INSTANCE_PROFILE_ID, nvmlDevice_t,
    nvmlEnableState_enum_NVML_FEATURE_ENABLED as FEATURE_ENABLED,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH as RAW_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND as RAW_FUNCTION_NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as RAW_NOT_SUPPORTED,
    nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_SIZE as CAP_EXCLUSIVE_SIZE,
    nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_TYPE as CAP_EXCLUSIVE_TYPE,
    nvmlVgpuHeterogeneousMode_v1_t,
};

use super::{NvmlBackend, check, wrap};
use crate::hardware::vgpu::{GpuVgpu, VgpuFramework, VgpuType};
use crate::hardware::{HardwareError, MigProfile};

/// `nvmlVgpuHeterogeneousMode_v1`: `NVML_STRUCT_VERSION(VgpuHeterogeneousMode, 1)`.
const HETEROGENEOUS_MODE_V1: u32 = (size_of::<nvmlVgpuHeterogeneousMode_v1_t>() as u32) | (1 << 24);

const MIB: u64 = 1024 * 1024;

/// Whether a wrapper error means "this driver has no such thing": NOT_SUPPORTED (a GPU or
/// driver without vGPU), FUNCTION_NOT_FOUND, or a library without the symbol (an older
/// driver).
fn absent(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// `Ok(None)` for an [`absent`] answer, the value for a present one, an error naming
/// `operation` otherwise.
fn optional<T>(
    result: Result<T, NvmlError>,
    operation: &str,
    index: u32,
) -> Result<Option<T>, HardwareError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if absent(&e) => Ok(None),
        Err(e) => Err(wrap(operation, index)(e)),
    }
}

impl NvmlBackend {
    /// What NVML says about the GPU's vGPU support; `None` when it offers none: the GPU or
    /// driver has no vGPU manager (NOT_SUPPORTED), the library is too old for the calls, or
    /// it lists no types. Other NVML failures are errors naming the call.
    ///
    /// A MIG-backed type whose GPU-instance profile is not among `mig_profiles` is left out:
    /// without its profile it would pass for a time-sliced type and be mixed with those.
    pub(super) fn vgpu(
        &self,
        dev: &Device<'_>,
        handle: nvmlDevice_t,
        index: u32,
        mig_profiles: &[MigProfile],
    ) -> Result<Option<GpuVgpu>, HardwareError> {
        let Some(types) = optional(
            dev.vgpu_supported_types(),
            "nvmlDeviceGetSupportedVgpus",
            index,
        )?
        else {
            return Ok(None);
        };
        if types.is_empty() {
            return Ok(None);
        }
        let mut supported = Vec::with_capacity(types.len());
        for t in &types {
            let profile_id = optional(
                t.instance_profile_id(),
                "nvmlVgpuTypeGetGpuInstanceProfileId",
                index,
            )?
            .unwrap_or(INVALID_GPU_INSTANCE_PROFILE_ID);
            let mig_profile = if profile_id == INVALID_GPU_INSTANCE_PROFILE_ID {
                None
            } else {
                match mig_profiles.iter().find(|p| p.id == profile_id) {
                    Some(p) => Some(p.name.clone()),
                    None => continue,
                }
            };
            let cap = |cap, operation| {
                optional(t.capabilities(cap), operation, index).map(|v| v.unwrap_or(false))
            };
            supported.push(VgpuType {
                id: t.id(),
                name: t.name().map_err(wrap("nvmlVgpuTypeGetName", index))?,
                framebuffer_mib: t
                    .framebuffer_size()
                    .map_err(wrap("nvmlVgpuTypeGetFramebufferSize", index))?
                    / MIB,
                max_instances: t
                    .max_instances()
                    .map_err(wrap("nvmlVgpuTypeGetMaxInstances", index))?,
                exclusive_type: cap(
                    CAP_EXCLUSIVE_TYPE,
                    "nvmlVgpuTypeGetCapabilities (EXCLUSIVE_TYPE)",
                )?,
                exclusive_size: cap(
                    CAP_EXCLUSIVE_SIZE,
                    "nvmlVgpuTypeGetCapabilities (EXCLUSIVE_SIZE)",
                )?,
                mig_profile,
            });
        }
        // A driver without the SR-IOV query predates vdev: mdev.
        let framework = match optional(dev.vgpu_host_mode(), "nvmlDeviceGetHostVgpuMode", index)? {
            Some(HostVgpuMode::Sriov) => VgpuFramework::Vdev,
            Some(HostVgpuMode::NonSriov) | None => VgpuFramework::Mdev,
        };
        let mut vgpu = GpuVgpu {
            framework,
            heterogeneous: false,
            supported,
            creatable: Vec::new(),
        };
        self.refresh_vgpu(dev, handle, index, &mut vgpu)?;
        Ok(Some(vgpu))
    }

    /// Reads again what of `vgpu` changes while the GPU keeps its driver: the creatable types
    /// (they follow the vGPUs that run) and the heterogeneous mode (an admin may switch it).
    /// The supported types and the host mode are the driver's and the GPU's, kept as read.
    ///
    /// Fails as [`NvmlBackend::vgpu`] does, naming the call.
    pub(super) fn refresh_vgpu(
        &self,
        dev: &Device<'_>,
        handle: nvmlDevice_t,
        index: u32,
        vgpu: &mut GpuVgpu,
    ) -> Result<(), HardwareError> {
        vgpu.creatable = optional(
            dev.vgpu_creatable_types(),
            "nvmlDeviceGetCreatableVgpus",
            index,
        )?
        .unwrap_or_default()
        .iter()
        .map(|t| t.id())
        .collect();
        vgpu.heterogeneous = self.heterogeneous(dev, handle, index)?;
        Ok(())
    }

    /// Whether the GPU runs time-sliced types of different sizes side by side: its
    /// heterogeneous mode is enabled and neither heterogeneous-timeslice capability
    /// (profiles, sizes) is reported off. A driver or GPU that cannot say (NOT_SUPPORTED,
    /// which NVML also answers while MIG is enabled; FUNCTION_NOT_FOUND; a newer struct
    /// version; no symbol) is homogeneous: one type per GPU is what every driver allows.
    fn heterogeneous(
        &self,
        dev: &Device<'_>,
        handle: nvmlDevice_t,
        index: u32,
    ) -> Result<bool, HardwareError> {
        let Ok(&call) = self.nvml.lib().nvmlDeviceGetVgpuHeterogeneousMode.as_ref() else {
            return Ok(false);
        };
        let mut mode = MaybeUninit::<nvmlVgpuHeterogeneousMode_v1_t>::zeroed();
        // SAFETY: `mode` is zeroed (a valid bit pattern for this plain C struct) and writable.
        unsafe { (*mode.as_mut_ptr()).version = HETEROGENEOUS_MODE_V1 };
        // SAFETY: live device handle; the struct is the v1 layout its `version` word declares
        // (the bindings' `nvmlVgpuHeterogeneousMode_t` is that same type).
        let ret = unsafe { call(handle, mode.as_mut_ptr()) };
        if matches!(
            ret,
            RAW_NOT_SUPPORTED | RAW_FUNCTION_NOT_FOUND | RAW_VERSION_MISMATCH
        ) {
            return Ok(false);
        }
        check(ret, "nvmlDeviceGetVgpuHeterogeneousMode", index)?;
        // SAFETY: NVML filled the struct on success; it was zero-initialised before.
        if unsafe { mode.assume_init() }.mode != FEATURE_ENABLED {
            return Ok(false);
        }
        for (cap, operation) in [
            (
                VgpuCapability::HeterogeneousTimesliceProfiles,
                "nvmlDeviceGetVgpuCapabilities (HETEROGENEOUS_TIMESLICE_PROFILES)",
            ),
            (
                VgpuCapability::HeterogeneousTimesliceSizes,
                "nvmlDeviceGetVgpuCapabilities (HETEROGENEOUS_TIMESLICE_SIZES)",
            ),
        ] {
            if optional(dev.vgpu_capabilities(cap), operation, index)? == Some(0) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_version_word_is_the_struct_size_with_version_one_on_top() {
        assert_eq!(HETEROGENEOUS_MODE_V1, 0x0100_0008);
    }

    #[test]
    fn a_driver_without_vgpu_is_no_vgpu_and_other_failures_are_errors_naming_the_call() {
        for e in [
            NvmlError::NotSupported,
            NvmlError::FunctionNotFound,
            NvmlError::FailedToLoadSymbol("nvmlDeviceGetSupportedVgpus".into()),
        ] {
            assert!(matches!(
                optional::<u32>(Err(e), "nvmlDeviceGetSupportedVgpus", 3),
                Ok(None)
            ));
        }
        assert!(matches!(optional(Ok(7u32), "x", 3), Ok(Some(7))));
        match optional::<u32>(Err(NvmlError::GpuLost), "nvmlDeviceGetSupportedVgpus", 3) {
            Err(HardwareError::Nvml {
                operation, index, ..
            }) => assert_eq!(
                (operation.as_str(), index),
                ("nvmlDeviceGetSupportedVgpus", 3)
            ),
            other => panic!("{other:?}"),
        }
    }
}
