//! GPU health into Kubernetes, pure: the configurable [`HealthPolicy`] judges the faults the
//! backends observed (`GpuInfo::faults`) and turns them into a verdict per published device,
//! a `resource.k8s.io/v1` device taint on each unhealthy device, and devices kept published
//! (tainted) for prepared claims whose GPU is gone.
//!
//! * A GPU's verdict applies to all its devices (the full GPU, its MIG devices and dynamic
//!   placements); a fault NVML attributes to a GPU instance applies to that MIG device only.
//! * The worst state wins; between faults of one state the earliest names the cause, so a
//!   taint's value and `timeAdded` stay the same while nothing new happens and the publisher
//!   writes nothing at steady state.
//! * Degraded verdicts end by themselves `holdDown` after the last degrading fault; failed
//!   ones only with a recovery (the backend clears the faults on a GPU reset) or a restart
//!   that finds the GPU healthy.

mod ghosts;
mod policy;
mod verdict;

pub use ghosts::{GONE_CAUSE, PreparedDevice, gone_taint, keep_prepared};
pub use policy::{
    DEFAULT_FAILED_XIDS, DEFAULT_HOLD_DOWN_SECONDS, DEFAULT_IGNORED_XIDS, DEFAULT_TAINT_KEY,
    HealthPolicy, HealthState, PolicyError, TaintEffect,
};
pub use verdict::{DeviceVerdict, GpuVerdicts, Verdict, apply_taints, judge, judge_gpu, taint};
