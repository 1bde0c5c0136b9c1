//! MIG through NVML's C API: mode get/set, GPU-instance and compute-instance profiles and
//! placements, creating and destroying instances, and MIG device handles. Every rule (which
//! placements a profile allows, occupied slices, the A100's pending-until-reset mode) is the
//! simulator's, so the codes returned are the ones the sim backend gives.

use std::ffi::c_uint;

use gpu_dra::hardware::nvml::convert::default_ci_profile_index;
use gpu_dra::hardware::{GpuBackend, GpuInfo, MigModeChange, MigProfile, Placement};
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::handles::Handle;
use crate::node::{self, Dev, View};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`.
const GI_PROFILE_COUNT: u32 = 0x12;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
const CI_PROFILE_COUNT: u32 = 0x9;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_SHARED: u32 = 0;

/// A GPU instance as the hardware reports it.
struct Gi<'a> {
    gpu: &'a GpuInfo,
    id: u32,
    profile: &'a MigProfile,
    placement: Placement,
    /// Its compute instance (the simulator makes at most one, id 0).
    ci: Option<u32>,
}

fn instances(gpu: &GpuInfo) -> Vec<Gi<'_>> {
    let mut out: Vec<Gi<'_>> = Vec::new();
    for m in &gpu.mig_devices {
        if let Some(profile) = gpu.profile_by_id(m.profile_id) {
            out.push(Gi {
                gpu,
                id: m.gi_id,
                profile,
                placement: m.placement,
                ci: Some(m.ci_id),
            });
        }
    }
    for e in &gpu.empty_gpu_instances {
        if let Some(profile) = gpu.profile_by_id(e.profile_id) {
            out.push(Gi {
                gpu,
                id: e.gi_id,
                profile,
                placement: e.placement,
                ci: None,
            });
        }
    }
    out.sort_by_key(|g| g.id);
    out
}

fn gi_of<T>(view: &View, ptr: *mut T) -> Result<Gi<'_>, Ret> {
    let Some(Handle::GpuInstance { gpu, gi }) = Handle::from_ptr(ptr) else {
        return Err(ffi::INVALID_ARGUMENT);
    };
    instances(view.gpu(gpu)?)
        .into_iter()
        .find(|g| g.id == gi)
        .ok_or(ffi::INVALID_ARGUMENT)
}

fn ci_of<T>(view: &View, ptr: *mut T) -> Result<(Gi<'_>, u32), Ret> {
    let Some(Handle::ComputeInstance { gpu, gi, ci }) = Handle::from_ptr(ptr) else {
        return Err(ffi::INVALID_ARGUMENT);
    };
    let g = instances(view.gpu(gpu)?)
        .into_iter()
        .find(|g| g.id == gi && g.ci == Some(ci))
        .ok_or(ffi::INVALID_ARGUMENT)?;
    Ok((g, ci))
}

fn mig_capable(gpu: &GpuInfo) -> Result<(), Ret> {
    if gpu.mig.capable {
        Ok(())
    } else {
        Err(ffi::NOT_SUPPORTED)
    }
}

fn on_gpu(device: nvmlDevice_t, body: impl FnOnce(&View, &GpuInfo) -> Result<(), Ret>) -> Ret {
    guard(|| {
        let view = node::view()?;
        let gpu = view.full_gpu(device)?;
        body(&view, gpu)
    })
}

/// `nvmlDeviceGetMigMode`.
///
/// # Safety
/// `currentMode` and `pendingMode` are null or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        mig_capable(gpu)?;
        // SAFETY: null or valid for one write each (caller's contract).
        unsafe {
            put(currentMode, c_uint::from(gpu.mig.current))?;
            put(pendingMode, c_uint::from(gpu.mig.pending))
        }
    })
}

/// `nvmlDeviceSetMigMode`: Hopper and later apply at once on an idle GPU; Ampere keeps the
/// change pending until a reset and says so with `activationStatus` =
/// `NVML_ERROR_RESET_REQUIRED`. `NVML_ERROR_IN_USE` while MIG devices exist.
///
/// # Safety
/// `activationStatus` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activationStatus: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    on_gpu(device, |view, gpu| {
        mig_capable(gpu)?;
        if mode > 1 {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let change = view
            .node
            .backend
            .set_mig_mode(gpu.index, mode == 1)
            .map_err(|e| ffi::code_of(&e))?;
        let status = match change {
            MigModeChange::PendingReset => sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
            MigModeChange::Applied | MigModeChange::Unchanged => ffi::SUCCESS,
        };
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(activationStatus, status) }
    })
}

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

/// Writes up to `*count` items; with a null buffer only the count.
///
/// # Safety
/// `count` is null or valid for a read and a write; `buf` is null or valid for `*count`
/// writes.
unsafe fn put_list<T: Copy>(buf: *mut T, count: *mut c_uint, items: &[T]) -> Result<(), Ret> {
    if count.is_null() {
        return Err(ffi::INVALID_ARGUMENT);
    }
    if buf.is_null() {
        // SAFETY: non-null and valid for a write (caller's contract).
        return unsafe { put(count, items.len() as c_uint) };
    }
    // SAFETY: non-null and valid for a read (caller's contract).
    let room = unsafe { count.read_unaligned() } as usize;
    // SAFETY: valid for a write (caller's contract).
    unsafe { put(count, items.len() as c_uint)? };
    if room < items.len() {
        return Err(ffi::INSUFFICIENT_SIZE);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: `i < items.len() <= room`, the caller's buffer length.
        unsafe { buf.add(i).write_unaligned(*item) };
    }
    Ok(())
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

/// `nvmlDeviceIsMigDeviceHandle`.
///
/// # Safety
/// `isMigDevice` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let is_mig = matches!(view.device(device)?, Dev::Mig(..));
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(isMigDevice, c_uint::from(is_mig)) }
    })
}

fn on_mig(device: nvmlDevice_t, body: impl FnOnce(&GpuInfo, u32, u32) -> Result<(), Ret>) -> Ret {
    guard(|| {
        let view = node::view()?;
        match view.device(device)? {
            Dev::Mig(g, m) => body(g, m.gi_id, m.ci_id),
            Dev::Gpu(_) => Err(ffi::NOT_SUPPORTED),
        }
    })
}

/// `nvmlDeviceGetGpuInstanceId` of a MIG device.
///
/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_mig(device, |_, gi, _| unsafe { put(id, gi) })
}

/// `nvmlDeviceGetComputeInstanceId` of a MIG device.
///
/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_mig(device, |_, _, ci| unsafe { put(id, ci) })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`.
///
/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    migDevice: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_mig(migDevice, |g, _, _| unsafe {
        put(device, Handle::Gpu(g.minor).to_ptr())
    })
}

/// The most MIG devices the GPU can hold (0 with MIG off).
fn max_mig_devices(gpu: &GpuInfo) -> u32 {
    if !gpu.mig.current {
        return 0;
    }
    gpu.mig_profiles
        .iter()
        .map(|p| p.max_instances)
        .max()
        .unwrap_or(0)
}

/// `nvmlDeviceGetMaxMigDeviceCount`.
///
/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_gpu(device, |_, gpu| unsafe { put(count, max_mig_devices(gpu)) })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: `NVML_ERROR_NOT_FOUND` for an unused index below
/// the maximum.
///
/// # Safety
/// `migDevice` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    on_gpu(device, |_, gpu| {
        if index >= max_mig_devices(gpu) {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let m = gpu.mig_devices.get(index as usize).ok_or(ffi::NOT_FOUND)?;
        let handle = Handle::Mig {
            gpu: gpu.minor,
            gi: m.gi_id,
            ci: m.ci_id,
        };
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(migDevice, handle.to_ptr()) }
    })
}
