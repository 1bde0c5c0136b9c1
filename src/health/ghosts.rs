//! Devices of prepared claims whose GPU is gone (fell off the bus and was removed, or taken
//! off the node): they stay published, tainted, until the claim is unprepared, so a pod
//! holding one is never silently left with a device nobody publishes.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceTaint};

use super::policy::{HealthPolicy, HealthState};
use super::verdict::{DeviceVerdict, Verdict, taint};
use crate::devices::{DeviceKind, DeviceModel, PublishedDevice};

/// The taint value of a prepared device whose GPU the backend no longer reports.
pub const GONE_CAUSE: &str = "gpu-gone";

/// A device a prepared (or half-prepared) claim holds, as the checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The device name.
    pub device: String,
    /// The (parent) GPU's UUID.
    pub gpu_uuid: String,
    /// The MIG device's UUID, for MIG devices.
    pub mig_uuid: Option<String>,
}

/// The `gpu-gone` taint of a device kept published for a prepared claim, if it is one.
pub fn gone_taint<'d>(device: &'d Device, policy: &HealthPolicy) -> Option<&'d DeviceTaint> {
    device
        .taints
        .iter()
        .flatten()
        .find(|t| t.key == policy.taint_key && t.value.as_deref() == Some(GONE_CAUSE))
}

/// Adds to `model` (and `verdicts`) every `prepared` device it lacks: the device as
/// `previous` (the model published before) had it, or a minimal one (name and UUID) when it
/// was not there (a restart after the GPU went), without counter consumption (its GPU's
/// counter set is gone too) and tainted `gpu-gone` with the policy's failed effect. The
/// taint keeps the time it was first added in `previous`. Returns the names added.
pub fn keep_prepared(
    model: &mut DeviceModel,
    verdicts: &mut Vec<DeviceVerdict>,
    prepared: &[PreparedDevice],
    previous: &DeviceModel,
    policy: &HealthPolicy,
    now: i64,
) -> Vec<String> {
    let mut added = Vec::new();
    let mut seen: BTreeMap<&str, ()> = BTreeMap::new();
    for p in prepared {
        if model.device(&p.device).is_some() || seen.insert(&p.device, ()).is_some() {
            continue;
        }
        let mut ghost = previous.device(&p.device).cloned().unwrap_or_else(|| {
            let uuid = p.mig_uuid.clone().unwrap_or_else(|| p.gpu_uuid.clone());
            PublishedDevice {
                gpu_index: u32::MAX,
                gpu_minor: u32::MAX,
                gpu_uuid: p.gpu_uuid.clone(),
                kind: DeviceKind::Gpu,
                device: Device {
                    name: p.device.clone(),
                    attributes: Some(
                        [(
                            "uuid".to_string(),
                            DeviceAttribute {
                                string: Some(uuid),
                                ..Default::default()
                            },
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
            }
        });
        let since = gone_taint(&ghost.device, policy)
            .and_then(|t| t.time_added.as_ref())
            .map_or(now, |t| t.0.as_second());
        let verdict = Verdict {
            state: HealthState::Failed,
            cause: Some(GONE_CAUSE.to_string()),
            since,
        };
        ghost.device.consumes_counters = None;
        ghost.device.taints = Some(vec![taint(policy, &verdict, policy.failed_effect)]);
        verdicts.push(DeviceVerdict {
            device: p.device.clone(),
            gpu_uuid: p.gpu_uuid.clone(),
            verdict,
        });
        added.push(p.device.clone());
        model.devices.push(ghost);
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{self, ModelOptions};
    use crate::hardware::sim::SimBackend;
    use crate::hardware::{GpuBackend, MigPolicy};

    #[test]
    fn a_prepared_device_of_a_gone_gpu_stays_published_tainted_with_a_stable_time() {
        let sim = SimBackend::open("dgx-h100", None).unwrap();
        let options = ModelOptions::with_policies("gpu.nvidia.com", &[MigPolicy::Dynamic; 8]);
        let before = devices::build(&sim.inventory().unwrap(), &options);
        sim.remove_gpu(1).unwrap();
        let inventory = sim.inventory().unwrap();
        let policy = HealthPolicy::default();
        let prepared = [
            PreparedDevice {
                device: "gpu-1-mig-1g10gb-0".into(),
                gpu_uuid: before.device("gpu-1").unwrap().gpu_uuid.clone(),
                mig_uuid: Some("MIG-x".into()),
            },
            PreparedDevice {
                device: "gpu-2".into(),
                gpu_uuid: "GPU-2".into(),
                mig_uuid: None,
            },
        ];
        let mut model = devices::build(&inventory, &options);
        let mut verdicts = Vec::new();
        let added = keep_prepared(&mut model, &mut verdicts, &prepared, &before, &policy, 1000);
        assert_eq!(added, ["gpu-1-mig-1g10gb-0"], "gpu-2 is still there");
        let ghost = model.device("gpu-1-mig-1g10gb-0").unwrap();
        assert!(ghost.device.consumes_counters.is_none());
        let t = &ghost.device.taints.as_ref().unwrap()[0];
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            (policy.taint_key.as_str(), Some(GONE_CAUSE), "NoExecute")
        );
        assert_eq!(verdicts[0].verdict.state, HealthState::Failed);
        // The next round keeps the taint's time.
        let previous = model.clone();
        let mut next = devices::build(&inventory, &options);
        keep_prepared(
            &mut next,
            &mut Vec::new(),
            &prepared,
            &previous,
            &policy,
            2000,
        );
        assert_eq!(next, previous, "nothing changes while nothing happens");
        // After a restart nothing was published before: a minimal device with its UUID.
        let mut fresh = devices::build(&inventory, &options);
        keep_prepared(
            &mut fresh,
            &mut Vec::new(),
            &prepared,
            &DeviceModel::default(),
            &policy,
            3000,
        );
        let ghost = fresh.device("gpu-1-mig-1g10gb-0").unwrap();
        assert_eq!(
            ghost.device.attributes.as_ref().unwrap()["uuid"]
                .string
                .as_deref(),
            Some("MIG-x")
        );
    }
}
