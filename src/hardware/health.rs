//! The health policy both backends share: which NVML events make a GPU unhealthy, and which
//! one makes it healthy again. Pure: the simulator applies it when a fault is injected, the
//! NVML backend when its event loop receives the event, so both report the same health.

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
