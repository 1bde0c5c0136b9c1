//! The GPU side of the facts, behind [`GpuProbe`]: the backend's inventory, the sharing
//! tools and `nvidia-smi`'s answer. [`NodeGpus`] is the real one over the plugin's backend
//! settings; tests substitute their own.
//!
//! The doctor names the backend with its own [`GpuSource`] rather than the plugin's
//! `BackendChoice`: the plugin runs the doctor's quick checks at start
//! (`plugin/start_checks.rs`), so the doctor must not import the plugin back.

use std::path::{Path, PathBuf};

use super::host::ToolsFacts;
use crate::errors::error_chain;
use crate::hardware::nvml::NvmlBackend;
use crate::hardware::sim::{STATE_FILE, SimBackend};
use crate::hardware::{GpuBackend, NodeInventory};
use crate::sharing::Tools;
use crate::sharing::simtools::query::{NODE_ENV, STATE_DIR_ENV};

/// Which GPUs the doctor opens: `--gpu-backend` with its `--nvml-lib` or `--sim-node`, as
/// the plugin would open them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    /// GPUs through NVML; `lib`: the library to load instead of `libnvidia-ml.so.1`.
    Nvml {
        /// `--nvml-lib`.
        lib: Option<PathBuf>,
    },
    /// A simulated node (preset or node file).
    Sim {
        /// `--sim-node`.
        sim_node: String,
    },
}

/// Where the GPU facts come from.
pub trait GpuProbe {
    /// The backend as the report names it, e.g. `nvml (libnvidia-ml.so.1)`.
    fn describe(&self) -> String;
    /// Whether the node is simulated: CDI specs name simulated device nodes and need no
    /// driver files.
    fn simulated(&self) -> bool;
    /// The simulated node's name, the default node name of a simulated node.
    fn sim_node_name(&self) -> Option<String>;
    /// The backend's inventory, or the error chain of opening or reading it.
    fn inventory(&self) -> Result<NodeInventory, String>;
    /// Where the sharing tools are.
    fn tools(&self) -> ToolsFacts;
    /// `nvidia-smi <args>`'s output, or why it could not be run.
    fn nvidia_smi(&self, args: &[&str]) -> Result<String, String>;
}

/// The GPUs as `kubelet-plugin` with the same settings would see them.
#[derive(Debug, Clone)]
pub struct NodeGpus {
    /// `--gpu-backend` and its `--sim-node` / `--nvml-lib`.
    pub backend: GpuSource,
    /// Whether the node is simulated (sim backend, or `--simulated-host` over the simulated
    /// NVML library): simulated device nodes and tools.
    pub simulated: bool,
    /// `--driver-root`.
    pub driver_root: PathBuf,
    /// The simulated hardware's state directory (`<state dir>/sim`).
    pub sim_state: PathBuf,
}

impl NodeGpus {
    /// The simulated tools need the `gpu-dra` binary; a simulated node with another driver
    /// root uses that root's tools, as the plugin does.
    fn simulated_tools(&self) -> bool {
        self.simulated && self.driver_root == Path::new("/")
    }

    /// The state directory, when a simulated node has run with it: the plugin's hardware
    /// state (MIG devices, pending modes) is read, never created.
    fn existing_sim_state(&self) -> Option<&Path> {
        self.sim_state
            .join(STATE_FILE)
            .exists()
            .then_some(self.sim_state.as_path())
    }
}

impl GpuProbe for NodeGpus {
    fn describe(&self) -> String {
        match &self.backend {
            GpuSource::Sim { sim_node } => format!("sim ({sim_node})"),
            GpuSource::Nvml { lib: Some(lib) } => format!("nvml ({})", lib.display()),
            GpuSource::Nvml { lib: None } => "nvml (libnvidia-ml.so.1)".into(),
        }
    }

    fn simulated(&self) -> bool {
        self.simulated
    }

    fn sim_node_name(&self) -> Option<String> {
        match &self.backend {
            GpuSource::Sim { sim_node } => crate::hardware::sim::NodeSource::resolve(sim_node)
                .and_then(|s| s.plan())
                .ok()
                .map(|p| p.node_name),
            GpuSource::Nvml { .. } => None,
        }
    }

    fn inventory(&self) -> Result<NodeInventory, String> {
        match &self.backend {
            GpuSource::Sim { sim_node } => {
                let sim = SimBackend::open(sim_node, self.existing_sim_state())
                    .map_err(|e| error_chain(&e))?;
                sim.inventory().map_err(|e| error_chain(&e))
            }
            GpuSource::Nvml { lib } => {
                let nvml = NvmlBackend::open_with(lib.as_deref()).map_err(|e| error_chain(&e))?;
                nvml.inventory().map_err(|e| error_chain(&e))
            }
        }
    }

    fn tools(&self) -> ToolsFacts {
        if self.simulated_tools() {
            return ToolsFacts::Simulated;
        }
        match Tools::from_driver_root(&self.driver_root) {
            Ok(t) => ToolsFacts::Found {
                nvidia_smi: t.nvidia_smi,
                mps_control: t.mps_control,
            },
            Err(e) => ToolsFacts::Missing(error_chain(&e)),
        }
    }

    fn nvidia_smi(&self, args: &[&str]) -> Result<String, String> {
        if !self.simulated_tools() {
            let tools = Tools::from_driver_root(&self.driver_root).map_err(|e| error_chain(&e))?;
            return tools.query_smi(args).map_err(|e| error_chain(&e));
        }
        // The simulated nvidia-smi is this binary under that name, linked in a directory of
        // its own (the plugin's tool directory is left alone), reading the node the backend
        // reads.
        let dir = tempfile_dir()?;
        let exe =
            std::env::current_exe().map_err(|e| format!("finding the gpu-dra binary: {e}"))?;
        let mut tools = Tools::simulated(&exe, dir.path()).map_err(|e| error_chain(&e))?;
        if let GpuSource::Sim { sim_node } = &self.backend {
            tools.env.push((NODE_ENV.into(), sim_node.clone()));
            let state = self
                .existing_sim_state()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            tools.env.push((STATE_DIR_ENV.into(), state));
        }
        tools.query_smi(args).map_err(|e| error_chain(&e))
    }
}

/// A directory removed on drop, under `$TMPDIR`.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir() -> Result<TempDir, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("gpu-dra-doctor-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(TempDir(dir))
}
