//! The simulated node behind the library: opened by `nvmlInit*` from `GPU_DRA_SIM_NODE` and
//! `GPU_DRA_SIM_STATE_DIR`, released by the matching `nvmlShutdown`, and re-read on every
//! call so other processes' changes (the plugin, `sim-fault`, `nvidia-smi`) are seen.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::{GpuBackend, GpuInfo, MigDevice, NodeInventory};

use crate::ffi::{self, Ret};
use crate::handles::Handle;

/// Environment variable naming the node: a preset or a node file.
pub const NODE_ENV: &str = "GPU_DRA_SIM_NODE";
/// Environment variable naming the state directory shared with the simulator.
pub const STATE_DIR_ENV: &str = "GPU_DRA_SIM_STATE_DIR";

/// An initialised library.
pub struct Node {
    /// The simulated node.
    pub backend: SimBackend,
    /// State directory, when shared.
    pub state_dir: Option<PathBuf>,
    /// The last inventory read, with the state file's bytes then. The file is replaced by
    /// an atomic rename on every change, so reading it without the lock sees one whole
    /// version; identical bytes mean an identical state, and an NVML caller's hundreds of
    /// queries parse it once.
    cache: Mutex<Option<(Vec<u8>, Arc<NodeInventory>)>>,
}

impl Node {
    /// The state file's bytes, the GPUs the simulated host has moved off `nvidia` (a
    /// driver switch changes what NVML lists without touching the state file), and the
    /// host's vGPUs (creating one changes what NVML reports as creatable, likewise).
    fn state_file_bytes(&self) -> Option<Vec<u8>> {
        let dir = self.state_dir.as_ref()?;
        let mut bytes = std::fs::read(dir.join(gpu_dra::hardware::sim::STATE_FILE)).ok()?;
        for slot in self.backend.hidden_slots() {
            bytes.extend_from_slice(format!("\nhidden {slot}").as_bytes());
        }
        let vgpus = self.backend.vgpu_fingerprint();
        if !vgpus.is_empty() {
            bytes.extend_from_slice(b"\nvgpu ");
            bytes.extend_from_slice(&vgpus);
        }
        Some(bytes)
    }

    /// The node's hardware now.
    fn inventory(&self) -> Result<Arc<NodeInventory>, Ret> {
        let before = self.state_file_bytes();
        if let Some(bytes) = &before {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((cached, inv)) = cache.as_ref()
                && cached == bytes
            {
                return Ok(inv.clone());
            }
        }
        let inv = Arc::new(self.backend.inventory().map_err(|e| ffi::code_of(&e))?);
        // Cached only when the file did not change around the read, so the inventory is
        // the one those bytes describe.
        if let Some(bytes) = before
            && self.state_file_bytes().as_ref() == Some(&bytes)
        {
            *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = Some((bytes, inv.clone()));
        }
        Ok(inv)
    }
}

struct Loaded {
    node: Arc<Node>,
    refs: u32,
}

static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

fn loaded() -> std::sync::MutexGuard<'static, Option<Loaded>> {
    LOADED.lock().unwrap_or_else(|p| p.into_inner())
}

/// `nvmlInit`: opens the node on the first call, counts the others.
pub fn init() -> Result<(), Ret> {
    let mut guard = loaded();
    if let Some(l) = guard.as_mut() {
        l.refs += 1;
        return Ok(());
    }
    let Some(name) = std::env::var_os(NODE_ENV) else {
        eprintln!("simulated NVML: {NODE_ENV} is not set (a preset name or a node file)");
        return Err(nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED);
    };
    let state_dir = std::env::var_os(STATE_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let backend = SimBackend::open(&name.to_string_lossy(), state_dir.as_deref()).map_err(|e| {
        eprintln!("simulated NVML: {NODE_ENV}: {e}");
        nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED
    })?;
    *guard = Some(Loaded {
        node: Arc::new(Node {
            backend,
            state_dir,
            cache: Mutex::new(None),
        }),
        refs: 1,
    });
    Ok(())
}

/// `nvmlShutdown`: the last one closes the node.
pub fn shutdown() -> Result<(), Ret> {
    let mut guard = loaded();
    let Some(l) = guard.as_mut() else {
        return Err(ffi::UNINITIALIZED);
    };
    l.refs -= 1;
    if l.refs == 0 {
        *guard = None;
    }
    Ok(())
}

/// The open node, or `NVML_ERROR_UNINITIALIZED`.
pub fn current() -> Result<Arc<Node>, Ret> {
    loaded()
        .as_ref()
        .map(|l| l.node.clone())
        .ok_or(ffi::UNINITIALIZED)
}

/// One consistent reading of the node for one call.
pub struct View {
    /// The node.
    pub node: Arc<Node>,
    /// Its hardware now.
    pub inv: Arc<NodeInventory>,
}

/// A device handle resolved against the current hardware.
pub enum Dev<'a> {
    /// A physical GPU.
    Gpu(&'a GpuInfo),
    /// A MIG device and its parent.
    Mig(&'a GpuInfo, &'a MigDevice),
}

impl<'a> Dev<'a> {
    /// The physical GPU (the parent of a MIG device).
    pub fn gpu(&self) -> &'a GpuInfo {
        match self {
            Dev::Gpu(g) | Dev::Mig(g, _) => g,
        }
    }

    /// The physical GPU, or `NVML_ERROR_NOT_SUPPORTED` for a MIG device (calls NVML does not
    /// answer for MIG handles).
    pub fn full(&self) -> Result<&'a GpuInfo, Ret> {
        match self {
            Dev::Gpu(g) => Ok(g),
            Dev::Mig(..) => Err(ffi::NOT_SUPPORTED),
        }
    }
}

/// Reads the node now.
pub fn view() -> Result<View, Ret> {
    let node = current()?;
    let inv = node.inventory()?;
    Ok(View { node, inv })
}

impl View {
    /// The GPU in slot `slot` (what handles carry: a GPU keeps it when another is removed),
    /// or `NVML_ERROR_INVALID_ARGUMENT`.
    pub fn gpu(&self, slot: u32) -> Result<&GpuInfo, Ret> {
        self.inv
            .gpus
            .iter()
            .find(|g| g.minor == slot)
            .ok_or(ffi::INVALID_ARGUMENT)
    }

    /// The GPU NVML enumerates at `index` now (removed GPUs are skipped).
    pub fn enumerated(&self, index: u32) -> Result<&GpuInfo, Ret> {
        self.inv
            .gpus
            .get(index as usize)
            .ok_or(ffi::INVALID_ARGUMENT)
    }

    /// Resolves a device handle; `NVML_ERROR_INVALID_ARGUMENT` for anything that is not a
    /// live GPU or MIG device.
    pub fn device<T>(&self, ptr: *mut T) -> Result<Dev<'_>, Ret> {
        match Handle::from_ptr(ptr) {
            Some(Handle::Gpu(i)) => Ok(Dev::Gpu(self.gpu(i)?)),
            Some(Handle::Mig { gpu, gi, ci }) => {
                let g = self.gpu(gpu)?;
                let m = g
                    .mig_devices
                    .iter()
                    .find(|m| m.gi_id == gi && m.ci_id == ci)
                    .ok_or(ffi::INVALID_ARGUMENT)?;
                Ok(Dev::Mig(g, m))
            }
            _ => Err(ffi::INVALID_ARGUMENT),
        }
    }

    /// Resolves a physical-GPU handle.
    pub fn full_gpu<T>(&self, ptr: *mut T) -> Result<&GpuInfo, Ret> {
        self.device(ptr)?.full()
    }
}
