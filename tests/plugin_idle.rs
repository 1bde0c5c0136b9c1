//! An idle plugin's wake-ups, by counting (house rule 15). On the VMs the plugin runs on, a
//! wake-up costs 0.1–0.5 ms of CPU however little follows it, so an idle plugin's CPU is its
//! number of wake-ups (docs/architecture.md, "Idle wake-ups"). The plugin as the chart runs it
//! (10 s rounds), registered with a kubelet and published, is left alone for a few seconds,
//! and its main thread's context switches — one per wake-up of its single-threaded runtime —
//! are counted, and on the NVML backend those of its event thread. The health poll this
//! replaced woke it about ten times a second; the event thread's 100 ms waits did too.

mod plugin_support;

use std::time::Duration;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::{Node, PRESET, claims, eventually, prepare_all, unprepare_all};

/// How long the plugin is watched.
const WATCHED: Duration = Duration::from_secs(4);

/// Wake-ups allowed in [`WATCHED`]: one regular round (inventory, telemetry, usage and
/// supervision on the shared timer grid, each handing work to a blocking thread and taking
/// its answer back) and one socket check, with the timer wheel's cascades. The 200 ms health
/// poll alone came to about 40.
const MOST: u64 = 20;

/// Wake-ups allowed in [`WATCHED`] to the NVML backend's event thread: one 5 s wait ends,
/// and a look for added GPUs every other wait. With its old 100 ms waits it woke about 40
/// times.
const MOST_EVENT_THREAD: u64 = 3;

/// Context switches of process `pid`'s main thread so far, voluntary and not.
fn main_thread_switches(pid: u32) -> u64 {
    switches(&format!("/proc/{pid}/status"))
}

/// Context switches so far of `pid`'s thread named `name`, if it has one.
fn thread_switches(pid: u32, name: &str) -> Option<u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .filter_map(Result::ok)
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .map(|t| switches(&t.path().join("status").to_string_lossy()))
}

fn switches(status: &str) -> u64 {
    let status = std::fs::read_to_string(status).expect("status");
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
    let events_before = thread_switches(plugin.pid(), "nvml-events");
    tokio::time::sleep(WATCHED).await;
    let woke = main_thread_switches(plugin.pid()) - before;
    // The NVML backend's event thread blocks in the (simulated) library's wait, which ends
    // only at an event or its timeout, as a real driver's does.
    if let Some(before) = events_before {
        let after = thread_switches(plugin.pid(), "nvml-events").expect("the event thread");
        let events_woke = after - before;
        eprintln!("the NVML event thread woke {events_woke} times in {WATCHED:?}");
        assert!(
            events_woke <= MOST_EVENT_THREAD,
            "the NVML event thread woke {events_woke} times in {WATCHED:?} (at most \
             {MOST_EVENT_THREAD})"
        );
    } else {
        assert!(
            !plugin_support::nvml_backend(),
            "the NVML backend runs an nvml-events thread"
        );
    }
    assert!(
        woke <= MOST,
        "the idle plugin woke {woke} times in {WATCHED:?} (at most {MOST}): something polls \
         again\n{}",
        plugin.log()
    );
    assert!(plugin.is_running());
}

/// KiB of process `pid`'s executable resident in its read-only mappings (code and
/// constants), read from `/proc/<pid>/smaps`: what the kubelet's calls map and
/// `plugin::memory::release_after_calls` unmaps again.
fn resident_code_kib(pid: u32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut counting = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, permissions, offset, device, inode, path.
            let perms = fields.next().unwrap_or("");
            let path = fields.nth(3).unwrap_or("");
            counting = std::path::Path::new(path) == exe && perms.as_bytes().get(1) == Some(&b'-');
        } else if counting && first == "Rss:" {
            kib += fields
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    kib
}

/// A burst of kubelet calls maps the code they run (TLS, HTTP, gRPC, JSON, the claims'
/// lifecycle); an idle plugin gives it back once the calls are over, after each burst and
/// not only the first (start-up's own release happens once). Counted in resident pages, not
/// timed: the plugin has [`plugin_support`]'s patience to do it.
#[tokio::test]
async fn after_each_burst_of_calls_the_plugin_unmaps_the_code_they_ran() {
    let node = Node::new();
    let node_file = plugin_support::static_mig_node_file(&node);
    let refs = claims::one_per_device(&node.api, &plugin_support::static_mig_devices(4));
    let mut plugin = node.spawn_command(node.chart_command_on(&node_file), &[]);
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("the pool published", || node.api.complete_pool()).await;
    let pid = plugin.pid();

    for burst in 1..=2 {
        for claim in &refs {
            prepare_all(&mut kubelet, std::slice::from_ref(claim)).await;
        }
        prepare_all(&mut kubelet, &refs).await;
        unprepare_all(&mut kubelet, &refs).await;
        let after_calls = resident_code_kib(pid);
        let released = eventually("the code the calls ran given back", || {
            let now = resident_code_kib(pid);
            (now * 2 < after_calls).then_some(now)
        })
        .await;
        eprintln!(
            "burst {burst}: {after_calls} KiB of code resident after the calls, {released} KiB \
             once released"
        );
        assert!(plugin.is_running(), "{}", plugin.log());
    }
}
