//! matchAttribute / distinctAttribute constraints, and shared counters of partitionable
//! GPUs: a full GPU and its MIG devices exclude each other, overlapping placements too.

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::alloc::{
    ConstraintKind, Consumer, Detail, Holder, Node, Outcome, Rejection, RequestStatus,
    allocate_claim,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

fn run(slices: &[ResourceSlice], allocated: &[ResourceClaim], claim: &ResourceClaim) -> Outcome {
    let engine = engine();
    let classes = classes();
    allocate_claim(
        &engine,
        &classes,
        slices,
        allocated,
        claim,
        &Node::named("node-a"),
        Detail::Full,
    )
    .expect("claim is valid")
}

fn mig_request(name: &str, profile: &str) -> String {
    format!(
        "- name: {name}\n  exactly:\n    deviceClassName: mig.nvidia.com\n    \
         selectors: [{{cel: {{expression: \"{}\"}}}}]\n",
        profile_selector(profile)
    )
}

fn mig_claim(name: &str, requests: &[(&str, &str)], constraints: &str) -> ResourceClaim {
    let mut text = String::from("requests:\n");
    for (request, profile) in requests {
        text.push_str(&mig_request(request, profile));
    }
    text.push_str(constraints);
    claim(name, &text)
}

const SAME_PARENT: &str = "constraints:\n\
    - {requests: [mig-1g, mig-2g, mig-3g], matchAttribute: gpu.nvidia.com/parentUUID}\n";

#[test]
fn three_mig_devices_with_match_attribute_land_on_one_gpu() {
    let slices = h100_node("node-a", 2);
    let claim = mig_claim(
        "trio",
        &[
            ("mig-1g", "1g.10gb"),
            ("mig-2g", "2g.20gb"),
            ("mig-3g", "3g.40gb"),
        ],
        SAME_PARENT,
    );
    let got = run(&slices, &[], &claim);
    let want = vec![vec![
        "mig-1g=gpu-0-mig-1g10gb-0",
        "mig-2g=gpu-0-mig-2g20gb-2",
        "mig-3g=gpu-0-mig-3g40gb-4",
    ]];
    assert_eq!(want, device_names(&got));
}

#[test]
fn match_attribute_moves_every_request_to_the_gpu_with_room() {
    let slices = h100_node("node-a", 2);
    // GPU 0's upper half is taken, so its 3g placements are gone; the trio must move to GPU 1.
    let other = allocated(
        "other",
        "node-a",
        &[("x", "gpu-0-mig-4g40gb-0"), ("y", "gpu-0-mig-3g40gb-4")],
    );
    let claim = mig_claim(
        "trio",
        &[
            ("mig-1g", "1g.10gb"),
            ("mig-2g", "2g.20gb"),
            ("mig-3g", "3g.40gb"),
        ],
        SAME_PARENT,
    );
    let got = run(&slices, &[other], &claim);
    let want = vec![vec![
        "mig-1g=gpu-1-mig-1g10gb-0",
        "mig-2g=gpu-1-mig-2g20gb-2",
        "mig-3g=gpu-1-mig-3g40gb-4",
    ]];
    assert_eq!(want, device_names(&got));
}

#[test]
fn devices_lacking_the_matched_attribute_fail_the_constraint() {
    let slices = h100_node("node-a", 1);
    let claim = claim(
        "mixed",
        "requests:\n\
         - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}\n\
         - {name: mig, exactly: {deviceClassName: mig.nvidia.com}}\n\
         constraints:\n\
         - {matchAttribute: gpu.nvidia.com/parentUUID}",
    );
    let got = run(&slices, &[], &claim);
    assert_eq!(None, got.allocations);
    let want = Rejection::Constraint {
        index: 0,
        kind: ConstraintKind::MatchAttribute,
        attribute: "gpu.nvidia.com/parentUUID".into(),
        value: None,
        chosen: None,
    };
    let gpu_conflicts: Vec<&Rejection> = got.requests[0]
        .conflicts
        .iter()
        .map(|c| &c.reason)
        .collect();
    assert_eq!(vec![&want], gpu_conflicts);
}

#[test]
fn distinct_attribute_spreads_requests_over_gpus() {
    let slices = h100_node("node-a", 2);
    let claim = mig_claim(
        "spread",
        &[("a", "1g.10gb"), ("b", "1g.10gb")],
        "constraints:\n- {distinctAttribute: gpu.nvidia.com/parentUUID}\n",
    );
    let got = run(&slices, &[], &claim);
    assert_eq!(
        vec![vec!["a=gpu-0-mig-1g10gb-0", "b=gpu-1-mig-1g10gb-0"]],
        device_names(&got)
    );
    let refusal = got.requests[1]
        .conflicts
        .iter()
        .find(|c| c.device.device == "gpu-0-mig-1g10gb-1")
        .map(|c| c.reason.clone());
    let want = Rejection::Constraint {
        index: 0,
        kind: ConstraintKind::DistinctAttribute,
        attribute: "gpu.nvidia.com/parentUUID".into(),
        value: Some(gpu_uuid("node-a", 0)),
        chosen: Some(Holder {
            device: "gpu-0-mig-1g10gb-0".into(),
            request: "a".into(),
            value: gpu_uuid("node-a", 0),
        }),
    };
    assert_eq!(Some(want), refusal);
}

#[test]
fn a_full_gpu_excludes_its_mig_devices_and_the_other_way_round() {
    let slices = h100_node("node-a", 1);
    let claim = claim(
        "both",
        "requests:\n\
         - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}\n\
         - {name: mig, exactly: {deviceClassName: mig.nvidia.com}}",
    );
    let got = run(&slices, &[], &claim);
    assert_eq!(None, got.allocations);
    assert_eq!(RequestStatus::Blocked, got.requests[1].status);

    let other = allocated("holder", "node-a", &[("mig", "gpu-0-mig-1g10gb-6")]);
    let gpu = claim_one("gpu.nvidia.com");
    let got = run(&slices, &[other], &gpu);
    let want = Rejection::CountersExhausted {
        counter_set: "gpu-0-counter-set".into(),
        counter: "memory-slice-6".into(),
        needed: "1".into(),
        left: "0".into(),
        consumers: vec![Consumer {
            device: "gpu-0-mig-1g10gb-6".into(),
            by: "claim default/holder".into(),
        }],
    };
    assert_eq!(None, got.allocations);
    let gpu0 = got.requests[0]
        .rejected
        .first()
        .map(|r| (r.device.device.clone(), r.reason.clone()));
    assert_eq!(Some(("gpu-0".to_string(), want)), gpu0);
}

fn claim_one(class: &str) -> ResourceClaim {
    claim(
        "one",
        &format!("requests:\n- {{name: dev, exactly: {{deviceClassName: {class}}}}}"),
    )
}

#[test]
fn overlapping_placements_exclude_each_other_but_disjoint_ones_do_not() {
    let slices = h100_node("node-a", 1);
    let holder = allocated("holder", "node-a", &[("x", "gpu-0-mig-3g40gb-0")]);
    let cases = [
        ("4g.40gb", None),
        ("3g.40gb", Some("x=gpu-0-mig-3g40gb-4")),
        ("2g.20gb", Some("x=gpu-0-mig-2g20gb-4")),
    ];
    for (profile, want) in cases {
        let claim = mig_claim("probe", &[("x", profile)], "");
        let got = run(&slices, std::slice::from_ref(&holder), &claim);
        let want: Vec<Vec<String>> = want.into_iter().map(|w| vec![w.to_string()]).collect();
        assert_eq!(want, device_names(&got), "{profile}");
    }
}

#[test]
fn two_3g_devices_leave_no_memory_slice_for_a_1g() {
    let slices = h100_node("node-a", 1);
    let claim = mig_claim(
        "full-house",
        &[("a", "3g.40gb"), ("b", "3g.40gb"), ("c", "1g.10gb")],
        "",
    );
    let got = run(&slices, &[], &claim);
    assert_eq!(None, got.allocations);
    let statuses: Vec<RequestStatus> = got.requests.iter().map(|r| r.status).collect();
    assert_eq!(vec![RequestStatus::Blocked; 3], statuses);
    let reason = &got.requests[2].conflicts[0].reason;
    let Rejection::CountersExhausted {
        counter, consumers, ..
    } = reason
    else {
        panic!("expected counters exhausted, got {reason:?}");
    };
    assert_eq!("memory-slice-0", counter);
    assert_eq!(
        vec![Consumer {
            device: "gpu-0-mig-3g40gb-0".into(),
            by: "request a".into()
        }],
        *consumers
    );
}

#[test]
fn already_allocated_devices_are_skipped_with_the_holding_claim_named() {
    let slices = h100_node("node-a", 2);
    let holder = allocated("holder", "node-a", &[("gpu", "gpu-0")]);
    let got = run(&slices, &[holder], &claim_one("gpu.nvidia.com"));
    assert_eq!(vec![vec!["dev=gpu-1"]], device_names(&got));
    let first = &got.requests[0].rejected[0];
    assert_eq!(
        (
            "gpu-0",
            Rejection::AlreadyAllocated {
                claim: "default/holder".into()
            }
        ),
        (first.device.device.as_str(), first.reason.clone())
    );
}
