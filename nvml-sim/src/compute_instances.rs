//! Compute instances through NVML's C API: the whole-GI compute-instance profile (v1 and
//! the versioned v2/v3), creation, destruction, enumeration and info. The simulator makes
//! the default compute instance only (what `nvidia-smi mig -cgi … -C` creates).

use std::ffi::c_uint;

use gpu_dra::hardware::nvml::convert::default_ci_profile_index;
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlComputeInstance_t, nvmlGpuInstance_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::handles::Handle;
use crate::mig::{Gi, ci_of, gi_of, put_list};
use crate::node;

/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
const CI_PROFILE_COUNT: u32 = 0x9;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_SHARED: u32 = 0;

/// The compute-instance profile of a GI the simulator supports: the default one spanning
/// the whole GI (what `nvidia-smi mig -cgi … -C` creates).
fn ci_profile(
    gi: &Gi<'_>,
    index: u32,
    engine: u32,
) -> Result<sys::nvmlComputeInstanceProfileInfo_t, Ret> {
    if index >= CI_PROFILE_COUNT || engine != CI_ENGINE_SHARED {
        return Err(ffi::INVALID_ARGUMENT);
    }
    if default_ci_profile_index(gi.profile.compute_slices) != Some(index) {
        return Err(ffi::NOT_SUPPORTED);
    }
    let p = gi.profile;
    Ok(sys::nvmlComputeInstanceProfileInfo_t {
        id: index,
        sliceCount: p.compute_slices,
        instanceCount: 1,
        multiprocessorCount: p.multiprocessors,
        sharedCopyEngineCount: p.copy_engines,
        sharedDecoderCount: p.decoders,
        sharedEncoderCount: p.encoders,
        sharedJpegCount: p.jpeg_engines,
        sharedOfaCount: p.ofa_engines,
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo` (v1 struct).
///
/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpuInstance: nvmlGpuInstance_t,
    profile: c_uint,
    engProfile: c_uint,
    info: *mut sys::nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gi = gi_of(&view, gpuInstance)?;
        let out = ci_profile(&gi, profile, engProfile)?;
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(info, out) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfoV` (v2 or v3 struct, by `version`).
///
/// # Safety
/// `info` is null or a struct whose `version` word names its layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpuInstance: nvmlGpuInstance_t,
    profile: c_uint,
    engProfile: c_uint,
    info: *mut sys::nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gi = gi_of(&view, gpuInstance)?;
        let v1 = ci_profile(&gi, profile, engProfile)?;
        if info.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; every version starts with the u32 version word.
        let version = unsafe { std::ptr::addr_of!((*info).version).read_unaligned() };
        let name = format!("MIG {}", gi.profile.name);
        if version == ffi::struct_version::<sys::nvmlComputeInstanceProfileInfo_v2_t>(2) {
            let mut out = sys::nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: v1.id,
                sliceCount: v1.sliceCount,
                instanceCount: v1.instanceCount,
                multiprocessorCount: v1.multiprocessorCount,
                sharedCopyEngineCount: v1.sharedCopyEngineCount,
                sharedDecoderCount: v1.sharedDecoderCount,
                sharedEncoderCount: v1.sharedEncoderCount,
                sharedJpegCount: v1.sharedJpegCount,
                sharedOfaCount: v1.sharedOfaCount,
                name: [0; 96],
            };
            ffi::fill_array(&mut out.name, &name);
            // SAFETY: the version word says the caller's struct is a v2.
            unsafe { put(info, out) }
        } else if version == ffi::struct_version::<sys::nvmlComputeInstanceProfileInfo_v3_t>(3) {
            let mut out = sys::nvmlComputeInstanceProfileInfo_v3_t {
                version,
                id: v1.id,
                sliceCount: v1.sliceCount,
                instanceCount: v1.instanceCount,
                multiprocessorCount: v1.multiprocessorCount,
                sharedCopyEngineCount: v1.sharedCopyEngineCount,
                sharedDecoderCount: v1.sharedDecoderCount,
                sharedEncoderCount: v1.sharedEncoderCount,
                sharedJpegCount: v1.sharedJpegCount,
                sharedOfaCount: v1.sharedOfaCount,
                name: [0; 96],
                capabilities: 0,
            };
            ffi::fill_array(&mut out.name, &name);
            // SAFETY: the version word says the caller's struct is a v3.
            unsafe { put(info.cast::<sys::nvmlComputeInstanceProfileInfo_v3_t>(), out) }
        } else {
            Err(ffi::VERSION_MISMATCH)
        }
    })
}

/// `nvmlGpuInstanceCreateComputeInstance` with the GI's default compute-instance profile.
///
/// # Safety
/// `computeInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gi = gi_of(&view, gpuInstance)?;
        if computeInstance.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        ci_profile(&gi, profileId, CI_ENGINE_SHARED)?;
        let (ci, _uuid) = view
            .node
            .backend
            .create_compute_instance(gi.gpu.index, gi.id)
            .map_err(|e| ffi::code_of(&e))?;
        let handle = Handle::ComputeInstance {
            gpu: gi.gpu.minor,
            gi: gi.id,
            ci,
        };
        // SAFETY: non-null and valid for a write (caller's contract).
        unsafe { put(computeInstance, handle.to_ptr()) }
    })
}

/// `nvmlComputeInstanceDestroy`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(
    computeInstance: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let (gi, ci) = ci_of(&view, computeInstance)?;
        view.node
            .backend
            .destroy_compute_instance(gi.gpu.index, gi.id, ci)
            .map_err(|e| ffi::code_of(&e))
    })
}

/// `nvmlGpuInstanceGetComputeInstances`.
///
/// # Safety
/// `count` is valid for a read and a write; `computeInstances` is null or holds `*count`
/// entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    computeInstances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gi = gi_of(&view, gpuInstance)?;
        let list: Vec<nvmlComputeInstance_t> = match gi.ci {
            Some(ci) if default_ci_profile_index(gi.profile.compute_slices) == Some(profileId) => {
                vec![
                    Handle::ComputeInstance {
                        gpu: gi.gpu.minor,
                        gi: gi.id,
                        ci,
                    }
                    .to_ptr(),
                ]
            }
            _ => Vec::new(),
        };
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { put_list(computeInstances, count, &list) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`: `NVML_ERROR_NOT_FOUND` when there is none.
///
/// # Safety
/// `computeInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpuInstance: nvmlGpuInstance_t,
    id: c_uint,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gi = gi_of(&view, gpuInstance)?;
        if gi.ci != Some(id) {
            return Err(ffi::NOT_FOUND);
        }
        let handle = Handle::ComputeInstance {
            gpu: gi.gpu.minor,
            gi: gi.id,
            ci: id,
        };
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(computeInstance, handle.to_ptr()) }
    })
}

/// `nvmlComputeInstanceGetInfo_v2`: `device` is the MIG device handle of the instance.
///
/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    computeInstance: nvmlComputeInstance_t,
    info: *mut sys::nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let (gi, ci) = ci_of(&view, computeInstance)?;
        let gpu = gi.gpu.minor;
        let out = sys::nvmlComputeInstanceInfo_t {
            device: Handle::Mig { gpu, gi: gi.id, ci }.to_ptr(),
            gpuInstance: Handle::GpuInstance { gpu, gi: gi.id }.to_ptr(),
            id: ci,
            profileId: default_ci_profile_index(gi.profile.compute_slices).unwrap_or(0),
            placement: sys::nvmlComputeInstancePlacement_t {
                start: 0,
                size: gi.profile.compute_slices,
            },
        };
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(info, out) }
    })
}
