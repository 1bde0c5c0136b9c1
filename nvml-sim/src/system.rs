//! Library lifecycle and system queries: init, shutdown, error strings, driver and CUDA
//! versions.

use std::ffi::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::nvmlReturn_t;

use crate::ffi::{guard, put, put_str};
use crate::node;

/// `nvmlInit_v2`: opens the simulated node named by `GPU_DRA_SIM_NODE`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(node::init)
}

/// `nvmlInitWithFlags`: flags change nothing on the simulated node.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard(node::init)
}

/// `nvmlShutdown`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(node::shutdown)
}

/// `nvmlErrorString`: NVML's description of a return code (a static string).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text: &'static std::ffi::CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"Driver/library version mismatch",
        18 => c"In use by another client",
        19 => c"In Use",
        20 => c"Memory Error",
        21 => c"No data",
        22 => c"vGPU ECC not supported",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// `version` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        // SAFETY: the caller's buffer holds `length` bytes (NVML's contract).
        unsafe { put_str(version, length, &view.inv.driver_version) }
    })
}

/// `nvmlSystemGetNVMLVersion`: `<CUDA major>.<driver version>`, as NVML formats it.
///
/// # Safety
/// `version` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let major = view
            .inv
            .cuda_driver_version
            .split('.')
            .next()
            .unwrap_or("0");
        let text = format!("{major}.{}", view.inv.driver_version);
        // SAFETY: the caller's buffer holds `length` bytes (NVML's contract).
        unsafe { put_str(version, length, &text) }
    })
}

fn cuda_version_int() -> Result<c_int, nvmlReturn_t> {
    let view = node::view()?;
    let mut parts = view.inv.cuda_driver_version.split('.');
    let major: c_int = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: c_int = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Ok(major * 1000 + minor * 10)
}

/// `nvmlSystemGetCudaDriverVersion`: e.g. 13000 for CUDA 13.0.
///
/// # Safety
/// `cudaDriverVersion` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    // SAFETY: forwarded with the caller's guarantee.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion) }
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
///
/// # Safety
/// `cudaDriverVersion` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        let v = cuda_version_int()?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(cudaDriverVersion, v) }
    })
}
