//! Host facts of a simulated GPU node: device nodes are given, nothing is probed.
//!
//! A simulated node (kind, CI) has no `/dev/nvidia*`. Nodes given here should carry `type`
//! and `major` (see [`SimulatedHost::char_node`]): the runtime then creates them in the
//! container without looking for them on the host, so pods start and can read which GPUs
//! they were given from the env.

use std::collections::BTreeMap;

use super::builder::HostFacts;
use super::input::GpuDeviceRef;
use super::spec::{ContainerEdits, DeviceNode};

/// Major number of the NVIDIA GPU and control character devices.
pub const NVIDIA_MAJOR: u32 = 195;

/// The simulated node does not match what the claim asks for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A device's UUID has no entry (not even an empty one) in the simulated node.
    #[error("simulated node has no device nodes registered for {uuid}; known UUIDs: {known}")]
    UnknownDevice { uuid: String, known: String },
}

/// Device nodes a simulated GPU node reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimulatedHost {
    /// Spec-level nodes shared by every device (e.g. `/dev/nvidiactl`).
    pub common_nodes: Vec<DeviceNode>,
    /// Nodes of each GPU or MIG device, keyed by UUID. Every device of a claim must have an
    /// entry, so a mistyped UUID is an error rather than a device without nodes.
    pub device_nodes: BTreeMap<String, Vec<DeviceNode>>,
}

impl SimulatedHost {
    /// A fully specified character node (`type` c, major, minor, mode 0666) that runtimes
    /// create without a host node.
    pub fn char_node(path: &str, major: u32, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.to_string(),
            kind: Some("c".to_string()),
            major: Some(i64::from(major)),
            minor: Some(i64::from(minor)),
            file_mode: Some(0o666),
            ..DeviceNode::default()
        }
    }

    /// The control nodes a real node would have: `nvidiactl` (195:255) and
    /// `nvidia-uvm`/`nvidia-uvm-tools` (given major, minors 0 and 1).
    pub fn standard_control_nodes(uvm_major: u32) -> Vec<DeviceNode> {
        vec![
            Self::char_node("/dev/nvidiactl", NVIDIA_MAJOR, 255),
            Self::char_node("/dev/nvidia-uvm", uvm_major, 0),
            Self::char_node("/dev/nvidia-uvm-tools", uvm_major, 1),
        ]
    }

    /// Facts for `gpus`: the given nodes. As on a real node, which devices a container got
    /// is in its per-device `DRA_GPU_UUID_*` env (`NVIDIA_VISIBLE_DEVICES` is `void`).
    ///
    /// # Errors
    /// [`SimError::UnknownDevice`] for a UUID without an entry in `device_nodes`.
    pub fn facts(&self, gpus: &[GpuDeviceRef]) -> Result<HostFacts, SimError> {
        let mut per_device = BTreeMap::new();
        for gpu in gpus {
            let nodes =
                self.device_nodes
                    .get(gpu.uuid())
                    .ok_or_else(|| SimError::UnknownDevice {
                        uuid: gpu.uuid().to_string(),
                        known: self
                            .device_nodes
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", "),
                    })?;
            let edits = ContainerEdits {
                device_nodes: nodes.clone(),
                ..ContainerEdits::default()
            };
            per_device.insert(gpu.uuid().to_string(), edits);
        }
        Ok(HostFacts {
            common: ContainerEdits {
                device_nodes: self.common_nodes.clone(),
                ..ContainerEdits::default()
            },
            per_device,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_uuid_is_an_error_listing_the_known_ones() {
        let sim = SimulatedHost {
            common_nodes: vec![],
            device_nodes: BTreeMap::from([("GPU-a".to_string(), vec![])]),
        };
        let gpu = GpuDeviceRef::Full {
            minor: 1,
            uuid: "GPU-b".into(),
        };
        let want = SimError::UnknownDevice {
            uuid: "GPU-b".into(),
            known: "GPU-a".into(),
        };
        assert_eq!(sim.facts(&[gpu]), Err(want));
    }
}
