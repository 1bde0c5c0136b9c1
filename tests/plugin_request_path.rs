//! The guard of the kubelet's request path, by counting (house rule 15): the real plugin
//! process, as the chart runs it (usage accounting, claim status, telemetry and holders on),
//! prepares and unprepares 1 and 10 claims per call, and what each call cost — fsyncs, file
//! writes and removals, CDI specs, full checkpoint parses, simulator state reads, API
//! requests — is read from its `gpu_dra_request_path_costs_total` and compared with the exact
//! budget. A change that adds any of them to the path fails here, naming the cost.
//!
//! The node is the `prepare` bench's ([`plugin_support::STATIC_MIG_NODE`]): 8 A100-80GB with 7
//! static 1g.10gb MIG devices each and 8 L4, so no MIG device is carved.

mod plugin_support;

use std::collections::BTreeMap;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims;
use plugin_support::probe::metrics_addr;
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
    let node_file = node.root().join("bench-node.yaml");
    std::fs::write(&node_file, plugin_support::STATIC_MIG_NODE).unwrap();
    let devices: Vec<String> = (0..7)
        .map(|i| format!("gpu-0-mig-1g10gb-{i}"))
        .chain((8..12).map(|g| format!("gpu-{g}")))
        .collect();
    let refs = claims::one_per_device(&node.api, &devices);
    let mut plugin = node.spawn_command(node.command_on(node_file.to_str().unwrap()), &[]);
    plugin.wait_registrable().await;
    eventually("slices", || node.api.complete_pool()).await;
    eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;

    for n in [1, 10] {
        let call = &refs[..n];
        let n = n as u64;
        let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, call)).await;
        let want = budget(&[
            ("file_write", n + 1),
            ("cdi_spec_write", n),
            ("api_request", n),
        ]);
        assert_eq!(got, (1, want), "prepare of {n} claim(s): calls and costs");

        let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, call)).await;
        assert_eq!(
            got,
            (1, budget(&[])),
            "a repeated prepare of {n} prepared claim(s) costs nothing"
        );

        let got = measured(&plugin, "unprepare", unprepare_all(&mut kubelet, call)).await;
        // One checkpoint write forgets them all; each claim's spec goes, and a `.yaml` spec
        // of NVIDIA's driver for the same claim is looked for.
        let want = budget(&[("file_write", 1), ("file_remove", 2 * n)]);
        assert_eq!(got, (1, want), "unprepare of {n} claim(s): calls and costs");
    }
}

#[tokio::test]
async fn the_first_calls_after_a_restart_cost_what_every_call_costs() {
    let node = Node::new();
    let node_file = node.root().join("bench-node.yaml");
    std::fs::write(&node_file, plugin_support::STATIC_MIG_NODE).unwrap();
    let devices = ["gpu-0-mig-1g10gb-0".to_string(), "gpu-8".to_string()];
    let refs = claims::one_per_device(&node.api, &devices);
    let command = || node.command_on(node_file.to_str().unwrap());
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
    let got = measured(&plugin, "prepare", prepare_all(&mut kubelet, &refs[1..])).await;
    let want = budget(&[("file_write", 2), ("cdi_spec_write", 1), ("api_request", 1)]);
    assert_eq!(got, (1, want), "the first prepare after a restart");
    let got = measured(
        &plugin,
        "unprepare",
        unprepare_all(&mut kubelet, &refs[..1]),
    )
    .await;
    let want = budget(&[("file_write", 1), ("file_remove", 2)]);
    assert_eq!(got, (1, want), "the first unprepare after a restart");
}
