//! API-server faults under the real plugin: the fake API server refuses connections (an
//! outage), answers 5xx or 429 with `Retry-After`, hangs up mid-list, answers slowly past the
//! kubelet's deadline, or reports a conflict on a slice update.
//!
//! Claims: a prepare whose claim cannot be fetched fails that claim with a clear error, leaves
//! nothing behind and succeeds on retry. Publishing: backs off (with jitter) rather than
//! hot-looping and converges after the outage. Probes and prepared claims keep working
//! offline. A call the kubelet gives up on finishes whole or not at all.

mod plugin_support;

use std::time::{Duration, Instant};

use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::apiserver::{Fault, SLICES};
use plugin_support::claims::{self, claim_ref};
use plugin_support::{Node, eventually, probe};

const KEEP: &str = "uid-keep";
const MIG: &str = "uid-mig";
/// `--mig-profiles all`, for the plugins serving [`node_with_claims`]: the default `split`
/// gives GPU 0 no 3g.40gb.
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

fn node_with_claims() -> Node {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("keep", KEEP, &["gpu-6"]));
    node.api
        .put_claim(claims::on_node("mig", MIG, &["gpu-0-mig-3g40gb-4"]));
    node
}

async fn prepare(
    kubelet: &mut KubeletClient,
    name: &str,
    uid: &str,
) -> Result<Vec<String>, String> {
    let got = kubelet.prepare(&[claim_ref(name, uid)]).await.unwrap();
    got[uid]
        .clone()
        .map(|devices| devices.into_iter().flat_map(|d| d.cdi_device_ids).collect())
}

async fn unprepare(kubelet: &mut KubeletClient, name: &str, uid: &str) {
    let got = kubelet.unprepare(&[claim_ref(name, uid)]).await.unwrap();
    assert_eq!(Ok(()), got[uid]);
}

fn claim_path(name: &str) -> String {
    format!("/resourceclaims/{name}")
}

#[tokio::test]
async fn a_prepare_whose_claim_cannot_be_fetched_fails_that_claim_leaves_nothing_and_succeeds_on_retry()
 {
    let node = node_with_claims();
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert!(prepare(&mut kubelet, "keep", KEEP).await.is_ok());

    let status = |code, reason, retry_after| Fault::Status {
        code,
        reason,
        retry_after,
    };
    let faults = [
        ("refused", None, "could not be reached"),
        (
            "500",
            Some(status(500, "InternalError", None)),
            "(500 InternalError)",
        ),
        (
            "503",
            Some(status(503, "ServiceUnavailable", Some(1))),
            "(503 ServiceUnavailable)",
        ),
        (
            "429",
            Some(status(429, "TooManyRequests", Some(2))),
            "(429 TooManyRequests)",
        ),
        ("hang-up", Some(Fault::Hangup), "could not be reached"),
    ];
    for (what, fault, says) in faults {
        match &fault {
            None => node.api.set_down(true),
            Some(fault) => node
                .api
                .inject(Some("GET"), &claim_path("mig"), fault.clone(), None),
        }
        let error = prepare(&mut kubelet, "mig", MIG).await.unwrap_err();
        assert!(
            error.contains("reading ResourceClaim team-a/mig") && error.contains(says),
            "{what}: {error}"
        );
        node.snapshot()
            .assert_converged(&[KEEP], &format!("{what}: after the failed prepare"));
        assert!(
            prepare(&mut kubelet, "keep", KEEP).await.is_ok(),
            "{what}: a prepared claim is served without the API server"
        );

        node.api.set_down(false);
        node.api.clear_faults();
        let ids = prepare(&mut kubelet, "mig", MIG).await;
        assert!(ids.is_ok(), "{what}: the retry: {ids:?}\n{}", plugin.log());
        node.snapshot()
            .assert_converged(&[KEEP, MIG], &format!("{what}: after the retry"));
        unprepare(&mut kubelet, "mig", MIG).await;
    }
}

#[tokio::test]
async fn a_call_the_kubelet_gives_up_on_finishes_whole_and_its_retry_gets_the_same_devices() {
    let node = node_with_claims();
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    // The kubelet waits 45 s for a prepare; the test's kubelet waits 1 s and the API server
    // takes 3 s to answer the claim.
    node.api.inject(
        Some("GET"),
        &claim_path("mig"),
        Fault::Delay(Duration::from_secs(3)),
        Some(1),
    );
    let deadline = Duration::from_secs(1);
    let gave_up = tokio::time::timeout(deadline, prepare(&mut kubelet, "mig", MIG)).await;
    assert!(gave_up.is_err(), "the call must outlast the deadline");
    node.snapshot()
        .assert_converged(&[], "while the claim is being fetched nothing is done yet");

    // The retry queues behind the abandoned call, which goes on to finish the prepare.
    let ids = prepare(&mut kubelet, "mig", MIG).await.expect("the retry");
    // The device's CDI ID and the one that mounts its request's device metadata.
    assert_eq!(2, ids.len(), "{ids:?}");
    node.snapshot()
        .assert_converged(&[MIG], &format!("after the retry\n{}", plugin.log()));
    let again = prepare(&mut kubelet, "mig", MIG).await.unwrap();
    assert_eq!(
        ids, again,
        "the retry returns the devices the abandoned call prepared"
    );
}

/// Times of the LIST requests for this node's slices.
fn slice_lists(node: &Node, since: Instant) -> Vec<Instant> {
    node.api
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == SLICES && r.at >= since)
        .map(|r| r.at)
        .collect()
}

#[tokio::test]
async fn publishing_backs_off_through_server_errors_never_hot_loops_and_converges_after() {
    let node = Node::new();
    node.api.inject(
        None,
        SLICES,
        Fault::Status {
            code: 503,
            reason: "ServiceUnavailable",
            retry_after: None,
        },
        None,
    );
    let started = Instant::now();
    let mut plugin = node.start().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let lists = slice_lists(&node, started);
    // The publisher's retries start at 500 ms and double, each drawn from the upper half of
    // its step (jitter): within 6 s at most 6 tries, never a hot loop.
    assert!(
        (2..=7).contains(&lists.len()),
        "{} LISTs in 6 s:\n{}",
        lists.len(),
        plugin.log()
    );
    for (i, pair) in lists.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        let step = Duration::from_millis(500) * (1 << i.min(4));
        assert!(
            gap + Duration::from_millis(10) >= step / 2,
            "retry {} came after {gap:?}, before half of its {step:?} step",
            i + 1
        );
    }
    let addr = eventually("the metrics address", || probe::metrics_addr(&plugin.log())).await;
    assert_eq!(
        Some(200),
        probe::get(addr, "/healthz").map(|(code, _)| code),
        "alive while the API server fails"
    );
    assert!(
        probe::get(addr, "/metrics").is_some_and(|(code, _)| code == 200),
        "telemetry keeps working offline"
    );

    node.api.clear_faults();
    eventually("the pool published after the outage", || {
        node.api.complete_pool()
    })
    .await;
    assert!(plugin.is_running());
}

#[tokio::test]
async fn an_outage_at_start_up_does_not_stop_the_plugin_and_publishing_converges_after_it() {
    let node = node_with_claims();
    node.api.set_down(true);
    let mut plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let error = prepare(&mut kubelet, "mig", MIG).await.unwrap_err();
    assert!(error.contains("could not be reached"), "{error}");
    node.snapshot()
        .assert_converged(&[], "after the failed prepare");
    let addr = eventually("the metrics address", || probe::metrics_addr(&plugin.log())).await;
    assert_eq!(
        Some(200),
        probe::get(addr, "/healthz").map(|(code, _)| code)
    );

    node.api.set_down(false);
    eventually("the pool published after the outage", || {
        node.api.complete_pool()
    })
    .await;
    assert!(prepare(&mut kubelet, "mig", MIG).await.is_ok());
    node.snapshot().assert_converged(&[MIG], "after the retry");
    assert!(plugin.is_running());
}

#[tokio::test]
async fn interrupted_lists_and_a_conflict_on_update_are_retried_until_the_pool_is_right() {
    let node = Node::new();
    node.api.inject(Some("GET"), SLICES, Fault::Hangup, Some(2));
    let mut plugin = node.start().await;
    let published = eventually("the pool despite cut-off lists", || {
        node.api.complete_pool()
    })
    .await;
    let with_devices = published
        .iter()
        .find(|s| s["spec"]["devices"].as_array().is_some_and(|d| d.len() > 1))
        .expect("a slice with devices");
    let name = with_devices["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let original = with_devices["spec"]["devices"].clone();
    plugin.kill().await;

    // Another writer changed the slice; the next plugin's update of it meets a conflict once.
    node.api.edit_slice(&name, |slice| {
        let devices = slice["spec"]["devices"].as_array_mut().expect("devices");
        devices.pop();
    });
    node.api.inject(
        Some("PUT"),
        &name,
        Fault::Status {
            code: 409,
            reason: "Conflict",
            retry_after: None,
        },
        Some(1),
    );
    let since = Instant::now();
    let plugin = node.start().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.api.slices()[&name]["spec"]["devices"] != original {
        let seen: Vec<String> = node
            .api
            .requests()
            .iter()
            .filter(|r| r.at >= since)
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        assert!(
            Instant::now() < deadline,
            "the slice was not restored; requests {seen:#?}\n{}",
            plugin.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let puts = node
        .api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with(&name) && r.at >= since)
        .count();
    assert_eq!(
        2,
        puts,
        "one conflict, then one update that went through\n{}",
        plugin.log()
    );
}

#[tokio::test]
async fn publishing_waits_as_long_as_a_429_retry_after_asks() {
    let node = Node::new();
    node.api.inject(
        Some("GET"),
        SLICES,
        Fault::Status {
            code: 429,
            reason: "TooManyRequests",
            retry_after: Some(2),
        },
        Some(1),
    );
    let started = Instant::now();
    let plugin = node.start().await;
    eventually("the pool published after the 429", || {
        node.api.complete_pool()
    })
    .await;
    let lists = slice_lists(&node, started);
    assert!(lists.len() >= 2, "{lists:?}");
    let gap = lists[1] - lists[0];
    assert!(
        gap >= Duration::from_secs(2),
        "the retry came {gap:?} after a 429 asking for 2 s\n{}",
        plugin.log()
    );
}
