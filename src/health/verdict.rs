//! Verdicts: faults → a state with its cause per GPU, MIG instance and published device.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::policy::{HealthPolicy, HealthState, TaintEffect};
use crate::devices::{DeviceKind, DeviceModel};
use crate::hardware::health::GpuFault;
use crate::hardware::{GpuInfo, NodeInventory};

/// The health of one GPU, MIG instance or device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    /// Its state.
    pub state: HealthState,
    /// What caused it (`xid-79`, `ecc-double-bit`, `gpu-lost`, `gpu-gone`); `None` when
    /// healthy.
    pub cause: Option<String>,
    /// When the cause was first seen, Unix seconds (0 when healthy).
    pub since: i64,
}

impl Verdict {
    /// Keeps the worse of `self` and `other`: the higher state, or for equal states the
    /// earlier cause (so a verdict does not flip between two standing faults).
    fn worsen(&mut self, other: &Verdict) {
        if other.state > self.state || (other.state == self.state && other.since < self.since) {
            *self = other.clone();
        }
    }

    /// `failed: xid-79`, or `healthy`: the message of the kubelet's health stream and of a
    /// claim's device status.
    pub fn describe(&self) -> String {
        match &self.cause {
            Some(cause) => format!("{}: {cause}", self.state.as_str()),
            None => self.state.as_str().to_string(),
        }
    }
}

/// The verdicts on one GPU: on the whole GPU, and on each GPU instance a fault was
/// attributed to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuVerdicts {
    /// The whole GPU (and so every device on it).
    pub gpu: Verdict,
    /// Per GPU instance id: that MIG device only.
    pub instances: BTreeMap<u32, Verdict>,
}

/// Judges one GPU's `faults` at `now` (Unix seconds). A degraded fault last seen
/// `hold_down_seconds` or longer ago no longer counts.
pub fn judge_gpu(policy: &HealthPolicy, faults: &[GpuFault], now: i64) -> GpuVerdicts {
    let mut out = GpuVerdicts::default();
    let hold = i64::try_from(policy.hold_down_seconds).unwrap_or(i64::MAX);
    for f in faults {
        let state = policy.state_of(f.kind);
        if state == HealthState::Healthy
            || (state == HealthState::Degraded && now.saturating_sub(f.last_seen) >= hold)
        {
            continue;
        }
        let v = Verdict {
            state,
            cause: Some(f.kind.cause()),
            since: f.first_seen,
        };
        match f.gpu_instance {
            Some(gi) => out
                .instances
                .entry(gi)
                .or_insert_with(|| v.clone())
                .worsen(&v),
            None => out.gpu.worsen(&v),
        }
    }
    out
}

/// The verdict on one published device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceVerdict {
    /// The device name.
    pub device: String,
    /// Its (parent) GPU's UUID.
    pub gpu_uuid: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// Judges every device of `model` (built from `inventory`), in model order: a device is as
/// healthy as its GPU, and a MIG device (static, or a dynamic placement carved now) also as
/// its GPU instance.
pub fn judge(
    policy: &HealthPolicy,
    inventory: &NodeInventory,
    model: &DeviceModel,
    now: i64,
) -> Vec<DeviceVerdict> {
    let per_gpu: BTreeMap<u32, (&GpuInfo, GpuVerdicts)> = inventory
        .gpus
        .iter()
        .map(|g| (g.index, (g, judge_gpu(policy, &g.faults, now))))
        .collect();
    model
        .devices
        .iter()
        .map(|d| {
            let mut verdict = Verdict::default();
            if let Some((gpu, v)) = per_gpu.get(&d.gpu_index) {
                verdict = v.gpu.clone();
                let gi = match &d.kind {
                    DeviceKind::Gpu | DeviceKind::Vfio { .. } | DeviceKind::Vgpu { .. } => None,
                    DeviceKind::MigStatic { gi_id, .. } => Some(*gi_id),
                    DeviceKind::MigDynamic {
                        profile_id,
                        placement,
                        ..
                    } => gpu
                        .mig_devices
                        .iter()
                        .find(|m| {
                            m.profile_id == *profile_id && m.placement.start == placement.start
                        })
                        .map(|m| m.gi_id),
                };
                if let Some(iv) = gi.and_then(|gi| v.instances.get(&gi)) {
                    verdict.worsen(iv);
                }
            }
            DeviceVerdict {
                device: d.name().to_string(),
                gpu_uuid: d.gpu_uuid.clone(),
                verdict,
            }
        })
        .collect()
}

/// The taint of an unhealthy device: `<key>=<cause>:<effect>`, added when the cause was
/// first seen.
pub fn taint(policy: &HealthPolicy, verdict: &Verdict, effect: TaintEffect) -> DeviceTaint {
    DeviceTaint {
        key: policy.taint_key.clone(),
        value: verdict.cause.clone(),
        effect: effect.as_str().to_string(),
        time_added: k8s_openapi::jiff::Timestamp::from_second(verdict.since)
            .ok()
            .map(Time),
    }
}

/// Sets each device's taints from its verdict (`verdicts` as [`judge`] returns them for this
/// model): the policy's taint on a degraded or failed device, none on a healthy one.
pub fn apply_taints(model: &mut DeviceModel, verdicts: &[DeviceVerdict], policy: &HealthPolicy) {
    let by_name: BTreeMap<&str, &Verdict> = verdicts
        .iter()
        .map(|v| (v.device.as_str(), &v.verdict))
        .collect();
    for d in &mut model.devices {
        let Some(v) = by_name.get(d.device.name.as_str()) else {
            continue;
        };
        d.device.taints = policy
            .effect_of(v.state)
            .map(|effect| vec![taint(policy, v, effect)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::health::{FaultKind, record_fault};

    fn faults(list: &[(FaultKind, Option<u32>, i64)]) -> Vec<GpuFault> {
        let mut out = Vec::new();
        for &(kind, gi, at) in list {
            record_fault(&mut out, kind, gi, at);
        }
        out
    }

    #[test]
    fn the_worst_fault_wins_and_the_earliest_names_it() {
        let p = HealthPolicy::default();
        let f = faults(&[
            (FaultKind::Xid { code: 62 }, None, 100),
            (FaultKind::Xid { code: 94 }, None, 110),
            (FaultKind::Xid { code: 79 }, None, 120),
            (FaultKind::Xid { code: 13 }, None, 130),
        ]);
        let v = judge_gpu(&p, &f, 130);
        assert_eq!(v.gpu.state, HealthState::Failed);
        assert_eq!(v.gpu.cause.as_deref(), Some("xid-94"));
        assert_eq!(v.gpu.since, 110);
        assert_eq!(v.gpu.describe(), "failed: xid-94");
    }

    #[test]
    fn a_degraded_gpu_recovers_after_the_hold_down_but_a_failed_one_does_not() {
        let p = HealthPolicy {
            hold_down_seconds: 60,
            ..HealthPolicy::default()
        };
        let degraded = faults(&[(FaultKind::Xid { code: 62 }, None, 100)]);
        assert_eq!(
            judge_gpu(&p, &degraded, 159).gpu.state,
            HealthState::Degraded
        );
        assert_eq!(judge_gpu(&p, &degraded, 160).gpu, Verdict::default());
        let mut again = degraded.clone();
        record_fault(&mut again, FaultKind::Xid { code: 62 }, None, 150);
        let v = judge_gpu(&p, &again, 200).gpu;
        assert_eq!(
            (v.state, v.since),
            (HealthState::Degraded, 100),
            "a repeat extends the hold-down, the taint keeps its time"
        );
        let failed = faults(&[(FaultKind::EccDoubleBit, None, 100)]);
        assert_eq!(
            judge_gpu(&p, &failed, 1_000_000).gpu.state,
            HealthState::Failed
        );
    }

    #[test]
    fn a_mig_scoped_fault_judges_only_its_instance() {
        let p = HealthPolicy::default();
        let v = judge_gpu(
            &p,
            &faults(&[(FaultKind::Xid { code: 94 }, Some(3), 5)]),
            10,
        );
        assert_eq!(v.gpu, Verdict::default());
        assert_eq!(v.instances[&3].cause.as_deref(), Some("xid-94"));
    }
}
