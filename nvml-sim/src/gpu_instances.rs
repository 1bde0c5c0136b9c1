//! GPU instances through NVML's C API: profiles (v1 and the versioned v2/v3), possible
//! placements, creation with or without a placement, destruction, enumeration and info.

use std::ffi::c_uint;

use gpu_dra::hardware::{GpuInfo, MigProfile};
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlGpuInstance_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::handles::Handle;
use crate::mig::{gi_of, instances, mig_capable, on_gpu, put_list};
use crate::node;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`.
const GI_PROFILE_COUNT: u32 = 0x12;

fn profile_at(gpu: &GpuInfo, index: u32) -> Result<&MigProfile, Ret> {
    mig_capable(gpu)?;
    if index >= GI_PROFILE_COUNT {
        return Err(ffi::INVALID_ARGUMENT);
    }
    gpu.mig_profiles
        .iter()
        .find(|p| p.index == index)
        .ok_or(ffi::NOT_SUPPORTED)
}

fn profile_by_id(gpu: &GpuInfo, id: u32) -> Result<&MigProfile, Ret> {
    mig_capable(gpu)?;
    gpu.profile_by_id(id).ok_or(ffi::INVALID_ARGUMENT)
}

fn gi_profile_v1(p: &MigProfile) -> sys::nvmlGpuInstanceProfileInfo_t {
    sys::nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.compute_slices,
        instanceCount: p.max_instances,
        multiprocessorCount: p.multiprocessors,
        copyEngineCount: p.copy_engines,
        decoderCount: p.decoders,
        encoderCount: p.encoders,
        jpegCount: p.jpeg_engines,
        ofaCount: p.ofa_engines,
        memorySizeMB: p.memory_mib,
    }
}

/// `nvmlDeviceGetGpuInstanceProfileInfo` (v1 struct) by profile index.
///
/// # Safety
/// `info` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        let p = profile_at(gpu, profile)?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(info, gi_profile_v1(p)) }
    })
}

/// Fills a versioned GPU-instance profile struct (`nvmlGpuInstanceProfileInfo_v2` or `_v3`,
/// by its `version` word).
///
/// # Safety
/// `info` is null or valid for reading the version word and writing the struct it names.
unsafe fn put_gi_profile_v(
    info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t,
    p: &MigProfile,
) -> Result<(), Ret> {
    if info.is_null() {
        return Err(ffi::INVALID_ARGUMENT);
    }
    // SAFETY: non-null; every version starts with the u32 version word.
    let version = unsafe { std::ptr::addr_of!((*info).version).read_unaligned() };
    let v1 = gi_profile_v1(p);
    if version == ffi::struct_version::<sys::nvmlGpuInstanceProfileInfo_v2_t>(2) {
        let mut out = sys::nvmlGpuInstanceProfileInfo_v2_t {
            version,
            id: v1.id,
            isP2pSupported: v1.isP2pSupported,
            sliceCount: v1.sliceCount,
            instanceCount: v1.instanceCount,
            multiprocessorCount: v1.multiprocessorCount,
            copyEngineCount: v1.copyEngineCount,
            decoderCount: v1.decoderCount,
            encoderCount: v1.encoderCount,
            jpegCount: v1.jpegCount,
            ofaCount: v1.ofaCount,
            memorySizeMB: v1.memorySizeMB,
            name: [0; 96],
        };
        ffi::fill_array(&mut out.name, &format!("MIG {}", p.name));
        // SAFETY: the version word says the caller's struct is a v2.
        unsafe { put(info, out) }
    } else if version == ffi::struct_version::<sys::nvmlGpuInstanceProfileInfo_v3_t>(3) {
        let mut out = sys::nvmlGpuInstanceProfileInfo_v3_t {
            version,
            id: v1.id,
            sliceCount: v1.sliceCount,
            instanceCount: v1.instanceCount,
            multiprocessorCount: v1.multiprocessorCount,
            copyEngineCount: v1.copyEngineCount,
            decoderCount: v1.decoderCount,
            encoderCount: v1.encoderCount,
            jpegCount: v1.jpegCount,
            ofaCount: v1.ofaCount,
            memorySizeMB: v1.memorySizeMB,
            name: [0; 96],
            capabilities: 0,
        };
        ffi::fill_array(&mut out.name, &p.name);
        // SAFETY: the version word says the caller's struct is a v3.
        unsafe { put(info.cast::<sys::nvmlGpuInstanceProfileInfo_v3_t>(), out) }
    } else {
        Err(ffi::VERSION_MISMATCH)
    }
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` by profile index (v2 or v3 struct).
///
/// # Safety
/// `info` is null or a struct whose `version` word names its layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        let p = profile_at(gpu, profile)?;
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { put_gi_profile_v(info, p) }
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoByIdV` by driver profile id (v2 or v3 struct).
///
/// # Safety
/// `info` is null or a struct whose `version` word names its layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    device: nvmlDevice_t,
    profileId: c_uint,
    info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        let p = profile_by_id(gpu, profileId)?;
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { put_gi_profile_v(info, p) }
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every placement of the profile,
/// whether or not MIG is on (as NVML documents).
///
/// # Safety
/// `count` is valid for a read and a write; `placements` is null or holds `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profileId: c_uint,
    placements: *mut sys::nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        let p = profile_by_id(gpu, profileId)?;
        let list: Vec<sys::nvmlGpuInstancePlacement_t> = p
            .placement_starts
            .iter()
            .map(|&start| sys::nvmlGpuInstancePlacement_t {
                start,
                size: p.memory_slices,
            })
            .collect();
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { put_list(placements, count, &list) }
    })
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: `NVML_ERROR_INVALID_ARGUMENT` for a
/// placement the profile does not allow, `NVML_ERROR_INSUFFICIENT_RESOURCES` for an occupied
/// one, `NVML_ERROR_NOT_SUPPORTED` with MIG mode off.
///
/// # Safety
/// `placement` is null or valid for a read; `gpuInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profileId: c_uint,
    placement: *const sys::nvmlGpuInstancePlacement_t,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    on_gpu(device, |view, gpu| {
        if placement.is_null() || gpuInstance.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for a read (caller's contract).
        let wanted = unsafe { placement.read_unaligned() };
        let p = profile_by_id(gpu, profileId)?;
        if wanted.size != p.memory_slices {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let gi = view
            .node
            .backend
            .create_gpu_instance(gpu.index, profileId, wanted.start)
            .map_err(|e| ffi::code_of(&e))?;
        let handle = Handle::GpuInstance { gpu: gpu.minor, gi }.to_ptr();
        // SAFETY: non-null and valid for a write (caller's contract).
        unsafe { put(gpuInstance, handle) }
    })
}

/// `nvmlDeviceCreateGpuInstance`: the driver picks the placement, filling from the high end
/// as observed on hardware.
///
/// # Safety
/// `gpuInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profileId: c_uint,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    on_gpu(device, |view, gpu| {
        if gpuInstance.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let p = profile_by_id(gpu, profileId)?;
        let mut last = ffi::NOT_SUPPORTED;
        for &start in p.placement_starts.iter().rev() {
            match view
                .node
                .backend
                .create_gpu_instance(gpu.index, profileId, start)
            {
                Ok(gi) => {
                    let handle = Handle::GpuInstance { gpu: gpu.minor, gi }.to_ptr();
                    // SAFETY: non-null and valid for a write (caller's contract).
                    return unsafe { put(gpuInstance, handle) };
                }
                Err(e) => last = ffi::code_of(&e),
            }
        }
        Err(last)
    })
}

/// `nvmlGpuInstanceDestroy`: `NVML_ERROR_IN_USE` while it holds a compute instance.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(gpuInstance: nvmlGpuInstance_t) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gi = gi_of(&view, gpuInstance)?;
        view.node
            .backend
            .destroy_gpu_instance(gi.gpu.index, gi.id)
            .map_err(|e| ffi::code_of(&e))
    })
}

/// `nvmlDeviceGetGpuInstances`: the GPU instances of one profile.
///
/// # Safety
/// `count` is valid for a read and a write; `gpuInstances` is null or holds `*count`
/// entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profileId: c_uint,
    gpuInstances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        profile_by_id(gpu, profileId)?;
        let list: Vec<nvmlGpuInstance_t> = instances(gpu)
            .iter()
            .filter(|g| g.profile.id == profileId)
            .map(|g| {
                Handle::GpuInstance {
                    gpu: gpu.minor,
                    gi: g.id,
                }
                .to_ptr()
            })
            .collect();
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { put_list(gpuInstances, count, &list) }
    })
}

/// `nvmlDeviceGetGpuInstanceById`: `NVML_ERROR_NOT_FOUND` when there is none.
///
/// # Safety
/// `gpuInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        mig_capable(gpu)?;
        if !gpu.mig.current {
            return Err(ffi::NOT_SUPPORTED);
        }
        instances(gpu)
            .iter()
            .find(|g| g.id == id)
            .ok_or(ffi::NOT_FOUND)?;
        let handle = Handle::GpuInstance {
            gpu: gpu.minor,
            gi: id,
        }
        .to_ptr();
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(gpuInstance, handle) }
    })
}

/// `nvmlGpuInstanceGetInfo`.
///
/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpuInstance: nvmlGpuInstance_t,
    info: *mut sys::nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gi = gi_of(&view, gpuInstance)?;
        let out = sys::nvmlGpuInstanceInfo_t {
            device: Handle::Gpu(gi.gpu.minor).to_ptr(),
            id: gi.id,
            profileId: gi.profile.id,
            placement: sys::nvmlGpuInstancePlacement_t {
                start: gi.placement.start,
                size: gi.placement.size,
            },
        };
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(info, out) }
    })
}
