//! Bad claims are refused before any search, with the field, the value and the choices.

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::alloc::{Allocator, table::TableEngine};

fn error_for(devices: &str) -> String {
    let engine = engine();
    let classes = classes();
    let slices = h100_node("node-a", 1);
    let claims = vec![claim("bad", devices)];
    let allocator = Allocator::new(&engine, &classes, &slices, &[]).expect("no allocated claims");
    match allocator.prepare(&claims) {
        Ok(_) => "accepted".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_claims_are_refused_naming_field_value_and_choices() {
    let cases = [
        (
            "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.co}}",
            "claim default/bad: spec.devices.requests[0].exactly.deviceClassName is \"gpu.nvidia.co\", \
             which is not a known DeviceClass (known: gpu.nvidia.com, mig.nvidia.com)",
        ),
        (
            "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 0}}",
            "claim default/bad: spec.devices.requests[0].exactly.count is \"0\": must be at least 1",
        ),
        (
            "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 33}}",
            "claim default/bad: spec.devices.requests[0].exactly.count is \"33\": a claim holds at most 32 devices",
        ),
        (
            "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: Some}}",
            "claim default/bad: spec.devices.requests[0].exactly.allocationMode is \"Some\": valid: ExactCount, All",
        ),
        (
            "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}\n\
             constraints:\n- {requests: [gpu, mig], matchAttribute: gpu.nvidia.com/parentUUID}",
            "claim default/bad: spec.devices.constraints[0].requests[1] is \"mig\": no such request; valid: gpu",
        ),
        (
            "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}\n\
             constraints:\n- {matchAttribute: parentUUID}",
            "claim default/bad: spec.devices.constraints[0].matchAttribute is \"parentUUID\": must be fully \
             qualified as <domain>/<name>, e.g. gpu.nvidia.com/parentUUID",
        ),
        (
            "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, capacity: {requests: {memory: lots}}}}",
            "claim default/bad: spec.devices.requests[0].exactly.capacity.requests.memory is \"lots\": \
             not a quantity: it does not start with a number",
        ),
        (
            "requests:\n- {name: gpu}",
            "claim default/bad: spec.devices.requests[0] is \"gpu\": a request needs exactly or firstAvailable",
        ),
        (
            "requests:\n- {name: gpu, firstAvailable: [{name: a, deviceClassName: gpu.nvidia.com, count: 0}]}",
            "claim default/bad: spec.devices.requests[0].firstAvailable[0].count is \"0\": must be at least 1",
        ),
    ];
    for (devices, want) in cases {
        assert_eq!(want, error_for(devices));
    }
}

#[test]
fn selectors_that_do_not_compile_name_the_owner_and_the_expression() {
    let got = error_for(
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, selectors: [{cel: {expression: 'device.bogus'}}]}}",
    );
    let want = "claim default/bad: spec.devices.requests[0].exactly.selectors[0].cel.expression: selector \
                \"device.bogus\" does not compile: expression is not in the selector table: device.bogus";
    assert_eq!(want, got);
}

#[test]
fn each_distinct_expression_is_compiled_once_per_preparation() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting {
        inner: TableEngine,
        compiles: Arc<AtomicUsize>,
    }
    impl gpu_dra::alloc::SelectorEngine for Counting {
        type Program = <TableEngine as gpu_dra::alloc::SelectorEngine>::Program;
        type View<'d> = <TableEngine as gpu_dra::alloc::SelectorEngine>::View<'d>;
        fn view<'d>(
            &self,
            driver: &'d str,
            device: &'d k8s_openapi::api::resource::v1::Device,
        ) -> Result<Self::View<'d>, String> {
            self.inner.view(driver, device)
        }
        fn compile(&self, expression: &str) -> Result<Self::Program, String> {
            self.compiles.fetch_add(1, Ordering::SeqCst);
            self.inner.compile(expression)
        }
        fn evaluate(&self, program: &Self::Program, view: &Self::View<'_>) -> Result<bool, String> {
            self.inner.evaluate(program, view)
        }
    }
    let compiles = Arc::new(AtomicUsize::new(0));
    let engine = Counting {
        inner: engine(),
        compiles: compiles.clone(),
    };
    let classes = classes();
    let slices = h100_node("node-a", 1);
    let claims = vec![claim(
        "many",
        "requests:\n\
         - {name: a, exactly: {deviceClassName: gpu.nvidia.com}}\n\
         - {name: b, exactly: {deviceClassName: gpu.nvidia.com}}\n\
         - {name: c, exactly: {deviceClassName: mig.nvidia.com}}",
    )];
    let allocator = Allocator::new(&engine, &classes, &slices, &[]).expect("no allocated claims");
    allocator.prepare(&claims).expect("claim is valid");
    assert_eq!(2, compiles.load(Ordering::SeqCst));
}
