//! examples/consumable-capacity.yaml on a simulated node: both claims share one GPU with the
//! built-in allocator and real CEL, the plugin's claim reader sees each share, and the share
//! becomes the MPS limits the example promises. Without sharing, each claim gets its own GPU.

use std::collections::BTreeMap;

use gpu_dra::alloc::{self, CapacityProblem, Detail, Node, Rejection};
use gpu_dra::devices::{self, ModelOptions, ShareLimits, SharedGpus};
use gpu_dra::explain_inputs::builtin_classes;
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::k8s::ClaimRef;
use gpu_dra::k8s::claims::allocated;
use gpu_dra::selectors::CelEngine;
use gpu_dra::slices::{self, PoolOptions};
use k8s_openapi::api::resource::v1::{
    DeviceRequestAllocationResult, ResourceClaim, ResourceClaimStatus, ResourceClaimTemplate,
    ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

const EXAMPLE: &str = include_str!("../examples/consumable-capacity.yaml");
const DRIVER: &str = "gpu.nvidia.com";

/// A node of `count` H100s with dynamic MIG, so the full GPUs consume shared counters.
fn node(count: u32, shared: SharedGpus) -> (String, devices::DeviceModel, Vec<ResourceSlice>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h100.yaml");
    let yaml = format!(
        "nodeName: h100-node\ngpus:\n  - model: H100-SXM5-80GB\n    count: {count}\n    mig: dynamic\n"
    );
    std::fs::write(&path, yaml).unwrap();
    let sim = SimBackend::open(path.to_str().unwrap(), None).unwrap();
    let mut options = ModelOptions::with_policies(DRIVER, &sim.mig_policies());
    options.shared_gpus = shared;
    let model = devices::build(&sim.inventory().unwrap(), &options);
    let pool = PoolOptions {
        driver_name: DRIVER.into(),
        node_name: sim.node_name().into(),
        generation: 1,
    };
    let slices = slices::build(&model, &pool).unwrap();
    (sim.node_name().to_string(), model, slices)
}

/// The example's templates as the claims the control plane makes of them, and a third that
/// wants more memory than is left after them.
fn claims() -> Vec<ResourceClaim> {
    let mut claims: Vec<ResourceClaim> = serde_yaml::Deserializer::from_str(EXAMPLE)
        .filter_map(|doc| {
            let value = serde_yaml::Value::deserialize(doc).unwrap();
            (value["kind"] == "ResourceClaimTemplate")
                .then(|| serde_yaml::from_value::<ResourceClaimTemplate>(value).unwrap())
        })
        .map(|t| claim(&t.metadata.name.unwrap(), t.spec.unwrap().spec.unwrap()))
        .collect();
    let mut third = claims[1].spec.clone().unwrap();
    let request = third.devices.as_mut().unwrap().requests.as_mut().unwrap();
    let capacity = request[0].exactly.as_mut().unwrap().capacity.as_mut();
    capacity.unwrap().requests.as_mut().unwrap().insert(
        "memory".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("30Gi".into()),
    );
    claims.push(claim("gpu-share-third", third));
    claims
}

fn claim(name: &str, spec: k8s_openapi::api::resource::v1::ResourceClaimSpec) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("{name}-gpu")),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Allocates `claims` one after another (earlier ones keep their devices); `None` for a claim
/// that does not fit, with the reasons of its refusal on gpu-0.
fn allocate_in_turn(
    slices: &[ResourceSlice],
    node: &str,
    claims: Vec<ResourceClaim>,
) -> (Vec<ResourceClaim>, Vec<Option<Rejection>>) {
    let classes = builtin_classes().unwrap();
    let mut done: Vec<ResourceClaim> = Vec::new();
    let mut refusals = Vec::new();
    for mut claim in claims {
        let outcome = alloc::allocate_claim(
            &CelEngine,
            &classes,
            slices,
            &done,
            &claim,
            &Node::named(node),
            Detail::Full,
        )
        .unwrap();
        match outcome.allocations.and_then(|mut a| a.pop()) {
            Some(result) => {
                claim.status = Some(ResourceClaimStatus {
                    allocation: Some(result),
                    ..Default::default()
                });
                done.push(claim);
                refusals.push(None);
            }
            None => {
                let on_gpu0 = outcome.requests[0]
                    .rejected
                    .iter()
                    .find(|r| r.device.device == "gpu-0")
                    .map(|r| r.reason.clone());
                refusals.push(on_gpu0);
            }
        }
    }
    (done, refusals)
}

fn result(claim: &ResourceClaim) -> &DeviceRequestAllocationResult {
    let allocation = claim.status.as_ref().unwrap().allocation.as_ref().unwrap();
    &allocation
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0]
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn both_example_claims_share_one_gpu_with_distinct_share_ids_and_their_amounts() {
    let (node, _, slices) = node(1, SharedGpus::Shares(4));
    let (done, _) = allocate_in_turn(&slices, &node, claims()[..2].to_vec());
    assert_eq!(done.len(), 2);
    let (big, small) = (result(&done[0]), result(&done[1]));
    assert_eq!(
        ("gpu-0", "gpu-0"),
        (big.device.as_str(), small.device.as_str())
    );
    let (big_id, small_id) = (
        big.share_id.clone().unwrap(),
        small.share_id.clone().unwrap(),
    );
    assert_ne!(big_id, small_id);
    let consumed = |r: &DeviceRequestAllocationResult| -> BTreeMap<String, String> {
        r.consumed_capacity
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect()
    };
    // The engines and other capacities default to nothing, so they never block a share.
    let want_big = quantities(&[("memory", "40Gi"), ("multiprocessors", "66")]);
    let want_small = quantities(&[("memory", "20Gi"), ("multiprocessors", "33")]);
    assert_eq!(want_big, consumed(big));
    assert_eq!(want_small, consumed(small));
}

#[test]
fn a_third_claim_that_does_not_fit_beside_them_is_refused_for_memory() {
    let (node, _, slices) = node(1, SharedGpus::Memory);
    let (done, refusals) = allocate_in_turn(&slices, &node, claims());
    assert_eq!(done.len(), 2);
    let want = Some(Rejection::Capacity {
        capacity: "memory".into(),
        problem: CapacityProblem::Insufficient {
            requested: "30Gi".into(),
            left: "20119Mi".into(),
        },
    });
    assert_eq!(want, refusals[2]);
}

#[test]
fn without_sharing_the_second_claim_gets_a_gpu_of_its_own() {
    let (node, _, slices) = node(2, SharedGpus::Off);
    let (done, _) = allocate_in_turn(&slices, &node, claims()[..2].to_vec());
    let got: Vec<(&str, bool)> = done
        .iter()
        .map(|c| (result(c).device.as_str(), result(c).share_id.is_some()))
        .collect();
    assert_eq!(vec![("gpu-0", false), ("gpu-1", false)], got);
}

#[test]
fn the_plugin_reads_each_share_and_turns_it_into_the_mps_limits_the_example_promises() {
    let (node, model, slices) = node(1, SharedGpus::Shares(4));
    let (done, _) = allocate_in_turn(&slices, &node, claims()[..2].to_vec());
    let device = &model.device("gpu-0").unwrap().device;
    let mut got = Vec::new();
    for claim in &done {
        let wanted = ClaimRef {
            namespace: "default".into(),
            name: claim.metadata.name.clone().unwrap(),
            uid: claim.metadata.uid.clone().unwrap(),
        };
        let read = allocated(claim, wanted, DRIVER, &node).unwrap();
        let share = &read.devices[0];
        assert_eq!(share.share_id, result(claim).share_id);
        got.push(devices::share_limits(device, &share.consumed_capacity).unwrap());
    }
    let want = vec![
        ShareLimits {
            active_thread_percentage: 50,
            pinned_memory_bytes: Some(40 << 30),
        },
        ShareLimits {
            active_thread_percentage: 25,
            pinned_memory_bytes: Some(20 << 30),
        },
    ];
    assert_eq!(want, got);
    assert_eq!(
        vec![Some("40960M".to_string()), Some("20480M".to_string())],
        got.iter()
            .map(ShareLimits::pinned_memory_limit_arg)
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_claim_naming_no_amounts_takes_one_of_n_equal_shares() {
    let (node, _, slices) = node(1, SharedGpus::Shares(4));
    let mut plain = claims()[0].clone();
    let request = &mut plain
        .spec
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0];
    request.exactly.as_mut().unwrap().capacity = None;
    let four: Vec<ResourceClaim> = (0..5)
        .map(|i| {
            let mut c = plain.clone();
            c.metadata.name = Some(format!("plain-{i}"));
            c.metadata.uid = Some(format!("uid-plain-{i}"));
            c
        })
        .collect();
    let (done, refusals) = allocate_in_turn(&slices, &node, four);
    assert_eq!(4, done.len());
    let consumed: BTreeMap<String, String> = result(&done[0])
        .consumed_capacity
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    // 81559Mi / 4 and 132 / 4.
    let want = quantities(&[("memory", "20389Mi"), ("multiprocessors", "33")]);
    assert_eq!(want, consumed);
    assert!(matches!(
        refusals[4],
        Some(Rejection::Capacity { ref capacity, .. }) if capacity == "memory"
    ));
}

#[test]
fn a_gpu_republished_unshared_is_not_handed_out_whole_while_shares_of_it_remain() {
    let (node_name, _, shared_slices) = node(1, SharedGpus::Shares(4));
    let (done, _) = allocate_in_turn(&shared_slices, &node_name, claims()[..1].to_vec());
    let (_, _, unshared_slices) = node(1, SharedGpus::Off);
    let mut next = claims()[1].clone();
    next.metadata.uid = Some("uid-next".into());
    let classes = builtin_classes().unwrap();
    let outcome = alloc::allocate_claim(
        &CelEngine,
        &classes,
        &unshared_slices,
        &done,
        &next,
        &Node::named(&node_name),
        Detail::Full,
    )
    .unwrap();
    let got = outcome.requests[0]
        .rejected
        .iter()
        .find(|r| r.device.device == "gpu-0")
        .map(|r| r.reason.clone());
    let want = Some(Rejection::AlreadyAllocated {
        claim: "default/gpu-share-big-gpu".into(),
    });
    assert_eq!(want, got);
}
