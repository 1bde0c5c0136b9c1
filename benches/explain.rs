//! Explain over a large cluster: 1,000 nodes × 8 H100s × 26 devices (full GPU + 25 MIG
//! placements, with counter sets) ≈ 208,000 devices, with the table selector engine.
//!
//! Prints figures; asserts nothing about time (machines are noisy). Target: a single-GPU
//! claim explained in under a second. CPU time (user + system, 10 ms ticks, from
//! /proc/self/stat) is printed next to wall time because the build machine is shared.

#[path = "../tests/alloc_fixtures/mod.rs"]
mod alloc_fixtures;

use std::time::{Duration, Instant};

use alloc_fixtures::*;
use gpu_dra::alloc::Allocator;
use gpu_dra::explain::{ExplainInput, ExplainReport, explain};
use k8s_openapi::api::resource::v1::ResourceClaim;

const NODES: usize = 1000;
const GPUS: u32 = 8;
const RUNS: usize = 5;

fn node(n: usize) -> String {
    format!("node-{n:04}")
}

/// User + system CPU time of this process so far, in milliseconds (Linux only; 0 elsewhere).
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) * 10.0
}

fn measure<T>(label: &str, run: impl Fn() -> T, check: impl Fn(&T)) {
    let mut wall: Vec<Duration> = Vec::with_capacity(RUNS);
    let mut cpu: Vec<f64> = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let (start, cpu_start) = (Instant::now(), cpu_ms());
        let result = run();
        wall.push(start.elapsed());
        cpu.push(cpu_ms() - cpu_start);
        check(&result);
    }
    wall.sort();
    cpu.sort_by(f64::total_cmp);
    println!(
        "{label:<55} wall min {:>7.1} ms, median {:>7.1} ms | cpu min {:>5.0} ms, median {:>5.0} ms",
        wall[0].as_secs_f64() * 1e3,
        wall[RUNS / 2].as_secs_f64() * 1e3,
        cpu[0],
        cpu[RUNS / 2],
    );
}

fn gpus(count: u32) -> ResourceClaim {
    claim(
        "bench",
        &format!(
            "requests:\n- {{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}}}"
        ),
    )
}

fn main() {
    let start = Instant::now();
    let slices: Vec<_> = (0..NODES).flat_map(|n| h100_node(&node(n), GPUS)).collect();
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    println!(
        "setup: {NODES} nodes, {} slices, {devices} devices built in {:.1} s (not timed below)",
        slices.len(),
        start.elapsed().as_secs_f64()
    );
    let engine = engine();
    let mut input = ExplainInput {
        classes: classes(),
        slices,
        allocated: Vec::new(),
        claims: vec![gpus(1)],
    };

    measure(
        "indexing only (Allocator::new + prepare)",
        || {
            let allocator =
                Allocator::new(&engine, &input.classes, &input.slices, &input.allocated)
                    .expect("no allocated claims");
            let prepared = allocator.prepare(&input.claims).is_ok();
            (prepared, allocator.node_names().len())
        },
        |got| assert_eq!((true, NODES), *got),
    );
    measure(
        "single-GPU claim, empty cluster (fits on every node)",
        || explain(&engine, &input),
        |r: &ExplainReport| assert_eq!(NODES, r.fitting_nodes.len()),
    );

    // Every full GPU is taken except the last one of the last node.
    input.allocated = (0..NODES)
        .map(|n| {
            let held: Vec<(String, String)> = (0..GPUS)
                .filter(|&g| !(n == NODES - 1 && g == GPUS - 1))
                .map(|g| ("gpu".to_string(), format!("gpu-{g}")))
                .collect();
            let held: Vec<(&str, &str)> =
                held.iter().map(|(r, d)| (r.as_str(), d.as_str())).collect();
            allocated(&format!("holder-{n}"), &node(n), &held)
        })
        .collect();
    measure(
        "single-GPU claim, one free GPU in the cluster",
        || explain(&engine, &input),
        |r: &ExplainReport| assert_eq!(vec![node(NODES - 1)], r.fitting_nodes),
    );

    input.allocated.clear();
    input.claims = vec![gpus(9)];
    measure(
        "9-GPU claim, fits nowhere (3 near misses explained)",
        || explain(&engine, &input),
        |r: &ExplainReport| assert!(!r.fits() && r.near_misses.len() == 3),
    );
}
