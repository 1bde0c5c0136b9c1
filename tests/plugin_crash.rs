//! Crash recovery of the real plugin process: it is aborted at every named crash point, and
//! killed at random moments during a burst of calls; after the restart and the kubelet's
//! retries, hardware, checkpoint and CDI directory hold exactly the prepared claims.

mod plugin_support;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpu_dra::crashpoint;
use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{daemon_dirs, live_daemons, mps_config, with_config};
use plugin_support::{Node, Plugin, SIGABRT, SIGKILL};

const CLAIM: &str = "uid-crash";
/// `--mig-profiles all`, for every plugin these tests start: their claims hold MIG devices
/// the default `split` gives other GPUs (3g.40gb on GPU 0, 1g.10gb on GPUs 0-2).
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

/// Aborts the plugin at `point` while it handles the claim, restarts it, lets the kubelet
/// retry, and checks that the node converged.
async fn crash_and_recover(point: &str) {
    let node = Node::new();
    // MPS on the carved device, so every step has hardware, a daemon and a spec to leak.
    node.api.put_claim(with_config(
        claims::on_node("crash", CLAIM, &["gpu-0-mig-3g40gb-4"]),
        &[],
        mps_config("MigDeviceConfig", 50, "8Gi"),
    ));
    let claim = [claim_ref("crash", CLAIM)];
    let in_prepare = point.starts_with("prepare-");

    let mut plugin = node
        .start_with(&[(crashpoint::ENV, point), EVERY_PROFILE])
        .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    if in_prepare {
        let answer = kubelet.prepare(&claim).await;
        assert!(answer.is_err(), "{point}: prepare answered {answer:?}");
    } else {
        let prepared = kubelet.prepare(&claim).await.unwrap();
        assert!(prepared[CLAIM].is_ok(), "{point}: {prepared:?}");
        let answer = kubelet.unprepare(&claim).await;
        assert!(answer.is_err(), "{point}: unprepare answered {answer:?}");
    }
    let status = plugin.wait_exit().await;
    assert_eq!(
        Some(SIGABRT),
        Plugin::ended_by(&status),
        "{point}: {status}"
    );
    assert!(
        plugin
            .log()
            .contains(&format!("crash point {point} reached")),
        "{point}: {}",
        plugin.log()
    );

    // Recovery alone leaves a consistent node, whatever it decided about the claim.
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let recovered = node.snapshot();
    let recorded: Vec<&str> = recovered.checkpoint.keys().map(String::as_str).collect();
    recovered.assert_converged(&recorded, &format!("{point}: after recovery"));
    assert_eq!(
        recorded.len(),
        live_daemons(node.root()).len(),
        "{point}: one MPS daemon per prepared claim after recovery"
    );
    assert_eq!(
        recorded.len(),
        daemon_dirs(&node).len(),
        "{point}: daemon dirs"
    );

    // The kubelet got no answer, so it retries the same call on the new plugin.
    let mut kubelet = plugin.register(DraApi::V1).await;
    if in_prepare {
        let retried = kubelet.prepare(&claim).await.unwrap();
        assert!(retried[CLAIM].is_ok(), "{point}: retry: {retried:?}");
        let after = node.snapshot();
        after.assert_converged(&[CLAIM], &format!("{point}: after the retry"));
        let placements: Vec<(u64, u64, u64)> = after
            .instances
            .iter()
            .map(|i| (i.gpu, i.start, i.size))
            .collect();
        assert_eq!(
            vec![(0, 4, 4)],
            placements,
            "{point}: one 3g.40gb at slice 4"
        );
        let uuid = &after.hardware_mig_uuids()[0];
        let spec = node.spec(CLAIM).unwrap_or_default();
        assert!(spec.contains(uuid.as_str()), "{point}: spec names {uuid}");
        kubelet.unprepare(&claim).await.unwrap();
    } else {
        let retried = kubelet.unprepare(&claim).await.unwrap();
        assert_eq!(Some(&Ok(())), retried.get(CLAIM), "{point}: retry");
    }
    let end = node.snapshot();
    end.assert_converged(&[], &format!("{point}: at the end"));
    assert_eq!(
        Vec::<u32>::new(),
        live_daemons(node.root()),
        "{point}: leaked daemons"
    );
    assert_eq!(
        Vec::<String>::new(),
        daemon_dirs(&node),
        "{point}: leaked daemon dirs"
    );
    assert!(end.instances.is_empty(), "{point}: {:?}", end.instances);
}

#[tokio::test]
async fn a_crash_at_every_crash_point_converges_after_restart_and_retry() {
    // Named so that a new crash point cannot be forgotten here.
    for point in crashpoint::POINTS {
        crash_and_recover(point).await;
    }
}

#[tokio::test]
async fn a_spec_write_cut_short_by_a_crash_leaves_no_temp_file_after_recovery() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("crash", CLAIM, &["gpu-0-mig-3g40gb-4"]));
    let claim = [claim_ref("crash", CLAIM)];
    let mut plugin = node
        .start_with(&[
            (crashpoint::ENV, "prepare-mig-device-created"),
            EVERY_PROFILE,
        ])
        .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert!(kubelet.prepare(&claim).await.is_err());
    plugin.wait_exit().await;
    // What a kill during the spec write (before its rename) leaves behind.
    let temp = format!(".{}.tmp-4242-0", plugin_support::state::spec_file(CLAIM));
    std::fs::create_dir_all(node.cdi_root()).unwrap();
    std::fs::write(node.cdi_root().join(&temp), "{\"cdiVersion\":").unwrap();

    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    node.snapshot()
        .assert_converged(&[], "after recovery from a cut-short spec write");
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert!(kubelet.prepare(&claim).await.unwrap()[CLAIM].is_ok());
    node.snapshot()
        .assert_converged(&[CLAIM], "after the retry");
}

#[tokio::test]
async fn recovery_waits_while_another_instance_is_in_a_call() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("crash", CLAIM, &["gpu-0-mig-3g40gb-4"]));
    let claim = [claim_ref("crash", CLAIM)];
    let mut plugin = node
        .start_with(&[
            (crashpoint::ENV, "prepare-mig-device-created"),
            EVERY_PROFILE,
        ])
        .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert!(kubelet.prepare(&claim).await.is_err());
    plugin.wait_exit().await;
    let half_done = node.snapshot();
    assert_eq!("PrepareStarted", half_done.checkpoint[CLAIM].phase);

    // The old instance of a rolling update, half-way through that same prepare: it holds the
    // plugin lock, and its claim must not be rolled back under its feet.
    let lock = std::fs::File::create(node.plugin_dir().join("plugin.lock")).unwrap();
    lock.lock().unwrap();
    let mut plugin = node.spawn_with(&[EVERY_PROFILE]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(plugin.is_running(), "{}", plugin.log());
    assert_eq!(
        half_done,
        node.snapshot(),
        "recovery ran while the lock was held"
    );
    // The socket file of the aborted instance is still there, but nobody answers on it.
    let answered = KubeletClient::connect(&node.registration_socket()).await;
    assert!(answered.is_err(), "registrable before recovering");

    drop(lock);
    plugin.wait_registrable().await;
    node.snapshot()
        .assert_converged(&[], "after recovery, once the lock was free");
}

/// A small deterministic generator, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Claims that never conflict: 1g.10gb devices on GPUs 0 and 1, a 3g.40gb pair on GPU 2,
/// whole GPUs 6 and 7. Returns (claim, device).
fn burst_claims() -> Vec<(ClaimRef, String)> {
    let mut devices: Vec<String> = (0..2)
        .flat_map(|gpu| (0..7).map(move |p| format!("gpu-{gpu}-mig-1g10gb-{p}")))
        .collect();
    devices
        .extend(["gpu-2-mig-3g40gb-0", "gpu-2-mig-3g40gb-4", "gpu-6", "gpu-7"].map(String::from));
    devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            (
                claim_ref(&format!("burst-{i}"), &format!("uid-burst-{i}")),
                d,
            )
        })
        .collect()
}

/// Random prepares and unprepares until dropped; `wanted` is what the kubelet wants prepared,
/// updated before each call is sent (as the kubelet decides before it calls).
async fn burst(
    kubelet: &mut KubeletClient,
    claims: &[(ClaimRef, String)],
    wanted: &mut BTreeSet<String>,
    rng: &mut Rng,
) {
    loop {
        let size = 1 + rng.below(3) as usize;
        let mut prepare = Vec::new();
        let mut unprepare = Vec::new();
        for _ in 0..size {
            let (claim, _) = &claims[rng.below(claims.len() as u64) as usize];
            if wanted.contains(&claim.uid) {
                unprepare.push(claim.clone());
            } else {
                prepare.push(claim.clone());
            }
        }
        // The kubelet names each claim once per call.
        for list in [&mut prepare, &mut unprepare] {
            list.sort_by(|a, b| a.uid.cmp(&b.uid));
            list.dedup_by(|a, b| a.uid == b.uid);
        }
        wanted.extend(prepare.iter().map(|c| c.uid.clone()));
        let failed = match kubelet.prepare(&prepare).await {
            Ok(results) => results.values().any(Result::is_err),
            Err(_) => return,
        };
        assert!(!failed, "a prepare of a free device failed");
        for c in &unprepare {
            wanted.remove(&c.uid);
        }
        if kubelet.unprepare(&unprepare).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn sigkill_during_a_burst_of_calls_converges_after_restart_and_retry() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed);
    let node = Node::new();
    let claims = burst_claims();
    for (claim, device) in &claims {
        node.api
            .put_claim(claims::on_node(&claim.name, &claim.uid, &[device]));
    }
    let mut wanted = BTreeSet::new();
    let mut plugin = node.start_with(&[EVERY_PROFILE]).await;
    for round in 0..6 {
        let context = format!("seed {seed}, round {round}");
        let mut kubelet = plugin.register(DraApi::V1).await;
        let delay = Duration::from_millis(20 + rng.below(300));
        tokio::select! {
            () = burst(&mut kubelet, &claims, &mut wanted, &mut rng) => {
                panic!("{context}: the burst ended before the kill");
            }
            () = tokio::time::sleep(delay) => {}
        }
        plugin.signal(SIGKILL);
        let status = plugin.wait_exit().await;
        assert_eq!(Some(SIGKILL), Plugin::ended_by(&status), "{context}");

        plugin = node.start_with(&[EVERY_PROFILE]).await;
        let recovered = node.snapshot();
        let recorded: Vec<&str> = recovered.checkpoint.keys().map(String::as_str).collect();
        recovered.assert_converged(&recorded, &format!("{context}: after recovery"));

        // The kubelet retries what it has no answer for: prepare what it wants, unprepare
        // the rest (unpreparing an unknown claim succeeds).
        let mut kubelet = plugin.register(DraApi::V1).await;
        let (want, rest): (Vec<_>, Vec<_>) = claims
            .iter()
            .map(|(c, _)| c.clone())
            .partition(|c| wanted.contains(&c.uid));
        let prepared = kubelet.prepare(&want).await.unwrap();
        assert!(
            prepared.values().all(Result::is_ok),
            "{context}: {prepared:?}"
        );
        let unprepared = kubelet.unprepare(&rest).await.unwrap();
        assert!(
            unprepared.values().all(Result::is_ok),
            "{context}: {unprepared:?}"
        );

        let after = node.snapshot();
        let uids: Vec<&str> = wanted.iter().map(String::as_str).collect();
        after.assert_converged(&uids, &format!("{context}: after the retries"));
        let want_carved: usize = claims
            .iter()
            .filter(|(c, d)| wanted.contains(&c.uid) && d.contains("-mig-"))
            .count();
        assert_eq!(want_carved, after.instances.len(), "{context}: MIG devices");
    }
}
