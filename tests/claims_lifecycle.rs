//! Prepare and unprepare on a simulated node: hardware, checkpoint and CDI directory move
//! together, repeated calls are harmless, conflicts fail per claim and leave nothing behind.

mod manager_support;

use std::sync::Arc;

use gpu_dra::claims::{AllocatedDevice, ClaimAllocation, ClaimError, ClaimId, ClaimsManager};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use manager_support::Table;

struct Node {
    dir: tempfile::TempDir,
    sim: Arc<SimBackend>,
    mgr: ClaimsManager<Table>,
}

fn alloc(devices: &[&str]) -> ClaimAllocation {
    ClaimAllocation {
        pod_claim_name: None,
        devices: devices
            .iter()
            .enumerate()
            .map(|(i, d)| AllocatedDevice {
                request: format!("req{i}"),
                pool: "dgx-h100".into(),
                device: d.to_string(),
                admin_access: false,
                share_id: None,
                consumed_capacity: Default::default(),
            })
            .collect(),
        config: Vec::new(),
    }
}

fn node(claims: &[(&str, &[&str])]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimBackend::open("dgx-h100", Some(&dir.path().join("hw"))).unwrap());
    let table = claims
        .iter()
        .map(|(uid, devs)| (uid.to_string(), alloc(devs)))
        .collect();
    let mgr = manager_support::manager(&sim, Table(table), dir.path(), "dgx-h100");
    Node { dir, sim, mgr }
}

fn id(uid: &str) -> ClaimId {
    ClaimId {
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

fn spec_files(n: &Node) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(n.dir.path().join("cdi"))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn mig_layout(n: &Node, gpu: usize) -> Vec<String> {
    n.sim.inventory().unwrap().gpus[gpu]
        .mig_devices
        .iter()
        .map(|d| format!("{}@{}", d.profile_name, d.placement.start))
        .collect()
}

#[tokio::test]
async fn a_full_gpu_is_prepared_once_and_unprepared_twice_harmlessly() {
    let n = node(&[("u1", &["gpu-2"])]);
    let got = n.mgr.prepare(&id("u1")).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].cdi_device_ids, ["k8s.gpu.nvidia.com/claim=u1-gpu-2"]);
    assert_eq!(got[0].request_names, ["req0"]);
    assert_eq!(spec_files(&n), ["k8s.gpu.nvidia.com-claim_u1.json"]);
    let spec =
        std::fs::read_to_string(n.dir.path().join("cdi/k8s.gpu.nvidia.com-claim_u1.json")).unwrap();
    assert!(spec.contains("/dev/nvidia2"), "{spec}");
    let again = n.mgr.prepare(&id("u1")).await.unwrap();
    assert_eq!(again, got, "a repeated prepare returns the same devices");
    n.mgr.unprepare(&id("u1")).await.unwrap();
    assert!(spec_files(&n).is_empty());
    n.mgr.unprepare(&id("u1")).await.unwrap();
    n.mgr.unprepare(&id("never-seen")).await.unwrap();
}

#[tokio::test]
async fn a_dynamic_mig_device_is_carved_at_the_allocated_placement_and_destroyed_after() {
    let n = node(&[("u1", &["gpu-3-mig-3g40gb-4"])]);
    n.mgr.prepare(&id("u1")).await.unwrap();
    assert_eq!(mig_layout(&n, 3), ["3g.40gb@4"]);
    let spec =
        std::fs::read_to_string(n.dir.path().join("cdi/k8s.gpu.nvidia.com-claim_u1.json")).unwrap();
    let uuid = &n.sim.inventory().unwrap().gpus[3].mig_devices[0].uuid;
    assert!(
        spec.contains(uuid.as_str()),
        "the spec names the new MIG device: {spec}"
    );
    assert!(spec.contains("/dev/nvidia-caps/nvidia-cap"), "{spec}");
    n.mgr.prepare(&id("u1")).await.unwrap();
    assert_eq!(
        mig_layout(&n, 3),
        ["3g.40gb@4"],
        "a repeated prepare carves nothing more"
    );
    n.mgr.unprepare(&id("u1")).await.unwrap();
    assert!(mig_layout(&n, 3).is_empty());
}

/// The same race inside one call: the second claim is planned against the first one's
/// record of the same wave (not yet in the checkpoint), so it is refused all the same.
#[tokio::test]
async fn two_claims_for_one_placement_in_one_call_get_one_winner() {
    let n = node(&[
        ("a", &["gpu-0-mig-1g10gb-2"]),
        ("b", &["gpu-0-mig-1g10gb-2"]),
    ]);
    let mut results = n.mgr.prepare_batch(&[id("a"), id("b")]).await;
    let b = results.pop().unwrap();
    let a = results.pop().unwrap();
    assert!(a.is_ok(), "{a:?}");
    let err = b.unwrap_err();
    assert_eq!(
        err.to_string(),
        "claim ns/claim-b (b): device gpu-0-mig-1g10gb-2 is not free: claim ns/claim-a (a) holds gpu-0-mig-1g10gb-2"
    );
    assert_eq!(mig_layout(&n, 0), ["1g.10gb@2"]);
    assert_eq!(spec_files(&n), ["k8s.gpu.nvidia.com-claim_a.json"]);
}

#[tokio::test]
async fn two_claims_racing_for_one_placement_get_one_winner() {
    let n = node(&[
        ("a", &["gpu-0-mig-1g10gb-2"]),
        ("b", &["gpu-0-mig-1g10gb-2"]),
    ]);
    n.mgr.prepare(&id("a")).await.unwrap();
    let err = n.mgr.prepare(&id("b")).await.unwrap_err();
    assert!(matches!(err, ClaimError::DeviceBusy { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "claim ns/claim-b (b): device gpu-0-mig-1g10gb-2 is not free: claim ns/claim-a (a) holds gpu-0-mig-1g10gb-2"
    );
    assert_eq!(mig_layout(&n, 0), ["1g.10gb@2"]);
    assert_eq!(spec_files(&n), ["k8s.gpu.nvidia.com-claim_a.json"]);
}

#[tokio::test]
async fn an_overlapping_placement_fails_in_hardware_and_leaves_nothing_behind() {
    let n = node(&[
        ("a", &["gpu-1-mig-3g40gb-0"]),
        ("b", &["gpu-1-mig-1g10gb-6", "gpu-1-mig-4g40gb-0"]),
    ]);
    n.mgr.prepare(&id("a")).await.unwrap();
    let err = n.mgr.prepare(&id("b")).await.unwrap_err();
    let text = gpu_dra::kubelet::error_chain(&err);
    assert!(
        text.contains("claim ns/claim-b (b): create MIG device for device gpu-1-mig-4g40gb-0"),
        "{text}"
    );
    assert!(text.contains("NVML_ERROR_INSUFFICIENT_RESOURCES"), "{text}");
    assert_eq!(
        mig_layout(&n, 1),
        ["3g.40gb@0"],
        "the 1g carved before the failure was destroyed"
    );
    assert_eq!(spec_files(&n), ["k8s.gpu.nvidia.com-claim_a.json"]);
    // b is not recorded: after a's release, b's retry succeeds.
    n.mgr.unprepare(&id("a")).await.unwrap();
    n.mgr.prepare(&id("b")).await.unwrap();
    assert_eq!(mig_layout(&n, 1), ["4g.40gb@0", "1g.10gb@6"]);
}

#[tokio::test]
async fn a_full_gpu_and_a_mig_device_of_it_exclude_each_other() {
    let n = node(&[
        ("a", &["gpu-5"]),
        ("b", &["gpu-5-mig-1g10gb-0"]),
        ("c", &["gpu-6-mig-1g10gb-0"]),
    ]);
    n.mgr.prepare(&id("a")).await.unwrap();
    let err = n.mgr.prepare(&id("b")).await.unwrap_err();
    assert!(
        err.to_string()
            .ends_with("claim ns/claim-a (a) holds gpu-5"),
        "{err}"
    );
    n.mgr.prepare(&id("c")).await.unwrap();
    assert!(
        !n.sim.inventory().unwrap().gpus[5].mig.current,
        "MIG switched off for the full H100"
    );
}

#[tokio::test]
async fn bad_allocations_fail_with_the_claim_and_the_cause() {
    let dir_alloc = ClaimAllocation {
        pod_claim_name: None,
        devices: vec![AllocatedDevice {
            request: "gpu".into(),
            pool: "other-node".into(),
            device: "gpu-0".into(),
            admin_access: false,
            share_id: None,
            consumed_capacity: Default::default(),
        }],
        config: vec![],
    };
    let mut n = node(&[("ghost", &["gpu-0-mig-9g99gb-0"]), ("empty", &[])]);
    n.mgr.source.0.insert("elsewhere".into(), dir_alloc);
    let e = n.mgr.prepare(&id("ghost")).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "claim ns/claim-ghost (ghost): device gpu-0-mig-9g99gb-0 is not published by this node (the allocation is stale or the node changed)"
    );
    let e = n.mgr.prepare(&id("empty")).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "claim ns/claim-empty (empty): the allocation has no devices of this driver on this node"
    );
    let e = n
        .mgr
        .prepare(&id("elsewhere"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "claim ns/claim-elsewhere (elsewhere): device gpu-0 is in pool other-node, not this node's pool dgx-h100"
    );
    let e = n.mgr.prepare(&id("missing")).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "claim ns/claim-missing (missing): resourceclaims \"claim-missing\" not found"
    );
    assert!(spec_files(&n).is_empty());
}

#[tokio::test]
async fn recovery_destroys_orphans_and_stale_specs_but_keeps_prepared_claims() {
    let n = node(&[("keep", &["gpu-4-mig-2g20gb-2"])]);
    n.mgr.prepare(&id("keep")).await.unwrap();
    // An instance nobody owns (left by a crash between create and checkpoint), a GI without
    // its CI, and a spec of a claim that is not prepared.
    let gpu4 = n.sim.inventory().unwrap().gpus[4].clone();
    let orphan_profile = gpu4.profile_by_name("1g.10gb").unwrap().id;
    n.sim.create_mig_device(4, orphan_profile, 0).unwrap();
    n.sim.create_gpu_instance(7, orphan_profile, 6).unwrap();
    std::fs::write(
        n.dir.path().join("cdi/k8s.gpu.nvidia.com-claim_gone.json"),
        "{}",
    )
    .unwrap();

    let report = n.mgr.recover().unwrap();
    assert_eq!(
        report.orphans_destroyed,
        ["GPU 4 1g.10gb@0 (GI 7)", "GPU 7 1g.10gb@6 (GI 13)"]
    );
    assert_eq!(report.stale_specs_removed, ["gone"]);
    assert!(report.rolled_back.is_empty());
    assert_eq!(mig_layout(&n, 4), ["2g.20gb@2"]);
    assert!(
        n.sim.inventory().unwrap().gpus[7]
            .empty_gpu_instances
            .is_empty()
    );
    assert_eq!(spec_files(&n), ["k8s.gpu.nvidia.com-claim_keep.json"]);
}
