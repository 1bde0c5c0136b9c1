//! GPU health from NVML's event set, watched by a dedicated thread.
//!
//! The thread registers every GPU for the events of [`crate::hardware::health`] (those the
//! GPU supports), waits on the set, and records each event as a fault of its GPU (or of the
//! MIG instance NVML attributes it to). The plugin reads the faults through `inventory()`
//! (`GpuInfo::faults`, and the built-in verdict in `GpuInfo::healthy`), the same path the
//! simulator's faults take, and judges them with its health policy. It runs off the async
//! runtime because `nvmlEventSetWait` blocks.
//!
//! # Wake-ups
//!
//! An event ends a wait at once, so the wait's timeout ([`WAIT_MS`], 5 s) bounds only how
//! often an idle thread wakes: it used to be 100 ms, which woke an idle GPU node's plugin ten
//! times a second and re-enumerated its GPUs every second. GPUs that appear later (a driver
//! installed or a GPU added after start) are registered after the wait during which the
//! plugin's inventory first listed them (`HealthWatch::saw`), and at least every
//! [`RESCAN_EVERY`] waits. Dropping the watch does not wait for the thread: it stops after
//! its current wait, holding its own reference to the library until then.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::hardware::health::{
    FaultKind, GpuFault, WATCHED_EVENTS, attributed_instance, health_after, is_recovery,
    record_fault, unix_now,
};

/// Longest single wait on the event set: how often an idle thread wakes, and how long a GPU
/// the inventory found waits to be registered.
pub const WAIT_MS: u32 = 5_000;
/// Waits between looks for GPUs that appeared since the last look (about 10 s) when no
/// inventory asked for one sooner.
pub const RESCAN_EVERY: u32 = 2;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;
/// `NVML_ERROR_TIMEOUT`.
const RAW_TIMEOUT: u32 = 10;

/// What the thread learnt, per GPU UUID (which survives re-enumeration).
#[derive(Default)]
struct Findings {
    /// GPUs the built-in verdict holds unhealthy.
    unhealthy: BTreeSet<String>,
    /// Faults since each GPU's last recovery.
    faults: BTreeMap<String, Vec<GpuFault>>,
}

/// What the plugin's threads and the event thread share about registration.
#[derive(Default)]
struct Registration {
    /// UUIDs of the GPUs registered for events.
    registered: Mutex<BTreeSet<String>>,
    /// Set when an inventory listed a GPU not registered: look again after this wait.
    rescan: AtomicBool,
}

impl Registration {
    fn registered(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.registered.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The health-watching thread and what it found.
pub(super) struct HealthWatch {
    findings: Arc<Mutex<Findings>>,
    generation: Arc<Bumps>,
    registration: Arc<Registration>,
    stop: Arc<AtomicBool>,
    /// `false` when the thread could not start.
    running: bool,
}

impl HealthWatch {
    /// Starts watching every GPU NVML reports now. A GPU that already answers
    /// `NVML_ERROR_GPU_IS_LOST` starts unhealthy (events raised before this process started
    /// are not replayed by NVML, so nothing else is known about the past).
    pub(super) fn start(nvml: Arc<Nvml>) -> HealthWatch {
        let mut findings = Findings::default();
        let now = unix_now();
        for uuid in lost_gpus(&nvml) {
            record_fault(
                findings.faults.entry(uuid.clone()).or_default(),
                FaultKind::GpuLost,
                None,
                now,
            );
            findings.unhealthy.insert(uuid);
        }
        let findings = Arc::new(Mutex::new(findings));
        let generation = Arc::new(Bumps::default());
        let registration = Arc::new(Registration::default());
        let stop = Arc::new(AtomicBool::new(false));
        let running = {
            let shared = Shared {
                findings: findings.clone(),
                generation: generation.clone(),
                registration: registration.clone(),
                stop: stop.clone(),
            };
            std::thread::Builder::new()
                .name("nvml-events".into())
                .spawn(move || watch(&nvml, &shared))
                .map_err(|e| warn!(error = %e, "cannot start the NVML event thread; GPU health stays as last known"))
                .is_ok()
        };
        HealthWatch {
            findings,
            generation,
            registration,
            stop,
            running,
        }
    }

    /// Tells the event thread that an inventory listed GPU `uuid`: one it has not registered
    /// is registered after the thread's current wait (at most [`WAIT_MS`]).
    pub(super) fn saw(&self, uuid: &str) {
        if self.running && !self.registration.registered().contains(uuid) {
            self.registration.rescan.store(true, Ordering::Relaxed);
        }
    }

    fn findings(&self) -> std::sync::MutexGuard<'_, Findings> {
        self.findings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the GPU with `uuid` is healthy by the built-in verdict: no event it judges
    /// fatal since the last recovery.
    pub(super) fn healthy(&self, uuid: &str) -> bool {
        !self.findings().unhealthy.contains(uuid)
    }

    /// The faults GPU `uuid` raised since its last recovery, oldest first.
    pub(super) fn faults(&self, uuid: &str) -> Vec<GpuFault> {
        self.findings()
            .faults
            .get(uuid)
            .cloned()
            .unwrap_or_default()
    }

    /// Changes with every event received and every GPU newly registered.
    pub(super) fn generation(&self) -> u64 {
        self.generation.value.load(Ordering::Relaxed)
    }

    /// Notified at every change of [`HealthWatch::generation`]; `None` when the event
    /// thread could not start (nothing would ever notify it, so the plugin polls).
    pub(super) fn signal(&self) -> Option<Arc<Notify>> {
        self.running.then(|| Arc::clone(&self.generation.changed))
    }
}

impl Drop for HealthWatch {
    /// Asks the thread to stop and returns at once: it ends after its current wait (at most
    /// [`WAIT_MS`]), freeing its event set; a process that exits first needs neither.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What the event thread holds of the watch.
struct Shared {
    findings: Arc<Mutex<Findings>>,
    generation: Arc<Bumps>,
    registration: Arc<Registration>,
    stop: Arc<AtomicBool>,
}

/// UUIDs of the GPUs that have fallen off the bus: their temperature query answers
/// `NVML_ERROR_GPU_IS_LOST`.
fn lost_gpus(nvml: &Nvml) -> BTreeSet<String> {
    use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
    use nvml_wrapper::error::NvmlError;
    let mut lost = BTreeSet::new();
    for index in 0..nvml.device_count().unwrap_or(0) {
        let Ok(dev) = nvml.device_by_index(index) else {
            continue;
        };
        if let (Err(NvmlError::GpuLost), Ok(uuid)) =
            (dev.temperature(TemperatureSensor::Gpu), dev.uuid())
        {
            warn!(gpu = %uuid, "GPU is lost (NVML_ERROR_GPU_IS_LOST); unhealthy");
            lost.insert(uuid);
        }
    }
    lost
}

/// The event thread's generation and the signal that wakes whoever waits for it to move.
#[derive(Default)]
struct Bumps {
    value: AtomicU64,
    changed: Arc<Notify>,
}

impl Bumps {
    fn bump(&self) {
        self.value.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_one();
    }
}

fn watch(nvml: &Nvml, shared: &Shared) {
    let (findings, generation) = (&*shared.findings, &*shared.generation);
    let lib = nvml.lib();
    let (Ok(create), Ok(register), Ok(supported), Ok(wait), Ok(free), Ok(uuid_of)) = (
        lib.nvmlEventSetCreate.as_ref(),
        lib.nvmlDeviceRegisterEvents.as_ref(),
        lib.nvmlDeviceGetSupportedEventTypes.as_ref(),
        lib.nvmlEventSetWait_v2.as_ref(),
        lib.nvmlEventSetFree.as_ref(),
        lib.nvmlDeviceGetUUID.as_ref(),
    ) else {
        warn!("libnvidia-ml lacks the event-set calls; GPU health is not watched");
        return;
    };
    let mut set: nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: `set` is a valid out-pointer; NVML stores its handle there.
    let ret = unsafe { create(&mut set) };
    if ret != 0 {
        warn!(
            code = ret,
            "nvmlEventSetCreate failed; GPU health is not watched"
        );
        return;
    }
    // Registers every GPU not registered yet (all of them the first time; later, GPUs that
    // appeared since). Keyed by UUID: indexes shift when GPUs come and go.
    // The set is locked for each look-up and insertion only, not across NVML calls: an
    // inventory read asks about it for every GPU.
    let register_new = || {
        let mut added = 0u64;
        for index in 0..nvml.device_count().unwrap_or(0) {
            let Ok(dev) = nvml.device_by_index(index) else {
                continue;
            };
            let Ok(uuid) = dev.uuid() else {
                continue;
            };
            if shared.registration.registered().contains(&uuid) {
                continue;
            }
            // SAFETY: the handle is used only below, while `nvml` (and so the library) lives.
            let handle: nvmlDevice_t = unsafe { dev.handle() };
            let mut types: u64 = 0;
            // SAFETY: live device handle and a valid out-pointer.
            let ret = unsafe { supported(handle, &mut types) };
            let mask = if ret == 0 {
                types & WATCHED_EVENTS
            } else {
                WATCHED_EVENTS
            };
            // SAFETY: live device handle and the set created above.
            let ret = unsafe { register(handle, mask, set) };
            if ret == 0 {
                info!(gpu = index, %uuid, mask = format!("{mask:#x}"), "watching NVML events");
                shared.registration.registered().insert(uuid);
                added += 1;
            } else {
                warn!(
                    gpu = index,
                    %uuid,
                    code = ret,
                    "nvmlDeviceRegisterEvents failed; this GPU's health is not watched (retried)"
                );
            }
        }
        added
    };
    register_new();
    let mut waits = 0u32;
    while !shared.stop.load(Ordering::Relaxed) {
        waits += 1;
        let asked = shared.registration.rescan.swap(false, Ordering::Relaxed);
        if (asked || waits.is_multiple_of(RESCAN_EVERY)) && register_new() > 0 {
            generation.bump();
        }
        let mut data = MaybeUninit::<nvmlEventData_t>::zeroed();
        // SAFETY: the set is live until freed below; `data` is writable and sized for the
        // struct.
        let ret = unsafe { wait(set, data.as_mut_ptr(), WAIT_MS) };
        if ret == RAW_TIMEOUT {
            continue;
        }
        if ret != 0 {
            warn!(code = ret, "nvmlEventSetWait_v2 failed");
            std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
            continue;
        }
        // SAFETY: NVML returned success, so it filled the (zeroed) struct.
        let data = unsafe { data.assume_init() };
        let mut buf = [0 as std::ffi::c_char; UUID_BUFFER];
        // SAFETY: `data.device` is the handle NVML gave for the event; `buf` holds
        // UUID_BUFFER bytes.
        if unsafe { uuid_of(data.device, buf.as_mut_ptr(), UUID_BUFFER as u32) } != 0 {
            warn!(
                event = format!("{:#x}", data.eventType),
                "NVML event for an unknown device"
            );
            continue;
        }
        // SAFETY: NVML wrote a NUL-terminated string into `buf` on success.
        let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut found = findings.lock().unwrap_or_else(|p| p.into_inner());
        match health_after(data.eventType, data.eventData) {
            Some(false) => {
                found.unhealthy.insert(uuid.clone());
            }
            Some(true) => {
                found.unhealthy.remove(&uuid);
            }
            None => {}
        }
        if is_recovery(data.eventType, data.eventData) {
            found.faults.remove(&uuid);
        } else if let Some(kind) = FaultKind::from_event(data.eventType, data.eventData) {
            record_fault(
                found.faults.entry(uuid.clone()).or_default(),
                kind,
                attributed_instance(data.gpuInstanceId),
                unix_now(),
            );
        }
        warn!(
            gpu = %uuid,
            event = format!("{:#x}", data.eventType),
            data = data.eventData,
            gpu_instance = data.gpuInstanceId,
            compute_instance = data.computeInstanceId,
            healthy = !found.unhealthy.contains(&uuid),
            "NVML event"
        );
        drop(found);
        generation.bump();
    }
    // SAFETY: the set is live and freed once.
    unsafe { free(set) };
}
