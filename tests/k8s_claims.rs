//! Reading claims for prepare against a fake API server: this driver's results and config in
//! the right order, and each way a claim can be unusable.

mod k8s_support;

use std::collections::BTreeMap;

use gpu_dra::k8s::{
    AllocatedClaim, AllocatedDevice, ClaimReader, ClaimRef, ConfigSource, K8sError, OpaqueConfig,
    Step,
};
use k8s_support::fixtures::{self, DRIVER, opaque, result};
use k8s_support::{Answer, FakeApi, Fault};
use serde_json::{Value, json};

const POOL: &str = "node-a";
const OTHER: &str = "net.example.com";

fn reader(objects: Vec<(String, Value)>) -> (FakeApi, ClaimReader) {
    let (fake, client) = FakeApi::start(objects);
    (fake, ClaimReader::new(client, DRIVER, POOL))
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "team".into(),
        name: "training".into(),
        uid: uid.into(),
    }
}

fn allocated(results: Vec<Value>, config: Vec<Value>) -> Value {
    json!({"allocation": {"devices": {"results": results, "config": config}}})
}

#[tokio::test]
async fn this_drivers_devices_and_config_are_read_class_entries_first() {
    let mut shared = result("mps", DRIVER, POOL, "gpu-1");
    shared["shareID"] = json!("3f2a");
    shared["consumedCapacity"] = json!({"memory": "10Gi"});
    let mut watched = result("monitor", DRIVER, POOL, "gpu-2");
    watched["adminAccess"] = json!(true);
    let results = vec![
        result("mig", DRIVER, POOL, "gpu-0-mig-1g10gb-0"),
        result("nic", OTHER, POOL, "eth1"),
        shared,
        watched,
    ];
    let config = vec![
        opaque(
            "FromClaim",
            DRIVER,
            &["mps"],
            json!({"kind": "MpsConfig", "n": 1}),
        ),
        opaque(
            "FromClass",
            DRIVER,
            &[],
            json!({"kind": "GpuConfig", "n": 2}),
        ),
        opaque("FromClaim", OTHER, &[], json!({"mtu": 9000})),
        opaque(
            "FromClass",
            DRIVER,
            &["mig"],
            json!({"kind": "MigConfig", "n": 3}),
        ),
        opaque(
            "FromClaim",
            DRIVER,
            &[],
            json!({"kind": "GpuConfig", "n": 4}),
        ),
    ];
    let (fake, reader) = reader(vec![fixtures::claim(
        "team",
        "training",
        "uid-7",
        allocated(results, config),
    )]);

    let got = reader.fetch("team", "training", "uid-7").await.unwrap();

    let device = |request: &str, name: &str| AllocatedDevice {
        request: request.into(),
        pool: POOL.into(),
        device: name.into(),
        admin_access: false,
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    };
    let entry = |source, requests: &[&str], parameters| OpaqueConfig {
        source,
        requests: requests.iter().map(|r| r.to_string()).collect(),
        parameters,
    };
    let want = AllocatedClaim {
        pod_claim_name: None,
        claim: claim_ref("uid-7"),
        devices: vec![
            device("mig", "gpu-0-mig-1g10gb-0"),
            AllocatedDevice {
                share_id: Some("3f2a".into()),
                consumed_capacity: [("memory".to_string(), "10Gi".to_string())].into(),
                ..device("mps", "gpu-1")
            },
            AllocatedDevice {
                admin_access: true,
                ..device("monitor", "gpu-2")
            },
        ],
        config: vec![
            entry(
                ConfigSource::FromClass,
                &[],
                json!({"kind": "GpuConfig", "n": 2}),
            ),
            entry(
                ConfigSource::FromClass,
                &["mig"],
                json!({"kind": "MigConfig", "n": 3}),
            ),
            entry(
                ConfigSource::FromClaim,
                &["mps"],
                json!({"kind": "MpsConfig", "n": 1}),
            ),
            entry(
                ConfigSource::FromClaim,
                &[],
                json!({"kind": "GpuConfig", "n": 4}),
            ),
        ],
        classes: BTreeMap::new(),
        reserved_pods: Vec::new(),
    };
    assert_eq!(want, got);
    let lines: Vec<String> = fake.take_requests().iter().map(|r| r.line()).collect();
    assert_eq!(
        vec!["GET /apis/resource.k8s.io/v1/namespaces/team/resourceclaims/training"],
        lines
    );
}

#[tokio::test]
async fn a_deleted_claim_is_reported_as_not_found() {
    let (_, reader) = reader(vec![]);

    let err = reader.fetch("team", "training", "uid-7").await.unwrap_err();

    assert!(
        matches!(&err, K8sError::ClaimNotFound { claim } if **claim == claim_ref("uid-7")),
        "{err:?}"
    );
    assert_eq!(
        "ResourceClaim team/training (uid-7) not found (deleted?)",
        err.to_string()
    );
}

#[tokio::test]
async fn a_re_created_claim_is_told_apart_by_its_uid() {
    let status = allocated(vec![result("gpu", DRIVER, POOL, "gpu-0")], vec![]);
    let (_, reader) = reader(vec![fixtures::claim("team", "training", "uid-8", status)]);

    let err = reader.fetch("team", "training", "uid-7").await.unwrap_err();

    assert_eq!(
        "ResourceClaim team/training (uid-7) has UID uid-8 in the cluster: \
         it was deleted and re-created",
        err.to_string()
    );
}

#[tokio::test]
async fn an_unallocated_claim_is_an_error() {
    let (_, reader) = reader(vec![fixtures::claim(
        "team",
        "training",
        "uid-7",
        json!({}),
    )]);

    let err = reader.fetch("team", "training", "uid-7").await.unwrap_err();

    assert!(matches!(err, K8sError::ClaimNotAllocated { .. }), "{err:?}");
}

#[tokio::test]
async fn a_claim_with_devices_of_other_drivers_or_nodes_only_is_an_error_listing_them() {
    let results = vec![
        result("nic", OTHER, POOL, "eth1"),
        result("gpu", DRIVER, "node-b", "gpu-0"),
    ];
    let status = allocated(results, vec![]);
    let (_, reader) = reader(vec![fixtures::claim("team", "training", "uid-7", status)]);

    let err = reader.fetch("team", "training", "uid-7").await.unwrap_err();

    assert_eq!(
        "ResourceClaim team/training (uid-7) has no device of driver gpu.nvidia.com in pool \
         node-a (allocated: net.example.com/node-a/eth1, gpu.nvidia.com/node-b/gpu-0)",
        err.to_string()
    );
}

#[tokio::test]
async fn a_config_source_kubernetes_does_not_define_names_the_valid_ones() {
    let status = allocated(
        vec![result("gpu", DRIVER, POOL, "gpu-0")],
        vec![opaque("FromNode", DRIVER, &[], json!({}))],
    );
    let (_, reader) = reader(vec![fixtures::claim("team", "training", "uid-7", status)]);

    let err = reader.fetch("team", "training", "uid-7").await.unwrap_err();

    assert_eq!(
        "ResourceClaim team/training (uid-7): status.allocation.devices.config[0].source is \
         \"FromNode\"; valid: FromClass, FromClaim",
        err.to_string()
    );
}

#[tokio::test]
async fn an_unreachable_api_server_names_the_claim_and_is_transient() {
    let (fake, reader) = reader(vec![]);
    fake.fail(Fault::new("GET", "training", Answer::Disconnect));

    let err = reader.fetch("team", "training", "uid-7").await.unwrap_err();

    match &err {
        K8sError::Unreachable {
            step: Step::GetClaim { claim },
            ..
        } => assert_eq!(claim_ref("uid-7"), **claim),
        other => panic!("want Unreachable, got {other:?}"),
    }
    assert!(err.is_transient());
    assert!(err.to_string().contains("team/training (uid-7)"), "{err}");
}
