//! Simulated node descriptions: the YAML file format and its validation.
//!
//! ```yaml
//! nodeName: dgx-a100            # optional
//! driverVersion: "580.95.05"    # optional
//! cudaDriverVersion: "13.0"     # optional
//! numaNodes: 2                  # optional; GPUs are spread evenly over them
//! gpus:
//!   - model: A100-SXM4-40GB     # see `gpu-dra inventory --list-models`
//!     count: 4
//!     mig: static               # disabled | static | dynamic
//!     migDevices: [1g.5gb, 1g.5gb, 2g.10gb, 3g.20gb@4]   # pre-created; `@start` pins one
//!   - model: A100-SXM4-40GB
//!     count: 4
//!     mig: disabled
//!     fabric:                   # optional: multi-node NVLink (nvmlDeviceGetGpuFabricInfoV)
//!       clusterUuid: c2a0e7d4-1111-2222-3333-444455556666
//!       cliqueId: 1
//!       state: Completed        # NotSupported | NotStarted | InProgress | Completed
//!     vgpu:                     # optional: NVIDIA vGPU on these GPUs (H100, A100, L40S, T4)
//!       framework: vdev         # vdev (SR-IOV) | mdev; default: the model's
//!       heterogeneous: false    # mixed sizes on one GPU (L40S only); default false
//!       vfsEnabled: true        # vdev: VFs enabled (sriov-manage -e has run); default true
//! passthrough:                  # optional: simulate the host's PCI tree for VFIO
//!   iommu: true                 # false: the IOMMU is off
//!   iommufd: false              # true: /dev/iommu and vfio-dev/vfioN exist
//!   sharedGroup: [0]            # these GPUs share their IOMMU group with a NIC
//! nvswitch: true                # optional: an HGX baseboard; GPUs get module IDs 1–8
//! fabricMode: 1                 # optional: Fabric Manager's FABRIC_MODE (0, 1 = shared
//!                               # NVSwitch partitions, 2); 1 needs nvswitch and 8 GPUs
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::SimError;
use crate::hardware::catalog::{self, GpuModel};
use crate::hardware::fabric::{FabricInfo, FabricState};
use crate::hardware::geometry::{self, Occupant};
use crate::hardware::{MigPolicy, MigProfile, Placement};

/// A simulated node file as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// Kubernetes node name the node publishes for; defaults to the preset or file stem.
    #[serde(default)]
    pub node_name: Option<String>,
    /// NVIDIA driver version.
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    /// CUDA driver version.
    #[serde(default = "default_cuda_version")]
    pub cuda_driver_version: String,
    /// NUMA nodes the GPUs are spread over.
    #[serde(default = "default_numa_nodes")]
    pub numa_nodes: u32,
    /// GPU groups in index order.
    pub gpus: Vec<GpuGroupSpec>,
    /// The host's IOMMU and PCI tree for VFIO passthrough; absent: no host tree is
    /// simulated ([`super::sysfs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<super::sysfs::PassthroughSpec>,
    /// The GPUs sit on an NVSwitch baseboard (HGX): each reports a module ID
    /// (`nvmlDeviceGetModuleId`), 1 to 8 in index order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nvswitch: bool,
    /// Fabric Manager's `FABRIC_MODE`: 0 bare metal (default), 1 shared NVSwitch
    /// virtualization (the simulated FM serves partitions), 2 vGPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fabric_mode: u8,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// `count` identical GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuGroupSpec {
    /// Model key or alias.
    pub model: String,
    /// How many GPUs.
    #[serde(default = "default_count")]
    pub count: u32,
    /// MIG policy for these GPUs.
    #[serde(default)]
    pub mig: MigPolicy,
    /// Hardware MIG mode at power-on; defaults to on for `static`/`dynamic`, off otherwise.
    #[serde(default)]
    pub mig_enabled: Option<bool>,
    /// MIG devices that exist at power-on, as profile names with an optional `@start`.
    #[serde(default)]
    pub mig_devices: Vec<String>,
    /// Multi-node NVLink fabric membership these GPUs report; absent for GPUs on no fabric
    /// (NVML answers NOT_SUPPORTED for them, as for a PCIe GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricSpec>,
    /// NVIDIA vGPU on these GPUs' host ([`super::vgpu`]); absent: no vGPU manager, NVML
    /// answers NOT_SUPPORTED to the vGPU calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu: Option<super::vgpu::VgpuSpec>,
}

/// `fabric:` of a GPU group: what `nvmlDeviceGetGpuFabricInfoV` reports for its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FabricSpec {
    /// The fabric's cluster UUID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`); all zeros means
    /// the GPU is in no clique.
    pub cluster_uuid: String,
    /// The clique within the cluster.
    #[serde(default)]
    pub clique_id: u32,
    /// Registration state as NVML names it; default `Completed`.
    #[serde(default = "completed")]
    pub state: FabricState,
}

fn completed() -> FabricState {
    FabricState::Completed
}

impl FabricSpec {
    /// The fabric info the GPUs report; the error names what is wrong with the UUID.
    fn info(&self) -> Result<FabricInfo, String> {
        if !is_uuid(&self.cluster_uuid) {
            return Err(format!(
                "{:?} is not a UUID; write it as xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex digits), or all zeros for no clique",
                self.cluster_uuid
            ));
        }
        Ok(FabricInfo {
            cluster_uuid: self.cluster_uuid.to_ascii_lowercase(),
            clique_id: self.clique_id,
            state: self.state,
        })
    }
}

/// `8-4-4-4-12` hex digits.
fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn default_driver_version() -> String {
    "580.95.05".to_string()
}
fn default_cuda_version() -> String {
    "13.0".to_string()
}
fn default_numa_nodes() -> u32 {
    2
}
fn default_count() -> u32 {
    1
}

/// One GPU of a validated node, ready to power on.
#[derive(Debug, Clone)]
pub struct PlannedGpu {
    /// The model.
    pub model: &'static GpuModel,
    /// MIG policy.
    pub policy: MigPolicy,
    /// Hardware MIG mode at power-on.
    pub mig_enabled: bool,
    /// Pre-created MIG devices: profile id and placement.
    pub mig_devices: Vec<(u32, Placement)>,
    /// Fabric membership, when the GPU is on an NVLink fabric.
    pub fabric: Option<FabricInfo>,
    /// NVML module ID (1–8 on an NVSwitch baseboard), 0 when none.
    pub module_id: u32,
    /// Its vGPU host, when the group has a `vgpu:` section.
    pub vgpu: Option<super::vgpu::PlannedVgpu>,
}

/// A validated node: every GPU resolved against the catalog and every pre-created MIG device
/// placed.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// Node name.
    pub node_name: String,
    /// Driver version.
    pub driver_version: String,
    /// CUDA driver version.
    pub cuda_driver_version: String,
    /// NUMA nodes.
    pub numa_nodes: u32,
    /// GPUs in index order.
    pub gpus: Vec<PlannedGpu>,
    /// The description it was planned from, with the node name filled in: kept in the state
    /// file so tools given only the state directory (`gpu-dra sim-fault`) rebuild the node.
    pub spec: NodeSpec,
}

/// Most GPUs one simulated node may have (NVML enumerates at most 64 per host).
const MAX_GPUS: u32 = 64;

impl NodeSpec {
    /// Parses a node file's text. `source` names the file in errors.
    pub fn parse(source: &str, text: &str) -> Result<NodeSpec, SimError> {
        serde_yaml::from_str(text).map_err(|e| SimError::NodeFile {
            file: source.to_string(),
            field: String::new(),
            detail: e.to_string(),
        })
    }

    /// Reads and parses a node file.
    pub fn load(path: &Path) -> Result<NodeSpec, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::NodeFile {
            file: path.display().to_string(),
            field: String::new(),
            detail: e.to_string(),
        })?;
        NodeSpec::parse(&path.display().to_string(), &text)
    }

    /// Resolves models, checks counts and places pre-created MIG devices.
    ///
    /// Every error names `source`, the field (e.g. `gpus[0].migDevices`) and the valid
    /// choices.
    pub fn plan(&self, source: &str, default_name: &str) -> Result<NodePlan, SimError> {
        let err = |field: String, detail: String| SimError::NodeFile {
            file: source.to_string(),
            field,
            detail,
        };
        if self.gpus.is_empty() {
            return Err(err(
                "gpus".into(),
                "at least one GPU group is required".into(),
            ));
        }
        if self.numa_nodes == 0 {
            return Err(err("numaNodes".into(), "must be at least 1".into()));
        }
        let node_name = self
            .node_name
            .clone()
            .unwrap_or_else(|| default_name.to_string());
        if !is_dns_subdomain(&node_name) {
            return Err(err(
                "nodeName".into(),
                format!(
                    "{node_name:?} is not a valid Kubernetes node name (lowercase letters, digits, '-' and '.', at most 253 characters)"
                ),
            ));
        }
        let mut gpus = Vec::new();
        for (g, group) in self.gpus.iter().enumerate() {
            let model = catalog::model(&group.model)
                .map_err(|e| err(format!("gpus[{g}].model"), e.to_string()))?;
            if group.count == 0 {
                return Err(err(format!("gpus[{g}].count"), "must be at least 1".into()));
            }
            if !model.mig_capable()
                && (group.mig != MigPolicy::Disabled || group.mig_enabled == Some(true))
            {
                return Err(err(
                    format!("gpus[{g}].mig"),
                    format!(
                        "{} does not support MIG; the only valid choice is \"disabled\"",
                        model.key
                    ),
                ));
            }
            let mig_enabled = group
                .mig_enabled
                .unwrap_or(group.mig != MigPolicy::Disabled);
            if !group.mig_devices.is_empty() && (!mig_enabled || group.mig == MigPolicy::Disabled) {
                return Err(err(
                    format!("gpus[{g}].migDevices"),
                    "MIG devices need `mig: static` or `mig: dynamic` with MIG enabled".into(),
                ));
            }
            let mig_devices = place_devices(model, &group.mig_devices)
                .map_err(|detail| err(format!("gpus[{g}].migDevices"), detail))?;
            let fabric = group
                .fabric
                .as_ref()
                .map(FabricSpec::info)
                .transpose()
                .map_err(|detail| err(format!("gpus[{g}].fabric.clusterUuid"), detail))?;
            let vgpu = group
                .vgpu
                .as_ref()
                .map(|v| v.plan(model))
                .transpose()
                .map_err(|(field, detail)| err(format!("gpus[{g}].{field}"), detail))?;
            for _ in 0..group.count {
                gpus.push(PlannedGpu {
                    model,
                    policy: group.mig,
                    mig_enabled,
                    mig_devices: mig_devices.clone(),
                    fabric: fabric.clone(),
                    vgpu: vgpu.clone(),
                    module_id: if self.nvswitch {
                        gpus.len() as u32 + 1
                    } else {
                        0
                    },
                });
            }
        }
        if gpus.len() as u32 > MAX_GPUS {
            return Err(err(
                "gpus".into(),
                format!(
                    "{} GPUs in all; a node holds at most {MAX_GPUS}",
                    gpus.len()
                ),
            ));
        }
        if let Some(bad) = self
            .passthrough
            .iter()
            .flat_map(|p| &p.shared_group)
            .find(|i| **i as usize >= gpus.len())
        {
            return Err(err(
                "passthrough.sharedGroup".into(),
                format!(
                    "GPU {bad} does not exist; valid indices are 0 to {}",
                    gpus.len() - 1
                ),
            ));
        }
        if self.nvswitch && gpus.len() > 8 {
            return Err(err(
                "nvswitch".into(),
                format!(
                    "{} GPUs; an NVSwitch baseboard holds at most 8 (module IDs 1-8)",
                    gpus.len()
                ),
            ));
        }
        match self.fabric_mode {
            0 | 2 => {}
            1 if self.nvswitch && gpus.len() == 8 => {}
            1 => {
                return Err(err(
                    "fabricMode".into(),
                    "1 (shared NVSwitch partitions) needs `nvswitch: true` and 8 GPUs (the HGX 8-GPU partition table)".into(),
                ));
            }
            other => {
                return Err(err(
                    "fabricMode".into(),
                    format!(
                        "{other} is not a FABRIC_MODE; valid choices are 0 (bare metal), 1 (shared NVSwitch), 2 (vGPU)"
                    ),
                ));
            }
        }
        let mut spec = self.clone();
        spec.node_name = Some(node_name.clone());
        Ok(NodePlan {
            spec,
            node_name,
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version.clone(),
            numa_nodes: self.numa_nodes,
            gpus,
        })
    }
}

/// Places `1g.5gb` / `3g.20gb@4` entries on an empty GPU of `model`.
fn place_devices(model: &GpuModel, entries: &[String]) -> Result<Vec<(u32, Placement)>, String> {
    let mut wanted: Vec<(&MigProfile, Option<u32>)> = Vec::new();
    for entry in entries {
        let (name, start) = match entry.split_once('@') {
            Some((name, start)) => {
                let start = start
                    .parse::<u32>()
                    .map_err(|_| format!("{entry:?}: placement start {start:?} is not a number"))?;
                (name, Some(start))
            }
            None => (entry.as_str(), None),
        };
        let profile = model
            .profiles
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                let valid: Vec<&str> = model.profiles.iter().map(|p| p.name.as_str()).collect();
                format!(
                    "unknown MIG profile {name:?} for {}; valid profiles: {}",
                    model.key,
                    valid.join(", ")
                )
            })?;
        if let Some(start) = start
            && !profile.allows_start(start)
        {
            let valid: Vec<String> = profile
                .placement_starts
                .iter()
                .map(u32::to_string)
                .collect();
            return Err(format!(
                "{entry:?}: {name} cannot start at memory slice {start}; valid starts: {}",
                valid.join(", ")
            ));
        }
        wanted.push((profile, start));
    }
    let existing: [Occupant<'_>; 0] = [];
    let placements = geometry::fill_placements(&model.profiles, &existing, &wanted).ok_or_else(|| {
        format!(
            "[{}] do not fit together on one {} (memory slices overlap, an instance limit is exceeded, or two instances want the single media engine)",
            entries.join(", "),
            model.key
        )
    })?;
    Ok(wanted
        .iter()
        .zip(placements)
        .map(|((profile, _), placement)| (profile.id, placement))
        .collect())
}

/// Kubernetes DNS subdomain rule (RFC 1123).
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}
