//! `explain` as users run it: real CEL selectors (the built-in DeviceClasses) over a cluster of
//! 1,000 simulated dgx-h100 nodes (≈208,000 devices), for a single-GPU claim and for a MIG
//! claim. Target: under 1 s for the single-GPU claim. Run: `cargo bench --bench explain_cel`.

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_dra::explain::{ExplainInput, explain, load_claims};
use gpu_dra::explain_inputs::{builtin_classes, sim_slices};
use gpu_dra::selectors::CelEngine;

fn cluster(nodes: usize) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    let template =
        sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).expect("preset slices");
    let mut all = Vec::with_capacity(nodes * template.len());
    for n in 0..nodes {
        let node = format!("node-{n:04}");
        for s in &template {
            let mut s = s.clone();
            let index = s
                .metadata
                .name
                .as_deref()
                .and_then(|x| x.rsplit('-').next())
                .unwrap_or("0")
                .to_string();
            s.metadata.name = Some(format!("{node}-gpu.nvidia.com-{index}"));
            s.spec.node_name = Some(node.clone());
            s.spec.pool.name = node.clone();
            all.push(s);
        }
    }
    all
}

fn main() {
    let slices = cluster(1000);
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    let classes = builtin_classes().expect("classes");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    println!("{} slices, {devices} devices on 1,000 nodes", slices.len());
    println!(
        "{:<28} {:>6} {:>12} {:>12} {:>12}",
        "claim", "fits", "min", "median", "max"
    );
    for example in ["dedicated-gpu", "mig-h100", "mig-profiles"] {
        let claims = load_claims(&root.join(format!("examples/{example}.yaml"))).expect("claims");
        let input = ExplainInput {
            classes: classes.clone(),
            slices: slices.clone(),
            allocated: Vec::new(),
            claims,
        };
        let mut times: Vec<Duration> = Vec::new();
        let mut fits = false;
        for _ in 0..5 {
            let start = Instant::now();
            let report = explain(&CelEngine, &input);
            times.push(start.elapsed());
            fits = report.fits();
            std::hint::black_box(report);
        }
        times.sort();
        println!(
            "{:<28} {:>6} {:>12.1?} {:>12.1?} {:>12.1?}",
            example,
            fits,
            times[0],
            times[times.len() / 2],
            times[times.len() - 1]
        );
    }
}
