//! The real kube-apiserver as the prepare-path benches model it (issue 34): its answer times,
//! each overridable from the environment, applied to the tests' fake API server.
//!
//! - `GPU_DRA_BENCH_GET_LATENCY_US` (default 2,600 µs): a quorum GET of issue 34's held-out
//!   kube-apiserver, whose GET → 404 took 3.7 ms through the plugin;
//! - `GPU_DRA_BENCH_WRITE_LATENCY_US` (default 2,000 µs): a write (the claim-status `PUT`),
//!   an etcd write;
//! - `GPU_DRA_BENCH_GET_CPU_US`, `GPU_DRA_BENCH_WRITE_CPU_US` (default 0): of those, what the
//!   server spends on this machine's CPU rather than asleep.

use std::time::Duration;

use crate::plugin_support::FakeApiServer;

/// The API server's answer times.
#[derive(Clone, Copy)]
pub struct Latency {
    pub get: Duration,
    pub write: Duration,
    /// Of `get` and `write`, what the server spends on this machine's CPU.
    pub get_cpu: Duration,
    pub write_cpu: Duration,
}

impl Latency {
    /// The modelled times, with the environment's overrides (module docs).
    pub fn from_env() -> Latency {
        Latency {
            get: micros_from_env("GPU_DRA_BENCH_GET_LATENCY_US", 2600),
            write: micros_from_env("GPU_DRA_BENCH_WRITE_LATENCY_US", 2000),
            get_cpu: micros_from_env("GPU_DRA_BENCH_GET_CPU_US", 0),
            write_cpu: micros_from_env("GPU_DRA_BENCH_WRITE_CPU_US", 0),
        }
    }

    /// Makes `api` answer with these times.
    pub fn apply(&self, api: &FakeApiServer) {
        api.set_get_latency(self.get);
        api.set_write_latency(self.write);
        api.set_server_cpu(self.get_cpu, self.write_cpu);
    }
}

fn micros_from_env(name: &str, default: u64) -> Duration {
    Duration::from_micros(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}
