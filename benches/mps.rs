//! MPS daemon start: time from `MpsManager::start()` to a ready daemon with verified limits,
//! against the fake bash tools and the simulated tools, next to the tools' own time for the
//! same steps run bare. "Plugin overhead" = start() − bare tool time (target < 50 ms).
//!
//! Run: `cargo bench --bench mps` (add `--profile dev` to skip the optimised build).

#[path = "../tests/sharing_support/mod.rs"]
mod sharing_support;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpu_dra::sharing::{MpsDaemonSpec, MpsManager, MpsOptions, Tools};
use sharing_support::{Reaper, fake_tools, gpu, mig};

const RUNS: usize = 50;

fn main() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let fake_dir = tmp.path().join("fake");
    let sim_dir = tmp.path().join("sim");
    let fake = fake_tools(&fake_dir);
    let sim = Tools::simulated(Path::new(env!("CARGO_BIN_EXE_gpu-dra")), &sim_dir)
        .expect("simulated tools");
    println!("MPS daemon start, {RUNS} runs each (p50 / p99)");
    for (name, tools, dir) in [
        ("fake bash tools", fake, fake_dir),
        ("simulated tools", sim, sim_dir),
    ] {
        let root = dir.join("mps");
        let _reaper = Reaper(root.clone());
        let manager = MpsManager::new(tools.clone(), &root, MpsOptions::default());
        for (label, spec) in [
            ("no limits, MIG only", bare_spec()),
            ("GPU + limits", limited_spec()),
        ] {
            let start = sample(|| {
                let t = Instant::now();
                manager.start(&spec).expect("start");
                let took = t.elapsed();
                manager.stop(&spec.id, &spec.devices).expect("stop");
                took
            });
            let bare = sample(|| bare_tools(&tools, &root.join("bare"), &spec));
            let overhead = start.0.as_secs_f64() - bare.0.as_secs_f64();
            println!(
                "{name:16} {label:20} start() {} | tools alone {} | plugin overhead p50 {:.1} ms",
                fmt(start),
                fmt(bare),
                overhead * 1e3
            );
        }
    }
}

fn bare_spec() -> MpsDaemonSpec {
    MpsDaemonSpec {
        id: "bench".into(),
        devices: vec![mig("MIG-bb22")],
        active_thread_percentage: None,
        pinned_memory_bytes: Vec::new(),
        multi_user: false,
    }
}

fn limited_spec() -> MpsDaemonSpec {
    MpsDaemonSpec {
        id: "bench".into(),
        devices: vec![gpu("GPU-aa11")],
        active_thread_percentage: Some(50),
        pinned_memory_bytes: vec![Some(4096 << 20)],
        multi_user: false,
    }
}

/// The same tool calls start() makes, run directly: nvidia-smi per full GPU, `-d`, the first
/// answer, then the limit set/get pairs. Returns the time up to the last answer; the daemon is
/// then quit (not timed).
fn bare_tools(tools: &Tools, base: &Path, spec: &MpsDaemonSpec) -> Duration {
    let (pipe, log) = (base.join("pipe"), base.join("log"));
    fs::create_dir_all(&pipe).expect("pipe dir");
    fs::create_dir_all(&log).expect("log dir");
    let t = Instant::now();
    for d in spec.devices.iter().filter(|d| d.full_gpu) {
        let ok = Command::new(&tools.nvidia_smi)
            .args(["-i", &d.uuid, "-c", "EXCLUSIVE_PROCESS"])
            .envs(tools.env.iter().cloned())
            .stdout(Stdio::null())
            .status()
            .expect("nvidia-smi");
        assert!(ok.success());
    }
    let uuids: Vec<&str> = spec.devices.iter().map(|d| d.uuid.as_str()).collect();
    let started = Command::new(&tools.mps_control)
        .arg("-d")
        .envs(tools.env.iter().cloned())
        .env("CUDA_VISIBLE_DEVICES", uuids.join(","))
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("-d");
    assert!(started.success());
    while ask(tools, &pipe, "get_default_active_thread_percentage").is_none() {}
    if let Some(p) = spec.active_thread_percentage {
        ask(
            tools,
            &pipe,
            &format!("set_default_active_thread_percentage {p}"),
        );
        ask(tools, &pipe, "get_default_active_thread_percentage");
    }
    for (i, b) in spec.pinned_memory_bytes.iter().enumerate() {
        if let Some(b) = b {
            ask(
                tools,
                &pipe,
                &format!("set_default_device_pinned_mem_limit {i} {}M", b >> 20),
            );
            ask(
                tools,
                &pipe,
                &format!("get_default_device_pinned_mem_limit {i}"),
            );
        }
    }
    let took = t.elapsed();
    ask(tools, &pipe, "quit");
    let pid_file = pipe.join("nvidia-cuda-mps-control.pid");
    while pid_file.exists() {
        std::thread::yield_now();
    }
    let _ = fs::remove_dir_all(base);
    took
}

fn ask(tools: &Tools, pipe: &Path, command: &str) -> Option<String> {
    let mut child = Command::new(&tools.mps_control)
        .envs(tools.env.iter().cloned())
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("client");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{command}\n").as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// p50 and p99 of `RUNS` runs.
fn sample(mut run: impl FnMut() -> Duration) -> (Duration, Duration) {
    let mut times: Vec<Duration> = (0..RUNS).map(|_| run()).collect();
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

fn fmt((p50, p99): (Duration, Duration)) -> String {
    format!(
        "{:6.1} / {:6.1} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    )
}
