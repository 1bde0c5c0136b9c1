//! `capacity` against a live cluster: slices, claims and nodes listed from a (mocked) API
//! server at the HTTP layer, and the report showing which pod holds which device.

mod k8s_support;

use gpu_dra::capacity::{
    CapacityInput, CapacityOptions, TableOptions, build, build_from_cluster, render_table,
};
use gpu_dra::explain_inputs::sim_slices;
use serde_json::{Value, json};

use k8s_support::FakeApi;

fn objects() -> Vec<(String, Value)> {
    let mut objects = Vec::new();
    for s in sim_slices("mixed", "gpu.nvidia.com", Default::default()).unwrap() {
        let name = s.metadata.name.clone().unwrap();
        // As the API server lists them: a typed `ResourceSliceList` whose items carry no
        // apiVersion or kind.
        let mut value = serde_json::to_value(&s).unwrap();
        let object = value.as_object_mut().unwrap();
        object.remove("apiVersion");
        object.remove("kind");
        objects.push((format!("{}/{name}", k8s_support::SLICES), value));
    }
    objects.push((
        "/api/v1/nodes/mixed".into(),
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "mixed", "labels": {"gpu-pool": "research"}}}),
    ));
    objects.push((
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/trainer-gpu".into(),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "trainer-gpu", "namespace": "team-a"},
               "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "mig", "driver": "gpu.nvidia.com", "pool": "mixed", "device": "gpu-1-mig-3g40gb-4"}]}},
                   "reservedFor": [{"resource": "pods", "name": "trainer-7d9f", "uid": "p1"}]}}),
    ));
    objects.push((
        "/apis/resource.k8s.io/v1/namespaces/team-b/resourceclaims/pending".into(),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "pending", "namespace": "team-b"},
               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}),
    ));
    objects
}

#[tokio::test]
async fn a_live_cluster_shows_which_pod_holds_which_device() {
    let (api, client) = FakeApi::start(objects());
    let options = CapacityOptions {
        driver: "gpu.nvidia.com".into(),
        pool_label: Some("gpu-pool".into()),
        node: Some("mixed".into()),
    };
    let report = build_from_cluster(client, &options).await.unwrap();
    let requests = api.take_requests();
    let lines: Vec<String> = requests.iter().map(|r| r.line()).collect();
    // Claims first: what they hold is needed while the slices stream by, pool by pool.
    assert_eq!(
        lines,
        [
            "GET /apis/resource.k8s.io/v1/resourceclaims",
            "GET /apis/resource.k8s.io/v1/resourceslices",
            "GET /api/v1/nodes/mixed"
        ]
    );
    assert_eq!(
        requests[1].query.get("fieldSelector").map(String::as_str),
        Some("spec.driver=gpu.nvidia.com,spec.nodeName=mixed")
    );
    assert_eq!(
        (report.totals.claims, report.totals.allocated_devices),
        (1, 1),
        "only the allocated claim holds a device"
    );
    // The same objects handed over as API objects give the same report.
    let objects: Vec<serde_json::Value> = objects().into_iter().map(|(_, o)| o).collect();
    let of_kind = |kind: &str| -> Vec<serde_json::Value> {
        objects
            .iter()
            .filter(|o| o["kind"] == kind || (kind == "ResourceSlice" && o["kind"].is_null()))
            .cloned()
            .collect()
    };
    let input = CapacityInput {
        slices: serde_json::from_value(serde_json::Value::Array(of_kind("ResourceSlice"))).unwrap(),
        claims: serde_json::from_value(serde_json::Value::Array(of_kind("ResourceClaim"))).unwrap(),
        nodes: serde_json::from_value(serde_json::Value::Array(of_kind("Node"))).unwrap(),
    };
    assert_eq!(build(&input, &options).unwrap(), report);
    assert_eq!(report.nodes[0].pool.as_deref(), Some("research"));
    let table = render_table(
        &report,
        &TableOptions {
            detail: true,
            ..Default::default()
        },
    );
    let row = table
        .lines()
        .find(|l| l.contains("gpu-1-mig-3g40gb-4") && l.starts_with("mixed"))
        .unwrap_or_else(|| panic!("no allocation row in\n{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "mixed",
            "gpu-1",
            "gpu-1-mig-3g40gb-4",
            "3g.40gb",
            "4-7",
            "team-a",
            "trainer-7d9f",
            "trainer-gpu"
        ]
    );
    assert!(
        table.contains("mixed/gpu-1  NVIDIA H100 80GB HBM3  MIG dynamic  [....AAAA]"),
        "{table}"
    );
}

#[tokio::test]
async fn every_node_is_listed_for_pools_when_no_node_is_named() {
    let (api, client) = FakeApi::start(objects());
    let options = CapacityOptions {
        driver: "gpu.nvidia.com".into(),
        pool_label: Some("gpu-pool".into()),
        node: None,
    };
    let report = build_from_cluster(client, &options).await.unwrap();
    let lines: Vec<String> = api.take_requests().iter().map(|r| r.line()).collect();
    assert_eq!(lines[2], "GET /api/v1/nodes");
    assert_eq!(report.pools[0].pool, "research");
}

#[tokio::test]
async fn a_failed_list_names_what_was_being_listed() {
    let (api, client) = FakeApi::start(objects());
    api.fail(k8s_support::Fault::new(
        "GET",
        "resourceclaims",
        k8s_support::Answer::Status(403, "Forbidden", "claims are secret".into()),
    ));
    let options = CapacityOptions {
        driver: "gpu.nvidia.com".into(),
        pool_label: None,
        node: None,
    };
    let err = build_from_cluster(client, &options).await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "listing ResourceClaims from the API server"
    );
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("claims are secret")
    );
}

#[tokio::test]
async fn claims_whose_list_the_fast_path_does_not_take_are_read_in_full() {
    // The fake lists claims as a `v1` `List`; with items that carry no kind, only the full
    // read knows what they are (the endpoint's), and the report is the same.
    let mut stripped = objects();
    for (path, object) in &mut stripped {
        if path.contains("/resourceclaims/") {
            let object = object.as_object_mut().unwrap();
            object.remove("apiVersion");
            object.remove("kind");
        }
    }
    let options = CapacityOptions {
        driver: "gpu.nvidia.com".into(),
        pool_label: None,
        node: None,
    };
    let report = |objects| async {
        let (_api, client) = FakeApi::start(objects);
        build_from_cluster(client, &options).await.unwrap()
    };
    let full = report(stripped).await;
    assert_eq!(full, report(objects()).await);
    assert_eq!(full.totals.allocated_devices, 1);
}

#[tokio::test]
async fn a_response_that_is_no_list_is_named() {
    let (api, client) = FakeApi::start(objects());
    api.fail(k8s_support::Fault::new(
        "GET",
        "resourceclaims",
        k8s_support::Answer::Json(200, serde_json::json!({"kind": "Status", "items": "none"})),
    ));
    let options = CapacityOptions {
        driver: "gpu.nvidia.com".into(),
        pool_label: None,
        node: None,
    };
    let err = build_from_cluster(client, &options).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "reading the API server's list of ResourceClaims"
    );
}
