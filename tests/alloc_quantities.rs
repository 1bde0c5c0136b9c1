//! Quantities the allocator reads from slices and allocated claims: unreadable ones stop the
//! node naming the slice, the field and the value; request-policy rounding is reported in
//! the step's format.

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::alloc::{Abort, Detail, Node, Outcome, allocate_claim};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A shareable GPU whose memory capacity has the given value and validRange step.
fn shared_slice(memory: &str, step: &str) -> ResourceSlice {
    yaml(&format!(
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: node-a-shared}}
spec:
  driver: gpu.nvidia.com
  nodeName: node-a
  pool: {{name: node-a, generation: 1, resourceSliceCount: 1}}
  devices:
  - name: gpu-0
    allowMultipleAllocations: true
    attributes: {{type: {{string: gpu}}}}
    capacity:
      memory:
        value: "{memory}"
        requestPolicy: {{default: 10Gi, validRange: {{min: 1Gi, max: 40Gi, step: "{step}"}}}}
"#
    ))
}

fn memory_claim(memory: &str) -> ResourceClaim {
    claim(
        "share",
        &format!(
            "requests:\n- name: gpu\n  exactly:\n    deviceClassName: gpu.nvidia.com\n    \
             capacity: {{requests: {{memory: \"{memory}\"}}}}"
        ),
    )
}

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
        Detail::Brief,
    )
    .expect("claim is valid")
}

/// (slice, field, value, start of the problem) of an `InvalidSlice` abort.
fn invalid_slice(outcome: &Outcome) -> Option<(String, String, String, String)> {
    match &outcome.abort {
        Some(Abort::InvalidSlice {
            slice,
            field,
            value,
            problem,
        }) => Some((slice.clone(), field.clone(), value.clone(), problem.clone())),
        _ => None,
    }
}

#[test]
fn unreadable_capacity_values_and_steps_stop_the_node_naming_field_and_value() {
    let cases = [
        (
            "80GB",
            "2Gi",
            "devices[gpu-0].capacity.memory.value",
            "80GB",
            "unknown suffix \"GB\"",
        ),
        (
            "80Gi",
            "0",
            "devices[gpu-0].capacity.memory.requestPolicy.validRange.step",
            "0",
            "a step must be above zero",
        ),
        (
            "80Gi",
            "two",
            "devices[gpu-0].capacity.memory.requestPolicy.validRange.step",
            "two",
            "it does not start with a number",
        ),
    ];
    for (memory, step, field, value, problem) in cases {
        let slices = vec![shared_slice(memory, step)];
        let got = invalid_slice(&run(&slices, &[], &memory_claim("6Gi")));
        let got = got.map(|(s, f, v, p)| (s, f, v, p.starts_with(problem)));
        let want = Some((
            "node-a-shared".to_string(),
            field.to_string(),
            value.to_string(),
            true,
        ));
        assert_eq!(want, got, "memory {memory}, step {step}");
    }
}

#[test]
fn unreadable_shared_counters_stop_the_node_naming_the_counter_and_value() {
    let mut slices = h100_node("node-a", 1);
    let counters = slices
        .iter_mut()
        .flat_map(|s| s.spec.shared_counters.iter_mut().flatten())
        .next()
        .expect("the fixture publishes a counter set");
    let memory = counters
        .counters
        .get_mut("memory")
        .expect("the counter set has memory");
    memory.value = Quantity("lots".into());
    let mig = claim(
        "mig",
        "requests:\n- {name: mig, exactly: {deviceClassName: mig.nvidia.com}}",
    );
    let want = Some((
        "node-a-gpu.nvidia.com-1".to_string(),
        "spec.sharedCounters[gpu-0-counter-set].counters.memory.value".to_string(),
        "lots".to_string(),
        "it does not start with a number".to_string(),
    ));
    assert_eq!(want, invalid_slice(&run(&slices, &[], &mig)));
}

#[test]
fn unreadable_consumed_capacity_of_an_allocated_claim_names_field_and_value() {
    let slices = vec![shared_slice("80Gi", "2Gi")];
    let mut earlier = allocated("earlier", "node-a", &[("gpu", "gpu-0")]);
    let allocation: AllocationResult = yaml(
        "devices: {results: [{request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-0, \
         shareID: 11111111-2222-4333-8444-555555555555, consumedCapacity: {memory: ten}}]}",
    );
    earlier.status.as_mut().expect("status set").allocation = Some(allocation);
    let engine = engine();
    let classes = classes();
    let got = gpu_dra::alloc::Allocator::new(&engine, &classes, &slices, &[earlier])
        .err()
        .map(|e| e.to_string());
    let want = "allocated claim default/earlier: status.allocation.devices.results[0]\
                .consumedCapacity.memory is \"ten\": it does not start with a number";
    assert_eq!(Some(want.to_string()), got);
}

#[test]
fn rounded_capacity_requests_are_reported_in_the_steps_format() {
    let slices = vec![shared_slice("80Gi", "2Gi")];
    let cases = [
        ("6Gi", "7Gi"),
        ("6G", "7Gi"),
        ("6000Mi", "7Gi"),
        ("0.5Gi", "1Gi"),
    ];
    for (request, want) in cases {
        let outcome = run(&slices, &[], &memory_claim(request));
        let got: Vec<Option<Quantity>> = outcome
            .allocations
            .iter()
            .flatten()
            .flat_map(|a| a.devices.iter().flat_map(|d| d.results.clone()))
            .flatten()
            .map(|r: DeviceRequestAllocationResult| {
                r.consumed_capacity.and_then(|c| c.get("memory").cloned())
            })
            .collect();
        assert_eq!(vec![Some(Quantity(want.into()))], got, "{request}");
    }
}
