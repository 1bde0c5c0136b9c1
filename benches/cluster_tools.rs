//! The three cluster-wide CLI tools at 1,000 `dgx-h100` nodes, as an operator runs them: the
//! RELEASE binary, start to exit, its output discarded (issue 34, part 2).
//!
//! Generates the 1,000 nodes' ResourceSlices with the library's own device model and slice
//! packing (what `gpu-dra inventory --sim-node dgx-h100 -o json` publishes), under node names
//! `node-0000`…`node-0999`, plus 10,000 allocated claims, and writes them as (a) a compact
//! JSON list (`kubectl get --raw`) and (b) an indented list (`kubectl get -o json`, four
//! spaces). For each input it runs `gpu-dra explain` of a claim that fits nowhere (9 GPUs in
//! one request) and `gpu-dra capacity`, several times, and prints the median wall time, CPU
//! time (the machine is shared: wall time is noisy) and the child's peak RSS (VmHWM from
//! /proc, polled while the child runs) against the budget: met / NOT met. Asserts nothing
//! about time.
//!
//! Then the same cluster from a fake API server (the tests' `FakeApiServer`, in this
//! process, plain HTTP): `explain --kubeconfig` and `capacity --kubeconfig` list the 6,000
//! slices and 10,000 claims from it, and `gpu-dra doctor` runs its node and cluster checks for
//! one node (the cluster checks list that node's slices by field selector, the classes, the
//! admission policies, and one access review per RBAC rule). Wall time includes the fake
//! server's own serialisation in this process; CPU and RSS are the tool's alone.

#[path = "support/fleet.rs"]
mod fleet;
#[path = "../tests/plugin_support/mod.rs"]
mod plugin_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpu_dra::explain_inputs::sim_slices;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};

const NODES: usize = 1000;
const RUNS: usize = 3;
const BIN: &str = env!("CARGO_BIN_EXE_gpu-dra");

fn cluster(template: &[ResourceSlice]) -> Value {
    let items: Vec<Value> = fleet::cluster(template, NODES)
        .into_iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap();
            v["apiVersion"] = json!("resource.k8s.io/v1");
            v["kind"] = json!("ResourceSlice");
            v
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// Per node: GPUs 0–2 carved 3g.40gb@0 + 2g.20gb@4 + 1g.10gb@6, GPU 3 whole (10 claims a
/// node), as benches/capacity.rs.
fn claims() -> Value {
    let mut items = Vec::new();
    for n in 0..NODES {
        let pool = fleet::node(n);
        for (i, device) in fleet::held_per_node().into_iter().enumerate() {
            items.push(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": format!("c-{n}-{i}"), "namespace": format!("team-{}", n % 20)},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
                "status": {
                    "allocation": {"devices": {"results": [
                        {"request": "r", "driver": "gpu.nvidia.com", "pool": pool, "device": device}]}},
                    "reservedFor": [{"resource": "pods", "name": format!("pod-{n}-{i}"), "uid": "u"}]}
            }));
        }
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

fn text(value: &Value, indent: bool) -> Vec<u8> {
    if !indent {
        return serde_json::to_vec(value).unwrap();
    }
    let mut out = Vec::new();
    let format = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, format);
    serde::Serialize::serialize(value, &mut serializer).unwrap();
    out
}

/// A field of /proc/<pid>/status, in kB.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// utime + stime of a live process, in ms (clock ticks of 10 ms).
fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((ticks(11)? + ticks(12)?) * 10.0)
}

struct Run {
    wall: Duration,
    cpu_ms: f64,
    peak_mb: f64,
    code: Option<i32>,
}

/// Runs the binary once, polling its peak RSS and CPU time every 5 ms until it exits.
fn run(args: &[&std::ffi::OsStr]) -> Run {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (mut peak_kb, mut cpu) = (0, 0.0_f64);
    loop {
        if let Some(kb) = status_kb(pid, "VmHWM:") {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(ms) = cpu_ms(pid) {
            cpu = cpu.max(ms);
        }
        if let Some(status) = child.try_wait().unwrap() {
            return Run {
                wall: start.elapsed(),
                cpu_ms: cpu,
                peak_mb: peak_kb as f64 / 1024.0,
                code: status.code(),
            };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn measure(
    label: &str,
    args: &[&std::ffi::OsStr],
    expect: Option<i32>,
    wall_budget: f64,
    mb_budget: f64,
) {
    let mut runs: Vec<Run> = (0..RUNS).map(|_| run(args)).collect();
    for r in &runs {
        if let Some(expect) = expect {
            assert_eq!(r.code, Some(expect), "{label}: exit code");
        }
    }
    let median = |key: &dyn Fn(&Run) -> f64, runs: &mut Vec<Run>| {
        runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
        key(&runs[RUNS / 2])
    };
    let wall = median(&|r| r.wall.as_secs_f64(), &mut runs);
    let cpu = median(&|r| r.cpu_ms, &mut runs);
    let peak = median(&|r| r.peak_mb, &mut runs);
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "{label:<44} median wall {wall:>5.2} s (budget {wall_budget} s: {}), cpu {:>5.2} s, peak RSS {peak:>5.0} MB (budget {mb_budget} MB: {})",
        met(wall < wall_budget),
        cpu / 1e3,
        met(peak < mb_budget),
    );
}

/// The bench's directory: removed at the end, or kept for a person to look at.
enum KeptOrTemp {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl KeptOrTemp {
    fn path(&self) -> &Path {
        match self {
            KeptOrTemp::Temp(t) => t.path(),
            KeptOrTemp::Kept(p) => p,
        }
    }
}

fn main() {
    let start = Instant::now();
    let template = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    let (slices, claims) = (cluster(&template), claims());
    let dir = tempfile::tempdir().unwrap();
    // GPU_DRA_BENCH_KEEP=1 keeps the generated files (printed) for profiling a verb by hand.
    let dir = if std::env::var_os("GPU_DRA_BENCH_KEEP").is_some() {
        let kept = dir.keep();
        println!("files kept in {}", kept.display());
        KeptOrTemp::Kept(kept)
    } else {
        KeptOrTemp::Temp(dir)
    };
    let nine: PathBuf = dir.path().join("nine-gpus.yaml");
    std::fs::write(
        &nine,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: nine, namespace: default}\n\
         spec:\n  devices:\n    requests:\n    - name: gpus\n      exactly: {deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 9}\n",
    )
    .unwrap();
    let mut inputs = Vec::new();
    for (form, indent) in [
        ("compact (get --raw)", false),
        ("indented (get -o json)", true),
    ] {
        let tag = if indent { "indented" } else { "compact" };
        let s = dir.path().join(format!("slices-{tag}.json"));
        let c = dir.path().join(format!("claims-{tag}.json"));
        std::fs::write(&s, text(&slices, indent)).unwrap();
        std::fs::write(&c, text(&claims, indent)).unwrap();
        inputs.push((form, s, c));
    }
    let (slices_value, claims_value) = (slices, claims);
    let mb = |p: &Path| std::fs::metadata(p).unwrap().len() as f64 / 1e6;
    println!(
        "setup: {NODES} dgx-h100 nodes, {} slices, 10,000 claims; files {} in {:.1} s (not timed); {RUNS} runs each",
        template.len() * NODES,
        inputs
            .iter()
            .map(|(f, s, c)| format!("{f}: {:.0} MB + {:.0} MB", mb(s), mb(c)))
            .collect::<Vec<_>>()
            .join(", "),
        start.elapsed().as_secs_f64()
    );
    for (form, s, c) in &inputs {
        let os = |x: &'static str| std::ffi::OsStr::new(x);
        measure(
            &format!("explain 9 GPUs, {form}"),
            &[
                os("explain"),
                os("--claim"),
                nine.as_os_str(),
                os("--slices"),
                s.as_os_str(),
                os("--allocated"),
                c.as_os_str(),
            ],
            Some(1),
            2.0,
            300.0,
        );
        measure(
            &format!("capacity, {form}"),
            &[
                os("capacity"),
                os("--slices"),
                s.as_os_str(),
                os("--claims"),
                c.as_os_str(),
            ],
            Some(0),
            2.0,
            200.0,
        );
    }
    live(&slices_value, &claims_value, &nine);
}

/// The same cluster served by a fake API server: explain, capacity and doctor against it.
fn live(slices: &Value, claims: &Value, nine: &Path) {
    let started = Instant::now();
    let node = plugin_support::Node::new();
    for item in slices["items"].as_array().unwrap() {
        node.api.put_slice(item.clone());
    }
    for item in claims["items"].as_array().unwrap() {
        node.api.put_claim(item.clone());
    }
    for class in gpu_dra::explain_inputs::builtin_classes().unwrap() {
        node.api.put_object(
            plugin_support::apicatalog::DEVICE_CLASSES,
            serde_json::to_value(class).unwrap(),
        );
    }
    println!(
        "fake API server: {} slices, {} claims loaded in {:.1} s (not timed)",
        slices["items"].as_array().unwrap().len(),
        claims["items"].as_array().unwrap().len(),
        started.elapsed().as_secs_f64()
    );
    // What the fake server alone takes to answer the two big lists once (its JSON is built
    // and serialised per request in this process): the floor under the tools' wall times.
    let mut serve = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let bytes = get(&node.api.url(), "/apis/resource.k8s.io/v1/resourceslices")
            + get(&node.api.url(), "/apis/resource.k8s.io/v1/resourceclaims");
        serve.push((t.elapsed().as_secs_f64(), bytes));
    }
    serve.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!(
        "fake API server alone, GET slices + claims lists: median {:.2} s for {:.0} MB (a floor under the --kubeconfig wall times below; CPU and RSS are the tools' own)",
        serve[RUNS / 2].0,
        serve[RUNS / 2].1 as f64 / 1e6
    );
    let kubeconfig = node.root().join("kubeconfig");
    let os = |x: &'static str| std::ffi::OsStr::new(x);
    measure(
        "explain 9 GPUs, --kubeconfig",
        &[
            os("explain"),
            os("--claim"),
            nine.as_os_str(),
            os("--kubeconfig"),
            kubeconfig.as_os_str(),
        ],
        Some(1),
        2.0,
        300.0,
    );
    measure(
        "capacity, --kubeconfig",
        &[os("capacity"), os("--kubeconfig"), kubeconfig.as_os_str()],
        Some(0),
        2.0,
        200.0,
    );
    let plugin_dir = node.plugin_dir();
    let state_dir = node.state_dir();
    // The node's own checks fail here (no plugin runs), so the exit code is not checked; the
    // budget (5 s) is for the cluster checks, which this run includes.
    measure(
        "doctor (node + cluster checks), --kubeconfig",
        &[
            os("doctor"),
            os("--node-name"),
            os("node-0000"),
            os("--kubeconfig"),
            kubeconfig.as_os_str(),
            os("--gpu-backend"),
            os("sim"),
            os("--sim-node"),
            os("dgx-h100"),
            os("--plugin-dir"),
            plugin_dir.as_os_str(),
            os("--state-dir"),
            state_dir.as_os_str(),
        ],
        None,
        5.0,
        200.0,
    );
    // What that doctor run checked, so its time stands for the cluster checks it claims.
    let out = Command::new(BIN)
        .args([
            "doctor",
            "-o",
            "json",
            "--node-name",
            "node-0000",
            "--gpu-backend",
            "sim",
            "--sim-node",
            "dgx-h100",
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .arg("--state-dir")
        .arg(&state_dir)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let checks: Vec<String> = report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={}",
                c["name"].as_str().unwrap_or("?"),
                c["status"].as_str().unwrap_or("?")
            )
        })
        .collect();
    println!("  doctor's checks in that run: {}", checks.join(" "));
}

/// GETs `path` from the plain-HTTP server at `base` (`http://host:port`) and returns the bytes
/// of the answer, read to the end.
fn get(base: &str, path: &str) -> usize {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = Vec::new();
    stream.read_to_end(&mut body).unwrap();
    body.len()
}
