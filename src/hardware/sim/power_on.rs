//! Powering a simulated node on: the fixed identity of each GPU, the hardware state of a
//! fresh node (pre-created MIG devices with the driver's GI ids), the fingerprint that ties a
//! state file to its node description, and the `GpuInfo` the backend reports.

use super::state::{GpuState, InstanceState, SimState};
use super::{NodePlan, ids};
use crate::hardware::geometry::Occupant;
use crate::hardware::{GpuInfo, MigDevice, MigModeState, Placement};

/// Fixed facts of one simulated GPU.
#[derive(Debug, Clone)]
pub(super) struct StaticGpu {
    pub(super) uuid: String,
    pub(super) pci_bus_id: String,
    pub(super) pcie_root: String,
    pub(super) numa_node: i64,
    pub(super) fabric: Option<crate::hardware::fabric::FabricInfo>,
    pub(super) module_id: u32,
}

/// The fixed identity of GPU slot `i` (slots past the description's GPUs are hot-added ones,
/// placed on the last NUMA node, on no fabric).
pub(super) fn static_gpu(plan: &NodePlan, i: u32) -> StaticGpu {
    let count = (plan.gpus.len() as u32).max(i + 1);
    let (pci_bus_id, pcie_root) = ids::pci_address(i);
    StaticGpu {
        uuid: ids::gpu_uuid(&plan.node_name, i),
        pci_bus_id,
        pcie_root,
        numa_node: ids::numa_node(i, count, plan.numa_nodes),
        fabric: plan.gpus.get(i as usize).and_then(|g| g.fabric.clone()),
        module_id: plan.gpus.get(i as usize).map_or(0, |g| g.module_id),
    }
}

/// GI ids as the driver hands them out on the observed hardware: the node of the memory-slice
/// tree the placement covers (8-wide: 0, 4-wide: 1–2, 2-wide: 3–6, 1-wide: 7–14 on an 8-slice
/// GPU; e.g. seven 1g instances get 7 + start, as seen on H100). Falls back to the lowest
/// free id for a placement that is not a tree node.
pub(super) fn gi_id_for(
    memory_slices: u32,
    placement: Placement,
    existing: &[InstanceState],
) -> u32 {
    let size = placement.size.max(1);
    if memory_slices.is_multiple_of(size)
        && size.is_power_of_two()
        && placement.start.is_multiple_of(size)
    {
        let id = (memory_slices / size - 1) + placement.start / size;
        if !existing.iter().any(|g| g.gi_id == id) {
            return id;
        }
    }
    (0..)
        .find(|id| !existing.iter().any(|g| g.gi_id == *id))
        .unwrap_or(0)
}

pub(super) fn occupants<'a>(
    model: &'a crate::hardware::catalog::GpuModel,
    instances: &[InstanceState],
) -> Vec<Occupant<'a>> {
    instances
        .iter()
        .filter_map(|g| {
            let profile = model.profiles.iter().find(|p| p.id == g.profile_id)?;
            Some(Occupant {
                profile,
                placement: Placement {
                    start: g.start,
                    size: g.size,
                },
            })
        })
        .collect()
}

pub(super) fn initial_state(plan: &NodePlan, statics: &[StaticGpu]) -> SimState {
    let mut serial = 0u64;
    let gpus = plan
        .gpus
        .iter()
        .zip(statics)
        .map(|(gpu, st)| {
            let mut instances: Vec<InstanceState> = Vec::new();
            for &(profile_id, placement) in &gpu.mig_devices {
                serial += 1;
                let gi_id = gi_id_for(gpu.model.memory_slices, placement, &instances);
                instances.push(InstanceState {
                    gi_id,
                    profile_id,
                    start: placement.start,
                    size: placement.size,
                    compute_instances: vec![(0, ids::mig_uuid(&st.uuid, gi_id, 0, serial))],
                });
            }
            GpuState {
                mig_current: gpu.mig_enabled,
                mig_pending: gpu.mig_enabled,
                healthy: true,
                faults: Vec::new(),
                instances,
                lost: false,
                ecc: Default::default(),
                removed: false,
                added_model: None,
                persistence_off: false,
                unknown: Default::default(),
            }
        })
        .collect();
    SimState {
        serial,
        gpus,
        event_seq: 0,
        events: Vec::new(),
        loads: Default::default(),
        unknown: Default::default(),
    }
}

/// Identifies a node description, so a state file written for another node shape is not
/// applied to this one.
pub(super) fn fingerprint(plan: &NodePlan) -> String {
    let mut text = format!(
        "{}|{}|{}",
        plan.node_name, plan.driver_version, plan.cuda_driver_version
    );
    for g in &plan.gpus {
        text.push_str(&format!(
            "|{}:{}:{}:{:?}",
            g.model.key,
            g.policy.as_str(),
            g.mig_enabled,
            g.mig_devices
        ));
    }
    ids::gpu_uuid(&text, 0)
}

pub(super) fn gpu_info(
    index: u32,
    slot: u32,
    model: &'static crate::hardware::catalog::GpuModel,
    st: &StaticGpu,
    gs: &GpuState,
) -> GpuInfo {
    let mut mig_devices = Vec::new();
    let mut empty_gpu_instances = Vec::new();
    for gi in &gs.instances {
        let profile = model.profiles.iter().find(|p| p.id == gi.profile_id);
        let placement = Placement {
            start: gi.start,
            size: gi.size,
        };
        let profile_name = profile.map(|p| p.name.clone()).unwrap_or_default();
        if gi.compute_instances.is_empty() {
            empty_gpu_instances.push(crate::hardware::GpuInstanceRef {
                gi_id: gi.gi_id,
                profile_id: gi.profile_id,
                placement,
            });
        }
        for (ci_id, uuid) in &gi.compute_instances {
            mig_devices.push(MigDevice {
                uuid: uuid.clone(),
                profile_id: gi.profile_id,
                profile_name: profile_name.clone(),
                gi_id: gi.gi_id,
                ci_id: *ci_id,
                placement,
            });
        }
    }
    mig_devices.sort_by_key(|d| (d.placement.start, d.gi_id));
    GpuInfo {
        index,
        minor: slot,
        uuid: st.uuid.clone(),
        product_name: model.product_name.clone(),
        brand: model.brand.clone(),
        architecture: model.architecture,
        compute_capability: model.compute_capability,
        memory_mib: model.memory_mib,
        multiprocessors: model.multiprocessors,
        pci_bus_id: st.pci_bus_id.clone(),
        pcie_root: st.pcie_root.clone(),
        numa_node: Some(st.numa_node),
        mig: MigModeState {
            capable: model.mig_capable(),
            current: gs.mig_current,
            pending: gs.mig_pending,
        },
        memory_slices: model.memory_slices,
        mig_profiles: model.profiles.clone(),
        mig_devices,
        empty_gpu_instances,
        healthy: gs.healthy,
        faults: gs.faults.clone(),
        fabric: st.fabric.clone(),
        module_id: st.module_id,
        vgpu: None,
    }
}
