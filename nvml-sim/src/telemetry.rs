//! Telemetry of a simulated GPU: power, utilisation, clocks, temperature, ECC counters,
//! retired pages and remapped rows, and compute mode.
//!
//! Power, utilisation and temperature follow the simulator's load model
//! (`gpu_dra::hardware::sim::telemetry`: idle GPUs, a workload on every MIG device that
//! exists, and the load `gpu-dra sim-fault load` sets), as the sim backend reports them; ECC counters,
//! retired pages and remapped rows follow the faults injected with `gpu-dra sim-fault`, and a
//! GPU that fell off the bus answers `NVML_ERROR_GPU_IS_LOST`. Compute mode is the one the
//! simulated `nvidia-smi -c` keeps, so both tools see one setting.

use std::ffi::{c_uint, c_ulonglong};

use gpu_dra::hardware::sim::faults::EccCounters;
use gpu_dra::hardware::sim::telemetry::{
    SimReadings, ecc_capable, power_limit_mw, readings, remaps_rows,
};
use gpu_dra::hardware::{Architecture, GpuInfo};
use gpu_dra::sharing::simtools;
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::node::{self, View};

/// Maximum SM clock of the architecture, MHz.
fn sm_clock_mhz(gpu: &GpuInfo) -> u32 {
    match gpu.architecture {
        Architecture::Ampere => 1410,
        Architecture::Hopper => 1980,
        Architecture::Blackwell => 1965,
        Architecture::AdaLovelace if gpu.product_name.contains("L4") => 2040,
        Architecture::AdaLovelace => 2520,
        _ => 1530,
    }
}

/// Runs `body` on a physical GPU that is still on the bus, with its ECC counters.
fn on_live_gpu(
    device: nvmlDevice_t,
    body: impl FnOnce(&View, &GpuInfo, EccCounters) -> Result<(), Ret>,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gpu = view.full_gpu(device)?;
        let faults = view
            .node
            .backend
            .fault_state(gpu.index)
            .map_err(|e| ffi::code_of(&e))?;
        if faults.lost {
            return Err(ffi::GPU_IS_LOST);
        }
        body(&view, gpu, faults.ecc)
    })
}

/// The load model's readings of a live GPU.
pub(crate) fn model_readings(view: &View, gpu: &GpuInfo) -> Result<SimReadings, Ret> {
    let load = view
        .node
        .backend
        .load(gpu.index)
        .map_err(|e| ffi::code_of(&e))?;
    Ok(readings(gpu, load.as_ref()))
}

/// `nvmlDeviceGetPowerUsage`, milliwatts: the load model's draw.
///
/// # Safety
/// `power` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    on_live_gpu(device, |view, gpu, _| {
        let usage = model_readings(view, gpu)?.power_mw;
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(power, usage) }
    })
}

/// `nvmlDeviceGetPowerManagementLimit`, milliwatts.
///
/// # Safety
/// `limit` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_live_gpu(device, |_, gpu, _| unsafe {
        put(limit, power_limit_mw(gpu))
    })
}

/// `nvmlDeviceGetEnforcedPowerLimit`, milliwatts.
///
/// # Safety
/// `limit` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_live_gpu(device, |_, gpu, _| unsafe {
        put(limit, power_limit_mw(gpu))
    })
}

/// `nvmlDeviceGetUtilizationRates`: the load model's activity (memory: the share of memory
/// in use, as a stand-in for memory-controller activity).
///
/// # Safety
/// `utilization` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut sys::nvmlUtilization_t,
) -> nvmlReturn_t {
    on_live_gpu(device, |view, gpu, _| {
        let r = model_readings(view, gpu)?;
        // NVML does not report utilisation of a GPU in MIG mode: the model says `None`.
        let busy = r.utilization_percent.ok_or(ffi::NOT_SUPPORTED)?;
        let memory = (r.memory_used_mib * 100 / gpu.memory_mib.max(1)) as c_uint;
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(utilization, sys::nvmlUtilization_t { gpu: busy, memory }) }
    })
}

fn clock(gpu: &GpuInfo, type_: sys::nvmlClockType_t) -> Result<c_uint, Ret> {
    match type_ {
        sys::nvmlClockType_enum_NVML_CLOCK_GRAPHICS | sys::nvmlClockType_enum_NVML_CLOCK_SM => {
            Ok(sm_clock_mhz(gpu))
        }
        sys::nvmlClockType_enum_NVML_CLOCK_MEM => Ok(1593),
        sys::nvmlClockType_enum_NVML_CLOCK_VIDEO => Ok(1275),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceGetClockInfo`, MHz (clocks stay at their maximum: no power states).
///
/// # Safety
/// `clock` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    type_: sys::nvmlClockType_t,
    clock_mhz: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_live_gpu(device, |_, gpu, _| unsafe {
        put(clock_mhz, clock(gpu, type_)?)
    })
}

/// `nvmlDeviceGetMaxClockInfo`, MHz.
///
/// # Safety
/// `clock` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    type_: sys::nvmlClockType_t,
    clock_mhz: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or valid for a write (caller's contract).
    on_live_gpu(device, |_, gpu, _| unsafe {
        put(clock_mhz, clock(gpu, type_)?)
    })
}

/// `nvmlDeviceGetTemperature` (GPU sensor), °C.
///
/// # Safety
/// `temp` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensorType: sys::nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    on_live_gpu(device, |view, gpu, _| {
        if sensorType != sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let celsius = model_readings(view, gpu)?.temperature_c;
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(temp, celsius) }
    })
}

/// `nvmlDeviceGetEccMode`: on for data-centre GPUs, unsupported on GeForce.
///
/// # Safety
/// `current` and `pending` are null or valid for a write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut sys::nvmlEnableState_t,
    pending: *mut sys::nvmlEnableState_t,
) -> nvmlReturn_t {
    on_live_gpu(device, |_, gpu, _| {
        if !ecc_capable(gpu) {
            return Err(ffi::NOT_SUPPORTED);
        }
        let on = sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED;
        // SAFETY: null or valid for a write each (caller's contract).
        unsafe {
            put(current, on)?;
            put(pending, on)
        }
    })
}

/// `nvmlDeviceGetTotalEccErrors`: corrected or uncorrected, volatile or aggregate.
///
/// # Safety
/// `eccCounts` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    errorType: sys::nvmlMemoryErrorType_t,
    counterType: sys::nvmlEccCounterType_t,
    eccCounts: *mut c_ulonglong,
) -> nvmlReturn_t {
    on_live_gpu(device, |_, gpu, ecc| {
        if !ecc_capable(gpu) {
            return Err(ffi::NOT_SUPPORTED);
        }
        let count = match (errorType, counterType) {
            (0, 0) => ecc.single_volatile,
            (0, 1) => ecc.single_aggregate,
            (1, 0) => ecc.double_volatile,
            (1, 1) => ecc.double_aggregate,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(eccCounts, count) }
    })
}

/// `nvmlDeviceGetRetiredPages` (before Ampere; later GPUs remap rows instead).
///
/// # Safety
/// `pageCount` is valid for a read and a write; `addresses` is null or holds `*pageCount`
/// entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: sys::nvmlPageRetirementCause_t,
    pageCount: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    on_live_gpu(device, |_, gpu, ecc| {
        if remaps_rows(gpu) || !ecc_capable(gpu) {
            return Err(ffi::NOT_SUPPORTED);
        }
        let n = match cause {
            0 => ecc.retired_single,
            1 => ecc.retired_double,
            _ => return Err(ffi::INVALID_ARGUMENT),
        };
        if pageCount.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for a read (caller's contract).
        let room = unsafe { pageCount.read_unaligned() } as u64;
        // SAFETY: valid for a write (caller's contract).
        unsafe { put(pageCount, n as c_uint)? };
        if addresses.is_null() {
            return Ok(());
        }
        if room < n {
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        for i in 0..n {
            // SAFETY: `i < n <= room`, the caller's buffer length.
            unsafe { addresses.add(i as usize).write_unaligned(0x1000 * (i + 1)) };
        }
        Ok(())
    })
}

/// `nvmlDeviceGetRetiredPagesPendingStatus`: nothing pending (retirement is immediate here).
///
/// # Safety
/// `isPending` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    isPending: *mut sys::nvmlEnableState_t,
) -> nvmlReturn_t {
    on_live_gpu(device, |_, gpu, _| {
        if remaps_rows(gpu) || !ecc_capable(gpu) {
            return Err(ffi::NOT_SUPPORTED);
        }
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(isPending, sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED) }
    })
}

/// `nvmlDeviceGetRemappedRows` (Ampere and later): one row per uncorrectable error.
///
/// # Safety
/// Each pointer is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corrRows: *mut c_uint,
    uncRows: *mut c_uint,
    isPending: *mut c_uint,
    failureOccurred: *mut c_uint,
) -> nvmlReturn_t {
    on_live_gpu(device, |_, gpu, ecc| {
        if !remaps_rows(gpu) || !ecc_capable(gpu) {
            return Err(ffi::NOT_SUPPORTED);
        }
        // SAFETY: null or valid for a write each (caller's contract).
        unsafe {
            put(corrRows, ecc.retired_single as c_uint)?;
            put(uncRows, ecc.retired_double as c_uint)?;
            put(isPending, 0)?;
            put(failureOccurred, 0)
        }
    })
}

fn mode_name(mode: sys::nvmlComputeMode_t) -> Option<&'static str> {
    match mode {
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT => Some("DEFAULT"),
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED => Some("PROHIBITED"),
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS => Some("EXCLUSIVE_PROCESS"),
        _ => None,
    }
}

/// `nvmlDeviceGetComputeMode`: what the simulated `nvidia-smi -c` last set.
///
/// # Safety
/// `mode` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut sys::nvmlComputeMode_t,
) -> nvmlReturn_t {
    on_live_gpu(device, |view, gpu, _| {
        let name = view
            .node
            .state_dir
            .as_ref()
            .and_then(|d| simtools::read_state(&d.join("tools")).remove(&gpu.uuid))
            .map(|s| s.compute_mode)
            .unwrap_or_else(|| "DEFAULT".to_string());
        let code = [
            sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
            sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        ]
        .into_iter()
        .find(|c| mode_name(*c) == Some(name.as_str()))
        .unwrap_or(sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT);
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(mode, code) }
    })
}

/// `nvmlDeviceSetComputeMode`: shared with the simulated `nvidia-smi`; needs
/// `GPU_DRA_SIM_STATE_DIR` (without it there is nowhere to keep the setting).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetComputeMode(
    device: nvmlDevice_t,
    mode: sys::nvmlComputeMode_t,
) -> nvmlReturn_t {
    on_live_gpu(device, |view, gpu, _| {
        let name = mode_name(mode).ok_or(ffi::INVALID_ARGUMENT)?;
        let dir = view.node.state_dir.as_ref().ok_or(ffi::NOT_SUPPORTED)?;
        simtools::set_compute_mode(&dir.join("tools"), &gpu.uuid, name).map_err(|_| ffi::UNKNOWN)
    })
}
