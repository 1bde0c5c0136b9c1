//! GPUs added to or removed from a running simulated node (`gpu-dra sim-fault add-gpu` /
//! `remove-gpu`). The change lives in the shared state, so every process using the node sees
//! it at its next operation: the sim backend's next inventory, the simulated NVML library's
//! next call (its device count and enumeration change, as NVML's do after a hot-plug and
//! driver reload). GPU indices are enumeration positions, as NVML's: a removal shifts the
//! later GPUs' indices, while every GPU keeps its slot (minor number, UUID, PCI address);
//! slots are never reused.

use super::state::{GpuState, SimState};
use super::{SimBackend, SimError};
use crate::hardware::HardwareError;
use crate::hardware::catalog::{self, GpuModel};

/// Most GPUs one simulated node may have (NVML enumerates at most 64 per host).
const MAX_GPUS: usize = 64;

/// The slot of GPU `index`: GPUs are indexed in enumeration order as NVML does, so after a
/// removal the later GPUs' indices shift while their slots (minor numbers, UUIDs) stay.
/// Slots in `hidden` (GPUs the simulated host moved off `nvidia`) are not enumerated
/// either, as NVML does not enumerate them.
pub(super) fn slot(state: &SimState, index: u32, hidden: &[usize]) -> Result<usize, HardwareError> {
    let listed = |(i, g): &(usize, &super::state::GpuState)| !g.removed && !hidden.contains(i);
    state
        .gpus
        .iter()
        .enumerate()
        .filter(listed)
        .nth(index as usize)
        .map(|(i, _)| i)
        .ok_or_else(|| HardwareError::NoSuchGpu {
            index,
            count: state.gpus.iter().enumerate().filter(listed).count(),
        })
}

/// The model of hot-added slot `i` from its recorded key.
pub(super) fn added_model(key: Option<&str>, i: usize) -> Result<&'static GpuModel, HardwareError> {
    let key = key.ok_or_else(|| {
        HardwareError::Sim(SimError::NodeFile {
            file: super::STATE_FILE.into(),
            field: format!("gpus[{i}]"),
            detail: "a GPU beyond the node description without a model".into(),
        })
    })?;
    catalog::model(key).map_err(|e| {
        HardwareError::Sim(SimError::NodeFile {
            file: super::STATE_FILE.into(),
            field: format!("gpus[{i}].addedModel"),
            detail: e.to_string(),
        })
    })
}

impl SimBackend {
    /// Adds a GPU of `model` (key or alias) in the next free slot, MIG off, and returns its
    /// index (the last one). Fails naming the valid models when `model` is unknown, or when the node
    /// already has the most GPUs a node can hold.
    pub fn add_gpu(&self, model: &str) -> Result<u32, HardwareError> {
        let model = catalog::model(model).map_err(|e| {
            HardwareError::Sim(SimError::NodeFile {
                file: "sim-fault add-gpu".into(),
                field: "--model".into(),
                detail: e.to_string(),
            })
        })?;
        self.store.with(|s| {
            if s.gpus.len() >= MAX_GPUS {
                return Err(HardwareError::Sim(SimError::NodeFile {
                    file: "sim-fault add-gpu".into(),
                    field: "--model".into(),
                    detail: format!("the node has used all {MAX_GPUS} GPU slots"),
                }));
            }
            s.gpus.push(GpuState {
                mig_current: false,
                mig_pending: false,
                healthy: true,
                faults: Vec::new(),
                instances: Vec::new(),
                lost: false,
                ecc: Default::default(),
                removed: false,
                added_model: Some(model.key.clone()),
                persistence_off: false,
                unknown: Default::default(),
            });
            let index = s.gpus.iter().filter(|g| !g.removed).count() - 1;
            Ok((index as u32, true))
        })
    }

    /// Takes GPU `index` off the node, with whatever MIG devices it had. Fails with
    /// [`HardwareError::NoSuchGpu`] when there is no such GPU now.
    pub fn remove_gpu(&self, index: u32) -> Result<(), HardwareError> {
        self.store.with(|s| {
            let i = slot(s, index, &[])?;
            s.gpus[i].removed = true;
            s.gpus[i].instances.clear();
            Ok(((), true))
        })
    }
}
