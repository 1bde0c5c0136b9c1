//! Loading explain's inputs from files: claims, templates and Pods; classes and slices
//! from files or directories; errors that name the file and the problem.

mod alloc_fixtures;

use std::path::{Path, PathBuf};

use alloc_fixtures::*;
use gpu_dra::explain::{load_allocated, load_claims, load_classes, load_slices};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file is writable");
    path
}

fn names(claims: &[k8s_openapi::api::resource::v1::ResourceClaim]) -> Vec<String> {
    claims.iter().map(gpu_dra::alloc::claim_display).collect()
}

const TEMPLATE: &str = "\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: ml}
spec:
  metadata: {labels: {team: ml}}
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
";

const CLAIM: &str = "\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared-mig, namespace: ml}
spec:
  devices:
    requests:
    - {name: mig, exactly: {deviceClassName: mig.nvidia.com}}
";

#[test]
fn a_pod_resolves_its_claims_and_templates_from_the_same_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pod = "\
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: ml}
spec:
  containers: [{name: main, image: busybox}]
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
  - {name: mig, resourceClaimName: shared-mig}
";
    let path = write(
        dir.path(),
        "pod.yaml",
        &format!("{TEMPLATE}---\n{CLAIM}---\n{pod}"),
    );
    let claims = load_claims(&path).expect("file is valid");
    assert_eq!(vec!["ml/trainer-gpu", "ml/shared-mig"], names(&claims));
    let labels = claims[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(Some(&"ml".to_string()), labels.get("team"));
}

#[test]
fn without_a_pod_every_claim_and_template_is_explained() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        "claims.yaml",
        &format!("{CLAIM}---\n{TEMPLATE}"),
    );
    assert_eq!(
        vec!["ml/shared-mig", "ml/one-gpu"],
        names(&load_claims(&path).expect("valid"))
    );
}

#[test]
fn json_files_and_kind_lists_are_read_too() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"}}
    ]}"#;
    let path = write(dir.path(), "classes.json", json);
    let classes = load_classes(&path).expect("valid");
    let got: Vec<_> = classes
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(vec!["gpu.nvidia.com", "mig.nvidia.com"], got);
}

#[test]
fn a_directory_yields_the_objects_of_all_its_yaml_and_json_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let slices = h100_node("node-a", 1);
    for (i, slice) in slices.iter().enumerate() {
        let text = serde_yaml::to_string(slice).expect("slice serialises");
        write(dir.path(), &format!("slice-{i}.yaml"), &text);
    }
    write(dir.path(), "notes.txt", "not a manifest");
    write(
        dir.path(),
        "class.yml",
        &serde_yaml::to_string(&classes()[0]).expect("serialises"),
    );
    assert_eq!(slices, load_slices(dir.path()).expect("valid"));
    assert_eq!(1, load_classes(dir.path()).expect("valid").len());
}

#[test]
fn only_allocated_claims_count_as_allocated() {
    let dir = tempfile::tempdir().expect("temp dir");
    let held = serde_yaml::to_string(&allocated("holder", "node-a", &[("gpu", "gpu-0")]))
        .expect("serialises");
    let path = write(dir.path(), "claims.yaml", &format!("{held}---\n{CLAIM}"));
    assert_eq!(
        vec!["default/holder"],
        names(&load_allocated(&path).expect("valid"))
    );
}

#[test]
fn bad_files_are_refused_naming_the_file_and_the_problem() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().display();
    let cases = [
        (
            "broken.yaml",
            "kind: ResourceClaim\nmetadata: {name: [unclosed\n",
            format!("{d}/broken.yaml: document 1 is not valid YAML or JSON"),
        ),
        (
            "old.yaml",
            "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceClaim\nmetadata: {name: old}\n",
            format!(
                "{d}/old.yaml: document 1: ResourceClaim has apiVersion \"resource.k8s.io/v1beta1\"; \
                 supported: resource.k8s.io/v1, resource.k8s.io/v1beta2"
            ),
        ),
        (
            "wrong-shape.yaml",
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: odd}\nspec: {devices: {requests: 3}}\n",
            format!(
                "{d}/wrong-shape.yaml: document 1: ResourceClaim odd does not match the resource.k8s.io/v1 schema"
            ),
        ),
        (
            "pod.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: []\n  \
             resourceClaims: [{name: gpu, resourceClaimTemplateName: missing}]\n",
            format!(
                "{d}/pod.yaml: Pod p: spec.resourceClaims[0] refers to ResourceClaimTemplate \"missing\", \
                 which the file does not contain (it has: none)"
            ),
        ),
        (
            "classes.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
            format!(
                "{d}/classes.yaml: no ResourceClaim, ResourceClaimTemplate or Pod found (kinds present: ConfigMap)"
            ),
        ),
    ];
    for (name, text, want) in cases {
        let path = write(dir.path(), name, text);
        let got = load_claims(&path)
            .map(|c| names(&c))
            .map_err(|e| e.to_string());
        assert_eq!(Err(want), got, "{name}");
    }
    let missing = dir.path().join("absent.yaml");
    let got = load_classes(&missing)
        .map(|c| c.len())
        .map_err(|e| e.to_string());
    assert_eq!(Err(format!("cannot read {d}/absent.yaml")), got);
}

#[test]
fn the_api_servers_typed_lists_give_their_items_the_lists_kind_and_version() {
    // `kubectl get --raw /apis/resource.k8s.io/v1/resourceslices`: items carry neither field.
    let dir = tempfile::tempdir().unwrap();
    let raw = write(
        dir.path(),
        "raw.json",
        r#"{"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
            "metadata": {"resourceVersion": "9"},
            "items": [{"metadata": {"name": "n-0"},
                       "spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
                                "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                                "devices": [{"name": "gpu-0"}]}}]}"#,
    );
    let slices = load_slices(&raw).unwrap();
    assert_eq!(slices[0].metadata.name.as_deref(), Some("n-0"));
    // An older version's typed list is refused as that version, not as a missing kind.
    let old = write(
        dir.path(),
        "old.json",
        &std::fs::read_to_string(&raw)
            .unwrap()
            .replace("resource.k8s.io/v1\"", "resource.k8s.io/v1alpha3\""),
    );
    let err = load_slices(&old).unwrap_err().to_string();
    assert!(err.contains("v1alpha3"), "{err}");
}
