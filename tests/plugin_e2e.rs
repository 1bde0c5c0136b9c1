//! The real `gpu-dra kubelet-plugin` binary on a simulated DGX H100, driven over its Unix
//! sockets exactly as the kubelet drives it, against a fake API server on a TCP port.

mod plugin_support;

use gpu_dra::kubelet::client::DraApi;
use gpu_dra::kubelet::{ClaimRef, PrepareResults, PreparedDevice};
use plugin_support::Node;
use plugin_support::claims::{self, DRIVER, NODE, claim_ref};
use plugin_support::state::SimInstance;

/// Every MIG profile on every GPU (`--mig-profiles all`), for the tests that prepare MIG devices
/// the default `split` gives to other GPUs (gpu-0-mig-3g40gb-4, gpu-0-mig-1g10gb-2: GPU 0
/// offers the one-slice variants).
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

/// The device the kubelet gets for a claim's only device of `request`: its CDI ID `cdi`
/// (`…/claim=<uid>-<name>`) and the one that mounts the request's device metadata.
fn device(request: &str, name: &str, cdi: &str) -> PreparedDevice {
    let claim_uid = cdi
        .strip_prefix("k8s.gpu.nvidia.com/claim=")
        .and_then(|rest| rest.strip_suffix(&format!("-{name}")))
        .expect("a claim device ID");
    PreparedDevice {
        request_names: vec![request.to_string()],
        pool_name: NODE.to_string(),
        device_name: name.to_string(),
        cdi_device_ids: vec![
            cdi.to_string(),
            format!("k8s.gpu.nvidia.com/claim={claim_uid}-metadata-{request}"),
        ],
        share_id: None,
    }
}

async fn full_gpu_claim_is_prepared_and_unprepared(api: DraApi) {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("training", "uid-full", &["gpu-2"]));
    let plugin = node.start().await;
    let mut kubelet = plugin.register(api).await;
    assert_eq!(kubelet.dra_api(), Some(api));
    let before = node.snapshot();

    let claim = claim_ref("training", "uid-full");
    let got = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let want: PrepareResults = [(
        "uid-full".to_string(),
        Ok(vec![device(
            "gpu-0",
            "gpu-2",
            "k8s.gpu.nvidia.com/claim=uid-full-gpu-2",
        )]),
    )]
    .into_iter()
    .collect();
    assert_eq!(want, got);
    let prepared = node.snapshot();
    prepared.assert_converged(&["uid-full"], "after prepare");
    assert_eq!(
        before.instances, prepared.instances,
        "no MIG device for a full GPU"
    );
    assert_eq!(
        (true, false),
        (before.mig_mode[2], prepared.mig_mode[2]),
        "MIG mode of GPU 2 switched off for the whole GPU"
    );
    let spec = node.spec("uid-full").unwrap();
    assert!(spec.contains("\"/dev/nvidia2\""), "{spec}");
    // The device metadata (KEP-5304): a file per request, mounted read-only where Kubernetes
    // defines it, naming the device and its PCI bus ID, newest version first.
    let host = node
        .plugin_dir()
        .join("dra-device-metadata/uid-full_gpu-0.json");
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    let mount = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "uid-full-metadata-gpu-0")
        .map(|d| d["containerEdits"]["mounts"][0].clone())
        .expect("the metadata device in the claim's spec");
    assert_eq!(
        mount,
        serde_json::json!({
            "hostPath": host.to_string_lossy(),
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/training/gpu-0/gpu.nvidia.com-metadata.json",
            "options": ["ro", "bind"],
        })
    );
    let text = std::fs::read_to_string(&host).unwrap();
    let versions: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        versions
            .iter()
            .map(|v| v["apiVersion"].as_str().unwrap())
            .collect::<Vec<_>>(),
        [
            "metadata.resource.k8s.io/v1beta1",
            "metadata.resource.k8s.io/v1alpha1"
        ]
    );
    let described = &versions[0]["requests"][0]["devices"][0];
    assert_eq!(
        (&described["name"], &described["pool"], &described["driver"]),
        (
            &serde_json::json!("gpu-2"),
            &serde_json::json!(NODE),
            &serde_json::json!(DRIVER)
        )
    );
    let bus = described["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
        .as_str()
        .expect("a PCI bus ID");
    assert!(bus.contains(':'), "{bus}");

    let again = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(got, again, "a repeated prepare answers the same");

    let got = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(Some(&Ok(())), got.get("uid-full"));
    node.snapshot().assert_converged(&[], "after unprepare");
    let got = kubelet.unprepare(&[claim]).await.unwrap();
    assert_eq!(
        Some(&Ok(())),
        got.get("uid-full"),
        "unprepare is idempotent"
    );
    drop(plugin);
}

#[tokio::test]
async fn full_gpu_claim_is_prepared_and_unprepared_over_v1() {
    full_gpu_claim_is_prepared_and_unprepared(DraApi::V1).await;
}

#[tokio::test]
async fn full_gpu_claim_is_prepared_and_unprepared_over_v1beta1() {
    full_gpu_claim_is_prepared_and_unprepared(DraApi::V1beta1).await;
}

async fn dynamic_mig_claim_is_carved_at_its_placement_and_destroyed_on_unprepare(api: DraApi) {
    let node = Node::new();
    node.api.put_claim(claims::on_node(
        "inference",
        "uid-mig",
        &["gpu-0-mig-3g40gb-4"],
    ));
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(api).await;

    let claim = claim_ref("inference", "uid-mig");
    let got = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let want: PrepareResults = [(
        "uid-mig".to_string(),
        Ok(vec![device(
            "gpu-0",
            "gpu-0-mig-3g40gb-4",
            "k8s.gpu.nvidia.com/claim=uid-mig-gpu-0-mig-3g40gb-4",
        )]),
    )]
    .into_iter()
    .collect();
    assert_eq!(want, got);
    let prepared = node.snapshot();
    prepared.assert_converged(&["uid-mig"], "after prepare");
    let uuid = prepared.hardware_mig_uuids().pop().unwrap();
    let want = vec![SimInstance {
        gpu: 0,
        start: 4,
        size: 4,
        mig_uuids: vec![uuid.clone()],
    }];
    assert_eq!(
        want, prepared.instances,
        "one 3g.40gb GI at slice 4 of GPU 0"
    );
    let spec = node.spec("uid-mig").unwrap();
    assert!(
        spec.contains(&format!("DRA_GPU_UUID_GPU_0_MIG_3G40GB_4={uuid}")),
        "the spec names the new MIG device: {spec}"
    );

    kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(
        prepared,
        node.snapshot(),
        "a repeated prepare carves nothing"
    );

    let got = kubelet.unprepare(&[claim]).await.unwrap();
    assert_eq!(Some(&Ok(())), got.get("uid-mig"));
    let after = node.snapshot();
    after.assert_converged(&[], "after unprepare");
    assert_eq!(
        Vec::<SimInstance>::new(),
        after.instances,
        "the GI is destroyed"
    );
    drop(plugin);
}

#[tokio::test]
async fn dynamic_mig_claim_is_carved_at_its_placement_and_destroyed_on_unprepare_over_v1() {
    dynamic_mig_claim_is_carved_at_its_placement_and_destroyed_on_unprepare(DraApi::V1).await;
}

#[tokio::test]
async fn dynamic_mig_claim_is_carved_at_its_placement_and_destroyed_on_unprepare_over_v1beta1() {
    dynamic_mig_claim_is_carved_at_its_placement_and_destroyed_on_unprepare(DraApi::V1beta1).await;
}

/// Claims the plugin must refuse, each with the exact error the kubelet gets.
fn refused_claims(node: &Node) -> Vec<(ClaimRef, String)> {
    node.api.put_claim(claims::allocated(
        "elsewhere",
        "uid-other-drivers",
        &[
            ("nic.example.com", NODE, "eth0"),
            (DRIVER, "other-node", "gpu-0"),
        ],
    ));
    node.api
        .put_claim(claims::on_node("recreated", "uid-new", &["gpu-1"]));
    node.api
        .put_claim(claims::unallocated("pending", "uid-pending"));
    vec![
        (
            claim_ref("elsewhere", "uid-other-drivers"),
            "claim team-a/elsewhere (uid-other-drivers): ResourceClaim team-a/elsewhere \
             (uid-other-drivers) has no device of driver gpu.nvidia.com in pool dgx-h100 \
             (allocated: nic.example.com/dgx-h100/eth0, gpu.nvidia.com/other-node/gpu-0)"
                .to_string(),
        ),
        (
            claim_ref("ghost", "uid-ghost"),
            "claim team-a/ghost (uid-ghost): ResourceClaim team-a/ghost (uid-ghost) not found \
             (deleted?)"
                .to_string(),
        ),
        (
            claim_ref("recreated", "uid-old"),
            "claim team-a/recreated (uid-old): ResourceClaim team-a/recreated (uid-old) has UID \
             uid-new in the cluster: it was deleted and re-created"
                .to_string(),
        ),
        (
            claim_ref("pending", "uid-pending"),
            "claim team-a/pending (uid-pending): ResourceClaim team-a/pending (uid-pending) is \
             not allocated (no status.allocation)"
                .to_string(),
        ),
    ]
}

#[tokio::test]
async fn refused_claims_fail_alone_naming_the_claim_and_the_cause() {
    let node = Node::new();
    let refused = refused_claims(&node);
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let before = node.snapshot();
    for (claim, want) in &refused {
        let got = kubelet.prepare(std::slice::from_ref(claim)).await.unwrap();
        let want: PrepareResults = [(claim.uid.clone(), Err(want.clone()))].into();
        assert_eq!(want, got);
        assert_eq!(before, node.snapshot(), "{} changed the node", claim.uid);
    }
    // Each refusal is one warning in the log (the handler's, with its kind), not two.
    let log = plugin.log();
    for (claim, _) in &refused {
        let warnings = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("failed") && l.contains(&claim.uid))
            .count();
        assert_eq!(
            1, warnings,
            "{}'s failure logged once at warn:\n{log}",
            claim.uid
        );
    }
}

#[tokio::test]
async fn refused_claims_in_a_batch_do_not_stop_the_good_one() {
    let node = Node::new();
    let refused = refused_claims(&node);
    node.api
        .put_claim(claims::on_node("good", "uid-good", &["gpu-7-mig-1g10gb-6"]));
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1beta1).await;
    let mut batch: Vec<ClaimRef> = refused.iter().map(|(c, _)| c.clone()).collect();
    batch.insert(2, claim_ref("good", "uid-good"));

    let got = kubelet.prepare(&batch).await.unwrap();
    let mut want: PrepareResults = refused.into_iter().map(|(c, e)| (c.uid, Err(e))).collect();
    want.insert(
        "uid-good".into(),
        Ok(vec![device(
            "gpu-0",
            "gpu-7-mig-1g10gb-6",
            "k8s.gpu.nvidia.com/claim=uid-good-gpu-7-mig-1g10gb-6",
        )]),
    );
    assert_eq!(want, got);
    node.snapshot()
        .assert_converged(&["uid-good"], "after the mixed batch");
}

/// Two claims the scheduler should never have given the same placement: the first wins, the
/// second gets an error naming both and leaves nothing behind.
fn racing_claims(node: &Node) -> (ClaimRef, ClaimRef, String) {
    for (name, uid) in [("first", "uid-first"), ("second", "uid-second")] {
        node.api
            .put_claim(claims::on_node(name, uid, &["gpu-0-mig-1g10gb-2"]));
    }
    (
        claim_ref("first", "uid-first"),
        claim_ref("second", "uid-second"),
        "claim team-a/second (uid-second): device gpu-0-mig-1g10gb-2 is not free: claim \
         team-a/first (uid-first) holds gpu-0-mig-1g10gb-2"
            .to_string(),
    )
}

fn one_1g_at_slice_2(node: &Node) {
    let got: Vec<(u64, u64, u64)> = node
        .snapshot()
        .instances
        .iter()
        .map(|i| (i.gpu, i.start, i.size))
        .collect();
    assert_eq!(vec![(0, 2, 1)], got, "exactly one 1g.10gb GI at slice 2");
}

#[tokio::test]
async fn two_claims_racing_for_one_placement_in_one_batch_get_one_winner() {
    let node = Node::new();
    let (first, second, refusal) = racing_claims(&node);
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;

    let got = kubelet.prepare(&[first, second]).await.unwrap();
    let want: PrepareResults = [
        (
            "uid-first".to_string(),
            Ok(vec![device(
                "gpu-0",
                "gpu-0-mig-1g10gb-2",
                "k8s.gpu.nvidia.com/claim=uid-first-gpu-0-mig-1g10gb-2",
            )]),
        ),
        ("uid-second".to_string(), Err(refusal)),
    ]
    .into();
    assert_eq!(want, got);
    node.snapshot()
        .assert_converged(&["uid-first"], "after the racing batch");
    one_1g_at_slice_2(&node);
}

#[tokio::test]
async fn two_claims_racing_for_one_placement_in_two_concurrent_batches_get_one_winner() {
    let node = Node::new();
    let (first, second, _) = racing_claims(&node);
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet_a = plugin.register(DraApi::V1).await;
    let mut kubelet_b = plugin.register(DraApi::V1beta1).await;

    let (a, b) = tokio::join!(
        kubelet_a.prepare(std::slice::from_ref(&first)),
        kubelet_b.prepare(std::slice::from_ref(&second)),
    );
    let mut results = a.unwrap();
    results.extend(b.unwrap());
    let (winner, loser) = match results["uid-first"] {
        Ok(_) => (&first, &second),
        Err(_) => (&second, &first),
    };
    let refusal = format!(
        "claim team-a/{} ({}): device gpu-0-mig-1g10gb-2 is not free: claim team-a/{} ({}) \
         holds gpu-0-mig-1g10gb-2",
        loser.name, loser.uid, winner.name, winner.uid
    );
    assert_eq!(Some(&Err(refusal)), results.get(&loser.uid), "{results:?}");
    assert!(results[&winner.uid].is_ok(), "{results:?}");
    node.snapshot()
        .assert_converged(&[winner.uid.as_str()], "after the race");
    one_1g_at_slice_2(&node);

    // Once the winner is gone, the kubelet's retry of the loser succeeds.
    kubelet_a
        .unprepare(std::slice::from_ref(winner))
        .await
        .unwrap();
    let retried = kubelet_b
        .prepare(std::slice::from_ref(loser))
        .await
        .unwrap();
    assert!(retried[&loser.uid].is_ok(), "{retried:?}");
    node.snapshot()
        .assert_converged(&[loser.uid.as_str()], "after the retry");
    one_1g_at_slice_2(&node);
}
