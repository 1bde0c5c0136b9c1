//! Event sets: create, register a GPU's event types, wait with a timeout, free. Events come
//! from the simulator's fault log (`gpu-dra sim-fault`): XID critical errors, single- and
//! double-bit ECC errors, a GPU falling off the bus, and the recovery after a reset. A set
//! sees the events raised after it was created, for the GPUs and types registered with it.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_uint, c_ulonglong};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gpu_dra::hardware::health::WATCHED_EVENTS;
use gpu_dra::hardware::sim::StateWatch;
use gpu_dra::hardware::sim::faults::SimEvent;
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlEventSet_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::handles::Handle;
use crate::node;

/// Event types the simulated GPUs raise.
pub const SUPPORTED_EVENTS: u64 = WATCHED_EVENTS;
/// `gpuInstanceId` / `computeInstanceId` of an event not attributed to a MIG instance.
const UNATTRIBUTED: c_uint = 0xFFFF_FFFF;
/// How often a waiting set looks at the fault log when the state directory cannot be
/// watched.
const POLL: Duration = Duration::from_millis(20);

struct EventSet {
    /// Registered event types per GPU index.
    registered: BTreeMap<u32, u64>,
    /// Last fault-log sequence number looked at.
    cursor: u64,
    /// Matching events not yet returned.
    pending: VecDeque<SimEvent>,
}

static SETS: Mutex<BTreeMap<u32, EventSet>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

fn sets() -> std::sync::MutexGuard<'static, BTreeMap<u32, EventSet>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

fn set_id(set: nvmlEventSet_t) -> Result<u32, Ret> {
    match Handle::from_ptr(set) {
        Some(Handle::EventSet(id)) if sets().contains_key(&id) => Ok(id),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

/// `nvmlEventSetCreate`.
///
/// # Safety
/// `set` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        let node = node::current()?;
        let (_, cursor) = node
            .backend
            .events_after(u64::MAX)
            .map_err(|e| ffi::code_of(&e))?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        sets().insert(
            id,
            EventSet {
                registered: BTreeMap::new(),
                cursor,
                pending: VecDeque::new(),
            },
        );
        // SAFETY: null or valid for a write (caller's contract).
        let written = unsafe { put(set, Handle::EventSet(id).to_ptr()) };
        if written.is_err() {
            sets().remove(&id);
        }
        written
    })
}

/// `nvmlDeviceGetSupportedEventTypes`.
///
/// # Safety
/// `eventTypes` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        view.full_gpu(device)?;
        // SAFETY: null or valid for a write (caller's contract).
        unsafe { put(eventTypes, SUPPORTED_EVENTS) }
    })
}

/// `nvmlDeviceRegisterEvents`: `NVML_ERROR_NOT_SUPPORTED` (and nothing registered) when a
/// requested type is not one the simulated GPU raises, as NVML does.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let gpu = view.full_gpu(device)?.minor;
        let id = set_id(set)?;
        if eventTypes & !SUPPORTED_EVENTS != 0 {
            return Err(ffi::NOT_SUPPORTED);
        }
        let mut all = sets();
        let entry = all.get_mut(&id).ok_or(ffi::INVALID_ARGUMENT)?;
        *entry.registered.entry(gpu).or_default() |= eventTypes;
        Ok(())
    })
}

/// Moves new matching events of the fault log into the set's queue; the first one, if any.
fn next_event(id: u32) -> Result<Option<SimEvent>, Ret> {
    let cursor = {
        let mut all = sets();
        let set = all.get_mut(&id).ok_or(ffi::INVALID_ARGUMENT)?;
        if let Some(e) = set.pending.pop_front() {
            return Ok(Some(e));
        }
        set.cursor
    };
    let node = node::current()?;
    let (events, last) = node
        .backend
        .events_after(cursor)
        .map_err(|e| ffi::code_of(&e))?;
    let mut all = sets();
    let set = all.get_mut(&id).ok_or(ffi::INVALID_ARGUMENT)?;
    set.cursor = last;
    let registered = set.registered.clone();
    set.pending.extend(events.into_iter().filter(|e| {
        registered
            .get(&e.gpu)
            .is_some_and(|m| m & e.event_type != 0)
    }));
    Ok(set.pending.pop_front())
}

/// `nvmlEventSetWait_v2`: the next event, or `NVML_ERROR_TIMEOUT` after `timeoutms`.
///
/// # Safety
/// `data` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if data.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let id = set_id(set)?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
        // Made before the first look at the fault log, so a fault raised after the look
        // still ends the wait: the thread blocks as in a real driver's wait instead of
        // polling (it polls only where the kernel refuses the watch).
        let watch = node::current()?
            .state_dir
            .as_deref()
            .and_then(StateWatch::new);
        loop {
            if let Some(e) = next_event(id)? {
                let out = sys::nvmlEventData_t {
                    device: Handle::Gpu(e.gpu).to_ptr(),
                    eventType: e.event_type,
                    eventData: e.data,
                    // A MIG-scoped XID names its GPU instance; the simulator does not attribute
                    // events to compute instances.
                    gpuInstanceId: e.gpu_instance.unwrap_or(UNATTRIBUTED),
                    computeInstanceId: UNATTRIBUTED,
                };
                // SAFETY: non-null and valid for a write (caller's contract).
                return unsafe { put(data, out) };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ffi::TIMEOUT);
            }
            match &watch {
                Some(watch) => {
                    watch.wait(deadline - now);
                }
                None => std::thread::sleep(POLL.min(deadline - now)),
            }
        }
    })
}

/// `nvmlEventSetFree`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        let id = set_id(set)?;
        sets().remove(&id);
        Ok(())
    })
}
