//! ComputeDomains: multi-node NVLink (IMEX) for rack-scale systems such as GB200 NVL72.
//!
//! A second DRA driver, `compute-domain.nvidia.com`, served by the same binary:
//! - [`api`]: the names and wire types every part shares (CRDs, opaque configs, labels,
//!   device names, ports). Compatible with NVIDIA's driver, so existing manifests work.
//! - [`plugin`]: the kubelet plugin, `gpu-dra compute-domain-plugin`.
//!
//! The parts, each in its own module and verb: the controller (`gpu-dra
//! compute-domain-controller`), the kubelet plugin (`gpu-dra compute-domain-plugin`) and the
//! IMEX daemon wrapper (`gpu-dra imex-daemon`). See `docs/compute-domains.md`.
//!
//! ## How state flows, and why no object is written by every node
//! - The controller alone writes a `ComputeDomain`'s status.
//! - Each node's IMEX daemon writes only its own [`api::ComputeDomainNode`] object (one per
//!   domain and node, in the driver's namespace): its IP, clique, index and readiness.
//! - The controller aggregates those objects into the `ComputeDomain` status.
//! - The kubelet plugin reads the node's own `ComputeDomainNode` to know when the daemon is
//!   ready; the daemon lists the objects of its domain and clique to know its peers.

pub mod api;
pub mod controller;
pub mod daemon;
pub mod imex;
pub mod plugin;
