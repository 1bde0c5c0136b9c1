//! VFIO passthrough as the Helm chart deploys it (`cargo bench --bench vfio`): the real
//! binary with `--passthrough` on its kubelet sockets, the simulated HGX H100 whose host tree
//! (sysfs, `/dev/vfio`) the simulator keeps, the chart's malloc settings, and a fake API
//! server modelled on a real one as `benches/prepare.rs` models it: TLS with client
//! certificates, GETs answered after `GPU_DRA_BENCH_GET_LATENCY_US` (default 3,500 µs, 800 µs
//! of it busy on this machine's cores) and
//! writes (the claim-status PUT) after `GPU_DRA_BENCH_WRITE_LATENCY_US` (default 2,000 µs),
//! as `benches/support/api_model.rs` sets them for both benches.
//! The floor (a prepare of a claim that does not exist: one GET → 404) is reported too, so
//! what the plugin adds is the p50 above it.
//!
//! Reports, over `ROUNDS` prepare/unprepare cycles of one claim each (p50 / p99):
//! - a VFIO claim (`gpu-vfio-1`, enableAPIDevice): checks, persistence off, the sysfs driver
//!   switch to vfio-pci, CDI spec, device metadata; and its unprepare (switch back);
//! - a full-GPU claim on another GPU, for comparison (same node, same plugin);
//! - both again with `--device-metadata=false`: the metadata file's cost per claim.
//!
//! Targets (issue 32): VFIO prepare p50 < 5 ms; device metadata adds < 50 µs per claim.
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
use serde_json::json;

const ROUNDS: usize = 200;
const PRESET: &str = "hgx-h100-passthrough";

/// Runs `ROUNDS` cycles of a VFIO claim and of a full-GPU claim, interleaved, on one plugin.
async fn measure(metadata: bool) -> (Figures, Figures, Duration) {
    // CDI specs and metadata files on a tmpfs, as the chart keeps them.
    let tmpfs = tmpfs::parent(&std::env::temp_dir());
    let node = Node::new_tls_in(&std::env::temp_dir())
        .with_sim_node(PRESET)
        .with_cdi_in(&tmpfs)
        .with_metadata_in(&tmpfs);
    let vm = claims::on_node_with_config(
        "vm",
        "uid-vm",
        &["gpu-vfio-1"],
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
               "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": true}}),
    );
    node.api.put_claim(vm);
    node.api
        .put_claim(claims::on_node("pod", "uid-pod", &["gpu-2"]));
    Latency::from_env().apply(&node.api);
    let mut command = node.chart_command_on(PRESET);
    command.args(["--passthrough", &format!("--device-metadata={metadata}")]);
    let mut plugin = node.spawn_command(command, chart_malloc_env());
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("slices published", || node.api.complete_pool().map(drop)).await;
    let (vm, pod) = (claim_ref("vm", "uid-vm"), claim_ref("pod", "uid-pod"));
    // Warm up: connections, caches, the first spec file.
    for _ in 0..10 {
        cycle(&mut kubelet, &vm).await;
        cycle(&mut kubelet, &pod).await;
    }
    let floor = cycles::floor(&mut kubelet, ROUNDS).await;
    let (mut vfio, mut full) = (Figures::default(), Figures::default());
    for _ in 0..ROUNDS {
        vfio.push(cycle(&mut kubelet, &vm).await);
        full.push(cycle(&mut kubelet, &pod).await);
    }
    vfio.sort();
    full.sort();
    (vfio, full, floor)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tmpfs = tmpfs::parent(&std::env::temp_dir());
        println!(
            "VFIO passthrough, {ROUNDS} cycles each, simulated {PRESET}; CDI specs and metadata in {} ({})",
            tmpfs.display(),
            tmpfs::fs_type(&tmpfs)
        );
        let (vfio_on, full_on, floor) = measure(true).await;
        let (vfio_off, full_off, _) = measure(false).await;
        println!(
            "floor (prepare of a claim that does not exist: one GET -> 404, TLS): p50 {:.3} ms",
            ms(floor)
        );
        println!("{}", vfio_on.line("VFIO claim (metadata on)"));
        println!("{}", full_on.line("full-GPU claim (metadata on)"));
        println!("{}", vfio_off.line("VFIO claim (metadata off)"));
        println!("{}", full_off.line("full-GPU claim (metadata off)"));
        let (vfio_p50, _) = vfio_on.p50();
        let metadata_cost = |on: &Figures, off: &Figures| {
            on.p50().0.as_secs_f64() - off.p50().0.as_secs_f64()
        };
        let cost_vfio = metadata_cost(&vfio_on, &vfio_off) * 1e6;
        let cost_full = metadata_cost(&full_on, &full_off) * 1e6;
        println!(
            "VFIO over full GPU: {:+.3} ms p50 (the checks, persistence, the switch)",
            ms(vfio_p50) - ms(full_on.p50().0)
        );
        println!(
            "device metadata per claim (p50 on − off): VFIO {cost_vfio:+.0} µs, full GPU {cost_full:+.0} µs"
        );
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        println!(
            "target VFIO prepare p50 < 5 ms: {} ({:.3} ms with the API server's latencies; {:.3} ms above the floor)",
            verdict(vfio_p50 < Duration::from_millis(5)),
            ms(vfio_p50),
            ms(vfio_p50) - ms(floor)
        );
        let cost = cost_vfio.max(cost_full);
        println!(
            "target metadata < 50 µs per claim: {} ({cost:.0} µs, the larger of the two; noise on this machine is ± tens of µs)",
            verdict(cost < 50.0)
        );
    });
}
