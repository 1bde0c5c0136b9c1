//! Slice building: inventory → device model → ResourceSlices, for large presets.
//! Target: under 10 ms per node. Run: `cargo bench --bench slices`.

use std::time::{Duration, Instant};

use gpu_dra::devices::{self, ModelOptions};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::slices::{self, PoolOptions};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    println!(
        "{:<14} {:>8} {:>8} {:>10} {:>10} {:>10}",
        "preset", "devices", "slices", "p50", "p99", "mean"
    );
    for preset in ["dgx-h200", "hgx-h100-16", "dgx-h100", "mixed"] {
        let sim = SimBackend::open(preset, None).expect("preset");
        let inventory = sim.inventory().expect("inventory");
        let options =
            ModelOptions::with_policies(gpu_dra::devices::DEFAULT_DRIVER_NAME, &sim.mig_policies());
        let pool = PoolOptions {
            driver_name: "gpu.nvidia.com".into(),
            node_name: sim.node_name().into(),
            generation: 1,
        };
        let iterations = 300;
        let mut times = Vec::with_capacity(iterations);
        let mut last = (0, 0);
        for _ in 0..iterations {
            let start = Instant::now();
            let model = devices::build(&inventory, &options);
            let built = slices::build(&model, &pool).expect("slices");
            times.push(start.elapsed());
            last = (model.devices.len(), built.len());
            std::hint::black_box(built);
        }
        times.sort();
        let mean = times.iter().sum::<Duration>() / iterations as u32;
        println!(
            "{:<14} {:>8} {:>8} {:>10.3?} {:>10.3?} {:>10.3?}",
            preset,
            last.0,
            last.1,
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            mean
        );
    }
}
