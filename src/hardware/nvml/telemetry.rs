//! Telemetry through NVML: one sample of every GPU and MIG device.
//!
//! Per GPU: power usage and enforced limit, utilisation (the SM-activity figure; NVML has
//! none in MIG mode), memory, temperature, ECC counters, retired pages (before Ampere) or
//! remapped rows (Ampere and later). Per MIG device: memory (NVML answers memory info on
//! the MIG handle; power, temperature and ECC exist per GPU only) and, on GPUs with GPU
//! Performance Monitoring (Hopper and later), SM utilisation between this sample and the
//! previous one (`nvmlGpmMigSampleGet`, `nvmlGpmMetricsGet`): the first sample of an
//! instance has no figure yet. XID counts come from an
//! event set of this module's own, registered for XID critical errors and drained without
//! waiting at every sample, so nothing here blocks and no thread is added: NVML replays no
//! past events, so counts start when the backend starts. An XID whose event names a GPU
//! instance (`gpuInstanceId`) also counts for the MIG device of that instance.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause as NvmlCause, TemperatureSensor,
};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION, nvmlDevice_t, nvmlEventData_t,
    nvmlEventSet_t, nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL, nvmlGpmMetricsGet_t,
    nvmlGpmSample_t, nvmlGpmSupport_t,
};

use super::{NvmlBackend, wrap};
use crate::hardware::health::{EVENT_XID_CRITICAL, attributed_instance};
use crate::hardware::telemetry::{
    EccTelemetry, GpuTelemetry, MigTelemetry, MigXidCounts, NodeTelemetry, RetirementCause,
};
use crate::hardware::{HardwareError, NvmlCode};

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;
/// Most events taken from the set in one sample (a storm is counted over several samples).
const DRAIN_LIMIT: usize = 4096;

/// An NVML event set handle. NVML's handles may be used from any thread; the set is only
/// touched under [`Telemetry`]'s mutex.
struct EventSet(nvmlEventSet_t);

// SAFETY: the handle is an opaque NVML pointer, valid on every thread; all use is
// serialised by the mutex that owns it.
unsafe impl Send for EventSet {}

/// A GPM sample handle, kept from one telemetry sample to the next.
struct GpmSample(nvmlGpmSample_t);

// SAFETY: an opaque NVML pointer, valid on every thread; used only under the mutex that
// owns it.
unsafe impl Send for GpmSample {}

/// GPM support per GPU and the last sample of each MIG device, by (GPU UUID, GI id).
#[derive(Default)]
struct Gpm {
    supported: HashMap<String, bool>,
    last: HashMap<(String, u32), GpmSample>,
    /// Keys sampled in the current round; the others are freed at its end.
    seen: BTreeSet<(String, u32)>,
}

#[derive(Default)]
struct XidWatch {
    set: Option<EventSet>,
    /// The set could not be created (old driver): XIDs are not counted.
    unavailable: bool,
    registered: BTreeSet<String>,
    counts: BTreeMap<(String, u64), u64>,
    /// The XIDs attributed to a GPU instance, by MIG device.
    mig: MigXidCounts,
}

/// An XID NVML attributed to a GPU instance: (GPU UUID, GI id, XID).
type AttributedXid = (String, u32, u64);

/// The NVML backend's telemetry state: the XID event set and counts, and GPM samples. (Each
/// GPU's MIG profile table is the backend's kept inventory's.)
pub(super) struct Telemetry {
    nvml: Arc<Nvml>,
    xids: Mutex<XidWatch>,
    gpm: Mutex<Gpm>,
}

impl Telemetry {
    pub(super) fn new(nvml: Arc<Nvml>) -> Telemetry {
        Telemetry {
            nvml,
            xids: Mutex::new(XidWatch::default()),
            gpm: Mutex::new(Gpm::default()),
        }
    }

    fn free_gpm(&self, sample: GpmSample) {
        if let Ok(free) = self.nvml.lib().nvmlGpmSampleFree.as_ref() {
            // SAFETY: the sample was allocated by NVML and is freed once.
            unsafe { free(sample.0) };
        }
    }

    /// SM utilisation (0–1) of GPU instance `gi` of the GPU `handle` since the previous
    /// call for it; `None` without GPM, on the first call, or when NVML has no figure.
    fn mig_sm_active(&self, handle: nvmlDevice_t, uuid: &str, gi: u32) -> Option<f64> {
        let lib = self.nvml.lib();
        let (Ok(support), Ok(alloc), Ok(take), Ok(metrics)) = (
            lib.nvmlGpmQueryDeviceSupport.as_ref(),
            lib.nvmlGpmSampleAlloc.as_ref(),
            lib.nvmlGpmMigSampleGet.as_ref(),
            lib.nvmlGpmMetricsGet.as_ref(),
        ) else {
            return None;
        };
        let mut gpm = self.gpm.lock().unwrap_or_else(|p| p.into_inner());
        let supported = *gpm.supported.entry(uuid.to_string()).or_insert_with(|| {
            let mut s = nvmlGpmSupport_t {
                version: NVML_GPM_SUPPORT_VERSION,
                isSupportedDevice: 0,
            };
            // SAFETY: live device handle and a valid, versioned out-struct.
            unsafe { support(handle, &mut s) == 0 && s.isSupportedDevice != 0 }
        });
        if !supported {
            return None;
        }
        let mut sample: nvmlGpmSample_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; NVML stores a new sample handle there.
        if unsafe { alloc(&mut sample) } != 0 {
            return None;
        }
        let sample = GpmSample(sample);
        // SAFETY: live parent handle and the sample just allocated.
        if unsafe { take(handle, gi, sample.0) } != 0 {
            drop(gpm);
            self.free_gpm(sample);
            return None;
        }
        let key = (uuid.to_string(), gi);
        gpm.seen.insert(key.clone());
        let previous = gpm.last.insert(key, sample)?;
        let current = gpm.last.get(&(uuid.to_string(), gi)).map(|s| s.0)?;
        drop(gpm);
        // SAFETY: plain data; zeroed pointers and numbers are valid for every field.
        let mut request: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
        request.version = NVML_GPM_METRICS_GET_VERSION;
        request.numMetrics = 1;
        request.sample1 = previous.0;
        request.sample2 = current;
        request.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
        // SAFETY: a valid, versioned request naming two live samples of this instance.
        let ret = unsafe { metrics(&mut request) };
        self.free_gpm(previous);
        (ret == 0 && request.metrics[0].nvmlReturn == 0)
            .then(|| (request.metrics[0].value / 100.0).clamp(0.0, 1.0))
    }

    /// Frees the samples of MIG devices not seen since the last call (destroyed instances).
    fn end_gpm_round(&self) {
        let stale: Vec<GpmSample> = {
            let mut gpm = self.gpm.lock().unwrap_or_else(|p| p.into_inner());
            let seen = std::mem::take(&mut gpm.seen);
            let gone: Vec<(String, u32)> = gpm
                .last
                .keys()
                .filter(|k| !seen.contains(*k))
                .cloned()
                .collect();
            gone.iter().filter_map(|k| gpm.last.remove(k)).collect()
        };
        for sample in stale {
            self.free_gpm(sample);
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let samples: Vec<GpmSample> = {
            let gpm = self.gpm.get_mut().unwrap_or_else(|p| p.into_inner());
            gpm.last.drain().map(|(_, s)| s).collect()
        };
        for sample in samples {
            self.free_gpm(sample);
        }
        let watch = self.xids.get_mut().unwrap_or_else(|p| p.into_inner());
        if let (Some(set), Ok(free)) = (watch.set.take(), self.nvml.lib().nvmlEventSetFree.as_ref())
        {
            // SAFETY: the set was created by NVML, is live, and is freed once.
            unsafe { free(set.0) };
        }
    }
}

/// The UUID of an NVML device handle.
fn uuid_of(nvml: &Nvml, handle: nvmlDevice_t) -> Option<String> {
    let get = nvml.lib().nvmlDeviceGetUUID.as_ref().ok()?;
    let mut buf = [0 as std::ffi::c_char; UUID_BUFFER];
    // SAFETY: `handle` came from NVML; `buf` holds UUID_BUFFER bytes.
    if unsafe { get(handle, buf.as_mut_ptr(), UUID_BUFFER as u32) } != 0 {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into `buf` on success.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

impl XidWatch {
    /// Registers GPUs not seen before (hot-plugged ones too), takes every pending event
    /// without waiting, counts it in `counts` (by GPU UUID and XID) and returns the ones
    /// NVML attributed to a GPU instance.
    fn drain(&mut self, nvml: &Nvml) -> Vec<AttributedXid> {
        let mut attributed = Vec::new();
        if self.unavailable {
            return attributed;
        }
        let lib = nvml.lib();
        let (Ok(create), Ok(register), Ok(wait)) = (
            lib.nvmlEventSetCreate.as_ref(),
            lib.nvmlDeviceRegisterEvents.as_ref(),
            lib.nvmlEventSetWait_v2.as_ref(),
        ) else {
            self.unavailable = true;
            return attributed;
        };
        if self.set.is_none() {
            let mut set: nvmlEventSet_t = std::ptr::null_mut();
            // SAFETY: `set` is a valid out-pointer; NVML stores its handle there.
            if unsafe { create(&mut set) } != 0 {
                self.unavailable = true;
                return attributed;
            }
            self.set = Some(EventSet(set));
        }
        let Some(set) = self.set.as_ref().map(|s| s.0) else {
            return attributed;
        };
        for index in 0..nvml.device_count().unwrap_or(0) {
            let Ok(dev) = nvml.device_by_index(index) else {
                continue;
            };
            let Ok(uuid) = dev.uuid() else { continue };
            if self.registered.contains(&uuid) {
                continue;
            }
            // SAFETY: the handle is used only for this call, while `nvml` lives.
            let handle = unsafe { dev.handle() };
            // SAFETY: live device handle and the live set; a GPU without XID events
            // answers NOT_SUPPORTED and is simply not counted.
            unsafe { register(handle, EVENT_XID_CRITICAL, set) };
            self.registered.insert(uuid);
        }
        for _ in 0..DRAIN_LIMIT {
            let mut data = MaybeUninit::<nvmlEventData_t>::zeroed();
            // SAFETY: the set is live; `data` is writable and sized for the struct.
            let ret = unsafe { wait(set, data.as_mut_ptr(), 0) };
            if ret != 0 {
                // NVML_ERROR_TIMEOUT: nothing pending; anything else: next sample retries.
                break;
            }
            // SAFETY: NVML returned success, so it filled the (zeroed) struct.
            let data = unsafe { data.assume_init() };
            if data.eventType != EVENT_XID_CRITICAL {
                continue;
            }
            if let Some(uuid) = uuid_of(nvml, data.device) {
                if let Some(gi) = attributed_instance(data.gpuInstanceId) {
                    attributed.push((uuid.clone(), gi, data.eventData));
                }
                *self.counts.entry((uuid, data.eventData)).or_default() += 1;
            }
        }
        attributed
    }
}

/// `Ok(None)` for a reading the device does not offer; the error for anything else.
fn optional<T>(r: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::NotSupported | NvmlError::NoPermission | NvmlError::InvalidArg) => Ok(None),
        Err(e) => Err(e),
    }
}

impl NvmlBackend {
    /// One sample of every GPU NVML enumerates now.
    pub(super) fn sample_telemetry(&self) -> Result<NodeTelemetry, HardwareError> {
        let count = self
            .nvml
            .device_count()
            .map_err(wrap("nvmlDeviceGetCount_v2", 0))?;
        // Held for the whole sample: the counts and the MIG devices they are attributed to
        // belong to one round.
        let mut xids = self
            .telemetry
            .xids
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let attributed = xids.drain(&self.nvml);
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            // A GPU that vanished between the count and now is left out of this sample.
            let Ok(dev) = self.device(index) else {
                continue;
            };
            let (Ok(uuid), Ok(minor)) = (dev.uuid(), dev.minor_number()) else {
                continue;
            };
            let mut t = GpuTelemetry::new(index, minor, &uuid);
            t.xid_errors = xids
                .counts
                .iter()
                .filter(|((u, _), _)| *u == uuid)
                .map(|((_, xid), n)| (*xid, *n))
                .collect();
            // A lost GPU answers nothing more; any other failure leaves the readings not
            // taken yet absent, as for a reading the GPU does not offer.
            match self.gpu_readings(&dev, index, &mut t) {
                Ok(()) => {
                    // The MIG list is complete: attribute this round's instance XIDs.
                    let events = attributed
                        .iter()
                        .filter(|(u, _, _)| *u == uuid)
                        .map(|(_, gi, xid)| (*gi, *xid));
                    xids.mig.attribute(&mut t, events);
                }
                Err(NvmlError::GpuLost) => t.lost = true,
                Err(_) => {}
            }
            gpus.push(t);
        }
        self.telemetry.end_gpm_round();
        Ok(NodeTelemetry { gpus })
    }

    fn gpu_readings(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        index: u32,
        t: &mut GpuTelemetry,
    ) -> Result<(), NvmlError> {
        let watts = |mw: u32| f64::from(mw) / 1000.0;
        t.power_watts = optional(dev.power_usage())?.map(watts);
        t.power_limit_watts = optional(dev.enforced_power_limit())?.map(watts);
        t.temperature_celsius = optional(dev.temperature(TemperatureSensor::Gpu))?.map(f64::from);
        if let Some(memory) = optional(dev.memory_info())? {
            t.memory_used_bytes = Some(memory.used);
            t.memory_total_bytes = Some(memory.total);
        }
        // NVML answers NOT_SUPPORTED in MIG mode: no figure rather than a false zero.
        t.sm_active = optional(dev.utilization_rates())?.map(|u| f64::from(u.gpu) / 100.0);
        let ecc = |e, c| optional(dev.total_ecc_errors(e, c));
        if let (Some(sv), Some(sa), Some(dv), Some(da)) = (
            ecc(MemoryError::Corrected, EccCounter::Volatile)?,
            ecc(MemoryError::Corrected, EccCounter::Aggregate)?,
            ecc(MemoryError::Uncorrected, EccCounter::Volatile)?,
            ecc(MemoryError::Uncorrected, EccCounter::Aggregate)?,
        ) {
            t.ecc = Some(EccTelemetry {
                single_bit_volatile: sv,
                single_bit_aggregate: sa,
                double_bit_volatile: dv,
                double_bit_aggregate: da,
            });
        }
        for (cause, label) in [
            (
                NvmlCause::MultipleSingleBitEccErrors,
                RetirementCause::MultipleSingleBit,
            ),
            (NvmlCause::DoubleBitEccError, RetirementCause::DoubleBit),
        ] {
            if let Some(pages) = optional(dev.retired_pages(cause))? {
                t.retired_pages.insert(label, pages.len() as u64);
            }
        }
        // SAFETY: the handle is used only below, while `dev` (and `self.nvml`) live.
        let handle = unsafe { dev.handle() };
        if let Some((corrected, uncorrected)) = self.remapped_rows(handle)? {
            t.retired_pages
                .insert(RetirementCause::RowRemapCorrectable, corrected);
            t.retired_pages
                .insert(RetirementCause::RowRemapUncorrectable, uncorrected);
        }
        if optional(dev.mig_mode())?.is_some_and(|m| m.current == 1) {
            t.mig = self.mig_readings(dev, handle, index, &t.uuid)?;
        }
        Ok(())
    }

    /// `nvmlDeviceGetRemappedRows` (no safe wrapper): (correctable, uncorrectable) rows.
    fn remapped_rows(&self, handle: nvmlDevice_t) -> Result<Option<(u64, u64)>, NvmlError> {
        let Ok(get) = self.nvml.lib().nvmlDeviceGetRemappedRows.as_ref() else {
            return Ok(None);
        };
        let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: live device handle and four valid out-pointers to u32.
        let ret = unsafe { get(handle, &mut corr, &mut unc, &mut pending, &mut failed) };
        match ret {
            0 => Ok(Some((u64::from(corr), u64::from(unc)))),
            3 | 4 => Ok(None),
            15 => Err(NvmlError::GpuLost),
            other => Err(NvmlError::UnexpectedVariant(other)),
        }
    }

    fn mig_readings(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        handle: nvmlDevice_t,
        index: u32,
        uuid: &str,
    ) -> Result<Vec<MigTelemetry>, NvmlError> {
        // The profile table an inventory read of this GPU in MIG mode kept (an inventory
        // round reads every GPU), else one read now and kept for the next sample. A failed
        // read leaves the sample without MIG devices and is tried again next time.
        let profiles = match self.kept_profiles(index, uuid) {
            Some(profiles) => profiles,
            None => self
                .gpu_facts(index)
                .map(|gpu| gpu.mig_profiles)
                .unwrap_or_default(),
        };
        let devices = self
            .mig_devices(dev, handle, index, &profiles, &[])
            .map_err(|e| match e {
                HardwareError::Nvml {
                    code: NvmlCode::GpuIsLost,
                    ..
                } => NvmlError::GpuLost,
                HardwareError::Nvml { code, .. } => NvmlError::UnexpectedVariant(code.raw()),
                _ => NvmlError::Unknown,
            })?;
        let mut out: Vec<MigTelemetry> = devices
            .into_iter()
            .map(|d| MigTelemetry {
                uuid: d.uuid,
                profile: d.profile_name,
                placement_start: d.placement.start,
                gi_id: d.gi_id,
                sm_active: None,
                memory_used_bytes: None,
                memory_total_bytes: None,
                xid_errors: BTreeMap::new(),
            })
            .collect();
        // Memory per MIG device: read on the MIG handle, matched by UUID.
        let max = dev.mig_device_count().unwrap_or(0);
        for i in 0..max {
            let Ok(mig) = dev.mig_device_by_index(i) else {
                continue;
            };
            let (Ok(mig_uuid), Some(memory)) = (mig.uuid(), optional(mig.memory_info())?) else {
                continue;
            };
            if let Some(row) = out.iter_mut().find(|m| m.uuid == mig_uuid) {
                row.memory_used_bytes = Some(memory.used);
                row.memory_total_bytes = Some(memory.total);
            }
        }
        for row in &mut out {
            row.sm_active = self.telemetry.mig_sm_active(handle, uuid, row.gi_id);
        }
        Ok(out)
    }
}
