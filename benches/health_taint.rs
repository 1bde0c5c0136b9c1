//! From a GPU fault to the taint in the API server (`cargo bench --bench health_taint`): the
//! real plugin binary on the simulated `dgx-h100` node (8 GPUs; 62 devices in 2 slices with
//! the default `--mig-profiles split`) with the default 10 s `--inventory-interval`, a fake
//! API server, and `gpu-dra sim-fault` as the fault. Each round injects a critical XID on one GPU and waits until every slice of the
//! pool carries the taint (one generation), then resets the GPU and waits until the taint is
//! gone. `GPU_DRA_TEST_GPU_BACKEND=nvml` measures the NVML backend over the simulated NVML
//! library instead (events through `nvmlEventSetWait_v2`).
//!
//! Target (issue 13): published within 2 s of the event.

#[path = "../tests/plugin_support/mod.rs"]
mod plugin_support;

use std::time::{Duration, Instant};

use plugin_support::Node;

const ROUNDS: usize = 20;
const LIMIT: Duration = Duration::from_secs(30);

/// Whether the whole pool (one generation) shows GPU `gpu`'s full device tainted as `want`.
fn pool_shows(node: &Node, gpu: usize, want: bool) -> bool {
    let Some(pool) = node.api.complete_pool() else {
        return false;
    };
    let generation = &pool[0]["spec"]["pool"]["generation"];
    if pool
        .iter()
        .any(|s| &s["spec"]["pool"]["generation"] != generation)
    {
        return false;
    }
    let name = format!("gpu-{gpu}");
    pool.iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == name.as_str())
        .is_some_and(|d| d["taints"].as_array().is_some_and(|t| !t.is_empty()) == want)
}

async fn until(node: &Node, gpu: usize, want: bool) -> Duration {
    let start = Instant::now();
    while !pool_shows(node, gpu, want) {
        assert!(
            start.elapsed() < LIMIT,
            "gpu-{gpu} never became tainted={want}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

fn summary(name: &str, mut d: Vec<Duration>) {
    d.sort();
    let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<28} p50 {:>8.1} ms   p99 {:>8.1} ms   max {:>8.1} ms   (n = {})",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        d.last().unwrap().as_secs_f64() * 1e3,
        d.len()
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let node = Node::new();
        // The plugin as the chart runs it: the default inventory interval (the harness sets
        // 1 s for tests), so what is measured is the event path, not the interval.
        let command = node.chart_command_on(plugin_support::PRESET);
        let mut plugin = node.spawn_command(command, &[]);
        plugin.wait_registrable().await;
        let backend = if plugin_support::nvml_backend() {
            "nvml (simulated libnvidia-ml)"
        } else {
            "sim"
        };
        println!("backend {backend}; dgx-h100, --inventory-interval 10");
        until(&node, 0, false).await;
        let (mut taint, mut clear) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let gpu = round % 8;
            let start = Instant::now();
            node.sim_fault(&["xid", "--gpu", &gpu.to_string(), "--code", "79"]);
            until(&node, gpu, true).await;
            taint.push(start.elapsed());
            let start = Instant::now();
            node.sim_fault(&["recover", "--gpu", &gpu.to_string()]);
            until(&node, gpu, false).await;
            clear.push(start.elapsed());
        }
        summary("XID 79 -> taint published", taint);
        summary("reset -> taint removed", clear);
        plugin.kill().await;
    });
}
