//! The search itself: backtracking across requests, several claims allocated together,
//! selector errors aborting the node, and the step limit.

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::alloc::table::string_attribute;
use gpu_dra::alloc::{Abort, Allocator, Detail, DeviceRef, Node, RequestStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;

#[test]
fn an_earlier_request_gives_up_its_device_when_a_later_one_needs_the_space() {
    let engine = engine();
    let classes = classes();
    let slices = h100_node("node-a", 2);
    let holder = vec![allocated(
        "holder",
        "node-a",
        &[("x", "gpu-0-mig-3g40gb-4")],
    )];
    let claims = vec![claim(
        "pair",
        &format!(
            "requests:\n\
             - {{name: a, exactly: {{deviceClassName: mig.nvidia.com}}}}\n\
             - {{name: b, exactly: {{deviceClassName: mig.nvidia.com, selectors: [{{cel: {{expression: \"{}\"}}}}]}}}}\n\
             constraints:\n- {{matchAttribute: gpu.nvidia.com/parentUUID}}",
            profile_selector("4g.40gb")
        ),
    )];
    let allocator = Allocator::new(&engine, &classes, &slices, &holder).expect("valid");
    let prepared = allocator.prepare(&claims).expect("valid");
    let got = allocator.allocate(&prepared, &Node::named("node-a"), Detail::Brief);
    assert_eq!(
        vec![vec!["a=gpu-1-mig-1g10gb-4", "b=gpu-1-mig-4g40gb-0"]],
        device_names(&got)
    );
}

fn one_gpu(name: &str) -> ResourceClaim {
    claim(
        name,
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}",
    )
}

#[test]
fn claims_prepared_together_must_all_fit_on_the_same_node() {
    let engine = engine();
    let classes = classes();
    let slices = h100_node("node-a", 2);
    let claims = vec![one_gpu("first"), one_gpu("second")];
    let allocator = Allocator::new(&engine, &classes, &slices, &[]).expect("valid");
    let prepared = allocator.prepare(&claims).expect("valid");
    let got = allocator.allocate(&prepared, &Node::named("node-a"), Detail::Brief);
    assert_eq!(
        vec![vec!["gpu=gpu-0"], vec!["gpu=gpu-1"]],
        device_names(&got)
    );

    let claims = vec![one_gpu("first"), one_gpu("second"), one_gpu("third")];
    let prepared = allocator.prepare(&claims).expect("valid");
    let got = allocator.allocate(&prepared, &Node::named("node-a"), Detail::Full);
    assert_eq!(None, got.allocations);
    assert_eq!(
        vec![RequestStatus::Blocked; 3],
        got.requests.iter().map(|r| r.status).collect::<Vec<_>>()
    );
}

#[test]
fn a_selector_error_aborts_the_node_and_names_the_device() {
    let engine = engine().with_fallible(
        "device.attributes['gpu.nvidia.com'].uuid.startsWith('GPU')",
        |_, d| {
            string_attribute(d, "uuid")
                .map(|u| u.starts_with("GPU"))
                .ok_or_else(|| "no such key: uuid".to_string())
        },
    );
    let classes = classes();
    let slices = h100_node("node-a", 1);
    let claims = vec![claim(
        "strict",
        "requests:\n- {name: mig, exactly: {deviceClassName: mig.nvidia.com, selectors: \
         [{cel: {expression: \"device.attributes['gpu.nvidia.com'].uuid.startsWith('GPU')\"}}]}}",
    )];
    let allocator = Allocator::new(&engine, &classes, &slices, &[]).expect("valid");
    let prepared = allocator.prepare(&claims).expect("valid");
    let got = allocator.allocate(&prepared, &Node::named("node-a"), Detail::Full);
    let want = Abort::SelectorError {
        request: "mig".into(),
        device: DeviceRef {
            driver: DRIVER.into(),
            pool: "node-a".into(),
            device: "gpu-0-mig-1g10gb-0".into(),
        },
        class: None,
        expression: "device.attributes['gpu.nvidia.com'].uuid.startsWith('GPU')".into(),
        message: "no such key: uuid".into(),
    };
    assert_eq!((None, Some(want)), (got.allocations, got.abort));
    assert_eq!(RequestStatus::Unsatisfiable, got.requests[0].status);
}

#[test]
fn a_search_beyond_the_step_limit_gives_up_on_the_node() {
    let engine = engine();
    let classes = classes();
    let slices = h100_node("node-a", 4);
    let claims = vec![claim(
        "greedy",
        "requests:\n- {name: mig, exactly: {deviceClassName: mig.nvidia.com, count: 30}}",
    )];
    let allocator = Allocator::new(&engine, &classes, &slices, &[])
        .expect("valid")
        .with_step_limit(10_000);
    let prepared = allocator.prepare(&claims).expect("valid");
    let got = allocator.allocate(&prepared, &Node::named("node-a"), Detail::Brief);
    assert_eq!(
        (None, Some(Abort::StepLimit { steps: 10_000 })),
        (got.allocations, got.abort)
    );
}

#[test]
fn progress_reports_the_most_devices_held_at_once() {
    let engine = engine();
    let classes = classes();
    let slices = h100_node("node-a", 2);
    let claims = vec![claim(
        "three",
        "requests:\n- {name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 3}}",
    )];
    let allocator = Allocator::new(&engine, &classes, &slices, &[]).expect("valid");
    let prepared = allocator.prepare(&claims).expect("valid");
    let got = allocator.allocate(&prepared, &Node::named("node-a"), Detail::Brief);
    assert_eq!(
        gpu_dra::alloc::Progress {
            placed: 2,
            needed: 3
        },
        got.progress
    );
}
