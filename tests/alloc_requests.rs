//! Request semantics: ExactCount, All, firstAvailable, class and request selectors, and the
//! shape of the AllocationResult (results, configs, node selector).

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::alloc::{Detail, Node, RequestStatus, allocate_claim};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim};

fn allocate_on(
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claim: &ResourceClaim,
) -> gpu_dra::alloc::Outcome {
    let engine = engine();
    allocate_claim(
        &engine,
        classes,
        slices,
        allocated,
        claim,
        &Node::named("node-a"),
        Detail::Full,
    )
    .expect("claim is valid")
}

#[test]
fn single_gpu_claim_gets_the_first_full_gpu_as_a_complete_result() {
    let slices = h100_node("node-a", 2);
    let claim = claim(
        "one-gpu",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}",
    );
    let got = allocate_on(&slices, &classes(), &[], &claim);
    let want: AllocationResult = yaml(
        r#"
devices:
  results:
  - {request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-0}
nodeSelector:
  nodeSelectorTerms:
  - matchFields: [{key: metadata.name, operator: In, values: [node-a]}]
"#,
    );
    assert_eq!(Some(vec![want]), got.allocations);
}

#[test]
fn exact_count_takes_devices_in_node_order() {
    let slices = h100_node("node-a", 3);
    let claim = claim(
        "two-gpus",
        "requests:\n- {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}",
    );
    let got = allocate_on(&slices, &classes(), &[], &claim);
    assert_eq!(vec![vec!["gpus=gpu-0", "gpus=gpu-1"]], device_names(&got));
}

#[test]
fn exact_count_above_what_the_node_has_does_not_fit() {
    let slices = h100_node("node-a", 2);
    let claim = claim(
        "three-gpus",
        "requests:\n- {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 3}}",
    );
    let got = allocate_on(&slices, &classes(), &[], &claim);
    assert_eq!(None, got.allocations);
    assert_eq!(RequestStatus::Unsatisfiable, got.requests[0].status);
    assert_eq!(2, got.requests[0].usable.len());
}

#[test]
fn all_mode_takes_every_matching_device() {
    let slices = h100_node("node-a", 3);
    let claim = claim(
        "all-gpus",
        "requests:\n- {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}}",
    );
    let got = allocate_on(&slices, &classes(), &[], &claim);
    assert_eq!(
        vec![vec!["gpus=gpu-0", "gpus=gpu-1", "gpus=gpu-2"]],
        device_names(&got)
    );
}

#[test]
fn all_mode_fails_when_one_matching_device_is_allocated_elsewhere() {
    let slices = h100_node("node-a", 2);
    let other = allocated("other", "node-a", &[("gpu", "gpu-1")]);
    let claim = claim(
        "all-gpus",
        "requests:\n- {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}}",
    );
    let got = allocate_on(&slices, &classes(), &[other], &claim);
    assert_eq!(None, got.allocations);
    assert_eq!(RequestStatus::Unsatisfiable, got.requests[0].status);
}

#[test]
fn class_and_request_selectors_must_both_hold() {
    let slices = h100_node("node-a", 1);
    let claim = claim(
        "mig",
        &format!(
            "requests:\n- name: mig\n  exactly:\n    deviceClassName: mig.nvidia.com\n    \
             selectors: [{{cel: {{expression: \"{}\"}}}}]",
            profile_selector("3g.40gb")
        ),
    );
    let got = allocate_on(&slices, &classes(), &[], &claim);
    assert_eq!(vec![vec!["mig=gpu-0-mig-3g40gb-0"]], device_names(&got));
}

#[test]
fn first_available_uses_the_first_alternative_that_fits_and_names_it() {
    let slices = h100_node("node-a", 1);
    let text = format!(
        "requests:\n- name: mig\n  firstAvailable:\n  \
         - {{name: big, deviceClassName: mig.nvidia.com, count: 3, selectors: [{{cel: {{expression: \"{}\"}}}}]}}\n  \
         - {{name: small, deviceClassName: mig.nvidia.com, selectors: [{{cel: {{expression: \"{}\"}}}}]}}",
        profile_selector("3g.40gb"),
        profile_selector("1g.10gb")
    );
    let claim = claim("prio", &text);
    let got = allocate_on(&slices, &classes(), &[], &claim);
    assert_eq!(
        vec![vec!["mig/small=gpu-0-mig-1g10gb-0"]],
        device_names(&got)
    );
    let statuses: Vec<_> = got
        .requests
        .iter()
        .map(|r| (r.request.as_str(), r.status))
        .collect();
    assert_eq!(
        vec![
            ("mig/big", RequestStatus::Unsatisfiable),
            ("mig/small", RequestStatus::Allocated)
        ],
        statuses
    );
}

#[test]
fn first_available_prefers_the_first_alternative_when_it_fits() {
    let slices = h100_node("node-a", 1);
    let text = format!(
        "requests:\n- name: mig\n  firstAvailable:\n  \
         - {{name: big, deviceClassName: mig.nvidia.com, selectors: [{{cel: {{expression: \"{}\"}}}}]}}\n  \
         - {{name: small, deviceClassName: mig.nvidia.com, selectors: [{{cel: {{expression: \"{}\"}}}}]}}",
        profile_selector("3g.40gb"),
        profile_selector("1g.10gb")
    );
    let claim = claim("prio", &text);
    let got = allocate_on(&slices, &classes(), &[], &claim);
    assert_eq!(vec![vec!["mig/big=gpu-0-mig-3g40gb-0"]], device_names(&got));
    assert_eq!(RequestStatus::NotTried, got.requests[1].status);
}

#[test]
fn class_config_and_claim_config_are_copied_with_their_source() {
    let slices = h100_node("node-a", 2);
    let mut gpu_class = class("gpu.nvidia.com", GPU_SELECTOR);
    gpu_class.spec.as_mut().expect("class has a spec").config = Some(yaml(
        "- opaque: {driver: gpu.nvidia.com, parameters: {kind: GpuConfig, sharing: {strategy: TimeSlicing}}}",
    ));
    let claim = claim(
        "configured",
        "requests:\n\
         - {name: a, exactly: {deviceClassName: gpu.nvidia.com}}\n\
         - {name: b, exactly: {deviceClassName: gpu.nvidia.com}}\n\
         config:\n\
         - {requests: [b], opaque: {driver: gpu.nvidia.com, parameters: {kind: GpuConfig, mps: true}}}\n\
         - {opaque: {driver: gpu.nvidia.com, parameters: {kind: GpuConfig, all: true}}}",
    );
    let got = allocate_on(&slices, &[gpu_class], &[], &claim);
    let want: AllocationResult = yaml(
        r#"
devices:
  results:
  - {request: a, driver: gpu.nvidia.com, pool: node-a, device: gpu-0}
  - {request: b, driver: gpu.nvidia.com, pool: node-a, device: gpu-1}
  config:
  - source: FromClass
    opaque: {driver: gpu.nvidia.com, parameters: {kind: GpuConfig, sharing: {strategy: TimeSlicing}}}
  - source: FromClaim
    requests: [b]
    opaque: {driver: gpu.nvidia.com, parameters: {kind: GpuConfig, mps: true}}
  - source: FromClaim
    opaque: {driver: gpu.nvidia.com, parameters: {kind: GpuConfig, all: true}}
nodeSelector:
  nodeSelectorTerms:
  - matchFields: [{key: metadata.name, operator: In, values: [node-a]}]
"#,
    );
    assert_eq!(Some(vec![want]), got.allocations);
}

#[test]
fn devices_of_a_slice_for_all_nodes_need_no_node_selector() {
    let mut slices = h100_node("shared", 1);
    for slice in &mut slices {
        slice.spec.node_name = None;
        slice.spec.all_nodes = Some(true);
    }
    let claim = claim(
        "one-gpu",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}",
    );
    let got = allocate_on(&slices, &classes(), &[], &claim);
    let want: AllocationResult = yaml(
        "devices: {results: [{request: gpu, driver: gpu.nvidia.com, pool: shared, device: gpu-0}]}",
    );
    assert_eq!(Some(vec![want]), got.allocations);
}
