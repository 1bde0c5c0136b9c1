//! The plugin process end to end, built with the release profile (`cargo bench --bench
//! plugin`): start to registered and to slices published, prepare/unprepare latency over the
//! kubelet socket (full GPU and dynamic MIG on the simulated DGX H100), the simulated
//! hardware's own share, sustained claims per second, and idle memory.
//!
//! Targets: start < 100 ms, p99 prepare < 5 ms excluding hardware calls, idle RSS < 20 MiB.

#[path = "../tests/plugin_support/mod.rs"]
mod plugin_support;

use std::path::Path;
use std::time::{Duration, Instant};

use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{mps_config, with_config};
use plugin_support::{Node, eventually};

const STARTS: usize = 20;
const CYCLES: usize = 300;
const MPS_CYCLES: usize = 50;
const SUSTAIN: Duration = Duration::from_secs(3);

struct Stats {
    n: usize,
    p50: Duration,
    p99: Duration,
    min: Duration,
    max: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Stats {
        n: samples.len(),
        p50: at(0.5),
        p99: at(0.99),
        min: samples[0],
        max: samples[samples.len() - 1],
    }
}

fn row(label: &str, s: &Stats) {
    println!(
        "{label:<46} n={:<5} p50={:>9.2?} p99={:>9.2?} min={:>9.2?} max={:>9.2?}",
        s.n, s.p50, s.p99, s.min, s.max
    );
}

/// Polls the registration socket as tightly as is reasonable: GetInfo answered = registered.
async fn until_registrable(socket: &Path) {
    loop {
        if let Ok(mut client) = KubeletClient::connect(socket).await
            && client.get_info().await.is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// Start to GetInfo answered, and start to the first slice the API server received.
async fn start_up(root: &Path) -> (Vec<Duration>, Vec<Duration>) {
    let mut registered = Vec::new();
    let mut published = Vec::new();
    for _ in 0..STARTS {
        let node = Node::new_in(root);
        let started = Instant::now();
        let mut plugin = node.spawn_with(&[]);
        until_registrable(&node.registration_socket()).await;
        registered.push(started.elapsed());
        let first = eventually("the first slice", || {
            node.api
                .requests()
                .into_iter()
                .find(|r| r.method == "POST")
                .map(|r| r.at)
        })
        .await;
        published.push(first - started);
        plugin.kill().await;
    }
    (registered, published)
}

/// Prepare/unprepare of one claim over the socket, `CYCLES` times.
async fn cycles(root: &Path, device: &str) -> (Vec<Duration>, Vec<Duration>) {
    cycles_of(
        root,
        claims::on_node("bench", "uid-bench", &[device]),
        CYCLES,
    )
    .await
}

/// Prepare/unprepare round trips of an MPS claim (GpuConfig, 50 % threads, 10Gi pinned) on a
/// full GPU: each prepare starts a control daemon with the simulated tools and verifies its
/// limits, each unprepare stops it.
async fn mps_cycles(root: &Path) -> (Vec<Duration>, Vec<Duration>) {
    let claim = with_config(
        claims::on_node("bench", "uid-bench", &["gpu-3"]),
        &[],
        mps_config("GpuConfig", 50, "10Gi"),
    );
    cycles_of(root, claim, MPS_CYCLES).await
}

async fn cycles_of(
    root: &Path,
    claim: serde_json::Value,
    cycles: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let node = Node::new_in(root);
    node.api.put_claim(claim);
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = [claim_ref("bench", "uid-bench")];
    let (mut prepare, mut unprepare) = (Vec::new(), Vec::new());
    for _ in 0..cycles {
        let t = Instant::now();
        let got = kubelet.prepare(&claim).await.expect("prepare");
        prepare.push(t.elapsed());
        assert!(got["uid-bench"].is_ok(), "{got:?}");
        let t = Instant::now();
        kubelet.unprepare(&claim).await.expect("unprepare");
        unprepare.push(t.elapsed());
    }
    (prepare, unprepare)
}

/// The simulated hardware's own cost for the calls a MIG prepare and unprepare make, on a
/// file-backed state like the plugin's: inventory (twice per cycle: prepare's device model and
/// unprepare's), MIG mode check, create, destroy.
fn sim_own_time(root: &Path) -> (Vec<Duration>, Vec<Duration>) {
    let dir = tempfile::tempdir_in(root).expect("temp dir");
    let sim = SimBackend::open("dgx-h100", Some(&dir.path().join("sim"))).expect("sim");
    let profile = sim.inventory().expect("inventory").gpus[0]
        .profile_by_name("3g.40gb")
        .expect("3g.40gb")
        .id;
    let (mut prepare, mut unprepare) = (Vec::new(), Vec::new());
    for _ in 0..CYCLES {
        let t = Instant::now();
        sim.inventory().expect("inventory");
        sim.set_mig_mode(0, true).expect("MIG mode");
        let made = sim.create_mig_device(0, profile, 4).expect("create");
        prepare.push(t.elapsed());
        let t = Instant::now();
        sim.inventory().expect("inventory");
        sim.destroy_mig_device(0, made.gi_id, made.ci_id)
            .expect("destroy");
        unprepare.push(t.elapsed());
    }
    (prepare, unprepare)
}

/// Claims prepared and unprepared per second, one pod's batch of `batch` MIG claims per call.
async fn sustained(root: &Path, batch: usize) -> f64 {
    let node = Node::new_in(root);
    let refs: Vec<_> = (0..batch)
        .map(|i| {
            let uid = format!("uid-sustain-{i}");
            let device = format!("gpu-{}-mig-1g10gb-{}", i % 8, i / 8);
            node.api
                .put_claim(claims::on_node(&format!("sustain-{i}"), &uid, &[&device]));
            claim_ref(&format!("sustain-{i}"), &uid)
        })
        .collect();
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let started = Instant::now();
    let mut claims_done = 0usize;
    while started.elapsed() < SUSTAIN {
        let got = kubelet.prepare(&refs).await.expect("prepare");
        assert!(got.values().all(Result::is_ok), "{got:?}");
        kubelet.unprepare(&refs).await.expect("unprepare");
        claims_done += refs.len();
    }
    claims_done as f64 / started.elapsed().as_secs_f64()
}

/// Memory of an idle plugin that has published its slices: `/proc/<pid>/status` lines.
async fn idle_memory(env: &[(&str, &str)]) -> Vec<(String, u64)> {
    let node = Node::new();
    let plugin = node.start_with(env).await;
    eventually("slices", || node.api.complete_pool()).await;
    // A few inventory rounds, with nothing to do.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", plugin.pid())).expect("status");
    ["VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"]
        .iter()
        .map(|name| {
            let value = status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            (name.to_string(), value)
        })
        .collect()
}

/// Everything that touches the disk, on the file system under `root`.
async fn on(root: &Path, label: &str) {
    println!(
        "\n-- state, checkpoint and CDI specs on {label} ({})",
        root.display()
    );
    let (registered, published) = start_up(root).await;
    row("start -> registration answers GetInfo", &stats(registered));
    row(
        "start -> first ResourceSlice at API server",
        &stats(published),
    );

    let (prepare, unprepare) = cycles(root, "gpu-3").await;
    row("prepare full GPU (socket round trip)", &stats(prepare));
    row("unprepare full GPU (socket round trip)", &stats(unprepare));
    let (prepare, unprepare) = cycles(root, "gpu-0-mig-3g40gb-4").await;
    let prepare = stats(prepare);
    row("prepare dynamic MIG 3g.40gb (round trip)", &prepare);
    row(
        "unprepare dynamic MIG 3g.40gb (round trip)",
        &stats(unprepare),
    );
    let (sim_prepare, sim_unprepare) = sim_own_time(root);
    let sim_prepare = stats(sim_prepare);
    row("  sim's own time in a MIG prepare", &sim_prepare);
    row("  sim's own time in a MIG unprepare", &stats(sim_unprepare));
    println!(
        "{:<46} p50={:>9.2?} p99={:>9.2?}  (round trip minus the sim's p50)",
        "prepare dynamic MIG without hardware calls",
        prepare.p50.saturating_sub(sim_prepare.p50),
        prepare.p99.saturating_sub(sim_prepare.p50),
    );
    let (prepare, unprepare) = mps_cycles(root).await;
    row(
        "prepare MPS claim, daemon ready (round trip)",
        &stats(prepare),
    );
    row("unprepare MPS claim, daemon stopped", &stats(unprepare));
    for batch in [1, 8] {
        let rate = sustained(root, batch).await;
        println!(
            "sustained, {batch} MIG claim(s) per call: {rate:>9.0} claims/s (prepare + unprepare)"
        );
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        println!("gpu-dra kubelet-plugin, sim dgx-h100 (8 x H100, dynamic MIG), release build");
        on(
            &std::env::temp_dir(),
            "disk (checkpoint and CDI writes are not fsynced: docs/architecture.md, Durability)",
        )
        .await;
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            on(shm, "tmpfs: the plugin's own cost").await;
        }
        // The Helm chart tunes glibc's malloc for a mostly idle server (two arenas, large
        // buffers mmapped, early trim); the image runs the dist build (GPU_DRA_PLUGIN_BIN).
        let chart = plugin_support::chart_malloc_env();
        for (label, env) in [
            ("glibc defaults", &[][..]),
            ("malloc tuned as the chart runs it", chart),
        ] {
            println!("\n-- idle plugin, {label}");
            for (name, kib) in idle_memory(env).await {
                match name.as_str() {
                    "Threads" => println!("idle plugin {name}: {kib}"),
                    _ => println!("idle plugin {name}: {:.1} MiB", kib as f64 / 1024.0),
                }
            }
        }
    });
}
