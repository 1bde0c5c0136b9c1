//! Shared parts of the parser fuzz targets: JSON generators, structural mutations of a valid
//! document, and a runner that counts executions and catches hangs.

pub mod checks;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;

/// Cases per target: `GPU_DRA_FUZZ_CASES`, else a number CI runs in seconds.
pub fn cases() -> u32 {
    std::env::var("GPU_DRA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Any JSON value, a few levels deep, leaning to the shapes configs use.
pub fn json_value() -> impl Strategy<Value = Value> + Clone {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[A-Za-z0-9 ._/@-]{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "MPS",
            "TimeSlicing",
            "Long",
            "Short",
            "Medium",
            "Default",
            "10Gi",
            "0",
            "-1Gi",
            "1e400",
            "GpuConfig",
            "MigDeviceConfig",
            "resource.nvidia.com/v1beta1",
            "gpu.nvidia.com/v1alpha1",
            "PrepareCompleted",
            "H100-SXM5-80GB",
            "dynamic",
            "static",
        ])
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z0-9]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One structural change at a place chosen by `at` among the document's object keys.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Replace the value at the place.
    Replace { at: usize, with: Value },
    /// Remove the key at the place.
    Remove { at: usize },
    /// Add a key to the object at the place (or the root).
    Add { at: usize, key: String, with: Value },
}

/// One to three mutations.
pub fn mutations(
    values: impl Strategy<Value = Value> + Clone,
) -> impl Strategy<Value = Vec<Mutation>> {
    let one = prop_oneof![
        (any::<usize>(), values.clone()).prop_map(|(at, with)| Mutation::Replace { at, with }),
        any::<usize>().prop_map(|at| Mutation::Remove { at }),
        (any::<usize>(), "[a-zA-Z]{1,10}", values).prop_map(|(at, key, with)| Mutation::Add {
            at,
            key,
            with
        }),
    ];
    prop::collection::vec(one, 1..4)
}

/// Paths to every object key, depth first.
fn key_paths(value: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(map) = value {
        for (key, inner) in map {
            prefix.push(key.clone());
            out.push(prefix.clone());
            key_paths(inner, prefix, out);
            prefix.pop();
        }
    }
}

fn at_path<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |v, k| v.get_mut(k))
}

/// Applies `m` to `doc`; returns the key it touched.
pub fn apply(doc: &mut Value, m: &Mutation) -> Option<String> {
    let mut paths = Vec::new();
    key_paths(doc, &mut Vec::new(), &mut paths);
    let pick = |at: usize| (!paths.is_empty()).then(|| paths[at % paths.len()].clone());
    match m {
        Mutation::Replace { at, with } => {
            let path = pick(*at)?;
            *at_path(doc, &path)? = with.clone();
            path.last().cloned()
        }
        Mutation::Remove { at } => {
            let path = pick(*at)?;
            let (key, parent) = path.split_last()?;
            at_path(doc, parent)?.as_object_mut()?.remove(key);
            Some(key.clone())
        }
        Mutation::Add { at, key, with } => {
            let path = pick(*at).unwrap_or_default();
            let target = match at_path(doc, &path) {
                Some(Value::Object(_)) => at_path(doc, &path)?,
                _ => doc,
            };
            target.as_object_mut()?.insert(key.clone(), with.clone());
            Some(key.clone())
        }
    }
}

/// Runs `check` on `cases()` inputs of `strategy`; panics with the (shrunk) failing input.
/// An input taking longer than `hang` fails as a hang. Prints the executions.
pub fn run_target<S: Strategy>(
    name: &str,
    hang: Duration,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    let executions = AtomicU64::new(0);
    let mut runner = TestRunner::new_with_rng(
        config,
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let result = runner.run(&strategy, |input| {
        executions.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        check(input)?;
        let took = started.elapsed();
        if took > hang {
            return Err(TestCaseError::fail(format!("took {took:?}: a hang")));
        }
        Ok(())
    });
    eprintln!(
        "fuzz target {name}: {} executions",
        executions.load(Ordering::Relaxed)
    );
    if let Err(failure) = result {
        panic!("fuzz target {name}: {failure}");
    }
}
