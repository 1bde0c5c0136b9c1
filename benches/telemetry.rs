//! Cost of per-device telemetry on a node with 8 GPUs × 7 MIG devices (64 devices, each
//! held by a claim with one pod): one sample of the simulated backend, the join with the
//! checkpoint's claims and their pods and the families built from it (once per
//! `--telemetry-interval`), and one scrape (`/metrics` rendered with the last sample). Prints figures; asserts
//! nothing. Run with `cargo bench --bench telemetry`.

use std::hint::black_box;
use std::time::Instant;

use gpu_dra::checkpoint::{Checkpoint, ClaimPhase, ClaimRecord, DeviceRecord};
use gpu_dra::devices::mig_device_name;
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::metrics::Metrics;
use gpu_dra::plugin::holders::{ClaimPods, PodRef};
use gpu_dra::plugin::telemetry::rows;

fn time<R>(what: &str, iterations: u32, mut f: impl FnMut() -> R) {
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(f());
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    println!("{what:<60} {per:>10.1} µs/op");
}

/// A DGX H100 with seven 1g.10gb MIG devices carved on every GPU, and a checkpoint in which
/// each MIG device is held by its own claim, with one pod each.
fn node() -> (SimBackend, Checkpoint, ClaimPods) {
    let sim = SimBackend::open("dgx-h100", None).expect("preset");
    let inventory = sim.inventory().expect("inventory");
    let mut checkpoint = Checkpoint::new("boot");
    let mut pods = ClaimPods::new();
    for gpu in &inventory.gpus {
        let profile = gpu.profile_by_name("1g.10gb").expect("1g.10gb").clone();
        for &start in &profile.placement_starts {
            let Ok(mig) = sim.create_mig_device(gpu.index, profile.id, start) else {
                continue;
            };
            let uid = format!("uid-{}-{start}", gpu.index);
            checkpoint.claims.insert(
                uid.clone(),
                ClaimRecord {
                    uid: uid.clone(),
                    namespace: format!("team-{}", gpu.index % 3),
                    name: format!("claim-{}-{start}", gpu.index),
                    phase: ClaimPhase::PrepareCompleted,
                    devices: vec![DeviceRecord {
                        request_names: vec!["mig".into()],
                        pool: "dgx-h100".into(),
                        device: mig_device_name(gpu.minor, &profile.name, start),
                        share_id: None,
                        cdi_device_ids: vec![],
                        gpu_uuid: gpu.uuid.clone(),
                        mig: None,
                        sharing: None,
                        vfio: None,
                        vgpu: None,
                    }],
                    updated_unix: 0,
                    fabric_partition: None,
                },
            );
            let pod = PodRef {
                name: format!("pod-{}-{}", gpu.index, mig.gi_id),
                uid: format!("pod-uid-{uid}"),
            };
            pods.insert(uid, vec![pod]);
        }
    }
    (sim, checkpoint, pods)
}

fn main() {
    println!("gpu-dra per-device telemetry, 8 GPUs × 7 MIG devices");
    let (sim, checkpoint, pods) = node();
    let sample = sim.telemetry().expect("telemetry");
    let devices: usize = sample.gpus.iter().map(|g| 1 + g.mig.len()).sum();
    let metrics = Metrics::new();
    metrics.set_device_telemetry(&rows(&sample, Some(&checkpoint), &pods));
    let text = metrics.render();
    let series = text
        .lines()
        .filter(|l| l.starts_with("gpu_dra_device_"))
        .count();
    println!(
        "{devices} devices, {series} gpu_dra_device_* series, /metrics {} bytes",
        text.len()
    );
    time(
        "sample: SimBackend::telemetry (in-memory state)",
        200,
        || sim.telemetry(),
    );
    time("join: rows(sample, checkpoint, pods)", 2_000, || {
        rows(&sample, Some(&checkpoint), &pods)
    });
    let joined = rows(&sample, Some(&checkpoint), &pods);
    time("publish: Metrics::set_device_telemetry", 2_000, || {
        metrics.set_device_telemetry(&joined)
    });
    time(
        "scrape: Metrics::render (whole /metrics body)",
        2_000,
        || metrics.render(),
    );
    let bare = Metrics::new();
    time("scrape without telemetry (for comparison)", 2_000, || {
        bare.render()
    });
}
