//! What one prepared claim holds, as the usage counter labels and weighs it.

use std::collections::{BTreeMap, HashMap};

use super::{Holding, Labels};
use crate::quantity::Quantity;

/// What the published device says about itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceFacts {
    /// MIG profile, or `gpu` for a full GPU.
    pub profile: String,
    /// Its `memory` capacity, in bytes.
    pub memory: Option<f64>,
    /// Its `multiprocessors` capacity.
    pub multiprocessors: Option<f64>,
}

/// One device of a prepared claim.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeldDevice {
    /// The request (`req` or `req/subrequest`).
    pub request: String,
    pub device: String,
    /// Set for a consumable-capacity share.
    pub share_id: Option<String>,
    /// Capacity the share consumes (name → quantity).
    pub consumed: BTreeMap<String, String>,
    /// The opaque sharing strategy set up for it (`mps`, `time-slicing`), if any.
    pub strategy: Option<String>,
}

/// The label of a sharing strategy recorded with a device (`{"strategy": "MPS", …}`).
pub fn strategy_label(sharing: Option<&serde_json::Value>) -> Option<String> {
    let strategy = sharing?.get("strategy")?.as_str()?;
    Some(match strategy {
        "MPS" => "mps".to_string(),
        "TimeSlicing" => "time-slicing".to_string(),
        other => other.to_ascii_lowercase(),
    })
}

fn amount(consumed: &BTreeMap<String, String>, name: &str) -> Option<f64> {
    let text = consumed
        .iter()
        .find(|(k, _)| *k == name || k.rsplit('/').next() == Some(name))?
        .1;
    text.parse::<Quantity>().ok().map(|q| q.as_f64())
}

/// A share's part of its device: consumed memory over the device's memory, else consumed
/// multiprocessors over its multiprocessors; a whole device when neither is known.
fn share_weight(device: &HeldDevice, facts: Option<&DeviceFacts>) -> f64 {
    let ratio = |name: &str, total: Option<f64>| {
        let total = total.filter(|t| *t > 0.0)?;
        Some(amount(&device.consumed, name)? / total)
    };
    let facts = facts.cloned().unwrap_or_default();
    ratio("memory", facts.memory)
        .or_else(|| ratio("multiprocessors", facts.multiprocessors))
        .unwrap_or(1.0)
        .clamp(0.0, 1.0)
}

/// The holdings of a claim in `namespace`: one per device, labelled with the class of its
/// request (`classes`: request → DeviceClass; "" when unknown), its profile (from `facts`,
/// by device name; `unknown` when the device is no longer published) and its sharing mode,
/// weighted by the share's part of the device for consumable capacity.
pub fn holdings(
    namespace: &str,
    classes: &BTreeMap<String, String>,
    devices: &[HeldDevice],
    facts: &HashMap<String, DeviceFacts>,
) -> Vec<Holding> {
    devices
        .iter()
        .map(|device| {
            let known = facts.get(&device.device);
            let (sharing, weight) = match (&device.share_id, &device.strategy) {
                (Some(_), _) => ("capacity-share".to_string(), share_weight(device, known)),
                (None, Some(strategy)) => (strategy.clone(), 1.0),
                (None, None) => ("exclusive".to_string(), 1.0),
            };
            Holding {
                labels: Labels {
                    namespace: namespace.to_string(),
                    class: classes.get(&device.request).cloned().unwrap_or_default(),
                    profile: known.map_or_else(|| "unknown".to_string(), |f| f.profile.clone()),
                    sharing,
                },
                weight,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_share_weighs_its_part_of_the_device_and_an_exclusive_device_weighs_one() {
        let facts = HashMap::from([(
            "gpu-0".to_string(),
            DeviceFacts {
                profile: "gpu".into(),
                memory: Some(80.0 * 1024.0 * 1024.0 * 1024.0),
                multiprocessors: Some(132.0),
            },
        )]);
        let classes = BTreeMap::from([("gpu".to_string(), "gpu.nvidia.com".to_string())]);
        let share = HeldDevice {
            request: "gpu".into(),
            device: "gpu-0".into(),
            share_id: Some("s".into()),
            consumed: BTreeMap::from([("memory".to_string(), "20Gi".to_string())]),
            strategy: Some("mps".into()),
        };
        let whole = HeldDevice {
            request: "other".into(),
            device: "gpu-9".into(),
            strategy: strategy_label(Some(&serde_json::json!({"strategy": "TimeSlicing"}))),
            ..Default::default()
        };
        let got: Vec<(String, String, String, String, f64)> =
            holdings("team", &classes, &[share, whole], &facts)
                .into_iter()
                .map(|h| {
                    (
                        h.labels.namespace,
                        h.labels.class,
                        h.labels.profile,
                        h.labels.sharing,
                        h.weight,
                    )
                })
                .collect();
        assert_eq!(
            got,
            [
                (
                    "team".into(),
                    "gpu.nvidia.com".into(),
                    "gpu".into(),
                    "capacity-share".into(),
                    0.25
                ),
                (
                    "team".into(),
                    "".into(),
                    "unknown".into(),
                    "time-slicing".into(),
                    1.0
                ),
            ]
        );
    }
}
