//! gpu-dra: a Kubernetes Dynamic Resource Allocation (DRA) kubelet plugin for NVIDIA GPUs.
//!
//! The library holds every piece of the driver; the `gpu-dra` binary only parses flags and
//! calls in. Pure modules (device model, slices, CEL, allocator) do no I/O; every effect on
//! hardware, processes, files or the cluster sits behind a small trait with a real and a
//! simulated implementation side by side. See `docs/architecture.md`.

pub mod alloc;
pub mod explain;
