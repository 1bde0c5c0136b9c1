//! The simulated GPU node: a [`GpuBackend`] that behaves like the hardware.
//!
//! Node shapes come from node files or built-in [`presets`]; MIG geometry comes from the
//! embedded reference table ([`crate::hardware::catalog`]). GPU-instance creation enforces the
//! driver's rules and fails with the same NVML codes (INVALID_ARGUMENT for a placement the
//! profile does not allow, INSUFFICIENT_RESOURCES for an occupied one, NOT_SUPPORTED with MIG
//! mode off); MIG mode follows the architecture (Ampere needs a reset, Hopper and later toggle
//! when idle). With a state directory, the state survives restarts and is shared by every
//! process that opens it.

pub mod faults;
mod hotplug;
pub mod ids;
pub mod node_file;
mod power_on;
pub mod presets;
mod state;
pub mod sysfs;
pub mod telemetry;
pub mod vgpu;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use node_file::{NodePlan, NodeSpec};
use power_on::{StaticGpu, fingerprint, gi_id_for, gpu_info, initial_state, occupants, static_gpu};
pub use state::STATE_FILE;
use state::{InstanceState, Store};
pub use watch::StateWatch;

use super::geometry;
use super::{
    GpuBackend, HardwareError, MigDevice, MigModeChange, MigPolicy, NodeInventory, NvmlCode,
    Placement,
};

/// Errors of the simulated backend.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// `--sim-node` names neither a preset nor a readable file.
    #[error("--sim-node {value:?} is neither a preset nor a file; presets: {presets}")]
    UnknownNode {
        /// What was given.
        value: String,
        /// Valid preset names.
        presets: String,
    },
    /// A node file is malformed or describes an impossible node.
    #[error("{file}: {}{detail}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
    NodeFile {
        /// File (or preset) name.
        file: String,
        /// Field path, e.g. `gpus[0].migDevices`; empty when the whole file is at fault.
        field: String,
        /// What is wrong and the valid choices.
        detail: String,
    },
    /// The state file could not be read or written.
    #[error("simulated GPU state {step} failed for {}", path.display())]
    StateIo {
        /// Path involved.
        path: PathBuf,
        /// Step that failed.
        step: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing the state file failed.
    #[error("writing simulated GPU state failed")]
    StateWrite(#[source] crate::fsutil::FsError),
    /// The state file exists but cannot be trusted.
    #[error("simulated GPU state {} is unreadable: {detail}; move it away to start the node afresh", path.display())]
    StateCorrupt {
        /// Path of the state file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// Where a simulated node description comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSource {
    /// A built-in preset.
    Preset(&'static presets::Preset),
    /// A node file.
    File(PathBuf),
}

impl NodeSource {
    /// Resolves `--sim-node`: a preset name, else a path to a node file.
    pub fn resolve(value: &str) -> Result<NodeSource, SimError> {
        if let Some(p) = presets::preset(value) {
            return Ok(NodeSource::Preset(p));
        }
        let path = Path::new(value);
        if path.is_file() {
            return Ok(NodeSource::File(path.to_path_buf()));
        }
        Err(SimError::UnknownNode {
            value: value.to_string(),
            presets: presets::preset_names(),
        })
    }

    /// Parses and validates the description.
    pub fn plan(&self) -> Result<NodePlan, SimError> {
        match self {
            NodeSource::Preset(p) => {
                let source = format!("preset {}", p.name);
                NodeSpec::parse(&source, p.yaml)?.plan(&source, p.name)
            }
            NodeSource::File(path) => {
                let stem = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .map(|s| s.to_ascii_lowercase().replace('_', "-"))
                    .unwrap_or_else(|| "sim-node".to_string());
                NodeSpec::load(path)?.plan(&path.display().to_string(), &stem)
            }
        }
    }
}

/// A simulated GPU node.
pub struct SimBackend {
    plan: NodePlan,
    statics: Vec<StaticGpu>,
    store: Store,
    /// XID counts for telemetry (`telemetry.rs`).
    xids: telemetry::XidTally,
    /// The simulated host tree (`sysfs.rs`), when the node simulates one and has a state
    /// directory.
    host_root: Option<PathBuf>,
    /// The state directory's watch (`watch.rs`), started by the first
    /// [`GpuBackend::health_signal`] call.
    state_changes: std::sync::OnceLock<Option<std::sync::Arc<tokio::sync::Notify>>>,
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend")
            .field("node", &self.plan.node_name)
            .field("gpus", &self.plan.gpus.len())
            .finish()
    }
}

impl SimBackend {
    /// Powers on a simulated node from `--sim-node` (preset or file). With `state_dir`, the
    /// hardware state is read from and written to `<state_dir>/sim-gpu-state.json`;
    /// otherwise it lives in memory.
    pub fn open(sim_node: &str, state_dir: Option<&Path>) -> Result<SimBackend, SimError> {
        let plan = NodeSource::resolve(sim_node)?.plan()?;
        SimBackend::from_plan(plan, state_dir).with_host_tree()
    }

    /// Builds the simulated host tree (once per state directory) when the node describes
    /// one and has a state directory.
    fn with_host_tree(self) -> Result<SimBackend, SimError> {
        let Some(root) = &self.host_root else {
            return Ok(self);
        };
        // A vGPU node without `passthrough:` still has its IOMMU on: its VFs and mdevs go
        // to VMs through their groups.
        let spec = self
            .plan
            .spec
            .passthrough
            .clone()
            .unwrap_or(sysfs::PassthroughSpec {
                iommu: true,
                iommufd: false,
                shared_group: Vec::new(),
            });
        let gpus: Vec<sysfs::BusGpu<'_>> = self
            .statics
            .iter()
            .zip(&self.plan.gpus)
            .map(|(st, planned)| sysfs::BusGpu {
                address: &st.pci_bus_id,
                pcie_root: &st.pcie_root,
                device_id: format!(
                    "0x{}",
                    planned
                        .model
                        .pci_device_id
                        .trim_start_matches("0x")
                        .get(..4)
                        .unwrap_or("0000")
                        .to_ascii_lowercase()
                ),
                numa: st.numa_node,
                vgpu: planned.vgpu.as_ref(),
            })
            .collect();
        sysfs::build(root, &spec, &gpus)?;
        Ok(self)
    }

    /// The simulated host tree (`--host-root` with the sim backend), if the node has one.
    pub fn host_root(&self) -> Option<&Path> {
        self.host_root.as_deref()
    }

    /// Slots whose GPU the simulated host has moved off `nvidia` (to `vfio-pci`, or no
    /// driver): NVML does not list them. Empty without a host tree. Cheap (one `readlink`
    /// per GPU): the simulated NVML library keys its inventory cache on it, since a driver
    /// switch changes what NVML lists without touching the state file.
    pub fn hidden_slots(&self) -> Vec<usize> {
        let Some(root) = &self.host_root else {
            return Vec::new();
        };
        (0..self.plan.gpus.len())
            .filter(|&i| {
                let address = self.identity(i).pci_bus_id;
                sysfs::driver_of(root, &address).as_deref()
                    != Some(crate::hardware::passthrough::NVIDIA_DRIVER)
            })
            .collect()
    }

    /// The GPUs on the node's NVSwitch baseboard as its Fabric Manager knows them: module ID,
    /// UUID and PCI bus ID of every planned GPU with a module, whatever driver the host has
    /// bound it to (FM keeps a GPU moved to `vfio-pci`, which NVML no longer lists), by module.
    pub fn baseboard_gpus(&self) -> Vec<(u32, String, String)> {
        let mut gpus: Vec<(u32, String, String)> = (0..self.plan.gpus.len())
            .map(|i| self.identity(i))
            .filter(|g| g.module_id > 0)
            .map(|g| (g.module_id, g.uuid, g.pci_bus_id))
            .collect();
        gpus.sort();
        gpus
    }

    /// The vGPUs of the host tree, as bytes that change whenever one is created or deleted
    /// (the simulated kernel's record of them); empty on a node without vGPU or without a
    /// host tree. One small read: the simulated NVML library keys its inventory cache on it,
    /// since a vGPU changes what NVML reports as creatable without touching the state file.
    pub fn vgpu_fingerprint(&self) -> Vec<u8> {
        match &self.host_root {
            Some(root) if self.plan.gpus.iter().any(|g| g.vgpu.is_some()) => {
                vgpu::fingerprint(root)
            }
            _ => Vec::new(),
        }
    }

    /// Opens the node whose state is in `state_dir` (the description is stored with the
    /// state), as the processes sharing it see it. Fails when there is no state there yet
    /// (start the plugin or `gpu-dra inventory --state-dir` first) or it is unreadable.
    pub fn open_state_dir(state_dir: &Path) -> Result<SimBackend, SimError> {
        let Some((spec, _)) = state::stored(state_dir)? else {
            return Err(SimError::StateIo {
                path: state_dir.join(STATE_FILE),
                step: "open (no simulated node has run with this state directory yet)",
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        };
        let name = spec.node_name.clone().unwrap_or_else(|| "sim-node".into());
        let plan = spec.plan("state file", &name)?;
        SimBackend::from_plan(plan, Some(state_dir)).with_host_tree()
    }

    /// Powers on a validated node plan.
    pub fn from_plan(plan: NodePlan, state_dir: Option<&Path>) -> SimBackend {
        let count = plan.gpus.len() as u32;
        let statics: Vec<StaticGpu> = (0..count).map(|i| static_gpu(&plan, i)).collect();
        let initial = initial_state(&plan, &statics);
        let store = match state_dir {
            Some(dir) => Store::File {
                dir: dir.to_path_buf(),
                fingerprint: fingerprint(&plan),
                node: plan.spec.clone(),
                initial,
                seen: Mutex::new(None),
            },
            None => Store::Memory(Mutex::new(initial)),
        };
        let has_vgpu = plan.gpus.iter().any(|g| g.vgpu.is_some());
        let host_root = match state_dir {
            Some(dir) if plan.spec.passthrough.is_some() || has_vgpu => Some(sysfs::host_root(dir)),
            _ => None,
        };
        SimBackend {
            plan,
            statics,
            store,
            xids: Default::default(),
            host_root,
            state_changes: std::sync::OnceLock::new(),
        }
    }

    /// The node name the description gives.
    pub fn node_name(&self) -> &str {
        &self.plan.node_name
    }

    /// The validated node description.
    pub fn plan(&self) -> &NodePlan {
        &self.plan
    }

    /// MIG policy of each GPU, by index.
    pub fn mig_policies(&self) -> Vec<MigPolicy> {
        self.plan.gpus.iter().map(|g| g.policy).collect()
    }

    /// The slot of GPU `index` if it is on the node now (hot-plugged GPUs included).
    fn check_index(&self, index: u32) -> Result<usize, HardwareError> {
        let hidden = self.hidden_slots();
        self.store
            .with(|s| Ok((hotplug::slot(s, index, &hidden)?, false)))
    }

    /// The model of the GPU in slot `i`: the node description's, or a hot-added one's.
    fn model_of(&self, i: usize) -> Result<&'static super::catalog::GpuModel, HardwareError> {
        if let Some(gpu) = self.plan.gpus.get(i) {
            return Ok(gpu.model);
        }
        let key = self
            .store
            .with(|s| Ok((s.gpus.get(i).and_then(|g| g.added_model.clone()), false)))?;
        hotplug::added_model(key.as_deref(), i)
    }

    /// Fixed identity of the GPU in slot `i`.
    fn identity(&self, i: usize) -> StaticGpu {
        self.statics
            .get(i)
            .cloned()
            .unwrap_or_else(|| static_gpu(&self.plan, i as u32))
    }

    /// Resets GPU `index` (`nvidia-smi -r`): a pending MIG mode takes effect. Fails with
    /// IN_USE while GPU instances exist.
    pub fn reset_gpu(&self, index: u32) -> Result<(), HardwareError> {
        let i = self.check_index(index)?;
        self.store.with(|s| {
            let gpu = &mut s.gpus[i];
            if !gpu.instances.is_empty() {
                return Err(nvml_err("reset GPU", index, NvmlCode::InUse));
            }
            let changed = gpu.mig_current != gpu.mig_pending;
            gpu.mig_current = gpu.mig_pending;
            Ok(((), changed))
        })
    }

    /// Marks GPU `index` unhealthy with a critical XID (94, a contained ECC error: the GPU
    /// stays on the bus) or healthy again with a reset, as `sim-fault xid` / `recover` do.
    pub fn set_healthy(&self, index: u32, healthy: bool) -> Result<(), HardwareError> {
        let fault = if healthy {
            faults::Fault::Recover
        } else {
            faults::Fault::Xid {
                code: 94,
                gpu_instance: None,
            }
        };
        self.inject(index, fault).map(drop)
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`: creates a GPU instance of profile
    /// `profile_id` (driver id) at `start` and returns its GI id.
    pub fn create_gpu_instance(
        &self,
        index: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<u32, HardwareError> {
        let i = self.check_index(index)?;
        let model = self.model_of(i)?;
        let op = |code| {
            nvml_err(
                &format!("create GPU instance (profile id {profile_id}) at {start}"),
                index,
                code,
            )
        };
        self.store.with(|s| {
            let gpu = &mut s.gpus[i];
            if !model.mig_capable() || !gpu.mig_current {
                return Err(op(NvmlCode::NotSupported));
            }
            let Some(profile) = model.profiles.iter().find(|p| p.id == profile_id) else {
                return Err(op(NvmlCode::InvalidArgument));
            };
            let existing = occupants(model, &gpu.instances);
            geometry::check_placement(&model.profiles, &existing, profile, start).map_err(|c| {
                op(match c {
                    geometry::PlacementConflict::InvalidStart { .. } => NvmlCode::InvalidArgument,
                    _ => NvmlCode::InsufficientResources,
                })
            })?;
            let placement = Placement {
                start,
                size: profile.memory_slices,
            };
            let gi_id = gi_id_for(model.memory_slices, placement, &gpu.instances);
            gpu.instances.push(InstanceState {
                gi_id,
                profile_id,
                start,
                size: profile.memory_slices,
                compute_instances: Vec::new(),
            });
            Ok((gi_id, true))
        })
    }

    /// `nvmlGpuInstanceCreateComputeInstance` with the default (whole-GI) profile: returns
    /// the CI id and the new MIG device's UUID.
    pub fn create_compute_instance(
        &self,
        index: u32,
        gi_id: u32,
    ) -> Result<(u32, String), HardwareError> {
        let i = self.check_index(index)?;
        let gpu_uuid = self.identity(i).uuid;
        let op = |code| {
            nvml_err(
                &format!("create compute instance in GI {gi_id}"),
                index,
                code,
            )
        };
        self.store.with(|s| {
            s.serial += 1;
            let serial = s.serial;
            let gi = s.gpus[i]
                .instances
                .iter_mut()
                .find(|g| g.gi_id == gi_id)
                .ok_or_else(|| op(NvmlCode::NotFound))?;
            if !gi.compute_instances.is_empty() {
                return Err(op(NvmlCode::InsufficientResources));
            }
            let uuid = ids::mig_uuid(&gpu_uuid, gi_id, 0, serial);
            gi.compute_instances.push((0, uuid.clone()));
            Ok(((0, uuid), true))
        })
    }

    /// `nvmlComputeInstanceDestroy`.
    pub fn destroy_compute_instance(
        &self,
        index: u32,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), HardwareError> {
        let i = self.check_index(index)?;
        let op = |code| {
            nvml_err(
                &format!("destroy compute instance {ci_id} of GI {gi_id}"),
                index,
                code,
            )
        };
        self.store.with(|s| {
            let gi = s.gpus[i]
                .instances
                .iter_mut()
                .find(|g| g.gi_id == gi_id)
                .ok_or_else(|| op(NvmlCode::NotFound))?;
            let before = gi.compute_instances.len();
            gi.compute_instances.retain(|(ci, _)| *ci != ci_id);
            if gi.compute_instances.len() == before {
                return Err(op(NvmlCode::NotFound));
            }
            Ok(((), true))
        })
    }

    /// `nvmlGpuInstanceDestroy`: fails with IN_USE while compute instances exist.
    pub fn destroy_gpu_instance(&self, index: u32, gi_id: u32) -> Result<(), HardwareError> {
        let i = self.check_index(index)?;
        let op = |code| nvml_err(&format!("destroy GPU instance {gi_id}"), index, code);
        self.store.with(|s| {
            let gpu = &mut s.gpus[i];
            let pos = gpu
                .instances
                .iter()
                .position(|g| g.gi_id == gi_id)
                .ok_or_else(|| op(NvmlCode::NotFound))?;
            if !gpu.instances[pos].compute_instances.is_empty() {
                return Err(op(NvmlCode::InUse));
            }
            gpu.instances.remove(pos);
            Ok(((), true))
        })
    }
}

fn nvml_err(operation: &str, index: u32, code: NvmlCode) -> HardwareError {
    HardwareError::Nvml {
        operation: operation.to_string(),
        index,
        code,
    }
}

impl GpuBackend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    /// The state file's version: the inventory is built from the state file and the node
    /// description alone, unless the node has a host tree (whose drivers and vGPUs it reads
    /// too: no stamp then). In memory: no stamp.
    fn inventory_stamp(&self) -> Option<crate::hardware::InventoryStamp> {
        if self.host_root.is_some() {
            return None;
        }
        self.store
            .stamp()
            .map(|stamp| crate::hardware::InventoryStamp(stamp.words()))
    }

    /// The event sequence number and the GPU slots in use (another process — `sim-fault` —
    /// may change either); 0 when the state cannot be read (the next inventory says why).
    fn health_generation(&self) -> u64 {
        self.store
            .read(|s| {
                let removed = s.gpus.iter().filter(|g| g.removed).count() as u64;
                let slots = s.gpus.len() as u64;
                Ok(s.event_seq
                    .wrapping_mul(1 << 16)
                    .wrapping_add(slots << 8)
                    .wrapping_add(removed))
            })
            .unwrap_or(0)
    }

    /// With a state directory: notified whenever the state file is replaced (by this
    /// process or another, e.g. `gpu-dra sim-fault`), from an inotify watch started on the
    /// first call. In memory: `None` (only this process changes it; the plugin polls).
    fn health_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        self.state_changes
            .get_or_init(|| self.store.dir().and_then(watch::state_changes))
            .clone()
    }

    fn inventory(&self) -> Result<NodeInventory, HardwareError> {
        let hidden = self.hidden_slots();
        let has_vgpu = self.plan.gpus.iter().any(|g| g.vgpu.is_some());
        let active = match &self.host_root {
            Some(root) if has_vgpu => vgpu::active_by_gpu(root),
            _ => Default::default(),
        };
        // Built from the cached state in place, not from a copy of it: the claim lifecycle
        // reads the inventory once per wave.
        self.store.read(|state| {
            let mut gpus = Vec::new();
            for (i, gs) in state.gpus.iter().enumerate() {
                if gs.removed || hidden.contains(&i) {
                    continue;
                }
                let model = match self.plan.gpus.get(i) {
                    Some(planned) => planned.model,
                    None => hotplug::added_model(gs.added_model.as_deref(), i)?,
                };
                let index = gpus.len() as u32;
                let identity = self.identity(i);
                let mut info = gpu_info(index, i as u32, model, &identity, gs);
                if let Some(planned) = self.plan.gpus.get(i).and_then(|g| g.vgpu.as_ref()) {
                    let running = active
                        .get(&identity.pci_bus_id)
                        .map_or(&[][..], Vec::as_slice);
                    info.vgpu = Some(planned.info(running));
                }
                gpus.push(info);
            }
            Ok(NodeInventory {
                driver_version: self.plan.driver_version.clone(),
                cuda_driver_version: self.plan.cuda_driver_version.clone(),
                gpus,
                passthrough: None,
                vgpu_host: None,
            })
        })
    }

    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<MigModeChange, HardwareError> {
        let i = self.check_index(index)?;
        let model = self.model_of(i)?;
        let op = |code| {
            nvml_err(
                &format!("set MIG mode {}", if enabled { "on" } else { "off" }),
                index,
                code,
            )
        };
        self.store.with(|s| {
            let gpu = &mut s.gpus[i];
            if !model.mig_capable() {
                return Err(op(NvmlCode::NotSupported));
            }
            if gpu.mig_current == enabled && gpu.mig_pending == enabled {
                return Ok((MigModeChange::Unchanged, false));
            }
            if !gpu.instances.is_empty() {
                return Err(op(NvmlCode::InUse));
            }
            gpu.mig_pending = enabled;
            if model.architecture.mig_toggle_needs_reset() {
                Ok((MigModeChange::PendingReset, true))
            } else {
                gpu.mig_current = enabled;
                Ok((MigModeChange::Applied, true))
            }
        })
    }

    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, HardwareError> {
        let gi_id = self.create_gpu_instance(index, profile_id, placement_start)?;
        crate::crashpoint::hit("prepare-gpu-instance-created");
        let (ci_id, uuid) = match self.create_compute_instance(index, gi_id) {
            Ok(ci) => ci,
            Err(e) => {
                // Leave nothing behind: the GI without its CI is useless to anyone.
                let _ = self.destroy_gpu_instance(index, gi_id);
                return Err(e);
            }
        };
        let model = self.model_of(self.check_index(index)?)?;
        let profile = model.profiles.iter().find(|p| p.id == profile_id);
        Ok(MigDevice {
            uuid,
            profile_id,
            profile_name: profile.map(|p| p.name.clone()).unwrap_or_default(),
            gi_id,
            ci_id,
            placement: Placement {
                start: placement_start,
                size: profile.map(|p| p.memory_slices).unwrap_or(1),
            },
        })
    }

    fn destroy_mig_device(&self, index: u32, gi_id: u32, ci_id: u32) -> Result<(), HardwareError> {
        match self.destroy_compute_instance(index, gi_id, ci_id) {
            // A partial earlier cleanup may already have removed the CI.
            Ok(())
            | Err(HardwareError::Nvml {
                code: NvmlCode::NotFound,
                ..
            }) => {}
            Err(e) => return Err(e),
        }
        self.destroy_gpu_instance(index, gi_id)
    }

    fn telemetry(&self) -> Result<super::telemetry::NodeTelemetry, HardwareError> {
        self.sim_telemetry()
    }

    fn persistence_mode(&self, index: u32) -> Result<bool, HardwareError> {
        let i = self.check_index(index)?;
        self.store.read(|s| Ok(!s.gpus[i].persistence_off))
    }

    fn set_persistence_mode(&self, index: u32, enabled: bool) -> Result<(), HardwareError> {
        let i = self.check_index(index)?;
        self.store.with(|s| {
            let changed = s.gpus[i].persistence_off == enabled;
            s.gpus[i].persistence_off = !enabled;
            Ok(((), changed))
        })
    }
}
