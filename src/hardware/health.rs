//! What both backends observe about a GPU's health, and the built-in verdict on it. Pure.
//!
//! Backends record every health-relevant NVML event since the GPU's last recovery as a
//! [`GpuFault`] (`GpuInfo::faults`): the simulator when a fault is injected, the NVML backend
//! when its event thread receives the event. What a fault *means* (ignored, degraded, failed,
//! which taint) is the plugin's configurable health policy (`crate::health`), applied to these
//! observations. [`health_after`] is the built-in verdict behind `GpuInfo::healthy`, which
//! tools without a policy (`inventory`, `sim-fault`) print.

use serde::{Deserialize, Serialize};

/// `nvmlEventTypeSingleBitEccError`: corrected, counted, not a health problem.
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`: uncorrectable memory error.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`: `eventData` is the XID.
pub const EVENT_XID_CRITICAL: u64 = 0x8;
/// `nvmlEventTypeGpuUnavailableError`: the GPU is gone (e.g. fell off the bus).
pub const EVENT_GPU_UNAVAILABLE: u64 = 0x4000;
/// `nvmlEventTypeGpuRecoveryAction`: `eventData` is the recovery action still needed.
pub const EVENT_GPU_RECOVERY_ACTION: u64 = 0x8000;
/// The events the NVML backend registers for.
pub const WATCHED_EVENTS: u64 = EVENT_SINGLE_BIT_ECC
    | EVENT_DOUBLE_BIT_ECC
    | EVENT_XID_CRITICAL
    | EVENT_GPU_UNAVAILABLE
    | EVENT_GPU_RECOVERY_ACTION;

/// `NVML_GPU_RECOVERY_ACTION_NONE`: nothing left to do, the GPU is usable.
pub const RECOVERY_ACTION_NONE: u64 = 0;

/// XIDs an application causes (illegal address, MMU fault, reset channel, …): reported, but
/// the GPU stays healthy. The same list NVIDIA's device plugin skips.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];
/// XID 48: double-bit ECC error.
pub const XID_DOUBLE_BIT_ECC: u64 = 48;
/// XID 79: the GPU has fallen off the bus.
pub const XID_FALLEN_OFF_BUS: u64 = 79;

/// Most distinct faults a GPU keeps between recoveries; the oldest is dropped beyond it.
pub const FAULT_LIMIT: usize = 64;
/// `gpuInstanceId` / `computeInstanceId` of an event NVML did not attribute to a MIG instance.
pub const UNATTRIBUTED: u32 = 0xFFFF_FFFF;

/// What a GPU reported: the policy's vocabulary for events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum FaultKind {
    /// An XID error (`nvmlEventTypeXidCriticalError`).
    Xid {
        /// The XID code.
        code: u64,
    },
    /// A corrected (single-bit) ECC error.
    EccSingleBit,
    /// An uncorrectable (double-bit) ECC error.
    EccDoubleBit,
    /// The GPU is gone: fell off the bus, or answers `NVML_ERROR_GPU_IS_LOST`.
    GpuLost,
}

impl FaultKind {
    /// The kind an NVML event of `event_type` with `data` reports, if it is one.
    pub fn from_event(event_type: u64, data: u64) -> Option<FaultKind> {
        match event_type {
            EVENT_XID_CRITICAL => Some(FaultKind::Xid { code: data }),
            EVENT_SINGLE_BIT_ECC => Some(FaultKind::EccSingleBit),
            EVENT_DOUBLE_BIT_ECC => Some(FaultKind::EccDoubleBit),
            EVENT_GPU_UNAVAILABLE => Some(FaultKind::GpuLost),
            _ => None,
        }
    }

    /// The short name used as a taint value and in logs and metrics: `xid-79`,
    /// `ecc-single-bit`, `ecc-double-bit`, `gpu-lost` (a valid label value).
    pub fn cause(self) -> String {
        match self {
            FaultKind::Xid { code } => format!("xid-{code}"),
            FaultKind::EccSingleBit => "ecc-single-bit".into(),
            FaultKind::EccDoubleBit => "ecc-double-bit".into(),
            FaultKind::GpuLost => "gpu-lost".into(),
        }
    }
}

/// One kind of fault a GPU (or one of its MIG instances) raised since its last recovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuFault {
    /// What happened.
    pub kind: FaultKind,
    /// The GPU instance NVML attributed the event to (a MIG-scoped XID); `None` for the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
    /// When it was first seen, Unix seconds: a taint's stable `timeAdded`.
    pub first_seen: i64,
    /// When it was last seen, Unix seconds: the hold-down of a degraded GPU counts from here.
    pub last_seen: i64,
    /// How often it was seen.
    pub count: u64,
}

/// Records an event of `kind` (attributed to `gpu_instance`, if any) seen at `now` in
/// `faults`: a repeat updates its entry, a new kind is appended; beyond [`FAULT_LIMIT`]
/// entries the oldest is dropped.
pub fn record_fault(
    faults: &mut Vec<GpuFault>,
    kind: FaultKind,
    gpu_instance: Option<u32>,
    now: i64,
) {
    if let Some(f) = faults
        .iter_mut()
        .find(|f| f.kind == kind && f.gpu_instance == gpu_instance)
    {
        f.last_seen = f.last_seen.max(now);
        f.count += 1;
        return;
    }
    faults.push(GpuFault {
        kind,
        gpu_instance,
        first_seen: now,
        last_seen: now,
        count: 1,
    });
    let excess = faults.len().saturating_sub(FAULT_LIMIT);
    faults.drain(..excess);
}

/// Whether an event of `event_type` with `data` is a recovery: the GPU is usable again and
/// its recorded faults are cleared.
pub fn is_recovery(event_type: u64, data: u64) -> bool {
    event_type == EVENT_GPU_RECOVERY_ACTION && data == RECOVERY_ACTION_NONE
}

/// The GPU instance an event's `gpuInstanceId` names, if NVML attributed it to one.
pub fn attributed_instance(gpu_instance_id: u32) -> Option<u32> {
    (gpu_instance_id != UNATTRIBUTED).then_some(gpu_instance_id)
}

/// Unix seconds now (0 if the clock is before 1970).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The health a GPU has after event `event_type` with `data`: `Some(false)` unhealthy,
/// `Some(true)` healthy again, `None` no change.
pub fn health_after(event_type: u64, data: u64) -> Option<bool> {
    match event_type {
        EVENT_XID_CRITICAL if APPLICATION_XIDS.contains(&data) => None,
        EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_GPU_UNAVAILABLE => Some(false),
        EVENT_GPU_RECOVERY_ACTION if data == RECOVERY_ACTION_NONE => Some(true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_faults_update_one_entry_and_the_list_is_bounded() {
        let mut faults = Vec::new();
        record_fault(&mut faults, FaultKind::Xid { code: 79 }, None, 10);
        record_fault(&mut faults, FaultKind::Xid { code: 79 }, None, 20);
        record_fault(&mut faults, FaultKind::Xid { code: 79 }, Some(3), 30);
        assert_eq!(faults.len(), 2);
        assert_eq!(
            (faults[0].first_seen, faults[0].last_seen, faults[0].count),
            (10, 20, 2)
        );
        for code in 0..100 {
            record_fault(&mut faults, FaultKind::Xid { code }, None, 40);
        }
        assert_eq!(faults.len(), FAULT_LIMIT);
        assert_eq!(faults.last().unwrap().kind, FaultKind::Xid { code: 99 });
    }

    #[test]
    fn events_name_their_kind_and_cause() {
        assert_eq!(
            FaultKind::from_event(EVENT_XID_CRITICAL, 79).map(FaultKind::cause),
            Some("xid-79".to_string())
        );
        assert_eq!(
            FaultKind::from_event(EVENT_DOUBLE_BIT_ECC, 0),
            Some(FaultKind::EccDoubleBit)
        );
        assert_eq!(FaultKind::from_event(EVENT_GPU_RECOVERY_ACTION, 0), None);
        assert!(is_recovery(EVENT_GPU_RECOVERY_ACTION, 0));
        assert!(!is_recovery(EVENT_GPU_RECOVERY_ACTION, 2));
        assert_eq!(attributed_instance(UNATTRIBUTED), None);
        assert_eq!(attributed_instance(5), Some(5));
    }

    #[test]
    fn fatal_events_make_a_gpu_unhealthy_and_recovery_heals_it() {
        let cases = [
            (EVENT_XID_CRITICAL, 79, Some(false)),
            (EVENT_XID_CRITICAL, 48, Some(false)),
            (EVENT_XID_CRITICAL, 13, None),
            (EVENT_XID_CRITICAL, 43, None),
            (EVENT_DOUBLE_BIT_ECC, 0, Some(false)),
            (EVENT_SINGLE_BIT_ECC, 0, None),
            (EVENT_GPU_UNAVAILABLE, 0, Some(false)),
            (EVENT_GPU_RECOVERY_ACTION, RECOVERY_ACTION_NONE, Some(true)),
            (EVENT_GPU_RECOVERY_ACTION, 2, None),
        ];
        for (event, data, want) in cases {
            assert_eq!(
                health_after(event, data),
                want,
                "event {event:#x} data {data}"
            );
        }
    }
}
