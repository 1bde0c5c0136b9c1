//! Faults of a simulated GPU: XID errors, ECC errors, a GPU falling off the bus, and the
//! reset that recovers it. Each fault changes the shared state (health, lost flag, ECC
//! counters) under the simulator's lock and appends the NVML events a real GPU would raise,
//! which the simulated NVML library delivers to event sets. Health follows
//! [`crate::hardware::health`], the policy the NVML backend applies to the same events.

use super::SimBackend;
use super::state::GpuState;
use crate::hardware::HardwareError;
use crate::hardware::health::{self, XID_DOUBLE_BIT_ECC, XID_FALLEN_OFF_BUS};

/// Events kept in the state file; an event set that falls further behind misses the oldest.
pub const EVENT_LOG_LIMIT: usize = 1024;

// The data the faults change lives with the rest of the shared state; re-exported here,
// where callers (the simulated NVML library) look for it.
pub use super::state::{EccCounters, SimEvent};

/// A fault to inject (`gpu-dra sim-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// An XID error with this code.
    Xid {
        /// The XID.
        code: u64,
        /// The GPU instance NVML attributes it to (a MIG-scoped XID), if any.
        gpu_instance: Option<u32>,
    },
    /// An ECC error; double-bit errors are uncorrectable.
    Ecc {
        /// Uncorrectable (double-bit) rather than corrected (single-bit).
        double_bit: bool,
    },
    /// The GPU falls off the bus (XID 79).
    Lost,
    /// A GPU reset that clears the fault.
    Recover,
}

/// What a GPU reports about its faults now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultState {
    /// Healthy as the policy judges it.
    pub healthy: bool,
    /// Fallen off the bus.
    pub lost: bool,
    /// ECC counters.
    pub ecc: EccCounters,
}

/// Applies `fault` to one GPU at `now` (Unix seconds) and returns the `(event type, data)`
/// pairs it raises. Pure.
fn apply(gpu: &mut GpuState, fault: Fault, now: i64) -> Vec<(u64, u64)> {
    let gpu_instance = match fault {
        Fault::Xid { gpu_instance, .. } => gpu_instance,
        _ => None,
    };
    let events = match fault {
        Fault::Xid { code, .. } => {
            if code == XID_FALLEN_OFF_BUS {
                gpu.lost = true;
            }
            vec![(health::EVENT_XID_CRITICAL, code)]
        }
        Fault::Ecc { double_bit: false } => {
            gpu.ecc.single_volatile += 1;
            gpu.ecc.single_aggregate += 1;
            vec![(health::EVENT_SINGLE_BIT_ECC, 0)]
        }
        Fault::Ecc { double_bit: true } => {
            gpu.ecc.double_volatile += 1;
            gpu.ecc.double_aggregate += 1;
            gpu.ecc.retired_double += 1;
            vec![
                (health::EVENT_DOUBLE_BIT_ECC, 0),
                (health::EVENT_XID_CRITICAL, XID_DOUBLE_BIT_ECC),
            ]
        }
        Fault::Lost => {
            gpu.lost = true;
            vec![
                (health::EVENT_XID_CRITICAL, XID_FALLEN_OFF_BUS),
                (health::EVENT_GPU_UNAVAILABLE, 0),
            ]
        }
        Fault::Recover => {
            gpu.lost = false;
            gpu.ecc.single_volatile = 0;
            gpu.ecc.double_volatile = 0;
            // A reset also activates a pending MIG mode when no instance holds the GPU.
            if gpu.instances.is_empty() {
                gpu.mig_current = gpu.mig_pending;
            }
            vec![(
                health::EVENT_GPU_RECOVERY_ACTION,
                health::RECOVERY_ACTION_NONE,
            )]
        }
    };
    for &(event_type, data) in &events {
        if let Some(healthy) = health::health_after(event_type, data) {
            gpu.healthy = healthy;
        }
        if health::is_recovery(event_type, data) {
            gpu.faults.clear();
        } else if let Some(kind) = health::FaultKind::from_event(event_type, data) {
            health::record_fault(&mut gpu.faults, kind, gpu_instance, now);
        }
    }
    events
}

impl SimBackend {
    /// Injects `fault` on GPU `index` under the simulator's lock and returns the events it
    /// raised. Fails when the GPU does not exist or the state cannot be read or written.
    pub fn inject(&self, index: u32, fault: Fault) -> Result<Vec<SimEvent>, HardwareError> {
        let i = self.check_index(index)?;
        let now = health::unix_now();
        self.store.with(|s| {
            if let Fault::Xid {
                gpu_instance: Some(gi),
                ..
            } = fault
                && !s.gpus[i].instances.iter().any(|x| x.gi_id == gi)
            {
                return Err(HardwareError::Sim(super::SimError::NodeFile {
                    file: "sim-fault xid".into(),
                    field: "--gpu-instance".into(),
                    detail: format!(
                        "GPU {index} has no GPU instance {gi} (it has {:?})",
                        s.gpus[i]
                            .instances
                            .iter()
                            .map(|x| x.gi_id)
                            .collect::<Vec<_>>()
                    ),
                }));
            }
            let gpu_instance = match fault {
                Fault::Xid { gpu_instance, .. } => gpu_instance,
                _ => None,
            };
            let raised = apply(&mut s.gpus[i], fault, now);
            let mut out = Vec::new();
            for (event_type, data) in raised {
                s.event_seq += 1;
                out.push(SimEvent {
                    seq: s.event_seq,
                    gpu: i as u32,
                    event_type,
                    data,
                    gpu_instance: if event_type == health::EVENT_XID_CRITICAL {
                        gpu_instance
                    } else {
                        None
                    },
                });
            }
            s.events.extend(out.iter().copied());
            let excess = s.events.len().saturating_sub(EVENT_LOG_LIMIT);
            s.events.drain(..excess);
            Ok((out, true))
        })
    }

    /// Events after sequence number `seq`, and the last sequence number (pass it next time).
    pub fn events_after(&self, seq: u64) -> Result<(Vec<SimEvent>, u64), HardwareError> {
        self.store.read(|s| {
            let events = s.events.iter().filter(|e| e.seq > seq).copied().collect();
            Ok((events, s.event_seq))
        })
    }

    /// The fault state of GPU `index`.
    pub fn fault_state(&self, index: u32) -> Result<FaultState, HardwareError> {
        let i = self.check_index(index)?;
        self.store.with(|s| {
            let g = &s.gpus[i];
            Ok((
                FaultState {
                    healthy: g.healthy,
                    lost: g.lost,
                    ecc: g.ecc,
                },
                false,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> GpuState {
        GpuState {
            mig_current: false,
            mig_pending: true,
            healthy: true,
            instances: Vec::new(),
            lost: false,
            ecc: EccCounters::default(),
            removed: false,
            added_model: None,
            faults: Vec::new(),
            persistence_off: false,
            unknown: Default::default(),
        }
    }

    #[test]
    fn a_lost_gpu_is_unhealthy_until_a_reset_recovers_it() {
        let mut g = gpu();
        let events = apply(&mut g, Fault::Lost, 1);
        assert_eq!(
            events,
            [
                (health::EVENT_XID_CRITICAL, 79),
                (health::EVENT_GPU_UNAVAILABLE, 0)
            ]
        );
        assert!(g.lost && !g.healthy);
        let kinds: Vec<_> = g.faults.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [
                health::FaultKind::Xid { code: 79 },
                health::FaultKind::GpuLost
            ]
        );
        apply(&mut g, Fault::Recover, 2);
        assert!(!g.lost && g.healthy);
        assert!(g.faults.is_empty(), "a reset clears the recorded faults");
        assert!(g.mig_current, "the reset activated the pending MIG mode");
    }

    #[test]
    fn ecc_errors_count_and_only_double_bit_ones_make_the_gpu_unhealthy() {
        let mut g = gpu();
        apply(&mut g, Fault::Ecc { double_bit: false }, 1);
        assert!(g.healthy);
        apply(&mut g, Fault::Ecc { double_bit: true }, 1);
        assert!(!g.healthy);
        assert_eq!(
            g.ecc,
            EccCounters {
                single_volatile: 1,
                double_volatile: 1,
                single_aggregate: 1,
                double_aggregate: 1,
                retired_single: 0,
                retired_double: 1,
            }
        );
        apply(&mut g, Fault::Recover, 2);
        assert_eq!((g.ecc.single_volatile, g.ecc.single_aggregate), (0, 1));
    }

    #[test]
    fn application_xids_leave_the_gpu_healthy() {
        let mut g = gpu();
        apply(
            &mut g,
            Fault::Xid {
                code: 13,
                gpu_instance: None,
            },
            1,
        );
        assert!(g.healthy);
        apply(
            &mut g,
            Fault::Xid {
                code: 94,
                gpu_instance: None,
            },
            1,
        );
        assert!(!g.healthy);
    }
}
