//! `gpu-dra capacity` offline: slices the project's own inventory publishes for several
//! presets, claims allocated by the project's allocator, and the report compared with what
//! the allocator can still place.

use gpu_dra::alloc::{Detail, Node, allocate_claim};
use gpu_dra::capacity::{
    CapacityError, CapacityInput, CapacityOptions, CapacityReport, FULL_GPU, MigMode, build,
};
use gpu_dra::explain_inputs::{builtin_classes, sim_slices};
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;

fn options() -> CapacityOptions {
    CapacityOptions {
        driver: "gpu.nvidia.com".into(),
        pool_label: None,
        node: None,
    }
}

/// A one-device claim for a MIG profile, or a full GPU with `FULL_GPU`.
fn claim_for(namespace: &str, name: &str, profile: &str) -> ResourceClaim {
    let exactly = if profile == FULL_GPU {
        json!({"deviceClassName": "gpu.nvidia.com"})
    } else {
        json!({"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression":
            format!("device.attributes['gpu.nvidia.com'].profile == '{profile}'")}}]})
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
    }))
    .unwrap()
}

/// Allocates `claim` on `node` with the project's allocator, as the scheduler would, and
/// reserves it for `pod`. `None` when it does not fit.
fn allocate(
    slices: &[ResourceSlice],
    held: &[ResourceClaim],
    mut claim: ResourceClaim,
    node: &str,
    pod: &str,
) -> Option<ResourceClaim> {
    let classes = builtin_classes().unwrap();
    let outcome = allocate_claim(
        &CelEngine,
        &classes,
        slices,
        held,
        &claim,
        &Node::named(node),
        Detail::Brief,
    )
    .unwrap();
    let allocation = outcome.allocations?.pop()?;
    claim.status = Some(
        serde_json::from_value(json!({
            "allocation": allocation,
            "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("pod-{pod}")}]
        }))
        .unwrap(),
    );
    Some(claim)
}

/// How many more one-device claims of `profile` the allocator places on `node`.
fn allocator_free(
    slices: &[ResourceSlice],
    held: &[ResourceClaim],
    node: &str,
    profile: &str,
) -> usize {
    let mut held = held.to_vec();
    let mut n = 0;
    while let Some(claim) = allocate(
        slices,
        &held,
        claim_for("probe", &format!("probe-{n}"), profile),
        node,
        "probe",
    ) {
        held.push(claim);
        n += 1;
    }
    n
}

fn report(slices: &[ResourceSlice], claims: &[ResourceClaim]) -> CapacityReport {
    build(
        &CapacityInput {
            slices: slices.to_vec(),
            claims: claims.to_vec(),
            nodes: Vec::new(),
        },
        &options(),
    )
    .unwrap()
}

#[test]
fn every_profiles_free_count_is_what_the_allocator_can_still_place() {
    // The mixed preset: a static-MIG A100, a dynamic-MIG H100 and an L4.
    let slices = sim_slices("mixed", "gpu.nvidia.com", Default::default()).unwrap();
    let mut held = Vec::new();
    for (i, profile) in ["3g.40gb", "1g.10gb+me", "1g.5gb", FULL_GPU]
        .iter()
        .enumerate()
    {
        let claim = claim_for("team-a", &format!("c{i}"), profile);
        held.push(allocate(&slices, &held, claim, "mixed", &format!("pod-{i}")).unwrap());
    }
    let report = report(&slices, &held);
    assert_eq!(report.totals.allocated_devices, 4);
    assert_eq!(report.totals.claims, 4);
    for row in &report.profiles {
        let want = if row.profile == FULL_GPU {
            // Per model: count the allocator's free GPUs of that model only.
            let model = &row.models[0];
            let mut claim = claim_for("probe", "x", FULL_GPU);
            let spec = claim.spec.as_mut().unwrap();
            spec.devices.as_mut().unwrap().requests.as_mut().unwrap()[0]
                .exactly
                .as_mut()
                .unwrap()
                .selectors = Some(vec![
                serde_json::from_value(json!({"cel": {"expression": format!(
                    "device.attributes['gpu.nvidia.com'].productName == '{model}'")}}))
                .unwrap(),
            ]);
            let mut more = held.clone();
            let mut n = 0;
            while let Some(c) = allocate(&slices, &more, claim.clone(), "mixed", "p") {
                let mut c = c;
                c.metadata.name = Some(format!("probe-{n}"));
                more.push(c);
                n += 1;
            }
            n
        } else {
            allocator_free(&slices, &held, "mixed", &row.profile)
        };
        assert_eq!(
            (row.profile.as_str(), row.free),
            (row.profile.as_str(), want),
            "{row:?}"
        );
    }
}

#[test]
fn a_dgx_h100_shows_each_holder_its_placement_and_the_layout_it_leaves() {
    let slices = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    let mut held = Vec::new();
    for (ns, name, profile, pod) in [
        ("team-a", "train", "3g.40gb", "trainer-0"),
        ("team-b", "infer", "2g.20gb", "server-0"),
        ("team-b", "notebook", "1g.10gb", "jupyter-0"),
    ] {
        let claim = claim_for(ns, name, profile);
        held.push(allocate(&slices, &held, claim, "dgx-h100", pod).unwrap());
    }
    let report = report(&slices, &held);
    // MIG claims fill the node from its last GPU (`--slice-layout gpus-first`).
    let gpu7 = &report.nodes[0].gpus[7];
    assert_eq!(gpu7.mig, MigMode::Dynamic);
    assert_eq!(gpu7.model, "NVIDIA H100 80GB HBM3");
    let got: Vec<(String, String, String, Vec<String>)> = gpu7
        .allocated
        .iter()
        .map(|a| {
            let h = &a.holders[0];
            (
                a.device.clone(),
                h.namespace.clone(),
                h.claim.clone(),
                h.pods.clone(),
            )
        })
        .collect();
    // The packing order puts 3g at 4, 2g at 2 and 1g at 1, leaving slice 0 for one more
    // 1g.10gb (the old order left nothing: 3g@0, 2g@4, 1g@6).
    assert_eq!(
        got,
        [
            (
                "gpu-7-mig-1g10gb-1".to_string(),
                "team-b".to_string(),
                "notebook".to_string(),
                vec!["jupyter-0".to_string()]
            ),
            (
                "gpu-7-mig-2g20gb-2".into(),
                "team-b".into(),
                "infer".into(),
                vec!["server-0".into()]
            ),
            (
                "gpu-7-mig-3g40gb-4".into(),
                "team-a".into(),
                "train".into(),
                vec!["trainer-0".into()]
            ),
        ]
    );
    assert_eq!(gpu7.layout.as_deref(), Some(".ABBCCCC"));
    let free: Vec<(&str, usize)> = gpu7
        .free
        .iter()
        .map(|f| (f.profile.as_str(), f.count))
        .collect();
    assert_eq!(
        free,
        [
            (FULL_GPU, 0),
            ("1g.10gb", 1),
            ("1g.10gb+me", 1),
            ("1g.20gb", 0),
            ("2g.20gb", 0),
            ("3g.40gb", 0),
            ("4g.40gb", 0),
            ("7g.80gb", 0)
        ]
    );
    let row = |p: &str| report.profiles.iter().find(|r| r.profile == p).unwrap();
    assert_eq!((row("1g.10gb").capacity, row("1g.10gb").free), (56, 50));
    assert_eq!((row(FULL_GPU).capacity, row(FULL_GPU).allocated), (8, 0));
    assert_eq!(row(FULL_GPU).free, 7);
    assert_eq!(row("3g.40gb").allocated, 1);
    assert_eq!(report.totals.busy_gpus, 1);
    assert_eq!(report.totals.namespaces, 2);
}

#[test]
fn a_static_mig_node_counts_existing_devices_and_full_gpus() {
    let slices = sim_slices("dgx-a100", "gpu.nvidia.com", Default::default()).unwrap();
    let held = vec![
        allocate(
            &slices,
            &[],
            claim_for("ml", "small", "1g.5gb"),
            "dgx-a100",
            "p",
        )
        .unwrap(),
    ];
    let report = report(&slices, &held);
    let modes: Vec<MigMode> = report.nodes[0].gpus.iter().map(|g| g.mig).collect();
    assert_eq!(modes[..4], [MigMode::Static; 4]);
    assert_eq!(modes[4..], [MigMode::Off; 4]);
    let row = |p: &str| report.profiles.iter().find(|r| r.profile == p).unwrap();
    assert_eq!(
        (
            row("1g.5gb").capacity,
            row("1g.5gb").allocated,
            row("1g.5gb").free
        ),
        (8, 1, 7)
    );
    assert_eq!((row(FULL_GPU).capacity, row(FULL_GPU).free), (4, 4));
    assert_eq!(
        allocator_free(&slices, &held, "dgx-a100", "1g.5gb"),
        row("1g.5gb").free
    );
}

fn labelled(name: &str, pool: &str) -> KubeNode {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"gpu-pool": pool}}}))
        .unwrap()
}

fn renamed(preset: &str, node: &str) -> Vec<ResourceSlice> {
    let mut slices = sim_slices(preset, "gpu.nvidia.com", Default::default()).unwrap();
    for s in &mut slices {
        s.spec.node_name = Some(node.into());
        s.spec.pool.name = node.into();
        s.metadata.name = s.metadata.name.as_ref().map(|n| n.replace(preset, node));
    }
    slices
}

#[test]
fn nodes_are_grouped_into_pools_by_a_label_and_unlabelled_ones_are_named() {
    let mut slices = renamed("dgx-h100", "h-1");
    slices.extend(renamed("dgx-h100", "h-2"));
    slices.extend(renamed("l4-x4", "l-1"));
    let input = CapacityInput {
        slices,
        claims: Vec::new(),
        nodes: vec![labelled("h-1", "training"), labelled("h-2", "training")],
    };
    let report = build(
        &input,
        &CapacityOptions {
            pool_label: Some("gpu-pool".into()),
            ..options()
        },
    )
    .unwrap();
    let pools: Vec<(&str, usize, usize)> = report
        .pools
        .iter()
        .map(|p| (p.pool.as_str(), p.nodes, p.gpus))
        .collect();
    assert_eq!(pools, [("<none>", 1, 4), ("training", 2, 16)]);
    assert_eq!(report.nodes[0].pool.as_deref(), Some("training"));
    let training = &report.pools[1];
    let mig = training
        .profiles
        .iter()
        .find(|p| p.profile == "3g.40gb")
        .unwrap();
    assert_eq!((mig.capacity, mig.free), (32, 32));
}

#[test]
fn a_shared_claim_lists_every_pod_and_other_drivers_are_ignored() {
    let slices = sim_slices("l4-x4", "gpu.nvidia.com", Default::default()).unwrap();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "shared", "namespace": "web"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "l4-x4", "device": "gpu-2"},
                {"request": "nic", "driver": "net.example.com", "pool": "l4-x4", "device": "gpu-1"}]}},
            "reservedFor": [{"resource": "pods", "name": "a", "uid": "1"},
                            {"resource": "pods", "name": "b", "uid": "2"}]}
    }))
    .unwrap();
    let report = report(&slices, &[claim]);
    let held: Vec<(&str, &Vec<String>)> = report.nodes[0]
        .gpus
        .iter()
        .flat_map(|g| &g.allocated)
        .map(|a| (a.device.as_str(), &a.holders[0].pods))
        .collect();
    assert_eq!(held, [("gpu-2", &vec!["a".to_string(), "b".to_string()])]);
}

#[test]
fn a_claim_on_a_device_no_slice_publishes_is_a_warning_and_an_incomplete_pool_too() {
    let mut slices = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    slices.pop();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "ghost", "namespace": "x"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": "gpu.nvidia.com", "pool": "dgx-h100", "device": "gpu-42"}]}}}
    }))
    .unwrap();
    let report = report(&slices, &[claim]);
    assert_eq!(
        report.warnings,
        [
            "pool dgx-h100 is incomplete: 4 of 5 slices at generation 1; counted as is",
            "claim x/ghost holds device gpu-42 of pool dgx-h100, which no slice publishes"
        ]
    );
}

#[test]
fn an_unparsable_counter_names_the_slice_the_field_and_the_value() {
    let mut slices = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    let set = &mut slices[0].spec.shared_counters.as_mut().unwrap()[0];
    set.counters.get_mut("memory-slice-0").unwrap().value.0 = "lots".into();
    let err = build(
        &CapacityInput {
            slices,
            ..Default::default()
        },
        &options(),
    )
    .unwrap_err();
    assert!(matches!(err, CapacityError::InvalidSlice { .. }));
    let text = err.to_string();
    assert!(
        text.starts_with(
            "ResourceSlice dgx-h100-gpu.nvidia.com-00: spec.sharedCounters[gpu-0-counter-set].counters.memory-slice-0.value is \"lots\""
        ),
        "{text}"
    );
}

#[test]
fn an_unknown_node_is_refused_naming_the_nodes_that_publish_devices() {
    let slices = sim_slices("mixed", "gpu.nvidia.com", Default::default()).unwrap();
    let err = build(
        &CapacityInput {
            slices,
            ..Default::default()
        },
        &CapacityOptions {
            node: Some("gpu-9".into()),
            ..options()
        },
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "node \"gpu-9\" publishes no gpu.nvidia.com devices (nodes that do: mixed)"
    );
}

/// A claim in `namespace` already allocated `device` of the dgx-h100 node.
fn holding(name: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "dev", "driver": "gpu.nvidia.com", "pool": "dgx-h100", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": format!("{name}-0"), "uid": "u"}]}
    }))
    .unwrap()
}

#[test]
fn a_fragmented_gpu_names_its_free_slices_and_the_devices_blocking_each_profile() {
    let slices = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    let held = [
        holding("big", "gpu-3-mig-4g40gb-0"),
        holding("small", "gpu-3-mig-1g10gb-5"),
    ];
    let report = report(&slices, &held);
    let gpu3 = &report.nodes[0].gpus[3];
    assert_eq!(gpu3.layout.as_deref(), Some("AAAA.B.."));
    assert_eq!(gpu3.free_memory_slices, Some(vec![4, 6, 7]));
    let blocked: Vec<String> = gpu3.blocked.iter().map(ToString::to_string).collect();
    assert_eq!(
        blocked,
        [
            "2g.20gb blocked by gpu-3-mig-1g10gb-5 at slice 5",
            "3g.40gb blocked by gpu-3-mig-1g10gb-5 at slice 5",
            "4g.40gb blocked by gpu-3-mig-4g40gb-0 at slices 0-3",
            "7g.80gb blocked by gpu-3-mig-4g40gb-0 at slices 0-3, gpu-3-mig-1g10gb-5 at slice 5",
        ]
    );
    let json = serde_json::to_value(gpu3).unwrap();
    assert_eq!(json["freeMemorySlices"], json!([4, 6, 7]));
    assert_eq!(
        json["blocked"][1],
        json!({"profile": "3g.40gb", "placement": {"start": 4, "size": 4},
               "blockedBy": [{"device": "gpu-3-mig-1g10gb-5", "slices": [5]}]})
    );
    let idle = &report.nodes[0].gpus[0];
    assert_eq!(idle.free_memory_slices, Some((0..8).collect()));
    assert!(idle.blocked.is_empty());
}

#[test]
fn the_media_engine_holder_blocks_the_other_media_profile_by_counter() {
    let slices = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    let held = [holding("media", "gpu-0-mig-1g10gb-me-6")];
    let gpu0 = &report(&slices, &held).nodes[0].gpus[0];
    let blocked: Vec<String> = gpu0.blocked.iter().map(ToString::to_string).collect();
    assert_eq!(
        blocked,
        [
            "1g.10gb+me blocked by gpu-0-mig-1g10gb-me-6 on ofa-engines",
            "7g.80gb blocked by gpu-0-mig-1g10gb-me-6 at slice 6",
        ]
    );
}
