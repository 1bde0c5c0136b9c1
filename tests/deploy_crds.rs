//! The ComputeDomain CRDs: the copies in `deployments/crds/` and the chart's `crds/` are the
//! same files, they name what `src/compute_domain/api.rs` addresses, and their OpenAPI schemas
//! accept NVIDIA's example manifest and what our own types write, and refuse bad values
//! (checked with a JSON-schema validator: the structural schema's keywords are JSON Schema's;
//! the `x-kubernetes-*` extensions are checked for presence).

mod deploy_support;

use std::collections::BTreeMap;
use std::fs;

use deploy_support::{chart_dir, repo, yaml_file};
use gpu_dra::compute_domain::api;
use serde_json::{Value, json};

const DOMAINS: &str = "resource.nvidia.com_computedomains.yaml";
const NODES: &str = "resource.nvidia.com_computedomainnodes.yaml";

fn crd(file: &str) -> Value {
    yaml_file(&repo().join("deployments/crds").join(file))
}

fn version(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]
}

fn validator(crd: &Value) -> jsonschema::Validator {
    let schema = &version(crd)["schema"]["openAPIV3Schema"];
    jsonschema::validator_for(schema).expect("the CRD's schema is a valid JSON schema")
}

fn errors(validator: &jsonschema::Validator, object: &Value) -> Vec<String> {
    validator
        .iter_errors(object)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn files(dir: &std::path::Path) -> BTreeMap<String, String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read_to_string(&path).unwrap())
        })
        .collect()
}

#[test]
fn chart_crds_are_the_files_of_deployments_crds() {
    let want = files(&repo().join("deployments/crds"));
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        vec![NODES, DOMAINS],
        "deployments/crds/ holds exactly the two CRDs"
    );
    let got = files(&chart_dir().join("crds"));
    assert_eq!(
        got, want,
        "copy deployments/crds/*.yaml to deployments/helm/gpu-dra/crds/"
    );
}

#[test]
fn crds_name_the_group_version_kinds_and_plurals_the_code_addresses() {
    let got: Vec<(Value, Value, Value, Value, Value, Value)> = [DOMAINS, NODES]
        .into_iter()
        .map(crd)
        .map(|c| {
            (
                c["metadata"]["name"].clone(),
                c["spec"]["group"].clone(),
                version(&c)["name"].clone(),
                c["spec"]["names"]["kind"].clone(),
                c["spec"]["names"]["plural"].clone(),
                c["spec"]["scope"].clone(),
            )
        })
        .collect();
    let row = |kind: &str, plural: &str| {
        (
            json!(format!("{plural}.{}", api::GROUP)),
            json!(api::GROUP),
            json!(api::VERSION),
            json!(kind),
            json!(plural),
            json!("Namespaced"),
        )
    };
    let want = vec![
        row(api::COMPUTE_DOMAIN_KIND, api::COMPUTE_DOMAIN_PLURAL),
        row(
            api::COMPUTE_DOMAIN_NODE_KIND,
            api::COMPUTE_DOMAIN_NODE_PLURAL,
        ),
    ];
    assert_eq!(got, want);
}

#[test]
fn only_the_compute_domain_has_a_status_subresource_and_both_specs_are_immutable() {
    let (domains, nodes) = (crd(DOMAINS), crd(NODES));
    assert_eq!(version(&domains)["subresources"], json!({"status": {}}));
    assert_eq!(version(&nodes)["subresources"], Value::Null);
    let rule = |c: &Value| {
        version(c)["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"][0]
            ["rule"]
            .clone()
    };
    assert_eq!(
        (rule(&domains), rule(&nodes)),
        (json!("self == oldSelf"), json!("self == oldSelf"))
    );
}

/// NVIDIA's example from their ComputeDomain documentation, as users apply it.
fn nvidia_example() -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "compute-domain", "namespace": "default"},
        "spec": {
            "numNodes": 2,
            "channel": {"resourceClaimTemplate": {"name": "compute-domain-channel"}}
        }
    })
}

#[test]
fn schema_accepts_nvidias_example_and_both_allocation_modes() {
    let v = validator(&crd(DOMAINS));
    let mut all = nvidia_example();
    all["spec"]["channel"]["allocationMode"] = json!("All");
    let mut single = nvidia_example();
    single["spec"]["channel"]["allocationMode"] = json!("Single");
    let mut without_num_nodes = nvidia_example();
    without_num_nodes["spec"]
        .as_object_mut()
        .unwrap()
        .remove("numNodes");
    let got: Vec<Vec<String>> = [nvidia_example(), all, single, without_num_nodes]
        .iter()
        .map(|o| errors(&v, o))
        .collect();
    assert_eq!(got, vec![Vec::<String>::new(); 4]);
}

#[test]
fn schema_rejects_a_bad_allocation_mode_and_names_the_field() {
    let v = validator(&crd(DOMAINS));
    let mut object = nvidia_example();
    object["spec"]["channel"]["allocationMode"] = json!("Some");
    let got = errors(&v, &object);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("/spec/channel/allocationMode:") && got[0].contains("Some"),
        "{got:?}"
    );
}

#[test]
fn schema_rejects_a_missing_template_name_a_negative_num_nodes_and_a_bad_status() {
    let v = validator(&crd(DOMAINS));
    let mut no_name = nvidia_example();
    no_name["spec"]["channel"]["resourceClaimTemplate"] = json!({});
    let mut negative = nvidia_example();
    negative["spec"]["numNodes"] = json!(-1);
    let mut bad_status = nvidia_example();
    bad_status["status"] = json!({"status": "Done", "nodes": []});
    let mut no_channel = nvidia_example();
    no_channel["spec"] = json!({"numNodes": 0});
    let got: Vec<bool> = [no_name, negative, bad_status, no_channel]
        .iter()
        .map(|o| v.is_valid(o))
        .collect();
    assert_eq!(got, vec![false; 4]);
}

#[test]
fn what_the_controller_and_daemons_write_satisfies_the_schemas() {
    let mut domain: api::ComputeDomain = serde_json::from_value(nvidia_example()).unwrap();
    domain.status = Some(api::ComputeDomainStatus {
        status: api::Readiness::NotReady,
        nodes: vec![api::ComputeDomainNodeStatus {
            name: "node-a".into(),
            ip_address: "10.0.0.1".into(),
            clique_id: "c2a0e7d4-1111-2222-3333-444455556666.1".into(),
            index: 0,
            status: api::Readiness::Ready,
        }],
        reason: Some("WaitingForNodes".into()),
        message: Some("1 of 2 nodes ready".into()),
    });
    let domain = serde_json::to_value(&domain).unwrap();
    assert_eq!(
        errors(&validator(&crd(DOMAINS)), &domain),
        Vec::<String>::new()
    );

    let mut node = api::ComputeDomainNode::new(
        &api::compute_domain_node_name("uid-1", "node-a"),
        &api::compute_domain_node_resource(),
        api::ComputeDomainNodeSpec {
            domain_uid: "uid-1".into(),
            domain_namespace: "default".into(),
            domain_name: "compute-domain".into(),
            node_name: "node-a".into(),
            clique_id: "c2a0e7d4-1111-2222-3333-444455556666.1".into(),
        },
    );
    node.status = Some(api::ComputeDomainNodeState {
        ip_address: "10.0.0.1".into(),
        index: 3,
        status: api::Readiness::NotReady,
        reason: Some("DaemonCrashed".into()),
        message: Some("nvidia-imex exited with status 1".into()),
    });
    let node = serde_json::to_value(&node).unwrap();
    assert_eq!(errors(&validator(&crd(NODES)), &node), Vec::<String>::new());
}
