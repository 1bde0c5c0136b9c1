//! GPU Performance Monitoring (GPM, Hopper and later): samples of a GPU or of one GPU
//! instance, and metrics computed between two samples. Only SM utilisation and SM occupancy
//! have figures (the load model's SM activity, averaged over the two samples); every other
//! metric answers `NVML_ERROR_NOT_SUPPORTED` in its own slot, as NVML does for a metric a
//! device lacks. Before Hopper, GPM is not supported (`isSupportedDevice` 0, sample calls
//! `NVML_ERROR_NOT_SUPPORTED`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use gpu_dra::hardware::{Architecture, GpuInfo};
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlGpmSample_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::handles::Handle;
use crate::node::{self, View};

/// What a filled sample holds: whose it is, and the SM activity (percent) then.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Taken {
    /// GPU slot.
    gpu: u32,
    /// GPU instance, for a MIG sample.
    gi: Option<u32>,
    /// Order of sampling (a metric needs the earlier sample first).
    seq: u64,
    sm_percent: f64,
}

/// Allocated samples by id; `None` until filled.
static SAMPLES: Mutex<BTreeMap<u32, Option<Taken>>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU32 = AtomicU32::new(1);
static NEXT_SEQ: Mutex<u64> = Mutex::new(0);

fn samples() -> std::sync::MutexGuard<'static, BTreeMap<u32, Option<Taken>>> {
    SAMPLES.lock().unwrap_or_else(|p| p.into_inner())
}

fn sample_id(sample: nvmlGpmSample_t) -> Result<u32, Ret> {
    match Handle::from_ptr(sample) {
        Some(Handle::GpmSample(id)) if samples().contains_key(&id) => Ok(id),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

fn gpm_capable(gpu: &GpuInfo) -> bool {
    gpu.architecture >= Architecture::Hopper
}

/// `nvmlGpmQueryDeviceSupport`: Hopper and later. Checks the struct's version.
///
/// # Safety
/// `gpmSupport` is null or valid for reading and writing one `nvmlGpmSupport_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    gpmSupport: *mut sys::nvmlGpmSupport_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gpu = view.full_gpu(device)?;
        if gpmSupport.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for reads (caller's contract).
        let version = unsafe { std::ptr::addr_of!((*gpmSupport).version).read_unaligned() };
        if version != sys::NVML_GPM_SUPPORT_VERSION {
            return Err(ffi::VERSION_MISMATCH);
        }
        let out = sys::nvmlGpmSupport_t {
            version,
            isSupportedDevice: u32::from(gpm_capable(gpu)),
        };
        // SAFETY: valid for a write (caller's contract).
        unsafe { put(gpmSupport, out) }
    })
}

/// `nvmlGpmSampleAlloc`.
///
/// # Safety
/// `gpmSample` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(gpmSample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    guard(|| {
        node::current()?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        samples().insert(id, None);
        // SAFETY: null or valid for a write (caller's contract).
        let written = unsafe { put(gpmSample, Handle::GpmSample(id).to_ptr()) };
        if written.is_err() {
            samples().remove(&id);
        }
        written
    })
}

/// `nvmlGpmSampleFree`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleFree(gpmSample: nvmlGpmSample_t) -> nvmlReturn_t {
    guard(|| {
        let id = sample_id(gpmSample)?;
        samples().remove(&id);
        Ok(())
    })
}

/// Fills sample `id` with the SM activity of `gpu` (or its instance `gi`) now.
fn take(view: &View, gpu: &GpuInfo, gi: Option<u32>, id: u32) -> Result<(), Ret> {
    if !gpm_capable(gpu) {
        return Err(ffi::NOT_SUPPORTED);
    }
    let r = crate::telemetry::model_readings(view, gpu)?;
    let sm = match gi {
        Some(gi) => r.mig.get(&gi).ok_or(ffi::NOT_FOUND)?.0,
        // A GPU in MIG mode: its instances' activity weighted by their share of the GPU.
        None => r.utilization_percent.unwrap_or(r.mig_activity_percent),
    };
    let seq = {
        let mut next = NEXT_SEQ.lock().unwrap_or_else(|p| p.into_inner());
        *next += 1;
        *next
    };
    let mut all = samples();
    let slot = all.get_mut(&id).ok_or(ffi::INVALID_ARGUMENT)?;
    *slot = Some(Taken {
        gpu: gpu.minor,
        gi,
        seq,
        sm_percent: f64::from(sm),
    });
    Ok(())
}

/// `nvmlGpmSampleGet`: a sample of the whole GPU.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    gpmSample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gpu = view.full_gpu(device)?;
        let id = sample_id(gpmSample)?;
        take(&view, gpu, None, id)
    })
}

/// `nvmlGpmMigSampleGet`: a sample of GPU instance `gpuInstanceId` of a GPU (the parent's
/// handle, as NVML takes it); `NVML_ERROR_NOT_FOUND` for an instance without a MIG device.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpuInstanceId: std::ffi::c_uint,
    gpmSample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gpu = view.full_gpu(device)?;
        let id = sample_id(gpmSample)?;
        take(&view, gpu, Some(gpuInstanceId), id)
    })
}

/// The figure of `metric` between two samples of one device, in NVML's unit (percent).
fn metric(first: &Taken, second: &Taken, metric: u32) -> Result<f64, Ret> {
    match metric {
        sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL
        | sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => {
            Ok((first.sm_percent + second.sm_percent) / 2.0)
        }
        m if m < sys::nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX => Err(ffi::NOT_SUPPORTED),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

/// `nvmlGpmMetricsGet`: each requested metric between `sample1` and `sample2` (filled, of the
/// same GPU or instance, `sample1` taken first). Per-metric results go in each slot's
/// `nvmlReturn`; the call fails only for a bad request.
///
/// # Safety
/// `metricsGet` is null or valid for reading and writing one `nvmlGpmMetricsGet_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(
    metricsGet: *mut sys::nvmlGpmMetricsGet_t,
) -> nvmlReturn_t {
    guard(|| {
        if metricsGet.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for reads (caller's contract); the struct is plain data.
        let mut request = unsafe { metricsGet.read_unaligned() };
        if request.version != sys::NVML_GPM_METRICS_GET_VERSION {
            return Err(ffi::VERSION_MISMATCH);
        }
        let n = request.numMetrics as usize;
        if n > request.metrics.len() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let (a, b) = (sample_id(request.sample1)?, sample_id(request.sample2)?);
        let (first, second) = {
            let all = samples();
            (
                all.get(&a).copied().flatten(),
                all.get(&b).copied().flatten(),
            )
        };
        let (Some(first), Some(second)) = (first, second) else {
            return Err(ffi::INVALID_ARGUMENT);
        };
        if (first.gpu, first.gi) != (second.gpu, second.gi) || first.seq >= second.seq {
            return Err(ffi::INVALID_ARGUMENT);
        }
        for slot in request.metrics.iter_mut().take(n) {
            match metric(&first, &second, slot.metricId) {
                Ok(value) => {
                    slot.value = value;
                    slot.nvmlReturn = ffi::SUCCESS;
                }
                Err(code) => {
                    slot.value = 0.0;
                    slot.nvmlReturn = code;
                }
            }
        }
        // SAFETY: valid for a write (caller's contract).
        unsafe { put(metricsGet, request) }
    })
}
