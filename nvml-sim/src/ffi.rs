//! The C boundary: return codes, panic containment and the out-pointer writes every exported
//! function shares.

use std::ffi::{CStr, c_char, c_uint};

use nvml_wrapper_sys::bindings as sys;

pub use sys::nvmlReturn_t as Ret;

pub const SUCCESS: Ret = sys::nvmlReturn_enum_NVML_SUCCESS;
pub const UNINITIALIZED: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: Ret = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: Ret = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const TIMEOUT: Ret = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub const GPU_IS_LOST: Ret = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub const VERSION_MISMATCH: Ret = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const UNKNOWN: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// `NVML_STRUCT_VERSION(T, v)`: the struct's size with the version in the top byte.
pub const fn struct_version<T>(version: u32) -> u32 {
    (std::mem::size_of::<T>() as u32) | (version << 24)
}

/// Runs one exported call: its result becomes the return code, a panic becomes
/// `NVML_ERROR_UNKNOWN` instead of unwinding into C. Counts the call ([`crate::calls`]).
pub fn guard(call: impl FnOnce() -> Result<(), Ret>) -> Ret {
    crate::calls::count();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// Writes `value` through the caller's out-pointer.
///
/// # Safety
/// `ptr` is null or valid for writing one `T`, as NVML's contract for the call requires.
pub unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), Ret> {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid for a write of `T` by the caller's contract; unaligned
    // writes are allowed so a packed caller buffer is fine too.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Copies `text` and its NUL into the caller's buffer of `length` bytes;
/// `NVML_ERROR_INSUFFICIENT_SIZE` when it does not fit, as NVML does.
///
/// # Safety
/// `buf` is null or valid for writing `length` bytes.
pub unsafe fn put_str(buf: *mut c_char, length: c_uint, text: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller's buffer holds `length` >= len + 1 bytes; source and destination
    // do not overlap (ours is a Rust string).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Copies `text` into a fixed C array, truncating and NUL-terminating it.
pub fn fill_array<const N: usize>(array: &mut [c_char; N], text: &str) {
    for (slot, byte) in array
        .iter_mut()
        .zip(text.bytes().take(N - 1).chain(std::iter::repeat(0)))
    {
        *slot = byte as c_char;
    }
}

/// Reads the caller's NUL-terminated string.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string.
pub unsafe fn read_str(ptr: *const c_char) -> Result<String, Ret> {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str()
        .map(str::to_string)
        .map_err(|_| INVALID_ARGUMENT)
}

/// The NVML code of a simulator error.
pub fn code_of(e: &gpu_dra::hardware::HardwareError) -> Ret {
    match e {
        gpu_dra::hardware::HardwareError::Nvml { code, .. } => code.raw(),
        gpu_dra::hardware::HardwareError::NoSuchGpu { .. } => INVALID_ARGUMENT,
        gpu_dra::hardware::HardwareError::NoSuchProfile { .. } => INVALID_ARGUMENT,
        _ => UNKNOWN,
    }
}
