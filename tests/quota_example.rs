//! examples/quota-team-mig.yaml: the ResourceQuota names its DeviceClass the way the API
//! server's quota evaluator counts it (`<class>.deviceclass.resource.k8s.io/devices`, one per
//! device a claim requests), so the third claim is over the cap while the hardware would still
//! have room for it, and the class picks exactly the 3g.40gb MIG devices.

use std::path::Path;

use gpu_dra::alloc::{Allocator, Detail, Node};
use gpu_dra::explain::{load_claims, load_classes};
use gpu_dra::explain_inputs::{builtin_classes, sim_slices};
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::Deserialize;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quota-team-mig.yaml");
const SUFFIX: &str = ".deviceclass.resource.k8s.io/devices";

/// The quota's hard limits, from the example's ResourceQuota.
fn hard_limits() -> Vec<(String, i64)> {
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc).unwrap();
        if value["kind"].as_str() == Some("ResourceQuota") {
            let hard = value["spec"]["hard"].as_mapping().unwrap();
            return hard
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().unwrap().to_string(),
                        v.as_str().unwrap().parse().unwrap(),
                    )
                })
                .collect();
        }
    }
    panic!("no ResourceQuota in {EXAMPLE}");
}

/// What the quota evaluator (pkg/quota/v1/evaluator/core/resource_claims.go) charges a claim:
/// per class of an `exactly` request, its count (1 by default).
fn usage(claim: &ResourceClaim) -> Vec<(String, i64)> {
    let requests = claim.spec.as_ref().unwrap().devices.as_ref().unwrap();
    requests
        .requests
        .iter()
        .flatten()
        .filter_map(|r| r.exactly.as_ref())
        .map(|e| {
            (
                format!("{}{SUFFIX}", e.device_class_name),
                e.count.unwrap_or(1),
            )
        })
        .collect()
}

#[test]
fn the_quota_admits_two_3g40gb_claims_and_refuses_the_third() {
    let hard = hard_limits();
    let classes = load_classes(Path::new(EXAMPLE)).unwrap();
    let class = classes[0].metadata.name.clone().unwrap();
    assert_eq!(class, "mig-3g40gb.nvidia.com");
    let mut known: Vec<String> = builtin_classes()
        .unwrap()
        .iter()
        .chain(&classes)
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    known.sort();
    for (key, _) in &hard {
        let named = key.strip_suffix(SUFFIX).unwrap_or_else(|| {
            panic!("{key} is not a per-DeviceClass quota: want <class>{SUFFIX}")
        });
        assert!(known.iter().any(|k| k == named), "{key}: no such class");
    }
    let limit = |key: &str| hard.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    assert_eq!(limit(&format!("{class}{SUFFIX}")), Some(2));

    let claims = load_claims(Path::new(EXAMPLE)).unwrap();
    let mut used: Vec<(String, i64)> = Vec::new();
    let mut admitted = Vec::new();
    for claim in &claims {
        let charge = usage(claim);
        let fits = charge.iter().all(|(key, n)| {
            let now = used.iter().find(|(k, _)| k == key).map_or(0, |(_, v)| *v);
            limit(key).is_none_or(|max| now + n <= max)
        });
        if fits {
            for (key, n) in charge {
                match used.iter_mut().find(|(k, _)| *k == key) {
                    Some(slot) => slot.1 += n,
                    None => used.push((key, n)),
                }
            }
        }
        admitted.push((claim.metadata.name.clone().unwrap(), fits));
    }
    assert_eq!(
        admitted,
        [
            ("train-0".to_string(), true),
            ("train-1".to_string(), true),
            ("train-2".to_string(), false)
        ]
    );
}

#[test]
fn without_the_quota_a_dgx_h100_would_give_all_three_claims_a_3g40gb_device() {
    let mut classes = builtin_classes().unwrap();
    classes.extend(load_classes(Path::new(EXAMPLE)).unwrap());
    let slices = sim_slices("dgx-h100", "gpu.nvidia.com", Default::default()).unwrap();
    let claims = load_claims(Path::new(EXAMPLE)).unwrap();
    let allocator = Allocator::new(&CelEngine, &classes, &slices, &[]).unwrap();
    let prepared = allocator.prepare(&claims).unwrap();
    let outcome = allocator.allocate(&prepared, &Node::named("dgx-h100"), Detail::Brief);
    let devices: Vec<String> = outcome
        .allocations
        .expect("three 3g.40gb devices fit on eight H100s")
        .iter()
        .flat_map(|a| a.devices.as_ref().unwrap().results.clone().unwrap())
        .map(|r| r.device)
        .collect();
    assert_eq!(devices.len(), 3);
    assert!(
        devices.iter().all(|d| d.contains("-mig-3g40gb-")),
        "{devices:?}"
    );
}
