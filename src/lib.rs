//! gpu-dra: a Kubernetes Dynamic Resource Allocation (DRA) kubelet plugin for NVIDIA GPUs.
//!
//! The library holds every piece of the driver; the `gpu-dra` binary only parses flags and
//! calls in. Pure modules (device model, slices, CEL, allocator) do no I/O; every effect on
//! hardware, processes, files or the cluster sits behind a small trait with a real and a
//! simulated implementation side by side. See `docs/architecture.md`.

pub mod alloc;
pub mod allocation;
pub mod capacity;
pub mod cdi;
pub mod cel;
pub mod checkpoint;
pub mod claims;
pub mod compute_domain;
pub mod cost;
pub mod crashpoint;
pub mod demo;
pub mod devices;
pub mod doctor;
pub mod errors;
pub mod explain;
pub mod explain_inputs;
pub mod fabric_manager;
pub mod fsutil;
pub mod hardware;
pub mod health;
pub mod inventory;
pub mod k8s;
pub mod kubelet;
pub mod logging;
pub mod metrics;
pub mod opaque;
pub mod plugin;
pub mod quantity;
pub mod selectors;
pub mod sharing;
pub mod slices;
pub mod ticks;
pub mod usage;
