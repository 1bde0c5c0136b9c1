//! Orphan reconciliation under the real plugin binary: claims prepared and then forgotten by
//! the kubelet (deleted, re-created, deallocated, reserved for no pod past the grace period)
//! are unprepared by the plugin itself — MIG instance destroyed, CDI spec removed — while a
//! claim in use beside them is untouched; an API server that cannot answer never makes a
//! claim an orphan.

mod plugin_support;

use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::apiserver::Fault;
use plugin_support::claims::{self, NAMESPACE, claim_ref};
use plugin_support::{Node, eventually, probe};
use serde_json::json;

const GRACE_ENV: &str = "GPU_DRA_ORPHAN_GRACE_PERIOD";
/// `--mig-profiles all`: the claims below hold a 3g.40gb on each of GPUs 0-4, which the
/// default `split` publishes on GPUs 1 and 2 only.
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

/// `(name, uid, MIG device)`: one dynamic MIG device per GPU, so every claim has its own.
const KEEP: (&str, &str, &str) = ("keep", "uid-keep", "gpu-0-mig-3g40gb-4");
const DELETED: (&str, &str, &str) = ("deleted", "uid-deleted", "gpu-1-mig-3g40gb-4");
const RECREATED: (&str, &str, &str) = ("recreated", "uid-recreated", "gpu-2-mig-3g40gb-4");
const DEALLOCATED: (&str, &str, &str) = ("deallocated", "uid-deallocated", "gpu-3-mig-3g40gb-4");
const UNRESERVED: (&str, &str, &str) = ("unreserved", "uid-unreserved", "gpu-4-mig-3g40gb-4");

async fn prepare_all(node: &Node, kubelet: &mut KubeletClient, claims: &[(&str, &str, &str)]) {
    for (name, uid, device) in claims {
        node.api.put_claim(claims::on_node(name, uid, &[device]));
    }
    let refs: Vec<_> = claims.iter().map(|(n, u, _)| claim_ref(n, u)).collect();
    let got = kubelet.prepare(&refs).await.unwrap();
    for (_, uid, _) in claims {
        assert!(got[*uid].is_ok(), "prepare {uid}: {:?}", got[*uid]);
    }
    let uids: Vec<&str> = claims.iter().map(|(_, u, _)| *u).collect();
    node.snapshot().assert_converged(&uids, "after prepare");
}

#[tokio::test]
async fn each_orphan_case_is_reclaimed_and_a_claim_in_use_beside_them_is_untouched() {
    let node = Node::new();
    let plugin = node.start_with(&[(GRACE_ENV, "2s"), EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let all = [KEEP, DELETED, RECREATED, DEALLOCATED, UNRESERVED];
    prepare_all(&node, &mut kubelet, &all).await;
    let keep_uuids = node.snapshot().checkpoint[KEEP.1].mig_uuids.clone();

    // The kubelet forgets four of them; none gets an unprepare.
    node.api.remove_claim(NAMESPACE, DELETED.0);
    node.api.put_claim(claims::on_node(
        RECREATED.0,
        "uid-recreated-2",
        &[RECREATED.2],
    ));
    node.api.edit_claim(NAMESPACE, DEALLOCATED.0, |c| {
        c["status"] = json!({});
    });
    let unreserved_at = std::time::Instant::now();
    node.api.edit_claim(NAMESPACE, UNRESERVED.0, |c| {
        c["status"]["reservedFor"] = json!([]);
    });

    eventually("the four orphans reclaimed", || {
        (node.snapshot().checkpoint.len() == 1).then_some(())
    })
    .await;
    assert!(
        unreserved_at.elapsed() >= std::time::Duration::from_secs(2),
        "the unreserved claim was reclaimed before its grace period"
    );
    let after = node.snapshot();
    after.assert_converged(&[KEEP.1], &plugin.log());
    assert_eq!(
        keep_uuids,
        after.hardware_mig_uuids(),
        "the claim in use keeps its MIG device"
    );
    assert!(node.spec(KEEP.1).is_some());

    // Counted once the handler's call returned, a moment after the checkpoint was written.
    for reason in [
        "claim-deleted",
        "uid-changed",
        "not-allocated",
        "unreserved",
    ] {
        let series = format!("gpu_dra_orphaned_claims_reclaimed_total{{reason=\"{reason}\"}}");
        eventually(&format!("the orphan counted under {reason}"), || {
            (probe::metric(&plugin.log(), &series)? == 1.0).then_some(())
        })
        .await;
    }
    let log = plugin.log();
    for (_, uid, _) in [DELETED, RECREATED, DEALLOCATED, UNRESERVED] {
        assert!(
            log.lines()
                .any(|l| l.contains("reclaimed an orphaned claim") && l.contains(uid)),
            "no log line for {uid}:\n{log}"
        );
    }

    // The kubelet's late unprepare finds nothing left to do and succeeds.
    let late: Vec<_> = [DELETED, RECREATED, DEALLOCATED, UNRESERVED]
        .iter()
        .map(|(n, u, _)| claim_ref(n, u))
        .collect();
    let got = kubelet.unprepare(&late).await.unwrap();
    for claim in &late {
        assert_eq!(
            Some(&Ok(())),
            got.get(&claim.uid),
            "late unprepare of {}",
            claim.uid
        );
    }
    node.snapshot()
        .assert_converged(&[KEEP.1], "after the late unprepares");
}

/// Orphan-check GETs of claim `name` the fake API server has seen so far: the cached reads
/// (`resourceVersion=0`) that notice candidates. Prepare and the claim-status writer read
/// with quorum.
fn lookups(node: &Node, name: &str) -> usize {
    let path = format!("/namespaces/{NAMESPACE}/resourceclaims/{name}");
    node.api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&path))
        .filter(|r| r.query.get("resourceVersion").map(String::as_str) == Some("0"))
        .count()
}

#[tokio::test]
async fn an_api_server_that_cannot_answer_never_makes_a_claim_an_orphan() {
    let node = Node::new();
    let plugin = node.start_with(&[(GRACE_ENV, "1s"), EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let all = [DELETED, RECREATED, DEALLOCATED];
    prepare_all(&node, &mut kubelet, &all).await;

    // Every claim really is gone, but the API server cannot say so: a 404 for a path it
    // does not serve (empty details), a refusal, an internal error.
    let faults = [
        (DELETED.0, 404, "NotFound"),
        (RECREATED.0, 403, "Forbidden"),
        (DEALLOCATED.0, 500, "InternalError"),
    ];
    for (name, code, reason) in faults {
        let path = format!("/resourceclaims/{name}");
        let fault = Fault::Status {
            code,
            reason,
            retry_after: None,
        };
        node.api.inject(Some("GET"), &path, fault, None);
        node.api.remove_claim(NAMESPACE, name);
    }
    let before: Vec<usize> = all.iter().map(|(n, _, _)| lookups(&node, n)).collect();
    eventually("three more lookups of every claim", || {
        all.iter()
            .zip(&before)
            .all(|((n, _, _), b)| lookups(&node, n) >= b + 3)
            .then_some(())
    })
    .await;
    let uids: Vec<&str> = all.iter().map(|(_, u, _)| *u).collect();
    node.snapshot()
        .assert_converged(&uids, &format!("after refused lookups\n{}", plugin.log()));

    // An outage: nothing answers at all, for several check intervals.
    node.api.clear_faults();
    node.api.set_down(true);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    node.snapshot()
        .assert_converged(&uids, &format!("during an outage\n{}", plugin.log()));

    // Once the API server answers, the claims it says are gone are reclaimed.
    node.api.set_down(false);
    eventually("the deleted claims reclaimed", || {
        node.snapshot().checkpoint.is_empty().then_some(())
    })
    .await;
    node.snapshot()
        .assert_converged(&[], "after the API server came back");
}

#[tokio::test]
async fn a_grace_period_of_zero_turns_orphan_reconciliation_off() {
    let node = Node::new();
    let plugin = node.start_with(&[(GRACE_ENV, "0")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    prepare_all(&node, &mut kubelet, &[DELETED]).await;
    let fetched = lookups(&node, DELETED.0);
    node.api.remove_claim(NAMESPACE, DELETED.0);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        fetched,
        lookups(&node, DELETED.0),
        "no lookup with the reconciliation off"
    );
    node.snapshot()
        .assert_converged(&[DELETED.1], &plugin.log());
}
