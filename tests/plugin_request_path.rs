//! The guard of the kubelet's request path, by counting (house rule 15): the real plugin
//! process, as the chart runs it (usage accounting, claim status, telemetry and holders on),
//! prepares and unprepares 1 and 10 claims per call, and what each call cost — fsyncs, file
//! writes and removals, CDI specs, full checkpoint parses, simulator state reads, API
//! requests — is read from its `gpu_dra_request_path_costs_total` and compared with the exact
//! budget. A change that adds any of them to the path fails here, naming the cost.
//!
//! The work one claim causes after its call answered — the claim-status write, files the
//! background tasks replace, requests, connections and TLS handshakes, watches — is held to
//! its budget the same way, from `gpu_dra_background_costs_total` and what the fake API
//! server saw.
//!
//! The node is the `prepare` bench's ([`plugin_support::STATIC_MIG_NODE`]): 8 A100-80GB with 7
//! static 1g.10gb MIG devices each and 8 L4, so no MIG device is carved.

mod plugin_support;

use std::collections::BTreeMap;

use std::time::Duration;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::apiserver::{ConnectionStats, path_pattern};
use plugin_support::claims;
use plugin_support::probe::{background_costs, metrics_addr};
use plugin_support::{Node, Plugin, eventually, prepare_all, unprepare_all};

/// A cost's counter, for one operation.
type Costs = BTreeMap<String, u64>;

fn costs(plugin: &Plugin, operation: &str) -> (u64, Costs) {
    plugin_support::probe::request_path_costs(&plugin.log(), operation)
        .expect("the request-path series in a scrape")
}

/// What one call of `operation` cost: the difference of the counters around `call`.
async fn measured<F: Future<Output = ()>>(
    plugin: &Plugin,
    operation: &str,
    call: F,
) -> (u64, Costs) {
    let (calls_before, before) = costs(plugin, operation);
    call.await;
    let (calls_after, after) = costs(plugin, operation);
    let diff = after
        .iter()
        .map(|(cost, n)| (cost.clone(), n - before.get(cost).copied().unwrap_or(0)))
        .collect();
    (calls_after - calls_before, diff)
}

fn budget(pairs: &[(&str, u64)]) -> Costs {
    let mut all: Costs = [
        "fsync",
        "file_write",
        "file_remove",
        "cdi_spec_write",
        "checkpoint_parse",
        "hardware_state_read",
        "api_request",
        "directory_list",
        "inventory_read",
        "sysfs_write",
    ]
    .into_iter()
    .map(|c| (c.to_string(), 0))
    .collect();
    for (cost, n) in pairs {
        all.insert(cost.to_string(), *n);
    }
    all
}

#[tokio::test]
async fn prepare_and_unprepare_cost_no_fsync_no_checkpoint_parse_one_get_per_claim_and_one_checkpoint_write_per_call()
 {
    let node = Node::new();
    let node_file = plugin_support::static_mig_node_file(&node);
    let devices = plugin_support::static_mig_devices(4);
    let refs = claims::one_per_device(&node.api, &devices);
    let mut plugin = node.spawn_command(node.command_on(&node_file), &[]);
    plugin.wait_registrable().await;
    eventually("slices", || node.api.complete_pool()).await;
    eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    // 1 on the NVML backend, whose inventory has no stamp: a call reads it.
    let nvml = u64::from(plugin_support::nvml_backend());

    for n in [1, 10] {
        let call = &refs[..n];
        let n = n as u64;
        let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, call)).await;
        // Per claim: its CDI spec and its device metadata file (KEP-5304); per call: the
        // checkpoint.
        let want = budget(&[
            ("file_write", 2 * n + 1),
            ("cdi_spec_write", n),
            ("api_request", n),
            ("inventory_read", nvml),
        ]);
        assert_eq!(got, (1, want), "prepare of {n} claim(s): calls and costs");

        let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, call)).await;
        assert_eq!(
            got,
            (1, budget(&[])),
            "a repeated prepare of {n} prepared claim(s) costs nothing"
        );

        let got = measured(&plugin, "unprepare", unprepare_all(&mut kubelet, call)).await;
        // One checkpoint write forgets them all; each claim's spec and metadata directory
        // go, and a `.yaml` spec of NVIDIA's driver for the same claim is looked for.
        let want = budget(&[
            ("file_write", 1),
            ("file_remove", 3 * n),
            ("inventory_read", nvml),
        ]);
        assert_eq!(got, (1, want), "unprepare of {n} claim(s): calls and costs");
    }
}

#[tokio::test]
async fn the_first_calls_after_a_restart_cost_what_every_call_costs() {
    let node = Node::new();
    let node_file = plugin_support::static_mig_node_file(&node);
    let devices = ["gpu-0-mig-1g10gb-0".to_string(), "gpu-8".to_string()];
    let refs = claims::one_per_device(&node.api, &devices);
    let command = || node.command_on(&node_file);
    let mut plugin = node.spawn_command(command(), &[]);
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    prepare_all(&mut kubelet, &refs[..1]).await;
    plugin.kill().await;

    // Start-up recovery reads the checkpoint (and lists the state and CDI directories) once;
    // the first kubelet calls then take it from memory.
    let mut plugin = node.spawn_command(command(), &[]);
    plugin.wait_registrable().await;
    eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    // 1 on the NVML backend, whose inventory has no stamp: a call reads it (the model it
    // builds was built before the plugin served).
    let nvml = u64::from(plugin_support::nvml_backend());
    let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, &refs[1..])).await;
    let want = budget(&[
        ("file_write", 3),
        ("cdi_spec_write", 1),
        ("api_request", 1),
        ("inventory_read", nvml),
    ]);
    assert_eq!(got, (1, want), "the first prepare after a restart");
    let got = measured(
        &plugin,
        "unprepare",
        unprepare_all(&mut kubelet, &refs[..1]),
    )
    .await;
    let want = budget(&[
        ("file_write", 1),
        ("file_remove", 3),
        ("inventory_read", nvml),
    ]);
    assert_eq!(got, (1, want), "the first unprepare after a restart");
}

/// Everything the plugin did outside the kubelet's calls, as counted at one moment: its
/// background tally, the requests the API server saw (method and path pattern, `watch` marked)
/// and the connections it accepted.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    costs: Costs,
    requests: BTreeMap<String, u64>,
    connections: ConnectionStats,
}

fn seen(plugin: &Plugin, node: &Node) -> Seen {
    let mut requests = BTreeMap::new();
    for r in node.api.requests() {
        let watch = if r
            .query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1")
        {
            " (watch)"
        } else {
            ""
        };
        let key = format!("{} {}{watch}", r.method, path_pattern(&r.path));
        *requests.entry(key).or_insert(0) += 1;
    }
    Seen {
        costs: background_costs(&plugin.log()).expect("the background series in a scrape"),
        requests,
        connections: node.api.connection_stats(),
    }
}

/// Waits until nothing the plugin does changes for 1.5 s (its claim-status worker waits
/// 20 ms before it writes, its usage ledger 1 s after an end; after starts alone it waits
/// 10 s, which the prepares below leave pending for the unprepare that follows) and returns
/// what it has done by then.
async fn settled(plugin: &Plugin, node: &Node) -> Seen {
    let mut last = seen(plugin, node);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let now = seen(plugin, node);
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("the plugin never went quiet: still busy after 30 s, last seen {last:?}");
}

/// The costs in `pairs`, and no other.
fn budget_of(pairs: &[(&str, u64)]) -> Costs {
    pairs.iter().map(|(c, n)| (c.to_string(), *n)).collect()
}

/// What the plugin did between two [`Seen`]s: costs and requests that grew, connections
/// accepted and full TLS handshakes.
#[derive(Debug, PartialEq)]
struct Caused {
    costs: Costs,
    requests: BTreeMap<String, u64>,
    accepted: u64,
    full_handshakes: u64,
}

const READ_CLAIM: &str = "GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}";
const WRITE_STATUS: &str =
    "PUT /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status";

impl Caused {
    fn between(before: &Seen, after: &Seen) -> Caused {
        let grown = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            b.iter()
                .filter_map(|(k, n)| {
                    let d = n - a.get(k).copied().unwrap_or(0);
                    (d > 0).then(|| (k.clone(), d))
                })
                .collect::<BTreeMap<_, _>>()
        };
        let connections = after.connections.since(&before.connections);
        Caused {
            costs: grown(&before.costs, &after.costs),
            requests: grown(&before.requests, &after.requests),
            accepted: connections.accepted,
            full_handshakes: connections.full_handshakes,
        }
    }

    /// `requests` and the background costs of `claims` status writes and `ledger_writes`
    /// usage ledger writes (each a file and its directory synced), on the connections
    /// already open.
    fn budget(claims: u64, ledger_writes: u64, requests: &[(&str, u64)]) -> Caused {
        let mut costs = vec![("api_request", claims)];
        if ledger_writes > 0 {
            costs.extend([("file_write", ledger_writes), ("fsync", 2 * ledger_writes)]);
        }
        Caused {
            costs: budget_of(&costs),
            requests: requests.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            accepted: 0,
            full_handshakes: 0,
        }
    }
}

/// A node with its claims and its plugin, registered.
type BenchPlugin = (
    Node,
    Vec<gpu_dra::kubelet::ClaimRef>,
    Plugin,
    gpu_dra::kubelet::client::KubeletClient,
);

/// The `prepare` bench's node over TLS with a claim per device of `devices`, and the plugin
/// as the chart runs it with its inventory, telemetry and holders rounds every `interval`,
/// registered and published, its metrics served.
async fn static_mig_plugin(devices: &[String], interval: &str) -> BenchPlugin {
    bench_node_plugin(devices, [interval; 3], |node, file| {
        node.chart_command_on(file)
    })
    .await
}

/// The `prepare` bench's node over TLS with a claim per device of `devices`, and the plugin
/// `command` makes for the node file, with its inventory, telemetry and holders rounds at
/// `rounds`, registered and published, its metrics served.
async fn bench_node_plugin(
    devices: &[String],
    rounds: [&str; 3],
    command: impl FnOnce(&Node, &str) -> std::process::Command,
) -> BenchPlugin {
    let node = Node::new_tls_in(&std::env::temp_dir());
    let node_file = plugin_support::static_mig_node_file(&node);
    let refs = claims::one_per_device(&node.api, devices);
    let mut command = command(&node, &node_file);
    let [inventory, telemetry, holders] = rounds;
    command.args([
        "--inventory-interval",
        inventory,
        "--telemetry-interval",
        telemetry,
        "--holders-refresh-interval",
        holders,
    ]);
    let mut plugin = node.spawn_command(command, &[]);
    plugin.wait_registrable().await;
    eventually("slices", || node.api.complete_pool()).await;
    eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let kubelet = plugin.register(DraApi::V1).await;
    (node, refs, plugin, kubelet)
}

#[tokio::test]
async fn after_its_call_a_claim_costs_one_status_write_a_share_of_one_ledger_write_no_watch_and_no_new_connection()
 {
    let devices = plugin_support::static_mig_devices(4);
    // As the chart runs it, with its periodic passes (inventory, telemetry, holders, each a
    // per-node cost the idle figures measure) pushed out of the test's minutes, so that
    // everything counted is what the claims caused.
    let (node, refs, plugin, mut kubelet) = static_mig_plugin(&devices, "60m").await;
    // Every claim through its whole life once first, in one call, so the connections the
    // plugin keeps are open: kube-rs speaks HTTP/1.1, so a call's concurrent reads each need
    // a connection, opened (with a TLS handshake) the first time so many run at once and
    // kept idle for 90 s. And the publisher's second look at its slices after the
    // registration (`REPUBLISH_AGAIN`, one list) is over before anything is counted.
    prepare_all(&mut kubelet, &refs).await;
    unprepare_all(&mut kubelet, &refs).await;
    tokio::time::sleep(gpu_dra::plugin::observe::REPUBLISH_AGAIN).await;

    for n in [1usize, 10] {
        let call = &refs[..n];
        let count = n as u64;
        let before = settled(&plugin, &node).await;
        let started = std::time::Instant::now();
        prepare_all(&mut kubelet, call).await;
        let after = settled(&plugin, &node).await;
        // The starts' ledger write is due `START_FLUSH_DELAY` after them: in this window
        // only if settling took that long (a slow machine), never otherwise.
        let start_write_due = started.elapsed() >= gpu_dra::plugin::usage::START_FLUSH_DELAY;
        let caused = Caused::between(&before, &after);
        for claim in call {
            let status = node.api.claim(&claim.namespace, &claim.name).unwrap();
            assert!(
                status["status"]["devices"]
                    .as_array()
                    .is_some_and(|d| !d.is_empty()),
                "claim {} shows its devices after the prepare",
                claim.name
            );
        }
        // The call read each claim (its own budget, above); afterwards the status worker
        // writes each once, starting from that read: no second GET, no new connection, no
        // watch. The usage ledger is not written yet: starts wait up to
        // `START_FLUSH_DELAY` (a crash loses none of them; the checkpoint has them).
        let start_writes = u64::from(start_write_due && caused.costs.contains_key("fsync"));
        assert_eq!(
            caused,
            Caused::budget(
                count,
                start_writes,
                &[(READ_CLAIM, count), (WRITE_STATUS, count)]
            ),
            "what a prepare of {n} claim(s) caused, beyond the call: background costs, \
             requests by verb and path, connections accepted, TLS handshakes"
        );

        unprepare_all(&mut kubelet, call).await;
        let last = settled(&plugin, &node).await;
        // The ends, and the starts before them, go into one ledger write a second after
        // the call (the file and its directory synced: billing must survive a power cut).
        assert_eq!(
            Caused::between(&after, &last),
            Caused::budget(count, 1, &[(WRITE_STATUS, count)]),
            "what an unprepare of {n} claim(s) caused: one status write per claim, from the \
             claim as the last write left it, and one ledger write"
        );
    }
}

/// The plugin's periodic rounds — inventory, telemetry, holders, usage, MPS supervision —
/// each look at the checkpoint. With claims prepared and no call running, the file is parsed
/// at most once after its last write, not once per reader per round (each round parsed it
/// about four times before: 2.5 million instructions a read at 50 claims).
#[tokio::test]
async fn periodic_rounds_parse_an_unchanged_checkpoint_at_most_once() {
    let devices: Vec<String> = (0..7).map(|i| format!("gpu-0-mig-1g10gb-{i}")).collect();
    let (_node, refs, plugin, mut kubelet) = static_mig_plugin(&devices, "1").await;
    prepare_all(&mut kubelet, &refs).await;
    let parses = |plugin: &Plugin| {
        background_costs(&plugin.log())
            .expect("the background series in a scrape")
            .get("checkpoint_parse")
            .copied()
            .unwrap_or(0)
    };
    // Past the claim-status writes and a first round of every reader.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = parses(&plugin);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = parses(&plugin);
    assert!(
        after - before <= 1,
        "{} checkpoint parses in 5 s of rounds every second with nothing written (at most \
         1)",
        after - before
    );
    unprepare_all(&mut kubelet, &refs).await;
}

/// A VM's claim (`--passthrough`, the simulated HGX H100 with its host tree, dynamic MIG). The
/// driver switch has something to undo, so the checkpoint is written twice on each side
/// (intent and completion; marked and forgotten), never parsed. The simulated GPU's own
/// state (MIG mode and persistence mode, which a real GPU keeps) is written durably by the
/// simulator: with the sim backend that happens in the plugin's process and counts here
/// (writes, fsyncs, reads); on the NVML backend it happens in the simulated NVML library,
/// as a driver's work would, and does not. The plugin itself fsyncs nothing. The sysfs
/// writes of the switch are not files it replaces: they count as `sysfs_write`.
#[tokio::test]
async fn a_vfio_prepare_and_unprepare_cost_two_checkpoint_writes_each_and_no_parse() {
    let node = Node::new().with_sim_node("hgx-h100-passthrough");
    node.api
        .put_claim(claims::on_node("vm", "uid-vm", &["gpu-vfio-0"]));
    let mut command = node.command();
    command
        .arg("--passthrough")
        .arg("--host-root")
        .arg(node.state_dir().join("sim/host-root"));
    let mut plugin = node.spawn_command(command, &[]);
    plugin.wait_registrable().await;
    eventually("slices", || node.api.complete_pool()).await;
    eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let refs = [claims::claim_ref("vm", "uid-vm")];

    // 1 where the simulator's own file work counts as the plugin's (the sim backend).
    let sim = u64::from(!plugin_support::nvml_backend());
    let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, &refs)).await;
    // Files: the checkpoint twice, the CDI spec, the metadata file; and the simulated GPU's
    // state twice (MIG mode off, persistence off), each of those with two fsyncs. The state
    // is read once for the wave's inventory and again around each of its changes.
    let want = budget(&[
        ("api_request", 1),
        ("file_write", 4 + 2 * sim),
        ("cdi_spec_write", 1),
        ("fsync", 4 * sim),
        ("hardware_state_read", 5 * sim),
        // The driver switch: driver_override cleared, unbind, driver_override, bind.
        ("sysfs_write", 4),
        // No listing of the PCI bus: the call plans with the inventory poll's kept scan,
        // and the checks read their own GPU and IOMMU group afresh.
        ("directory_list", 0),
        // The wave's inventory (a VFIO node's has no stamp: it adds the PCI view), and
        // NVML's record of the GPU again right before its switch.
        ("inventory_read", 2),
    ]);
    assert_eq!(got, (1, want), "prepare of a VFIO claim: calls and costs");

    let got = measured(&plugin, "unprepare", unprepare_all(&mut kubelet, &refs)).await;
    // The checkpoint twice and the simulated GPU's persistence mode back on (two fsyncs);
    // the spec and the metadata file go, and NVIDIA's `.yaml` spec is looked for.
    let want = budget(&[
        ("file_write", 2 + sim),
        ("file_remove", 3),
        ("fsync", 2 * sim),
        ("hardware_state_read", 2 * sim),
        // The switch back to nvidia.
        ("sysfs_write", 4),
        // No listing of the PCI bus either: NVML's record of the returned GPU comes with
        // the kept scan, which a driver switch does not make stale.
        ("directory_list", 0),
        // NVML's record of the GPU back on nvidia, for its persistence mode.
        ("inventory_read", 1),
    ]);
    assert_eq!(got, (1, want), "unprepare of a VFIO claim: calls and costs");
}

/// A vGPU claim on the simulated HGX H100 with VFs (`--vgpu-types H100-4C`): its prepare
/// reads its own parent GPU's sysfs directories — not the 256 VFs of the node, which the
/// inventory poll scans — and writes one kernel attribute; its unprepare writes one more.
/// The simulated kernel keeps a ledger of the vGPUs each GPU runs (replaced on each write,
/// in the plugin's process on both backends: it is the kernel's side of sysfs).
#[tokio::test]
async fn a_vgpu_claim_reads_only_its_parent_gpus_sysfs_and_writes_one_kernel_attribute_each_way() {
    let node = Node::new().with_sim_node("hgx-h100-vgpu");
    let host_root = node.state_dir().join("sim/host-root");
    let refs = claims::one_per_device(&node.api, &["vgpu-0-4c-0".to_string()]);
    let mut command = node.command();
    command
        .args(["--vgpu-types", "H100-4C"])
        .arg("--host-root")
        .arg(&host_root);
    let mut plugin = node.spawn_command(command, &[]);
    plugin.wait_registrable().await;
    eventually("slices", || node.api.complete_pool()).await;
    eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    // 1 where the simulator's own GPU state (MIG mode) is written in the plugin's process.
    let sim = u64::from(!plugin_support::nvml_backend());

    for first in [true, false] {
        let round = if first { "first" } else { "second" };
        // The parent GPU's directory, its mdev types and the mdev bus: listed once; the VF's
        // `current_vgpu_type` written; the checkpoint twice (intent and completion), the CDI
        // spec, the metadata file and the simulated kernel's ledger. The first prepare also
        // turns MIG mode off on GPU 0 (the simulated GPU's state, durably, read around it).
        let mig = u64::from(first) * sim;
        let want = budget(&[
            ("api_request", 1),
            ("cdi_spec_write", 1),
            ("directory_list", 3),
            ("file_write", 5 + mig),
            ("fsync", 2 * mig),
            ("hardware_state_read", 2 * mig),
            ("sysfs_write", 1),
            // The wave's inventory: a vGPU node's has no stamp (it adds the host's view).
            ("inventory_read", 1),
        ]);
        let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, &refs)).await;
        assert_eq!(
            got,
            (1, want),
            "{round} prepare of a vGPU claim: calls and costs"
        );
        // `0` written to the VF; the checkpoint twice and the ledger; the spec and metadata
        // go, and NVIDIA's `.yaml` spec is looked for. No directory is listed.
        let want = budget(&[("file_write", 3), ("file_remove", 3), ("sysfs_write", 1)]);
        let got = measured(&plugin, "unprepare", unprepare_all(&mut kubelet, &refs)).await;
        assert_eq!(
            got,
            (1, want),
            "{round} unprepare of a vGPU claim: calls and costs"
        );
    }
}

/// The plugin on the NVML backend over the simulated library counting its calls, on the
/// bench's node with a claim per device of `devices`, its inventory rounds every `interval`
/// (the others an hour apart), registered and published; and the file the count is in.
async fn nvml_counted_plugin(
    devices: &[String],
    interval: &str,
) -> (BenchPlugin, std::path::PathBuf) {
    const CALLS: &str = "nvml-calls";
    let (node, refs, plugin, kubelet) =
        bench_node_plugin(devices, [interval, "60m", "60m"], |node, file| {
            let mut command = node.nvml_chart_command_on(file);
            command.env(gpu_dra_nvml_sim::calls::CALLS_ENV, node.root().join(CALLS));
            command
        })
        .await;
    let calls = node.root().join(CALLS);
    ((node, refs, plugin, kubelet), calls)
}

/// NVML calls per inventory of the bench's node as a kubelet call reads it: the GPU count;
/// per A100 in MIG mode: its handle, UUID and MIG mode, its GPU instances (one call for each
/// of its 7 profiles, one for each of its 7 instances), the MIG device count and each MIG
/// device's handle, GPU and compute instance IDs and UUID, its fabric state; per L4:
/// handle, UUID, MIG mode (not supported), fabric state.
const CALL_INVENTORY: u64 = 1 + 8 * (3 + (7 + 7) + (1 + 7 * 4) + 1) + 8 * (3 + 1);

/// What a kubelet call asks the GPU driver, counted in NVML calls (the simulated library
/// counts every call it answers, `GPU_DRA_SIM_NVML_CALLS`): the plugin on the NVML backend,
/// whatever backend this run tests, on the bench's node (8 A100 with 7 static 1g.10gb MIG
/// devices each, 8 L4). A real driver answers most NVML calls with an ioctl into its kernel
/// module, the MIG ones under its locks: a price on real nodes that the simulated backend
/// does not show.
///
/// A call plans with the node's inventory, but asks NVML only what can change: each GPU's
/// UUID and MIG mode (to know it is the GPU the last full read saw), its GPU instances and
/// MIG devices, its fabric state. The profile tables with their placements, the product,
/// memory and PCI facts come from the last full read. 1,515 calls per prepare before.
#[tokio::test]
async fn a_prepare_on_the_nvml_backend_asks_the_driver_only_what_can_change() {
    let devices: Vec<String> = ["gpu-3-mig-1g10gb-5", "gpu-12"].map(String::from).to_vec();
    // No periodic pass within the test's seconds: what is counted is the calls'.
    let ((_node, refs, _plugin, mut kubelet), calls) = nvml_counted_plugin(&devices, "60m").await;
    let count = || gpu_dra_nvml_sim::calls::read(&calls).expect("the library's call count");

    // Start-up's reads and the health thread's registrations end first: a second without a
    // call. It then looks for added GPUs every 10 s (a count and each GPU's handle and UUID),
    // so the fewest of three calls is the call's own count.
    let settled = std::time::Instant::now();
    loop {
        let before = count();
        tokio::time::sleep(Duration::from_secs(1)).await;
        if count() == before {
            break;
        }
        assert!(
            settled.elapsed() < Duration::from_secs(30),
            "the plugin kept calling NVML for 30 s with no kubelet call"
        );
    }
    let mut fewest = BTreeMap::new();
    for _ in 0..3 {
        for (claim, device) in refs.iter().zip(&devices) {
            let before = count();
            prepare_all(&mut kubelet, std::slice::from_ref(claim)).await;
            let between = count();
            unprepare_all(&mut kubelet, std::slice::from_ref(claim)).await;
            let got = [between - before, count() - between];
            let entry = fewest.entry(device.as_str()).or_insert(got);
            *entry = [entry[0].min(got[0]), entry[1].min(got[1])];
        }
    }
    let inventory = CALL_INVENTORY;
    assert_eq!(
        fewest,
        BTreeMap::from([
            // The unprepare of a MIG device looks at the MIG devices as they are now (a
            // carved one is destroyed only if its GPU instance was not reused); a full GPU's
            // asks nothing.
            ("gpu-3-mig-1g10gb-5", [inventory, inventory]),
            ("gpu-12", [inventory, 0]),
        ]),
        "NVML calls of a prepare and an unprepare, by the claim's device"
    );
}

/// An idle plugin's inventory rounds on the NVML backend ask what a kubelet call asks (each
/// GPU is read in full again only once what is kept of it is a minute old): rounds every
/// second, counted in bursts of calls. The health thread's look for added GPUs (the count,
/// each GPU's handle and UUID) may come as a burst of its own or within a round's.
#[tokio::test]
async fn an_idle_plugins_inventory_rounds_on_the_nvml_backend_ask_what_a_call_asks() {
    let ((_node, _refs, _plugin, _kubelet), calls) = nvml_counted_plugin(&[], "1").await;
    let count = || gpu_dra_nvml_sim::calls::read(&calls).expect("the library's call count");
    // Start-up's full reads are over once the count stands still between two rounds' ticks.
    let started = std::time::Instant::now();
    let mut last = count();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = count();
        if now == last {
            break;
        }
        last = now;
        assert!(started.elapsed() < Duration::from_secs(30), "never quiet");
    }
    // Bursts: the calls of 50 ms samples, merged until 300 ms pass without one (rounds are
    // 1 s apart; a round stalled for a moment by the machine stays one burst).
    let mut bursts = Vec::new();
    let (mut open, mut quiet) = (0, 0);
    let until = std::time::Instant::now() + Duration::from_millis(3500);
    while std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = count();
        if now > last {
            (open, quiet) = (open + now - last, 0);
        } else if open > 0 {
            quiet += 1;
            if quiet == 6 {
                bursts.push(open);
                (open, quiet) = (0, 0);
            }
        }
        last = now;
    }
    // The health thread's own calls: its 5 s wait (one call) and its look for added GPUs
    // (the count, each GPU's handle and UUID), alone or merged into a round's burst.
    let thread = 1 + 1 + 16 * 2;
    let rounds = bursts
        .iter()
        .filter(|&&b| (CALL_INVENTORY..=CALL_INVENTORY + thread).contains(&b))
        .count();
    assert!(
        rounds >= 2,
        "bursts of NVML calls {bursts:?}: at least two rounds of {CALL_INVENTORY} in 3.5 s"
    );
    assert!(
        bursts
            .iter()
            .all(|&b| b <= thread || (CALL_INVENTORY..=CALL_INVENTORY + thread).contains(&b)),
        "bursts of NVML calls {bursts:?}: rounds of {CALL_INVENTORY} (a full read: 843) and \
         the health thread's calls (at most {thread})"
    );
}

/// An unprepare of carved MIG devices (dynamic MIG on the simulated DGX H100, every profile
/// published) reads the node's inventory once for the whole call: the devices each claim
/// destroys are checked against that one read (nothing in an unprepare creates a GPU
/// instance, so an instance it lists as a claim's is still that claim's).
#[tokio::test]
async fn an_unprepare_of_carved_mig_devices_reads_the_inventory_once_per_call() {
    let node = Node::new();
    let devices: Vec<String> = (0..3).map(|g| format!("gpu-{g}-mig-1g10gb-0")).collect();
    let refs = claims::one_per_device(&node.api, &devices);
    let mut plugin = node.spawn_command(
        node.command_on("dgx-h100"),
        &[("GPU_DRA_MIG_PROFILES", "all")],
    );
    plugin.wait_registrable().await;
    eventually("slices", || node.api.complete_pool()).await;
    eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    prepare_all(&mut kubelet, &refs).await;
    // 1 where the simulator's own file work counts as the plugin's (the sim backend).
    let sim = u64::from(!plugin_support::nvml_backend());
    let got = measured(&plugin, "unprepare", unprepare_all(&mut kubelet, &refs)).await;
    // The checkpoint twice (marked, forgotten); each claim's spec, metadata file and a look
    // for NVIDIA's spec; per MIG device its compute and GPU instance destroyed (the
    // simulated GPU's state: written durably, read around each change). One inventory read
    // for the call, where each claim read its own before (3 in all on the simulator, 4 on
    // the NVML backend).
    let want = budget(&[
        ("file_write", 2 + 6 * sim),
        ("file_remove", 9),
        ("fsync", 12 * sim),
        ("hardware_state_read", 12 * sim),
        ("inventory_read", 1),
    ]);
    assert_eq!(got, (1, want), "an unprepare of 3 carved MIG devices");
}
