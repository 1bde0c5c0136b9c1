//! Device taints and tolerations, pool completeness and generations, and which node a
//! slice serves.

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::alloc::{Detail, IgnoredPool, Node, Outcome, Rejection, allocate_claim};
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceClaim, ResourceSlice};

fn run(slices: &[ResourceSlice], claim: &ResourceClaim) -> Outcome {
    let engine = engine();
    let classes = classes();
    allocate_claim(
        &engine,
        &classes,
        slices,
        &[],
        claim,
        &Node::named("node-a"),
        Detail::Full,
    )
    .expect("claim is valid")
}

fn taint(slices: &mut [ResourceSlice], device: &str, effect: &str) {
    for slice in slices.iter_mut() {
        for d in slice.spec.devices.iter_mut().flatten() {
            if d.name == device {
                d.taints = Some(vec![DeviceTaint {
                    key: "nvidia.com/xid".into(),
                    value: Some("79".into()),
                    effect: effect.into(),
                    time_added: None,
                }]);
            }
        }
    }
}

fn gpu_claim(tolerations: &str) -> ResourceClaim {
    claim(
        "gpu",
        &format!(
            "requests:\n- {{name: gpu, exactly: {{deviceClassName: gpu.nvidia.com{tolerations}}}}}"
        ),
    )
}

#[test]
fn untolerated_taints_skip_the_device_and_name_the_taint() {
    for effect in ["NoSchedule", "NoExecute"] {
        let mut slices = h100_node("node-a", 2);
        taint(&mut slices, "gpu-0", effect);
        let got = run(&slices, &gpu_claim(""));
        assert_eq!(vec![vec!["gpu=gpu-1"]], device_names(&got), "{effect}");
        let want = Rejection::TaintNotTolerated {
            key: "nvidia.com/xid".into(),
            value: Some("79".into()),
            effect: effect.into(),
        };
        assert_eq!(want, got.requests[0].rejected[0].reason, "{effect}");
    }
}

#[test]
fn tolerations_admit_tainted_devices_and_are_recorded_in_the_result() {
    let cases = [
        (
            ", tolerations: [{key: nvidia.com/xid, operator: Exists}]",
            "gpu-0",
        ),
        (
            ", tolerations: [{key: nvidia.com/xid, value: '79', effect: NoSchedule}]",
            "gpu-0",
        ),
        (
            ", tolerations: [{key: nvidia.com/xid, value: '48'}]",
            "gpu-1",
        ),
        (
            ", tolerations: [{operator: Exists, effect: NoExecute}]",
            "gpu-1",
        ),
    ];
    for (tolerations, want) in cases {
        let mut slices = h100_node("node-a", 2);
        taint(&mut slices, "gpu-0", "NoSchedule");
        let got = run(&slices, &gpu_claim(tolerations));
        assert_eq!(
            vec![vec![format!("gpu={want}")]],
            device_names(&got),
            "{tolerations}"
        );
        let recorded = got.allocations.as_ref().and_then(|a| {
            a[0].devices.as_ref()?.results.as_ref()?[0]
                .tolerations
                .clone()
        });
        assert!(recorded.is_some_and(|t| t.len() == 1), "{tolerations}");
    }
}

#[test]
fn taints_with_other_effects_do_not_block() {
    let mut slices = h100_node("node-a", 1);
    taint(&mut slices, "gpu-0", "None");
    assert_eq!(
        vec![vec!["gpu=gpu-0"]],
        device_names(&run(&slices, &gpu_claim("")))
    );
}

#[test]
fn incomplete_pools_are_ignored_and_reported() {
    let mut slices = h100_node("node-a", 2);
    slices.remove(1);
    let got = run(&slices, &gpu_claim(""));
    assert_eq!(None, got.allocations);
    let want = vec![IgnoredPool {
        driver: DRIVER.into(),
        pool: "node-a".into(),
        why: "incomplete: 1 of 2 slices at generation 1".into(),
    }];
    assert_eq!(want, got.ignored_pools);
}

#[test]
fn only_the_highest_generation_of_a_pool_counts() {
    let mut slices = h100_node("node-a", 1);
    let mut stale = h100_node("node-a", 2);
    for slice in &mut stale {
        slice.spec.pool.generation = 0;
        slice.metadata.name = slice.metadata.name.as_ref().map(|n| format!("{n}-old"));
    }
    slices.extend(stale);
    let claim = claim(
        "two",
        "requests:\n- {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}",
    );
    let got = run(&slices, &claim);
    assert_eq!(None, got.allocations);
    assert_eq!(1, got.requests[0].usable.len());
}

#[test]
fn slices_of_other_nodes_are_not_used() {
    let mut slices = h100_node("node-b", 1);
    slices.extend(h100_node("node-a", 1));
    let got = run(&slices, &gpu_claim(""));
    let pools: Vec<String> = got
        .allocations
        .iter()
        .flatten()
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| r.pool.clone())
        .collect();
    assert_eq!(vec!["node-a".to_string()], pools);
    assert_eq!(
        26,
        got.requests[0].rejected.len() + got.requests[0].usable.len()
    );
}

#[test]
fn a_pools_slices_are_walked_in_name_order_not_in_the_order_listed() {
    // kube-scheduler ≥ 1.36 sorts a pool's slices by name before its first-fit walk
    // (`sortSlicesByName`), so the slice named first offers its devices first, wherever
    // the list puts it.
    let mut slices = h100_node("node-a", 2);
    let devices = slices[0].spec.devices.take().expect("device slice");
    let (gpu0, gpu1): (Vec<_>, Vec<_>) = devices
        .into_iter()
        .partition(|d| d.name == "gpu-0" || d.name.starts_with("gpu-0-"));
    assert_eq!((26, 26), (gpu0.len(), gpu1.len()));
    slices[0].spec.devices = Some(gpu0);
    slices[0].metadata.name = Some("node-a-gpu.nvidia.com-b".into());
    let mut second = slices[0].clone();
    second.spec.devices = Some(gpu1);
    second.metadata.name = Some("node-a-gpu.nvidia.com-a".into());
    slices.push(second);
    for slice in &mut slices {
        slice.spec.pool.resource_slice_count = 3;
    }
    let got = run(&slices, &gpu_claim(""));
    assert_eq!(vec![vec!["gpu=gpu-1"]], device_names(&got));
    slices.reverse();
    let got = run(&slices, &gpu_claim(""));
    assert_eq!(
        vec![vec!["gpu=gpu-1"]],
        device_names(&got),
        "listed the other way round"
    );
}
