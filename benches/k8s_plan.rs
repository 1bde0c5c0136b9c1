//! Publisher planning at steady state: the CPU cost of every resync round (list → compare every
//! slice → nothing to write) and of a round where the whole pool changed, for large presets.
//! Run: `cargo bench --bench k8s_plan`.

use std::time::{Duration, Instant};

use gpu_dra::devices::{self, ModelOptions};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::k8s::plan::{node_owner, plan};
use gpu_dra::slices::{self, PoolOptions};
use k8s_openapi::api::resource::v1::ResourceSlice;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn time(iterations: usize, mut f: impl FnMut() -> usize) -> (Duration, Duration, usize) {
    let mut times = Vec::with_capacity(iterations);
    let mut writes = 0;
    for _ in 0..iterations {
        let start = Instant::now();
        writes = std::hint::black_box(f());
        times.push(start.elapsed());
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99), writes)
}

fn main() {
    println!(
        "{:<14} {:>7} {:>8} {:>12} {:>12} {:>8} {:>12}",
        "preset", "slices", "KiB", "steady p50", "steady p99", "writes", "change p50"
    );
    for preset in ["dgx-h200", "hgx-h100-16", "dgx-h100", "mixed"] {
        let sim = SimBackend::open(preset, None).expect("preset");
        let options =
            ModelOptions::with_policies(gpu_dra::devices::DEFAULT_DRIVER_NAME, &sim.mig_policies());
        let model = devices::build(&sim.inventory().expect("inventory"), &options);
        let node = sim.node_name().to_string();
        let owner = node_owner(&node, "uid");
        let build = |generation| {
            let pool = PoolOptions {
                driver_name: "gpu.nvidia.com".into(),
                node_name: node.clone(),
                generation,
            };
            slices::build(&model, &pool).expect("slices")
        };
        let desired = build(0);
        // What a LIST returns: our slices after a JSON round trip, owned, at generation 4.
        let json = serde_json::to_vec(&build(4)).expect("json");
        let mut existing: Vec<ResourceSlice> = serde_json::from_slice(&json).expect("json");
        for s in &mut existing {
            s.metadata.owner_references = Some(vec![owner.clone()]);
        }
        let (p50, p99, writes) = time(200, || {
            plan(&desired, &existing, &node, &owner).writes.len()
        });
        assert_eq!(0, writes, "steady state must plan no write");
        let other_pool: Vec<ResourceSlice> = existing
            .iter()
            .cloned()
            .map(|mut s| {
                s.metadata.owner_references = None;
                s
            })
            .collect();
        let (change, _, _) = time(200, || {
            plan(&desired, &other_pool, &node, &owner).writes.len()
        });
        println!(
            "{:<14} {:>7} {:>8} {:>12?} {:>12?} {:>8} {:>12?}",
            preset,
            desired.len(),
            json.len() / 1024,
            p50,
            p99,
            writes,
            change
        );
    }
}
