//! The real kube-apiserver as the prepare-path benches model it, calibrated to issue 46's
//! held-out table (a real kube-apiserver over TLS on a kind control plane): its answer times,
//! each overridable from the environment, applied to the tests' fake API server.
//!
//! - `GPU_DRA_BENCH_GET_LATENCY_US` (default 3,500 µs): a GET's time in the server, of which
//! - `GPU_DRA_BENCH_GET_CPU_US` (default 800 µs) is spent busy on this machine's cores, where
//!   the plugin runs too, as kube-apiserver and etcd do on a kind node: ten GETs at once then
//!   queue for the cores and slow the plugin down. With these two the `prepare` bench's
//!   harness replay reproduces every latency and CPU figure of the held-out table within 7 %
//!   (floor 5.0 ms, 1 claim 5.9 ms, 10 claims 11.3 ms, 2.8 ms of plugin CPU per claim); with
//!   the server asleep instead (issue 34's model: 2.6 ms, no CPU) the 10-claim call came out
//!   at 6.6 ms and the CPU a fifth low (`docs/architecture.md`, "Calibrated to issue 46");
//! - `GPU_DRA_BENCH_WRITE_LATENCY_US` (default 2,000 µs): a write (the claim-status `PUT`),
//!   an etcd write; `GPU_DRA_BENCH_WRITE_CPU_US` (default 0) of it busy.

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
            get: micros_from_env("GPU_DRA_BENCH_GET_LATENCY_US", 3500),
            write: micros_from_env("GPU_DRA_BENCH_WRITE_LATENCY_US", 2000),
            get_cpu: micros_from_env("GPU_DRA_BENCH_GET_CPU_US", 800),
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
