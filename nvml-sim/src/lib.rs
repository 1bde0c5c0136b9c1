//! A simulated `libnvidia-ml.so.1`: NVML's C ABI over gpu-dra's simulated GPU node.
//!
//! Load it where NVML would be loaded (`gpu-dra … --gpu-backend nvml --nvml-lib
//! target/debug/libgpu_dra_nvml_sim.so`, or nvml-wrapper's `Nvml::builder().lib_path(..)`),
//! and the production NVML backend runs unchanged against a simulated node: device queries,
//! the MIG lifecycle with the real MIG tables and rules, event sets and telemetry.
//!
//! * The node comes from `GPU_DRA_SIM_NODE` (a preset name or a node file) and its state from
//!   `GPU_DRA_SIM_STATE_DIR` (the simulator's state file, under its lock), so the sim backend,
//!   the simulated `nvidia-smi` and this library see one truth. Without a state dir the state
//!   lives in this process only.
//! * Every exported function has NVML's exact signature, checked at compile time against
//!   nvml-wrapper-sys's bindings (`signatures.rs`). Functions not simulated return
//!   `NVML_ERROR_NOT_SUPPORTED` (`stubs.rs`); none panics across the C boundary.
//! * Handles are tagged integers this library decodes and validates on every call
//!   ([`handles`]); nothing is allocated for them, so none can dangle. A handle to something
//!   that no longer exists gets `NVML_ERROR_INVALID_ARGUMENT`.

#![allow(non_snake_case)]

pub mod calls;
pub mod handles;

mod compute_instances;
mod device;
mod enumeration;
mod events;
mod fabric;
mod ffi;
mod gpm;
mod gpu_instances;
mod mig;
mod node;
mod signatures;
mod stubs;
mod system;
mod telemetry;
mod vgpu;

pub use compute_instances::*;
pub use device::*;
pub use enumeration::*;
pub use events::*;
pub use fabric::*;
pub use gpm::*;
pub use gpu_instances::*;
pub use mig::*;
pub use stubs::*;
pub use system::*;
pub use telemetry::*;
pub use vgpu::*;

/// The file name Cargo gives the built library.
pub const LIBRARY_FILE: &str = "libgpu_dra_nvml_sim.so";
