//! Cluster facts and client construction: version, served DRA API, the Node's UID, kubeconfig.

mod k8s_support;

use gpu_dra::k8s::{self, ClusterFacts, K8sError, ServerVersion, Step, cluster};
use k8s_support::FakeApi;
use k8s_support::fixtures::{self, NODE_UID};
use serde_json::{Value, json};

fn version(minor: &str) -> (String, Value) {
    (
        "/version".into(),
        json!({"major": "1", "minor": minor, "gitVersion": format!("v1.{minor}-gke.1"),
               "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "",
               "compiler": "", "platform": "linux/amd64"}),
    )
}

fn groups(resource_versions: &[&str]) -> (String, Value) {
    let versions: Vec<Value> = resource_versions
        .iter()
        .map(|v| json!({"groupVersion": format!("resource.k8s.io/{v}"), "version": v}))
        .collect();
    (
        "/apis".into(),
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]},
            {"name": "resource.k8s.io", "versions": versions},
        ]}),
    )
}

#[tokio::test]
async fn facts_read_a_decorated_version_and_the_served_dra_api() {
    let (_, client) = FakeApi::start(vec![version("36+"), groups(&["v1", "v1beta2"])]);

    let got = cluster::facts(&client).await.unwrap();

    let want = ClusterFacts {
        version: ServerVersion {
            major: 1,
            minor: 36,
            git_version: "v1.36+-gke.1".into(),
        },
        serves_resource_v1: true,
    };
    assert_eq!(want, got);
}

#[tokio::test]
async fn a_server_with_only_beta_dra_apis_does_not_serve_v1() {
    let (_, client) = FakeApi::start(vec![groups(&["v1beta1", "v1beta2"])]);

    assert!(!cluster::serves_resource_v1(&client).await.unwrap());
}

#[tokio::test]
async fn the_node_uid_is_read_from_the_node_object() {
    let (_, client) = FakeApi::start(vec![fixtures::node("node-a")]);

    assert_eq!(
        NODE_UID,
        cluster::node_uid(&client, "node-a").await.unwrap()
    );
}

#[tokio::test]
async fn a_missing_node_is_a_permanent_error_naming_it() {
    let (_, client) = FakeApi::start(vec![]);

    let err = cluster::node_uid(&client, "node-a").await.unwrap_err();

    match &err {
        K8sError::Api {
            step: Step::GetNode { node },
            code: 404,
            ..
        } => assert_eq!("node-a", node),
        other => panic!("want a 404 for node-a, got {other:?}"),
    }
    assert!(!err.is_transient());
}

#[tokio::test]
async fn a_kubeconfig_file_gives_a_client_without_contacting_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1
kind: Config
clusters:
- name: kind
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
users:
- name: plugin
  user:
    token: abc
contexts:
- name: kind
  context: {cluster: kind, user: plugin}
current-context: kind
",
    )
    .unwrap();

    let client = k8s::connect(Some(&path)).await;

    assert!(client.is_ok(), "{:?}", client.err());
}

#[tokio::test]
async fn a_missing_kubeconfig_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope");

    let Err(err) = k8s::connect(Some(&path)).await else {
        panic!("a missing kubeconfig must fail");
    };

    match &err {
        K8sError::Kubeconfig { path: got, .. } => assert_eq!(&path, got),
        other => panic!("want Kubeconfig, got {other:?}"),
    }
    assert!(err.to_string().contains("nope"), "{err}");
}
