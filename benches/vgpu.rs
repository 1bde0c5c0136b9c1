//! vGPU prepare as the Helm chart deploys it (`cargo bench --bench vgpu`): the real binary
//! with `--vgpu-types` on its kubelet sockets, the simulated HGX H100 whose sysfs (VFs,
//! `/dev/vfio`) the simulator keeps, the chart's malloc settings, CDI specs and metadata files
//! on a tmpfs, and a fake API server modelled on a real one as `benches/prepare.rs` and
//! `benches/vfio.rs` model it (TLS with client certificates, GETs after
//! `GPU_DRA_BENCH_GET_LATENCY_US`, default 3,500 µs with 800 µs of it busy on this machine's
//! cores, writes after
//! `GPU_DRA_BENCH_WRITE_LATENCY_US`, default 2,000 µs; `benches/support/api_model.rs`).
//!
//! Reports, over `ROUNDS` prepare/unprepare cycles of one claim each (p50 / p99):
//! - the floor: a prepare of a claim that does not exist (one GET → 404);
//! - a vdev vGPU claim (`vgpu-0-4c-0`): the checks (sysfs scan, `/proc` for holders), the
//!   intent, `current_vgpu_type` written and read back, CDI spec, device metadata; and its
//!   unprepare (write 0);
//! - a full-GPU claim on another GPU of the same plugin, for comparison.
//!
//! Target (issue 47): a vGPU prepare p50 < 10 ms including the modelled API-server latency.
//! Wall times on a shared 2-core machine are noisy; the p50 of many rounds is what to read.

#[path = "support/api_model.rs"]
mod api_model;
#[path = "support/cycles.rs"]
mod cycles;
#[path = "../tests/plugin_support/mod.rs"]
mod plugin_support;
#[path = "support/tmpfs.rs"]
mod tmpfs;

use std::time::Duration;

use api_model::Latency;
use cycles::{Figures, cycle, ms};
use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims::{self, claim_ref};
use plugin_support::{Node, chart_malloc_env, eventually};

const ROUNDS: usize = 200;
const PRESET: &str = "hgx-h100-vgpu";

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tmpfs = tmpfs::parent(&std::env::temp_dir());
        println!(
            "vGPU, {ROUNDS} cycles each, simulated {PRESET} with --vgpu-types H100-4C; CDI specs and metadata in {} ({})",
            tmpfs.display(),
            tmpfs::fs_type(&tmpfs)
        );
        let node = Node::new_tls_in(&std::env::temp_dir())
            .with_sim_node(PRESET)
            .with_cdi_in(&tmpfs)
            .with_metadata_in(&tmpfs);
        node.api
            .put_claim(claims::on_node("vm", "uid-vm", &["vgpu-0-4c-0"]));
        node.api
            .put_claim(claims::on_node("pod", "uid-pod", &["gpu-2"]));
        Latency::from_env().apply(&node.api);
        let mut command = node.chart_command_on(PRESET);
        command.args(["--vgpu-types", "H100-4C"]);
        let mut plugin = node.spawn_command(command, chart_malloc_env());
        plugin.wait_registrable().await;
        let mut kubelet = plugin.register(DraApi::V1).await;
        eventually("slices published", || node.api.complete_pool().map(drop)).await;
        let (vm, pod) = (claim_ref("vm", "uid-vm"), claim_ref("pod", "uid-pod"));
        // Warm up: connections, caches, the first spec file, MIG mode off on GPU 0.
        for _ in 0..10 {
            cycle(&mut kubelet, &vm).await;
            cycle(&mut kubelet, &pod).await;
        }
        let floor = cycles::floor(&mut kubelet, ROUNDS).await;
        let (mut vgpu, mut full) = (Figures::default(), Figures::default());
        for _ in 0..ROUNDS {
            vgpu.push(cycle(&mut kubelet, &vm).await);
            full.push(cycle(&mut kubelet, &pod).await);
        }
        vgpu.sort();
        full.sort();
        println!(
            "floor (prepare of a claim that does not exist: one GET -> 404, TLS): p50 {:.3} ms",
            ms(floor)
        );
        println!("{}", vgpu.line("vGPU claim (vdev, H100-4C)"));
        println!("{}", full.line("full-GPU claim"));
        let (p50, _) = vgpu.p50();
        println!(
            "vGPU over full GPU: {:+.3} ms p50 (the checks, the sysfs write and read-back)",
            ms(p50) - ms(full.p50().0)
        );
        let verdict = if p50 < Duration::from_millis(10) {
            "met"
        } else {
            "NOT met"
        };
        println!(
            "target vGPU prepare p50 < 10 ms: {verdict} ({:.3} ms with the API server's latencies; {:.3} ms above the floor)",
            ms(p50),
            ms(p50) - ms(floor)
        );
    });
}
