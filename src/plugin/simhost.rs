//! Device nodes of a simulated GPU node, for its CDI specs.
//!
//! A kind cluster without GPUs still gets complete specs: each GPU is `/dev/nvidia<minor>`
//! (character major 195, as the driver registers it); a MIG device adds the parent's node and
//! the `nvidia-caps` nodes of its GPU and compute instances, numbered by a fixed scheme
//! (major 237, minor `3 + 128·gpu + 8·gi` for the GI, `+ 1 + ci` for the CI). Nodes carry
//! type and numbers, so the runtime creates them in the container without a host node.

use std::collections::BTreeMap;

use crate::cdi::{GpuDeviceRef, HostFacts, SimulatedHost};
use crate::claims::HostFactsSource;

/// Character major of `nvidia-caps` on the simulated node.
pub const SIM_CAPS_MAJOR: u32 = 237;
/// Character major of `nvidia-uvm` on the simulated node.
pub const SIM_UVM_MAJOR: u32 = 510;

/// Character major of the VFIO group nodes (`/dev/vfio/<group>`) on the simulated node.
pub const SIM_VFIO_MAJOR: u32 = 511;
/// Character major of the VFIO device cdevs (`/dev/vfio/devices/vfio<N>`) on the simulated node.
pub const SIM_VFIO_DEV_MAJOR: u32 = 509;
/// The misc major of `/dev/vfio/vfio` (minor 196, fixed by the kernel) and `/dev/iommu`.
pub const MISC_MAJOR: u32 = 10;

/// CDI facts for simulated GPUs: nothing is probed.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimHostFacts;

/// The nodes of one simulated device.
pub fn device_nodes(gpu: &GpuDeviceRef) -> Vec<crate::cdi::DeviceNode> {
    let parent = |minor: u32| {
        SimulatedHost::char_node(
            &format!("/dev/nvidia{minor}"),
            crate::cdi::NVIDIA_MAJOR,
            minor,
        )
    };
    match gpu {
        GpuDeviceRef::Full { minor, .. } => vec![parent(*minor)],
        GpuDeviceRef::Mig {
            parent_minor,
            gi,
            ci,
            ..
        } => {
            let gi_cap = 3 + 128 * parent_minor + 8 * gi;
            let ci_cap = gi_cap + 1 + ci;
            vec![
                parent(*parent_minor),
                SimulatedHost::char_node(
                    &format!("/dev/nvidia-caps/nvidia-cap{gi_cap}"),
                    SIM_CAPS_MAJOR,
                    gi_cap,
                ),
                SimulatedHost::char_node(
                    &format!("/dev/nvidia-caps/nvidia-cap{ci_cap}"),
                    SIM_CAPS_MAJOR,
                    ci_cap,
                ),
            ]
        }
    }
}

impl HostFactsSource for SimHostFacts {
    fn facts(&self, gpus: &[GpuDeviceRef]) -> Result<HostFacts, String> {
        let host = SimulatedHost {
            common_nodes: SimulatedHost::standard_control_nodes(SIM_UVM_MAJOR),
            device_nodes: gpus
                .iter()
                .map(|g| (g.uuid().to_string(), device_nodes(g)))
                .collect::<BTreeMap<_, _>>(),
        };
        host.facts(gpus).map_err(|e| e.to_string())
    }

    /// A simulated VFIO node carries its type and numbers, so the runtime creates it in the
    /// container without a host node: groups `511:<group − 1>`, device cdevs `509:<N>`,
    /// `/dev/vfio/vfio` `10:196`, `/dev/iommu` `10:123`.
    fn vfio_node(
        &self,
        path: &str,
        _host_root: &std::path::Path,
    ) -> Result<crate::cdi::DeviceNode, String> {
        let last = path.rsplit('/').next().unwrap_or_default();
        let (major, minor) = match path {
            "/dev/vfio/vfio" => (MISC_MAJOR, 196),
            "/dev/iommu" => (MISC_MAJOR, 123),
            _ if path.starts_with("/dev/vfio/devices/") => (
                SIM_VFIO_DEV_MAJOR,
                last.trim_start_matches("vfio")
                    .parse()
                    .map_err(|_| format!("{path}: not a VFIO device cdev"))?,
            ),
            _ => {
                let group: u32 = last
                    .parse()
                    .map_err(|_| format!("{path}: not a VFIO group node"))?;
                (SIM_VFIO_MAJOR, group.saturating_sub(1))
            }
        };
        Ok(SimulatedHost::char_node(path, major, minor))
    }
}
