//! A kubelet call with several claims, handled as a batch by the real plugin process:
//! fetched concurrently, intent and completion each recorded in one checkpoint write for all
//! (shown by aborting at the crash point right after the write), and each claim's failure
//! its own.

mod plugin_support;

use std::time::Duration;

use gpu_dra::crashpoint;
use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{as_share, daemon_dirs, live_daemons};
use plugin_support::{Node, Plugin, SIGABRT, eventually, state};
use serde_json::json;

/// Whole GPUs of dynamic-MIG GPUs (prepare may switch their MIG mode: intent is recorded).
const GPUS: [&str; 3] = ["gpu-3", "gpu-4", "gpu-5"];
/// Dynamic MIG devices: carved on prepare, destroyed on unprepare. A 1g.10gb on each of
/// GPUs 0-2, published with every profile on every GPU ([`EVERY_PROFILE`]).
const MIG: [&str; 3] = [
    "gpu-0-mig-1g10gb-0",
    "gpu-1-mig-1g10gb-0",
    "gpu-2-mig-1g10gb-0",
];

/// `--mig-profiles all`: the default `split` gives GPU 0 the one-slice variants and GPUs 1-2
/// the 3g/4g profiles, not [`MIG`]'s 1g.10gb.
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

fn uid(i: usize) -> String {
    format!("uid-batch-{i}")
}

/// Three claims of one device each, on the API server; their references.
fn three_claims(node: &Node, devices: [&str; 3]) -> Vec<ClaimRef> {
    devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let name = format!("batch-{i}");
            node.api
                .put_claim(claims::on_node(&name, &uid(i), &[device]));
            claim_ref(&name, &uid(i))
        })
        .collect()
}

/// Starts the plugin set to abort at `point`, sends one call of three claims of `devices`
/// (after a prepare of all of them when the point is in unprepare), and returns the phase
/// each claim has in the checkpoint the aborted plugin left, with the CDI files; then checks
/// that start-up recovery makes the node consistent again.
async fn abort_at(point: &str, sim_node: &str, devices: [&str; 3]) -> (Vec<String>, Vec<String>) {
    let node = Node::new();
    let refs = three_claims(&node, devices);
    let mut plugin = node.spawn_command(
        node.command_on(sim_node),
        &[(crashpoint::ENV, point), EVERY_PROFILE],
    );
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    if point.starts_with("prepare-") {
        assert!(kubelet.prepare(&refs).await.is_err(), "{point}");
    } else {
        let prepared = kubelet.prepare(&refs).await.expect("prepare");
        assert!(prepared.values().all(Result::is_ok), "{prepared:?}");
        assert!(kubelet.unprepare(&refs).await.is_err(), "{point}");
    }
    let status = plugin.wait_exit().await;
    assert_eq!(Plugin::ended_by(&status), Some(SIGABRT), "{}", plugin.log());
    let left = node.snapshot();
    let mut restarted = node.spawn_command(node.command_on(sim_node), &[EVERY_PROFILE]);
    restarted.wait_registrable().await;
    let recovered = node.snapshot();
    let recorded: Vec<&str> = recovered.checkpoint.keys().map(String::as_str).collect();
    if sim_node == "dgx-h100" {
        recovered.assert_converged(&recorded, &format!("{point}: after recovery"));
    } else {
        // Static MIG devices exist without claims: compare claims and specs only.
        let specs: Vec<String> = recorded.iter().map(|u| state::spec_file(u)).collect();
        assert_eq!(specs, recovered.cdi_files, "{point}: after recovery");
    }
    let phases = (0..devices.len())
        .map(|i| {
            left.checkpoint
                .get(&uid(i))
                .map_or_else(|| "absent".to_string(), |c| c.phase.clone())
        })
        .collect();
    (phases, left.cdi_files)
}

#[tokio::test]
async fn the_intent_of_every_claim_of_a_call_is_recorded_in_one_write_before_any_is_acted_on() {
    let (phases, cdi_files) = abort_at("prepare-intent-recorded", "dgx-h100", GPUS).await;
    assert_eq!(
        (phases, cdi_files),
        (vec!["PrepareStarted".to_string(); 3], Vec::<String>::new())
    );
}

#[tokio::test]
async fn the_completion_of_every_claim_of_a_call_is_recorded_in_one_write() {
    let (phases, cdi_files) = abort_at("prepare-completed", "dgx-h100", GPUS).await;
    assert_eq!(
        (phases, cdi_files.len()),
        (vec!["PrepareCompleted".to_string(); 3], 3)
    );
}

#[tokio::test]
async fn every_claim_of_an_unprepare_call_is_marked_in_one_write_before_any_is_undone() {
    let (phases, cdi_files) = abort_at("unprepare-started", "dgx-h100", MIG).await;
    assert_eq!(
        (phases, cdi_files.len()),
        (vec!["UnprepareStarted".to_string(); 3], 3)
    );
}

#[tokio::test]
async fn claims_with_nothing_but_a_cdi_spec_to_undo_are_forgotten_in_the_first_write_of_an_unprepare()
 {
    let (phases, cdi_files) = abort_at("unprepare-started", "dgx-h100", GPUS).await;
    assert_eq!(
        (phases, cdi_files.len()),
        (vec!["absent".to_string(); 3], 3)
    );
}

#[tokio::test]
async fn claims_with_nothing_but_a_cdi_spec_to_undo_are_recorded_only_once_complete() {
    // Static MIG devices and a GPU without MIG: no hardware step, so no intent record; the
    // spec the aborted call wrote is removed by recovery.
    let devices = ["gpu-0-mig-1g5gb-0", "gpu-0-mig-1g5gb-1", "gpu-2"];
    let (phases, cdi_files) = abort_at("prepare-cdi-written", "mixed", devices).await;
    assert_eq!(
        (phases, cdi_files.len()),
        (vec!["absent".to_string(); 3], 1)
    );
}

#[tokio::test]
async fn a_claim_that_cannot_be_prepared_does_not_fail_its_neighbours() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("good-a", "uid-good-a", &["gpu-3"]));
    node.api
        .put_claim(claims::unallocated("pending", "uid-pending"));
    node.api
        .put_claim(claims::on_node("stale", "uid-stale", &["gpu-99"]));
    node.api
        .put_claim(claims::on_node("good-b", "uid-good-b", &["gpu-4"]));
    let refs = [
        claim_ref("good-a", "uid-good-a"),
        claim_ref("pending", "uid-pending"),
        claim_ref("missing", "uid-missing"),
        claim_ref("stale", "uid-stale"),
        claim_ref("good-b", "uid-good-b"),
    ];
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet.prepare(&refs).await.expect("prepare");
    let ok: Vec<(&str, bool)> = refs
        .iter()
        .map(|r| (r.uid.as_str(), got[&r.uid].is_ok()))
        .collect();
    assert_eq!(
        ok,
        vec![
            ("uid-good-a", true),
            ("uid-pending", false),
            ("uid-missing", false),
            ("uid-stale", false),
            ("uid-good-b", true)
        ],
        "{got:?}"
    );
    node.snapshot()
        .assert_converged(&["uid-good-a", "uid-good-b"], "after the batch");
}

#[tokio::test]
async fn two_claims_of_one_call_allocated_the_same_device_never_both_get_it() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("first", "uid-first", &["gpu-3"]));
    node.api
        .put_claim(claims::on_node("second", "uid-second", &["gpu-3"]));
    let refs = [
        claim_ref("first", "uid-first"),
        claim_ref("second", "uid-second"),
    ];
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet.prepare(&refs).await.expect("prepare");
    let second = got["uid-second"].as_ref().expect_err("the second claim");
    assert!(
        got["uid-first"].is_ok() && second.contains("is not free"),
        "{got:?}"
    );
    node.snapshot()
        .assert_converged(&["uid-first"], "after the batch");
}

#[tokio::test]
async fn the_claims_of_one_call_are_fetched_concurrently() {
    let node = Node::new();
    let refs: Vec<ClaimRef> = (0..8)
        .map(|i| {
            let (name, uid) = (format!("c-{i}"), format!("uid-c-{i}"));
            let device = format!("gpu-{i}");
            node.api.put_claim(claims::on_node(&name, &uid, &[&device]));
            claim_ref(&name, &uid)
        })
        .collect();
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    // Published, and looked at twice after the registration (now and 5 s later: a starting
    // kubelet deletes slices), so the only GETs from now on are the call's.
    eventually("slices", || node.api.complete_pool()).await;
    eventually("the two looks at the slices after the registration", || {
        let requests = node.api.requests();
        let lists = requests
            .iter()
            .filter(|r| r.method == "GET" && r.path == plugin_support::apiserver::SLICES)
            .count();
        (lists >= 3 && node.api.gets_in_flight() == 0).then_some(())
    })
    .await;
    // Long enough that GETs sent one after another could never overlap.
    node.api.set_get_latency(Duration::from_millis(200));
    let before = node.api.peak_concurrent_gets();
    let got = kubelet.prepare(&refs).await.expect("prepare");
    assert!(got.values().all(Result::is_ok), "{got:?}");
    let peak = node.api.peak_concurrent_gets();
    assert!(
        peak > 1 && peak <= 8 && before <= 1,
        "peak GETs in flight: {before} before the call, {peak} after"
    );
}

#[tokio::test]
async fn two_shares_of_one_device_prepared_and_unprepared_in_one_call_share_one_daemon_and_stop_it()
{
    let node = Node::new();
    let share = |name: &str, uid: &str, id: &str| {
        as_share(
            claims::on_node(name, uid, &["gpu-4"]),
            0,
            id,
            json!({"memory": "20Gi", "multiprocessors": "33"}),
        )
    };
    node.api.put_claim(share("a", "uid-a", "aaaa1111"));
    node.api.put_claim(share("b", "uid-b", "bbbb2222"));
    let refs = [claim_ref("a", "uid-a"), claim_ref("b", "uid-b")];
    let plugin = node.start_with(&[("GPU_DRA_SHARED_GPUS", "4")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet.prepare(&refs).await.expect("prepare");
    assert!(got.values().all(Result::is_ok), "{got:?}\n{}", plugin.log());
    let while_prepared = (daemon_dirs(&node), live_daemons(node.root()).len());
    let got = kubelet.unprepare(&refs).await.expect("unprepare");
    assert!(got.values().all(Result::is_ok), "{got:?}\n{}", plugin.log());
    assert_eq!(
        (
            while_prepared,
            daemon_dirs(&node),
            live_daemons(node.root()).len()
        ),
        (
            (vec!["share-gpu-4".to_string()], 1),
            Vec::<String>::new(),
            0
        )
    );
    node.snapshot().assert_converged(&[], "after the batch");
}
