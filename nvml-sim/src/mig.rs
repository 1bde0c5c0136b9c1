//! MIG through NVML's C API: MIG mode get/set, MIG device handles, and what the GPU- and
//! compute-instance calls (`gpu_instances.rs`, `compute_instances.rs`) share. Every rule
//! (which placements a profile allows, occupied slices, the A100's pending-until-reset
//! mode) is the simulator's, so the codes returned are the ones the sim backend gives.

use std::ffi::c_uint;

use gpu_dra::hardware::{GpuBackend, GpuInfo, MigModeChange, MigProfile, Placement};
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::handles::Handle;
use crate::node::{self, Dev, View};

/// A GPU instance as the hardware reports it.
pub(crate) struct Gi<'a> {
    pub(crate) gpu: &'a GpuInfo,
    pub(crate) id: u32,
    pub(crate) profile: &'a MigProfile,
    pub(crate) placement: Placement,
    /// Its compute instance (the simulator makes at most one, id 0).
    pub(crate) ci: Option<u32>,
}

pub(crate) fn instances(gpu: &GpuInfo) -> Vec<Gi<'_>> {
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

pub(crate) fn gi_of<T>(view: &View, ptr: *mut T) -> Result<Gi<'_>, Ret> {
    let Some(Handle::GpuInstance { gpu, gi }) = Handle::from_ptr(ptr) else {
        return Err(ffi::INVALID_ARGUMENT);
    };
    instances(view.gpu(gpu)?)
        .into_iter()
        .find(|g| g.id == gi)
        .ok_or(ffi::INVALID_ARGUMENT)
}

pub(crate) fn ci_of<T>(view: &View, ptr: *mut T) -> Result<(Gi<'_>, u32), Ret> {
    let Some(Handle::ComputeInstance { gpu, gi, ci }) = Handle::from_ptr(ptr) else {
        return Err(ffi::INVALID_ARGUMENT);
    };
    let g = instances(view.gpu(gpu)?)
        .into_iter()
        .find(|g| g.id == gi && g.ci == Some(ci))
        .ok_or(ffi::INVALID_ARGUMENT)?;
    Ok((g, ci))
}

pub(crate) fn mig_capable(gpu: &GpuInfo) -> Result<(), Ret> {
    if gpu.mig.capable {
        Ok(())
    } else {
        Err(ffi::NOT_SUPPORTED)
    }
}

pub(crate) fn on_gpu(
    device: nvmlDevice_t,
    body: impl FnOnce(&View, &GpuInfo) -> Result<(), Ret>,
) -> Ret {
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
/// Writes up to `*count` items; with a null buffer only the count.
///
/// # Safety
/// `count` is null or valid for a read and a write; `buf` is null or valid for `*count`
/// writes.
pub(crate) unsafe fn put_list<T: Copy>(
    buf: *mut T,
    count: *mut c_uint,
    items: &[T],
) -> Result<(), Ret> {
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

/// `nvmlDeviceGetPersistenceMode`: on unless turned off (as with nvidia-persistenced running).
///
/// # Safety
/// `mode` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut sys::nvmlEnableState_t,
) -> nvmlReturn_t {
    on_gpu(device, |view, gpu| {
        let on = view
            .node
            .backend
            .persistence_mode(gpu.index)
            .map_err(|e| ffi::code_of(&e))?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(mode, sys::nvmlEnableState_t::from(on)) }
    })
}

/// `nvmlDeviceSetPersistenceMode`: `NVML_FEATURE_ENABLED` (1) or `NVML_FEATURE_DISABLED` (0);
/// anything else is `NVML_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetPersistenceMode(
    device: nvmlDevice_t,
    mode: sys::nvmlEnableState_t,
) -> nvmlReturn_t {
    on_gpu(device, |view, gpu| {
        if mode > 1 {
            return Err(ffi::INVALID_ARGUMENT);
        }
        view.node
            .backend
            .set_persistence_mode(gpu.index, mode == 1)
            .map_err(|e| ffi::code_of(&e))
    })
}
