//! An idle plugin's wake-ups, by counting (house rule 15). On the VMs the plugin runs on, a
//! wake-up costs 0.1–0.5 ms of CPU however little follows it, so an idle plugin's CPU is its
//! number of wake-ups (docs/architecture.md, "Idle wake-ups"). The plugin as the chart runs it
//! (10 s rounds), registered with a kubelet and published, is left alone for a few seconds,
//! and its main thread's context switches — one per wake-up of its single-threaded runtime —
//! are counted. The health poll this replaced woke it about ten times a second.

mod plugin_support;

use std::time::Duration;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::{Node, PRESET, eventually};

/// How long the plugin is watched.
const WATCHED: Duration = Duration::from_secs(4);

/// Wake-ups allowed in [`WATCHED`]: one regular round (inventory, telemetry, usage and
/// supervision on the shared timer grid, each handing work to a blocking thread and taking
/// its answer back) and one socket check, with the timer wheel's cascades. The 200 ms health
/// poll alone came to about 40.
const MOST: u64 = 20;

/// Context switches of process `pid`'s main thread so far, voluntary and not.
fn main_thread_switches(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn an_idle_plugin_wakes_only_for_its_rounds() {
    let node = Node::new();
    let mut plugin = node.spawn_command(node.chart_command_on(PRESET), &[]);
    plugin.wait_registrable().await;
    let _kubelet = plugin.register(DraApi::V1).await;
    eventually("the pool published", || node.api.complete_pool()).await;
    // Past start-up's own work and the publisher's second look 5 s after the registration.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let before = main_thread_switches(plugin.pid());
    tokio::time::sleep(WATCHED).await;
    let woke = main_thread_switches(plugin.pid()) - before;
    assert!(
        woke <= MOST,
        "the idle plugin woke {woke} times in {WATCHED:?} (at most {MOST}): something polls \
         again\n{}",
        plugin.log()
    );
    assert!(plugin.is_running());
}
