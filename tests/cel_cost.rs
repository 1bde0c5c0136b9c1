//! The cost limit: expressions that would run away are stopped, at compile time by the
//! worst-case estimate or at runtime by the meter (`actual cost limit exceeded`).

use gpu_dra::cel::{COST_LIMIT, CelError, CompileOptions, DeviceView, Selector};
use k8s_openapi::api::resource::v1::Device;

fn device() -> DeviceView {
    DeviceView::from_api(
        "gpu.nvidia.com",
        &Device {
            name: "gpu-0".into(),
            ..Default::default()
        },
    )
    .expect("an empty device is valid")
}

fn list(n: usize) -> String {
    let items: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// Three nested comprehensions over 100 elements: a million iterations.
fn nested_loops() -> String {
    let l = list(100);
    format!("{l}.all(a, {l}.all(b, {l}.all(c, a + b + c > 0)))")
}

/// Builds a 10 MB string out of a 1 kB one in two steps.
fn string_bomb() -> String {
    let a = "x".repeat(1000);
    let hundred_b = vec!["b"; 100].join(", ");
    let hundred_c = vec!["c"; 100].join(", ");
    format!(
        "cel.bind(b, '{a}', cel.bind(c, [{hundred_b}].join(), cel.bind(d, [{hundred_c}].join(), d.size() > 0)))"
    )
}

const NO_ESTIMATE: CompileOptions = CompileOptions {
    cost_limit: COST_LIMIT,
    estimate_cost: false,
};

#[test]
fn nested_comprehensions_over_large_lists_are_rejected_at_compile_time() {
    let expression = nested_loops();
    let got = Selector::compile(&expression);
    let Err(CelError::CostEstimate {
        estimated, limit, ..
    }) = &got
    else {
        panic!("expected a cost estimate error, got {got:?}");
    };
    let (estimated, limit) = (*estimated, *limit);
    assert_eq!(limit, 1_000_000);
    assert!(estimated > 1_000_000, "{estimated}");
    let message = got.expect_err("rejected").to_string();
    assert!(message.ends_with(&format!(
        "estimated cost {estimated} exceeds the cost limit of 1000000; simplify the expression or iterate over fewer elements"
    )), "{message}");
}

#[test]
fn nested_comprehensions_stop_at_runtime_with_actual_cost_limit_exceeded() {
    let expression = nested_loops();
    let selector =
        Selector::compile_with(&expression, NO_ESTIMATE).expect("compiles without the estimate");
    let got = selector.evaluate(&device()).map_err(|e| e.to_string());
    assert_eq!(
        got,
        Err(format!(
            "evaluating CEL expression {expression:?}: operation cancelled: actual cost limit exceeded (limit 1000000)"
        ))
    );
}

#[test]
fn growing_strings_are_bounded_at_compile_time_and_at_runtime() {
    let expression = string_bomb();
    assert!(matches!(
        Selector::compile(&expression),
        Err(CelError::CostEstimate { .. })
    ));
    let selector =
        Selector::compile_with(&expression, NO_ESTIMATE).expect("compiles without the estimate");
    assert!(matches!(
        selector.evaluate(&device()),
        Err(CelError::CostLimit {
            limit: COST_LIMIT,
            ..
        })
    ));
}

#[test]
fn a_lower_limit_stops_smaller_loops() {
    let expression = format!("{}.all(x, x > 0)", list(100));
    let generous = Selector::compile(&expression).expect("compiles");
    assert_eq!(
        generous.evaluate(&device()).map_err(|e| e.to_string()),
        Ok(true)
    );
    let tight = CompileOptions {
        cost_limit: 50,
        estimate_cost: false,
    };
    let selector = Selector::compile_with(&expression, tight).expect("compiles");
    assert!(matches!(
        selector.evaluate(&device()),
        Err(CelError::CostLimit { limit: 50, .. })
    ));
}

#[test]
fn map_and_filter_are_metered_too() {
    let l = list(100);
    let expression = format!("{l}.map(a, {l}.filter(b, {l}.map(c, c).size() > 0)).size() > 0");
    let selector = Selector::compile_with(&expression, NO_ESTIMATE).expect("compiles");
    assert!(matches!(
        selector.evaluate(&device()),
        Err(CelError::CostLimit { .. })
    ));
}

#[test]
fn realistic_selectors_are_far_below_the_limit() {
    let selector = Selector::compile(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' \
         && device.attributes['gpu.nvidia.com'].profile == '1g.10gb' \
         && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('10Gi')) >= 0",
    )
    .expect("compiles");
    assert!(
        selector.estimated_cost() < 100,
        "{}",
        selector.estimated_cost()
    );
    let attribute_loop = Selector::compile(
        "device.attributes['gpu.nvidia.com'].all(name, device.attributes['gpu.nvidia.com'].exists(other, other == name))",
    )
    .expect("two loops over a device's attributes are allowed");
    assert!(attribute_loop.estimated_cost() < COST_LIMIT);
}

#[test]
fn an_error_absorbed_by_or_still_stops_the_evaluation() {
    let expression = format!("{} || true", nested_loops());
    let selector = Selector::compile_with(&expression, NO_ESTIMATE).expect("compiles");
    assert!(matches!(
        selector.evaluate(&device()),
        Err(CelError::CostLimit { .. })
    ));
}
