//! `explain` against a live cluster: classes, slices and allocated claims listed from a
//! (mocked) API server at the HTTP layer.

mod k8s_support;

use gpu_dra::explain::{ExplainInput, explain};
use gpu_dra::explain_inputs::{cluster_allocated, cluster_classes, explain_cluster};
use gpu_dra::selectors::CelEngine;
use serde_json::json;

use k8s_support::FakeApi;

fn class(name: &str, kind: &str) -> (String, serde_json::Value) {
    (
        format!("/apis/resource.k8s.io/v1/deviceclasses/{name}"),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
               "spec": {"selectors": [{"cel": {"expression":
                 format!("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'")}}]}}),
    )
}

#[tokio::test]
async fn a_live_cluster_is_explained_with_its_own_classes_slices_and_allocations() {
    let slices =
        gpu_dra::explain_inputs::sim_slices("mixed", "gpu.nvidia.com", Default::default()).unwrap();
    let mut objects = vec![
        class("gpu.nvidia.com", "gpu"),
        class("mig.nvidia.com", "mig"),
    ];
    for s in &slices {
        let name = s.metadata.name.clone().unwrap();
        objects.push((
            format!("{}/{name}", k8s_support::SLICES),
            serde_json::to_value(s).unwrap(),
        ));
    }
    // Somebody holds the H100 and the L4 already.
    objects.push((
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/held".to_string(),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "held", "namespace": "team-a", "uid": "u-held"},
               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "mixed", "device": "gpu-1"},
                   {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "mixed", "device": "gpu-2"}]}}}}),
    ));
    let (api, client) = FakeApi::start(objects);
    let classes = cluster_classes(&client).await.unwrap();
    let allocated = cluster_allocated(&client).await.unwrap();
    assert_eq!(classes.len(), 2);
    assert_eq!(allocated.len(), 1);
    let claims = gpu_dra::explain::load_claims(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/dedicated-gpu.yaml"
    )))
    .unwrap();
    let report = explain_cluster(
        &CelEngine,
        &client,
        Some("mixed"),
        &classes,
        &allocated,
        &claims,
    )
    .await
    .unwrap();
    let requests = api.take_requests();
    let lines: Vec<String> = requests.iter().map(|r| r.line()).collect();
    // The slices last, read as they arrive: the classes and what claims hold are needed first.
    assert_eq!(
        lines,
        [
            "GET /apis/resource.k8s.io/v1/deviceclasses",
            "GET /apis/resource.k8s.io/v1/resourceclaims",
            "GET /apis/resource.k8s.io/v1/resourceslices"
        ]
    );
    assert_eq!(
        requests[2].query.get("fieldSelector").map(String::as_str),
        Some("spec.nodeName=mixed")
    );
    assert!(!report.fits());
    let text = report.render_human();
    assert!(
        text.contains("2 x allocated to claim team-a/held: gpu-1, gpu-2"),
        "{text}"
    );
    // The same objects read whole give the same report.
    let whole = explain(
        &CelEngine,
        &ExplainInput {
            classes,
            slices,
            allocated,
            claims,
        },
    );
    assert_eq!(whole, report);
}
