//! Device enumeration: the GPU count and handles by index, UUID (GPU or MIG device), PCI bus
//! ID and serial number.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::device::serial_of;
use crate::ffi::{self, guard, put, read_str};
use crate::handles::Handle;
use crate::node;

/// `nvmlDeviceGetCount_v2`.
///
/// # Safety
/// `deviceCount` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(deviceCount, view.inv.gpus.len() as c_uint) }
    })
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// `device` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let slot = view.enumerated(index)?.minor;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(device, Handle::Gpu(slot).to_ptr()) }
    })
}

/// `nvmlDeviceGetHandleByUUID`: GPU and MIG UUIDs.
///
/// # Safety
/// `uuid` is a NUL-terminated string; `device` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: NUL-terminated by the caller's contract.
        let wanted = unsafe { read_str(uuid) }?;
        let view = node::view()?;
        let found = view.inv.gpus.iter().find_map(|g| {
            if g.uuid == wanted {
                return Some(Handle::Gpu(g.minor));
            }
            g.mig_devices
                .iter()
                .find(|m| m.uuid == wanted)
                .map(|m| Handle::Mig {
                    gpu: g.minor,
                    gi: m.gi_id,
                    ci: m.ci_id,
                })
        });
        let handle = found.ok_or(ffi::NOT_FOUND)?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(device, handle.to_ptr()) }
    })
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: accepts the 4- and 8-digit domain forms.
///
/// # Safety
/// `pciBusId` is a NUL-terminated string; `device` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: NUL-terminated by the caller's contract.
        let wanted = unsafe { read_str(pciBusId) }?.to_ascii_lowercase();
        let short = match wanted.split_once(':') {
            Some((domain, rest)) if domain.len() > 4 => {
                format!("{}:{rest}", &domain[domain.len() - 4..])
            }
            _ => wanted,
        };
        let view = node::view()?;
        let gpu = view
            .inv
            .gpus
            .iter()
            .find(|g| g.pci_bus_id == short)
            .ok_or(ffi::NOT_FOUND)?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(device, Handle::Gpu(gpu.minor).to_ptr()) }
    })
}

/// `nvmlDeviceGetHandleBySerial`.
///
/// # Safety
/// `serial` is a NUL-terminated string; `device` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: NUL-terminated by the caller's contract.
        let wanted = unsafe { read_str(serial) }?;
        let view = node::view()?;
        let gpu = view
            .inv
            .gpus
            .iter()
            .find(|g| serial_of(&g.uuid) == wanted)
            .ok_or(ffi::NOT_FOUND)?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(device, Handle::Gpu(gpu.minor).to_ptr()) }
    })
}
