//! The CEL layer never panics: arbitrary expressions and arbitrary attribute values yield
//! `Ok` or `Err`. Inputs come from a seeded generator (deterministic, no clock): random
//! bytes, token soup from CEL's grammar, and mutations of real selectors.

use gpu_dra::cel::{DeviceView, Selector};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use std::collections::BTreeMap;

/// xorshift64*: small, deterministic, good enough to spread inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const TOKENS: &[&str] = &[
    "device",
    ".",
    "attributes",
    "capacity",
    "driver",
    "allowMultipleAllocations",
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    ",",
    ":",
    "'gpu.nvidia.com'",
    "'resource.kubernetes.io'",
    "profile",
    "type",
    "memory",
    "==",
    "!=",
    "<",
    ">=",
    "&&",
    "||",
    "!",
    "?",
    "+",
    "-",
    "*",
    "/",
    "%",
    "in",
    "1",
    "-1",
    "0",
    "9223372036854775807",
    "1u",
    "1.5",
    "'x'",
    "\"\"",
    "b'\\x00'",
    "true",
    "false",
    "null",
    "quantity",
    "isQuantity",
    "semver",
    "isSemver",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "add",
    "sub",
    "sign",
    "asInteger",
    "isInteger",
    "asApproximateFloat",
    "major",
    "includes",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "x",
    "y",
    "has",
    "size",
    "cel",
    "bind",
    "split",
    "join",
    "replace",
    "matches",
    "'[a-'",
    "'.*'",
    "lowerAscii",
    "format",
    "'%s'",
    "'10Gi'",
    "'1e400'",
    "'v1'",
    "int",
    "string",
    "type",
    "dyn",
    "?.",
    "[?",
    " ",
    "\n",
    "'\\u00e9'",
    "1e308",
    "0x7f",
    "duration('1s')",
    "timestamp('2024-01-01T00:00:00Z')",
];

const SELECTORS: &[&str] = &[
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('10Gi')) >= 0",
    "cel.bind(a, device.attributes['gpu.nvidia.com'], a.profile == '1g.10gb')",
    "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('500.0.0'))",
    "[1, 2, 3].all(x, [4, 5].exists(y, x < y))",
    "device.attributes['gpu.nvidia.com'].numbers.includes(3)",
    "'a,b,c'.split(',').map(s, s.upperAscii()).join('-') == 'A-B-C'",
    "device.attributes['resource.kubernetes.io'].pciBusID.matches('^0000:')",
];

fn random_expression(rng: &mut Rng) -> String {
    match rng.below(3) {
        0 => (0..rng.below(40))
            .map(|_| char::from_u32(rng.below(0x250) as u32).unwrap_or('?'))
            .collect(),
        1 => (0..rng.below(30))
            .map(|_| rng.pick(TOKENS))
            .collect::<Vec<_>>()
            .join(""),
        _ => {
            let mut chars: Vec<char> = rng.pick(SELECTORS).chars().collect();
            for _ in 0..=rng.below(4) {
                let at = rng.below(chars.len() + 1);
                match rng.below(3) {
                    0 if at < chars.len() => {
                        chars.remove(at);
                    }
                    1 => chars
                        .splice(at..at, rng.pick(TOKENS).chars())
                        .for_each(drop),
                    _ => chars.insert(
                        at,
                        rng.pick(&["(", ")", "'", "[", ".", ","])
                            .chars()
                            .next()
                            .unwrap_or('('),
                    ),
                }
            }
            chars.into_iter().collect()
        }
    }
}

fn random_attribute(rng: &mut Rng) -> DeviceAttribute {
    let mut attribute = DeviceAttribute::default();
    for _ in 0..=rng.below(2) {
        match rng.below(8) {
            0 => attribute.bool = Some(rng.below(2) == 0),
            1 => attribute.int = Some(rng.next() as i64),
            2 => attribute.string = Some(rng.pick(TOKENS).to_owned()),
            3 => {
                attribute.version = Some(
                    rng.pick(&["1.2.3", "01.2.3", "1.2", "1.0.0-rc.1+build", "x"])
                        .to_owned(),
                )
            }
            4 => attribute.bools = Some((0..rng.below(5)).map(|i| i % 2 == 0).collect()),
            5 => attribute.ints = Some((0..rng.below(60)).map(|i| i as i64).collect()),
            6 => {
                attribute.strings = Some(
                    (0..rng.below(5))
                        .map(|_| rng.pick(TOKENS).to_owned())
                        .collect(),
                )
            }
            _ => {
                attribute.versions = Some(vec![
                    "1.0.0".to_owned(),
                    rng.pick(&["2.0.0", "bad"]).to_owned(),
                ])
            }
        }
    }
    attribute
}

fn random_device(rng: &mut Rng) -> Device {
    let names = [
        "profile",
        "type",
        "numbers",
        "gpu.nvidia.com/type",
        "resource.kubernetes.io/pciBusID",
        "a/b/c",
        "",
        "/",
    ];
    let attributes: BTreeMap<String, DeviceAttribute> = (0..rng.below(6))
        .map(|_| (rng.pick(&names).to_owned(), random_attribute(rng)))
        .collect();
    let capacity: BTreeMap<String, DeviceCapacity> = (0..rng.below(3))
        .map(|_| {
            let value = rng.pick(&["10Gi", "9984Mi", "1e400", "5G1", "-1", "", "0.5", "9Ei"]);
            (
                rng.pick(&["memory", "gpu.nvidia.com/memory", "x/y"])
                    .to_owned(),
                DeviceCapacity {
                    value: ApiQuantity(value.to_owned()),
                    ..Default::default()
                },
            )
        })
        .collect();
    Device {
        name: "gpu-0".to_owned(),
        attributes: Some(attributes),
        capacity: Some(capacity),
        allow_multiple_allocations: Some(rng.below(2) == 0),
        ..Default::default()
    }
}

#[test]
fn arbitrary_expressions_and_devices_never_panic() {
    // FUZZ_ITERATIONS and FUZZ_SEED allow longer local campaigns.
    let iterations = std::env::var("FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seed = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let mut rng = Rng(seed);
    let fallback = DeviceView::from_api(
        "gpu.nvidia.com",
        &Device {
            name: "empty".into(),
            ..Default::default()
        },
    )
    .expect("an empty device is valid");
    let (mut compiled, mut evaluated, mut matched) = (0, 0, 0);
    for _ in 0..iterations {
        let expression = random_expression(&mut rng);
        let view = DeviceView::from_api("gpu.nvidia.com", &random_device(&mut rng))
            .unwrap_or_else(|_| fallback.clone());
        if let Ok(selector) = Selector::compile(&expression) {
            compiled += 1;
            match selector.evaluate(&view) {
                Ok(true) => matched += 1,
                Ok(false) => evaluated += 1,
                Err(error) => assert!(!error.to_string().is_empty()),
            }
        }
    }
    println!("compiled {compiled}, evaluated {evaluated} false and {matched} true");
    assert!(
        compiled > 100,
        "the generator reaches the evaluator: {compiled}"
    );
}

#[test]
fn deeply_nested_and_long_expressions_are_errors_not_crashes() {
    let device = DeviceView::from_api(
        "gpu.nvidia.com",
        &Device {
            name: "d".into(),
            ..Default::default()
        },
    )
    .expect("valid");
    let deep = |open: &str, middle: &str, close: &str, n: usize| {
        format!("{}{}{}", open.repeat(n), middle, close.repeat(n))
    };
    let cases = [
        deep("(", "true", ")", 3000),
        deep("[", "1", "]", 3000),
        deep("!", "true", "", 3000),
        deep("-", "1", "", 3000),
        format!("{}true", "true && ".repeat(2000)),
        format!("1{} == 2001", " + 1".repeat(2000)),
        format!("1{} == 41", " - 1".repeat(40)),
        format!("device{}", ".a".repeat(3000)),
        deep("f(", "1", ")", 2000),
        "x".repeat(20_000),
    ];
    for expression in cases {
        if let Ok(selector) = Selector::compile(&expression) {
            let _ = selector.evaluate(&device);
        }
    }
}

#[test]
fn expressions_just_inside_the_limits_evaluate_on_a_small_stack() {
    let device = DeviceView::from_api(
        "gpu.nvidia.com",
        &Device {
            name: "d".into(),
            ..Default::default()
        },
    )
    .expect("valid");
    let n = gpu_dra::cel::MAX_TREE_DEPTH - 10;
    let nest = gpu_dra::cel::MAX_BRACKET_NESTING;
    let calls = gpu_dra::cel::MAX_CALL_NESTING;
    let cases = [
        (
            format!("1{} == {}", " + 1".repeat(calls - 2), calls - 1),
            true,
        ),
        (
            format!("'a'{} == 'a'", ".lowerAscii()".repeat(calls - 1)),
            true,
        ),
        (format!("{}true", "!".repeat(2 * (n / 2))), true),
        (format!("{}true", "true && ".repeat(n)), true),
        (
            format!("{}true{}", "(".repeat(nest), ")".repeat(nest)),
            true,
        ),
        (
            format!(
                "size({}1{}) == 1",
                "[".repeat(calls - 2),
                "]".repeat(calls - 2)
            ),
            true,
        ),
        (format!("{}true", "false ? false : ".repeat(calls)), true),
        (
            format!(
                "{}x > 0{}",
                "[1].all(x, ".repeat((calls - 2) / 3),
                ")".repeat((calls - 2) / 3)
            ),
            true,
        ),
        ("device.attributes['x'].size() == 0".to_owned(), true),
        (
            format!(
                "{}.size() == 1",
                "{'a': ".repeat(calls - 3) + "{}" + &"}".repeat(calls - 3)
            ),
            true,
        ),
    ];
    // A thread with a 2 MiB stack, like test threads and many thread pools.
    std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            for (expression, want) in cases {
                let selector = Selector::compile(&expression).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    selector.evaluate(&device).map_err(|e| e.to_string()),
                    Ok(want),
                    "{expression}"
                );
            }
            let deep_index = format!("device{}.size() >= 0", ".attributes['x']".repeat(calls - 2));
            let selector = Selector::compile(&deep_index).expect("within the limits");
            let got = selector.evaluate(&device).map_err(|e| e.to_string());
            assert!(
                got.as_ref()
                    .is_err_and(|e| e.contains("no such key: attributes")),
                "{got:?}"
            );
        })
        .expect("thread starts")
        .join()
        .expect("no panic, no overflow");
}
