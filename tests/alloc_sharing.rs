//! Consumable capacity (allowMultipleAllocations, request policies, consumedCapacity,
//! shareID) and admin access.

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::alloc::{CapacityProblem, Detail, Node, Outcome, Rejection, allocate_claim};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};

const SHARED_SLICE: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-a-shared}
spec:
  driver: gpu.nvidia.com
  nodeName: node-a
  pool: {name: node-a, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    allowMultipleAllocations: true
    attributes: {type: {string: gpu}}
    capacity:
      memory:
        value: 80Gi
        requestPolicy: {default: 10Gi, validRange: {min: 1Gi, max: 40Gi, step: 2Gi}}
      compute:
        value: "100"
        requestPolicy: {default: "10", validValues: ["10", "25", "50"]}
"#;

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

fn capacity_claim(requests: &str) -> ResourceClaim {
    claim(
        "share",
        &format!(
            "requests:\n- name: gpu\n  exactly:\n    deviceClassName: gpu.nvidia.com\n    \
             capacity: {{requests: {requests}}}"
        ),
    )
}

fn results(outcome: &Outcome) -> Vec<DeviceRequestAllocationResult> {
    outcome
        .allocations
        .iter()
        .flatten()
        .flat_map(|a| {
            a.devices
                .iter()
                .flat_map(|d| d.results.clone().unwrap_or_default())
        })
        .collect()
}

fn is_uuid(text: &str) -> bool {
    let groups: Vec<usize> = text.split('-').map(str::len).collect();
    groups == [8, 4, 4, 4, 12] && text.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
}

#[test]
fn capacity_requests_round_up_per_policy_and_record_consumed_capacity_and_share() {
    let slices = vec![yaml::<ResourceSlice>(SHARED_SLICE)];
    let got = run(&slices, &[], &capacity_claim("{memory: 6Gi}"));
    let got = results(&got);
    let share = got
        .first()
        .and_then(|r| r.share_id.clone())
        .unwrap_or_default();
    assert!(is_uuid(&share), "share ID {share:?} is a UUID");
    let mut want: DeviceRequestAllocationResult = yaml(
        "{request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-0, \
         consumedCapacity: {compute: '10', memory: 7Gi}}",
    );
    want.share_id = Some(share);
    assert_eq!(vec![want], got);
}

#[test]
fn capacity_requests_outside_the_policy_or_the_remainder_are_refused() {
    let slices = vec![yaml::<ResourceSlice>(SHARED_SLICE)];
    let mut earlier = allocated("earlier", "node-a", &[("gpu", "gpu-0")]);
    let allocation: AllocationResult = yaml(
        "devices: {results: [{request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-0, \
         shareID: 11111111-2222-4333-8444-555555555555, consumedCapacity: {memory: 70Gi, compute: '10'}}]}",
    );
    earlier.status.as_mut().expect("status set").allocation = Some(allocation);
    let cases = [
        (
            "{memory: 41Gi}",
            vec![],
            CapacityProblem::PolicyViolated {
                requested: "41Gi".into(),
                policy: "validRange min 1Gi max 40Gi step 2Gi".into(),
            },
            "memory",
        ),
        (
            "{compute: '60'}",
            vec![],
            CapacityProblem::PolicyViolated {
                requested: "60".into(),
                policy: "validValues 10, 25, 50".into(),
            },
            "compute",
        ),
        (
            "{memory: 11Gi}",
            vec![earlier.clone()],
            CapacityProblem::Insufficient {
                requested: "11Gi".into(),
                left: "10Gi".into(),
            },
            "memory",
        ),
        (
            "{bandwidth: '1'}",
            vec![],
            CapacityProblem::NotOffered,
            "bandwidth",
        ),
    ];
    for (requests, allocated, problem, capacity) in cases {
        let got = run(&slices, &allocated, &capacity_claim(requests));
        assert_eq!(None, got.allocations, "{requests}");
        let want = Rejection::Capacity {
            capacity: capacity.into(),
            problem,
        };
        assert_eq!(want, got.requests[0].rejected[0].reason, "{requests}");
    }
}

#[test]
fn one_shareable_device_serves_two_requests_with_distinct_share_ids() {
    let slices = vec![yaml::<ResourceSlice>(SHARED_SLICE)];
    let claim = claim(
        "two-shares",
        "requests:\n\
         - {name: a, exactly: {deviceClassName: gpu.nvidia.com, capacity: {requests: {memory: 30Gi}}}}\n\
         - {name: b, exactly: {deviceClassName: gpu.nvidia.com, capacity: {requests: {memory: 30Gi}}}}",
    );
    let got = results(&run(&slices, &[], &claim));
    let devices: Vec<(&str, &str)> = got
        .iter()
        .map(|r| (r.request.as_str(), r.device.as_str()))
        .collect();
    assert_eq!(vec![("a", "gpu-0"), ("b", "gpu-0")], devices);
    assert_ne!(got[0].share_id, got[1].share_id);
}

#[test]
fn admin_access_may_use_a_device_another_claim_holds() {
    let slices = h100_node("node-a", 1);
    let holder = allocated("holder", "node-a", &[("gpu", "gpu-0")]);
    let admin = claim(
        "monitor",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, adminAccess: true}}",
    );
    let got = results(&run(&slices, std::slice::from_ref(&holder), &admin));
    let want: DeviceRequestAllocationResult = yaml(
        "{request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-0, adminAccess: true}",
    );
    assert_eq!(vec![want], got);

    let ordinary = claim(
        "user",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}",
    );
    assert_eq!(None, run(&slices, &[holder], &ordinary).allocations);
}

#[test]
fn admin_access_results_hold_nothing_for_later_claims() {
    let slices = h100_node("node-a", 1);
    let mut monitor = allocated("monitor", "node-a", &[("gpu", "gpu-0")]);
    let allocation: AllocationResult = yaml(
        "devices: {results: [{request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-0, adminAccess: true}]}",
    );
    monitor.status.as_mut().expect("status set").allocation = Some(allocation);
    let user = claim(
        "user",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}",
    );
    assert_eq!(
        vec![vec!["gpu=gpu-0"]],
        device_names(&run(&slices, &[monitor], &user))
    );
}
