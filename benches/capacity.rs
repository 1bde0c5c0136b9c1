//! `gpu-dra capacity` over a large cluster: 1,000 dgx-h100 nodes × 8 GPUs, each with the
//! full GPU and 25 dynamic MIG placements on a counter set (the slices `inventory` publishes,
//! ≈ 208,000 devices), half the GPUs partly or wholly held by 10,000 claims.
//!
//! Prints figures; asserts nothing about time. Target: the offline verb (JSON files read,
//! model, table) for 1,000 nodes in under 1 s; the last line times the release binary
//! itself, start to exit. The first lines build from API objects (what a library user holds),
//! which are lent to the model's records first. Also prints the general file path (every
//! field read through a YAML value) next to the fast path on 100 nodes. CPU time (the
//! process's and its waited-for children's) is printed next to wall time: reading and parsing
//! a large file use both cores, and the build machine is shared.

#[path = "support/fleet.rs"]
mod fleet;

use std::time::{Duration, Instant};

use gpu_dra::capacity::{
    CapacityInput, CapacityOptions, CapacityReport, InputFiles, TableOptions, build,
    build_from_files, render_table,
};
use gpu_dra::explain_inputs::sim_slices;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

const NODES: usize = 1000;
const RUNS: usize = 5;

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
    // utime + stime, and those of waited-for children (the process measurement).
    (ticks(11) + ticks(12) + ticks(13) + ticks(14)) * 10.0
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
        "{label:<58} wall min {:>7.1} ms, median {:>7.1} ms | cpu min {:>5.0} ms, median {:>5.0} ms",
        wall[0].as_secs_f64() * 1e3,
        wall[RUNS / 2].as_secs_f64() * 1e3,
        cpu[0],
        cpu[RUNS / 2],
    );
}

/// Per node: GPUs 0–2 carved 3g.40gb@0 + 2g.20gb@4 + 1g.10gb@6 (three claims), GPU 3 whole.
fn claims(nodes: usize) -> Vec<ResourceClaim> {
    let mut claims = Vec::new();
    for n in 0..nodes {
        let pool = fleet::node(n);
        for (i, device) in fleet::held_per_node().into_iter().enumerate() {
            claims.push(
                serde_json::from_value(json!({
                    "metadata": {"name": format!("c-{n}-{i}"), "namespace": format!("team-{}", n % 20)},
                    "status": {
                        "allocation": {"devices": {"results": [
                            {"request": "r", "driver": "gpu.nvidia.com", "pool": pool, "device": device}]}},
                        "reservedFor": [{"resource": "pods", "name": format!("pod-{n}-{i}"), "uid": "u"}]}
                }))
                .unwrap(),
            );
        }
    }
    claims
}

fn main() {
    let start = Instant::now();
    let template = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    let input = CapacityInput {
        slices: fleet::cluster(&template, NODES),
        claims: claims(NODES),
        nodes: Vec::new(),
    };
    let devices: usize = input
        .slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    println!(
        "setup: {NODES} nodes, {} slices, {devices} devices, {} claims in {:.1} s (not timed)",
        input.slices.len(),
        input.claims.len(),
        start.elapsed().as_secs_f64()
    );
    let options = CapacityOptions {
        driver: "gpu.nvidia.com".into(),
        pool_label: None,
        node: None,
    };
    let check = |r: &CapacityReport| {
        assert_eq!((r.totals.gpus, r.totals.allocated_devices), (8000, 10_000));
    };
    measure(
        "build from API objects (records, GPUs, holders, counters, free)",
        || build(&input, &options).unwrap(),
        check,
    );
    measure(
        "build + table (summaries, 50 allocation rows)",
        || {
            let report = build(&input, &options).unwrap();
            let table = render_table(&report, &TableOptions::default());
            (report, table)
        },
        |(r, t)| {
            check(r);
            assert!(t.contains("… 9950 more"));
        },
    );
    measure(
        "build + table --detail (every GPU)",
        || {
            let report = build(&input, &options).unwrap();
            render_table(
                &report,
                &TableOptions {
                    detail: true,
                    ..Default::default()
                },
            )
            .len()
        },
        |len| assert!(*len > 1_000_000),
    );
    measure(
        "build + JSON",
        || serde_json::to_string(&build(&input, &options).unwrap()).unwrap(),
        |s| assert!(s.len() > 1_000_000),
    );

    // Reading files as `kubectl get -o json` writes them: the fast path (JSON lists of v1
    // objects, only the fields the view reads) against the general path (every document
    // read in full through a YAML value, as before the fast path) on 100 nodes, and the fast
    // path on the whole 1,000-node cluster.
    let dir = tempfile::tempdir().unwrap();
    let write = |nodes: usize, indent: bool| {
        let list =
            |items: serde_json::Value| json!({"apiVersion": "v1", "kind": "List", "items": items});
        // kubectl's JSON printer indents by four spaces.
        let text = |value: serde_json::Value| {
            if !indent {
                return value.to_string();
            }
            let mut out = Vec::new();
            let format = serde_json::ser::PrettyFormatter::with_indent(b"    ");
            let mut serializer = serde_json::Serializer::with_formatter(&mut out, format);
            serde::Serialize::serialize(&value, &mut serializer).unwrap();
            String::from_utf8(out).unwrap()
        };
        let form = if indent { "indented" } else { "compact" };
        let slices_file = dir.path().join(format!("slices-{nodes}-{form}.json"));
        let claims_file = dir.path().join(format!("claims-{nodes}-{form}.json"));
        let mut slices = serde_json::to_value(fleet::cluster(&template, nodes)).unwrap();
        for s in slices.as_array_mut().unwrap() {
            s["apiVersion"] = json!("resource.k8s.io/v1");
            s["kind"] = json!("ResourceSlice");
        }
        std::fs::write(&slices_file, text(list(slices))).unwrap();
        let mut claim_values = serde_json::to_value(claims(nodes)).unwrap();
        for c in claim_values.as_array_mut().unwrap() {
            c["apiVersion"] = json!("resource.k8s.io/v1");
            c["kind"] = json!("ResourceClaim");
        }
        std::fs::write(&claims_file, text(list(claim_values))).unwrap();
        (slices_file, claims_file)
    };
    let mb = |path: &std::path::Path| std::fs::metadata(path).unwrap().len() as f64 / 1e6;
    let few = 100;
    let (slices_file, claims_file) = write(few, false);
    measure(
        &format!(
            "general path: load {few} nodes ({:.0} MB JSON) + build",
            mb(&slices_file)
        ),
        || {
            let input = CapacityInput {
                slices: gpu_dra::explain::load_slices(&slices_file).unwrap(),
                claims: gpu_dra::explain::load_allocated(&claims_file).unwrap(),
                nodes: Vec::new(),
            };
            build(&input, &options).unwrap()
        },
        |r| assert_eq!(r.totals.gpus, few * 8),
    );
    let options = &options;
    let files = |slices: &std::path::Path, claims: &std::path::Path| {
        let (slices, claims) = (slices.to_path_buf(), claims.to_path_buf());
        move || {
            build_from_files(
                InputFiles {
                    slices: &slices,
                    claims: Some(&claims),
                    nodes: None,
                },
                options,
            )
            .unwrap()
        }
    };
    measure(
        &format!("fast path: load {few} nodes from the same files + build"),
        files(&slices_file, &claims_file),
        |r| assert_eq!(r.totals.gpus, few * 8),
    );
    let (slices_file, claims_file) = write(NODES, false);
    let load_and_build = files(&slices_file, &claims_file);
    measure(
        &format!(
            "fast path: load {NODES} nodes ({:.0} MB JSON) + build",
            mb(&slices_file)
        ),
        &load_and_build,
        check,
    );
    measure(
        &format!("fast path: load {NODES} nodes + build + table"),
        || render_table(&load_and_build(), &TableOptions::default()).len(),
        |len| assert!(*len > 0),
    );
    // What an operator waits for: the release binary, start to exit (its output discarded).
    let process = |slices: &std::path::Path, claims: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
            .arg("capacity")
            .arg("--slices")
            .arg(slices)
            .arg("--claims")
            .arg(claims)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
    };
    measure(
        &format!("gpu-dra capacity --slices --claims, {NODES} nodes (process)"),
        || process(&slices_file, &claims_file),
        |status| assert!(status.success()),
    );
    // `kubectl get -o json` indents by four spaces: the same objects, four times the bytes.
    // (`kubectl get --raw /apis/resource.k8s.io/v1/resourceslices` gives the compact form.)
    let (slices_file, claims_file) = write(NODES, true);
    let indented = files(&slices_file, &claims_file);
    measure(
        &format!(
            "indented: load {NODES} nodes ({:.0} MB JSON) + build + table",
            mb(&slices_file)
        ),
        || render_table(&indented(), &TableOptions::default()).len(),
        |len| assert!(*len > 0),
    );
    measure(
        &format!("indented: gpu-dra capacity, {NODES} nodes (process)"),
        || process(&slices_file, &claims_file),
        |status| assert!(status.success()),
    );
}
