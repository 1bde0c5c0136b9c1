//! The first-fit walk, counted: how many selector evaluations one node evaluation costs for a
//! full-GPU and a `1g.10gb` claim under each slice layout, on an idle dgx-h100 node and on one
//! that already holds claims. kube-scheduler pays a CEL evaluation (built over every attribute
//! of the device) for each of these on every node it evaluates for every pod, so the counts
//! are the hot path's cost in a unit no machine's speed changes (docs/device-model.md,
//! "Packing order"). A device another claim holds costs no evaluation: Kubernetes checks
//! "in use" first.

use gpu_dra::alloc::{Allocator, Counting, Detail, Node};
use gpu_dra::devices::SliceLayout;
use gpu_dra::explain_inputs::{SimSliceOptions, builtin_classes, sim_slices};
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::{
    AllocationResult, CELDeviceSelector, DeviceClaim, DeviceRequest, DeviceSelector,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const FULL: Kind = Kind::Full;
const ONE_G: Kind = Kind::OneG;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Full,
    OneG,
}

fn claim(name: &str, kind: Kind) -> ResourceClaim {
    let (class, selectors) = match kind {
        Kind::Full => ("gpu.nvidia.com", None),
        Kind::OneG => (
            "mig.nvidia.com",
            Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'".into(),
                }),
            }]),
        ),
    };
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "r".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: class.into(),
                        selectors,
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

fn node_slices(layout: SliceLayout) -> Vec<ResourceSlice> {
    sim_slices(
        "dgx-h100",
        "gpu.nvidia.com",
        SimSliceOptions {
            slice_layout: layout,
            ..Default::default()
        },
    )
    .expect("dgx-h100 slices")
}

/// Places `held` claims one after another on the node, then returns the selector evaluations
/// of one more `next` claim's node evaluation, and the device it got.
fn walk(slices: &[ResourceSlice], held: &[Kind], next: Kind) -> (u64, String) {
    let classes = builtin_classes().expect("classes");
    let node = Node::named(slices[0].spec.node_name.clone().expect("node slices"));
    let engine = Counting::new(CelEngine);
    let mut allocated: Vec<ResourceClaim> = Vec::new();
    for (i, &kind) in held.iter().chain([&next]).enumerate() {
        let mut pending = claim(&format!("c{i}"), kind);
        let allocator = Allocator::new(&engine, &classes, slices, &allocated).expect("allocator");
        let prepared = allocator
            .prepare(std::slice::from_ref(&pending))
            .expect("claim");
        engine.take();
        let outcome = allocator.allocate(&prepared, &node, Detail::Brief);
        let evaluations = engine.take();
        let mut results = outcome
            .allocations
            .unwrap_or_else(|| panic!("claim {i} ({kind:?}) fits"));
        let result: AllocationResult = results.remove(0);
        if i == held.len() {
            let device = result
                .devices
                .as_ref()
                .expect("devices")
                .results
                .as_ref()
                .expect("results")[0]
                .device
                .clone();
            return (evaluations, device);
        }
        pending.status = Some(ResourceClaimStatus {
            allocation: Some(result),
            ..Default::default()
        });
        allocated.push(pending);
    }
    unreachable!("the last claim returns")
}

#[test]
fn interleaved_walks_at_most_as_many_devices_of_the_other_kind_as_the_node_holds_claims() {
    let slices = node_slices(SliceLayout::Interleaved);
    // Idle: a full GPU is the first device (its class selector, one evaluation); a 1g.10gb
    // passes one whole GPU (its class selector fails: one) and matches the next device (class
    // and request selector: two).
    assert_eq!(walk(&slices, &[], FULL), (1, "gpu-0".into()));
    assert_eq!(walk(&slices, &[], ONE_G), (3, "gpu-7-mig-1g10gb-6".into()));
    // With k claims of the same kind held, the walk passes the k devices of the other kind
    // interleaved before them; held devices cost nothing.
    for k in 1..=4 {
        let fulls = vec![FULL; k];
        let (n, device) = walk(&slices, &fulls, FULL);
        assert_eq!(
            (n, device),
            (1 + k as u64, format!("gpu-{k}")),
            "{k} full held"
        );
        let ones = vec![ONE_G; k];
        let (n, _) = walk(&slices, &ones, ONE_G);
        assert_eq!(n, 3 + k as u64, "{k} 1g.10gb held");
    }
    // Both kinds held: each passes fewer.
    let (n, _) = walk(&slices, &[FULL, ONE_G, FULL, ONE_G], FULL);
    assert_eq!(n, 1);
    let (n, _) = walk(&slices, &[FULL, ONE_G, FULL, ONE_G], ONE_G);
    assert_eq!(n, 3);
}

#[test]
fn interleaved_takes_the_device_gpus_first_takes_for_a_one_kind_request() {
    let interleaved = node_slices(SliceLayout::Interleaved);
    let gpus_first = node_slices(SliceLayout::GpusFirst);
    for held in [
        vec![],
        vec![FULL; 3],
        vec![ONE_G; 9],
        vec![FULL, ONE_G, ONE_G, FULL, ONE_G],
    ] {
        for next in [FULL, ONE_G] {
            assert_eq!(
                walk(&interleaved, &held, next).1,
                walk(&gpus_first, &held, next).1,
                "{held:?} then {next:?}"
            );
        }
    }
}

#[test]
fn each_layouts_walk_is_what_its_order_makes_it() {
    // gpus-first: a MIG request passes every whole GPU not held; a full GPU none.
    let gpus_first = node_slices(SliceLayout::GpusFirst);
    assert_eq!(walk(&gpus_first, &[], FULL).0, 1);
    assert_eq!(walk(&gpus_first, &[], ONE_G).0, 8 + 2);
    assert_eq!(walk(&gpus_first, &[FULL; 3], ONE_G).0, 5 + 2);
    // by-gpu: a full GPU passes every MIG device of each GPU before it (25 on an H100).
    let by_gpu = node_slices(SliceLayout::ByGpu);
    assert_eq!(walk(&by_gpu, &[], ONE_G).0, 1 + 2);
    assert_eq!(walk(&by_gpu, &[FULL; 2], FULL).0, 2 * 25 + 1);
}

#[test]
fn a_held_device_costs_no_selector_evaluation() {
    // MIG-disabled-like: with every whole GPU but the last held, a full-GPU claim on the
    // gpus-first node evaluates only the free one.
    let slices = node_slices(SliceLayout::GpusFirst);
    assert_eq!(walk(&slices, &[FULL; 7], FULL), (1, "gpu-7".into()));
}
