//! Observability: Prometheus metrics in the text exposition format and the `/healthz` and
//! `/readyz` probes, served over HTTP/1.1.
//!
//! [`Metrics`] and [`Health`] are plain shared state with setters; the plugin updates them
//! where it learns things (each claim call, the inventory watch, the publisher, the kubelet's
//! registration) and [`serve`] exposes them. Nothing here knows about GPUs or claims: callers
//! pass counts, error kinds and per-device readings ([`telemetry::DeviceReadings`]).
//!
//! One file per concern: `calls.rs` (prepare/unprepare requests, latency, errors),
//! `node.rs` (published devices, MIG instances, MPS daemons, prepared claims),
//! `gpu_health.rs` (GPUs per health state, taints, transitions), `lifecycle.rs` (orphaned
//! claims reclaimed), `usage.rs`
//! (device-seconds), `claim_status.rs` (status writes), `telemetry.rs` (per-device
//! readings); `registry.rs` is the handle over them, `text.rs` the exposition format,
//! `health.rs` the readiness behind `/readyz`, `server.rs` the HTTP endpoint.

mod calls;
mod claim_status;
mod gpu_health;
mod health;
mod lifecycle;
mod node;
mod registry;
mod request_path;
mod server;
pub mod telemetry;
pub mod text;
mod usage;

pub use calls::{DURATION_BUCKETS, Operation, Outcome};
pub use health::Health;
pub use lifecycle::ORPHAN_REASONS;
pub use registry::Metrics;
pub use server::{MetricsServer, bind_any, respond, serve};

/// Errors of the metrics endpoint.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The listening address could not be resolved or bound.
    #[error("binding the metrics address {addr:?}")]
    Bind {
        /// The address as configured.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The bound socket's address could not be read.
    #[error("reading the metrics socket's address")]
    LocalAddr {
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The endpoint's thread or its runtime could not be started, or the socket could not be
    /// registered with that runtime.
    #[error("starting the metrics endpoint's thread")]
    Thread {
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}
