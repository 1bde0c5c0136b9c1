//! Gathers [`HostFacts`] for a claim's devices, from the real host or a simulated node.

use std::collections::BTreeMap;

use super::builder::HostFacts;
use super::devnodes::{DevNodeError, control_node_edits, gpu_node_edits};
use super::driver_edits::driver_edits;
use super::driver_files::{DriverFilesError, discover_driver_files};
use super::input::{DriverOptions, GpuDeviceRef, HostLayout};
use super::sim::{SimError, SimulatedHost};
use super::spec::ContainerEdits;

/// Where device nodes and driver files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMode {
    /// Probe the host under the layout's roots.
    Real {
        layout: HostLayout,
        driver: DriverOptions,
    },
    /// Use the nodes a simulated GPU node reports; nothing is probed.
    Simulated(SimulatedHost),
}

/// Host facts could not be gathered.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// A control node exists but is unusable.
    #[error("discovering control device nodes")]
    ControlNodes {
        #[source]
        source: DevNodeError,
    },
    /// A GPU's or MIG device's nodes are missing or unusable.
    #[error("discovering device nodes of {uuid}")]
    DeviceNodes {
        uuid: String,
        #[source]
        source: DevNodeError,
    },
    /// Driver files could not be found.
    #[error("discovering driver files")]
    DriverFiles {
        #[source]
        source: DriverFilesError,
    },
    /// The simulated node does not know a device.
    #[error("reading simulated host")]
    Simulated {
        #[source]
        source: SimError,
    },
}

impl HostMode {
    /// Facts for `gpus`: spec-level edits and each device's own edits.
    ///
    /// # Errors
    /// [`DiscoverError`] naming the device or file that is missing or malformed.
    pub fn facts(&self, gpus: &[GpuDeviceRef]) -> Result<HostFacts, DiscoverError> {
        match self {
            HostMode::Real { layout, driver } => {
                let common = discover_common(layout, driver)?;
                let mut per_device = BTreeMap::new();
                for gpu in gpus {
                    per_device.insert(gpu.uuid().to_string(), discover_device(layout, gpu)?);
                }
                Ok(HostFacts { common, per_device })
            }
            HostMode::Simulated(sim) => sim
                .facts(gpus)
                .map_err(|source| DiscoverError::Simulated { source }),
        }
    }
}

/// Spec-level edits of a real host: control nodes plus driver files and hooks. The result
/// depends only on the host, not on the claim, so callers may reuse it between claims.
///
/// # Errors
/// [`DiscoverError::ControlNodes`] or [`DiscoverError::DriverFiles`].
pub fn discover_common(
    layout: &HostLayout,
    driver: &DriverOptions,
) -> Result<ContainerEdits, DiscoverError> {
    let nodes =
        control_node_edits(layout).map_err(|source| DiscoverError::ControlNodes { source })?;
    let files = discover_driver_files(layout, driver.driver_version.as_deref())
        .map_err(|source| DiscoverError::DriverFiles { source })?;
    let mut edits = driver_edits(&files, layout, driver.cdi_hook_path.as_deref());
    edits.device_nodes = nodes.device_nodes;
    edits.additional_gids = nodes.additional_gids;
    Ok(edits)
}

/// Device-level edits of one GPU or MIG device on a real host.
///
/// # Errors
/// [`DiscoverError::DeviceNodes`] naming the device's UUID and the missing path.
pub fn discover_device(
    layout: &HostLayout,
    gpu: &GpuDeviceRef,
) -> Result<ContainerEdits, DiscoverError> {
    gpu_node_edits(layout, gpu).map_err(|source| DiscoverError::DeviceNodes {
        uuid: gpu.uuid().to_string(),
        source,
    })
}
