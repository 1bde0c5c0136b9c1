//! The Helm chart's values against its schema, its DeviceClasses against `device-classes/`,
//! and its RBAC against the API calls `src/k8s/` makes. Rendering checks are in
//! `deploy_render.rs`.

mod deploy_support;

use std::collections::BTreeMap;
use std::fs;

use deploy_support::{chart_dir, repo, yaml_file};
use serde_json::{Value, json};

fn schema() -> jsonschema::Validator {
    let text = fs::read_to_string(chart_dir().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).expect("values.schema.json is JSON");
    jsonschema::validator_for(&schema).expect("values.schema.json is a valid JSON schema")
}

fn errors(validator: &jsonschema::Validator, values: &Value) -> Vec<String> {
    validator
        .iter_errors(values)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Helm's merge of a values file over the defaults: maps merge key by key, a `null` deletes
/// the default's key, anything else replaces.
fn coalesce(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                if value.is_null() {
                    base.remove(key);
                } else if let Some(existing) = base.get_mut(key) {
                    coalesce(existing, value);
                } else {
                    base.insert(key.clone(), value.clone());
                }
            }
        }
        (base, overlay) => *base = overlay.clone(),
    }
}

fn defaults() -> Value {
    yaml_file(&chart_dir().join("values.yaml"))
}

fn with(overrides: Value) -> Value {
    let mut values = defaults();
    coalesce(&mut values, &overrides);
    values
}

#[test]
fn default_values_satisfy_the_schema() {
    assert_eq!(errors(&schema(), &defaults()), Vec::<String>::new());
}

#[test]
fn sim_values_over_the_defaults_satisfy_the_schema() {
    let values = with(yaml_file(&chart_dir().join("values-sim.yaml")));
    assert_eq!(errors(&schema(), &values), Vec::<String>::new());
    let want = json!({});
    assert_eq!(values["kubeletPlugin"]["nodeSelector"], want);
}

#[test]
fn schema_rejects_a_misspelt_key_and_names_it() {
    let got = errors(
        &schema(),
        &with(json!({"kubeletPlugin": {"privilegd": true}})),
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("/kubeletPlugin:") && got[0].contains("privilegd"),
        "{got:?}"
    );
}

#[test]
fn schema_rejects_values_outside_their_choices() {
    let validator = schema();
    let cases = [
        ("gpuBackend", json!({"gpuBackend": "cuda"})),
        ("migPolicy", json!({"migPolicy": "auto"})),
        ("migProfiles", json!({"migProfiles": "1g.10gb,,7g.80gb"})),
        ("migProfiles", json!({"migProfiles": "1g.10gb, 7g.80gb"})),
        ("sliceLayout", json!({"sliceLayout": "by-node"})),
        ("migAttributes", json!({"migAttributes": "lean"})),
        ("logging.format", json!({"logging": {"format": "xml"}})),
        ("logging.level", json!({"logging": {"level": "verbose"}})),
        (
            "sharing.sharedGpus",
            json!({"sharing": {"sharedGpus": "half"}}),
        ),
        ("sharing.sharedGpus", json!({"sharing": {"sharedGpus": 0}})),
        ("metrics.port", json!({"metrics": {"port": 70000}})),
        ("driverRoot", json!({"driverRoot": "run/nvidia/driver"})),
        ("driverName", json!({"driverName": "GPU_NVIDIA"})),
        (
            "sim.nodePresets",
            json!({"sim": {"nodePresets": [{"preset": "l4-x4", "shared": "memory"}]}}),
        ),
        ("vgpu.types", json!({"vgpu": {"types": "\"H100-4C\""}})),
        ("vgpu.types", json!({"vgpu": {"types": ["H100-4C"]}})),
        (
            "vgpu.compatibilityGroups",
            json!({"vgpu": {"compatibilityGroups": "yes"}}),
        ),
        ("vgpu", json!({"vgpu": {"type": "H100-4C"}})),
        (
            "partitionableDevicesType",
            json!({"partitionableDevicesType": "on"}),
        ),
        (
            "sim.nodePresets[].vgpu",
            json!({"sim": {"nodePresets": [{"preset": "hgx-h100-vgpu", "vgpu": {"types": 4}}]}}),
        ),
    ];
    let got: Vec<(&str, bool)> = cases
        .iter()
        .map(|(field, overrides)| (*field, validator.is_valid(&with(overrides.clone()))))
        .collect();
    let want: Vec<(&str, bool)> = cases.iter().map(|(field, _)| (*field, false)).collect();
    assert_eq!(got, want);
}

#[test]
fn schema_accepts_every_documented_choice() {
    let validator = schema();
    let cases = [
        json!({"gpuBackend": "sim", "sim": {"preset": "dgx-h100"}}),
        json!({"migPolicy": "dynamic"}),
        json!({"migProfiles": "1g.10gb,3g.40gb,7g.80gb"}),
        json!({"migProfiles": "1g.10gb+me,7g.80gb", "migPolicy": "dynamic"}),
        json!({"migProfiles": "all"}),
        json!({"sliceLayout": "by-profile"}),
        json!({"sliceLayout": "by-gpu"}),
        json!({"sliceLayout": "gpus-first"}),
        json!({"sliceLayout": "interleaved"}),
        json!({"migAttributes": "compact"}),
        json!({"migAttributes": "full"}),
        json!({"sharing": {"sharedGpus": "memory"}}),
        json!({"sharing": {"sharedGpus": 4}}),
        json!({"sharing": {"sharedGpus": "4"}}),
        json!({"sim": {"nodePresets": ["dgx-h100", {"preset": "l4-x4", "sharedGpus": "memory"}]}}),
        json!({"metrics": {"enabled": false}, "logging": {"format": "json", "level": "debug"}}),
        json!({"driverRoot": "/run/nvidia/driver", "deviceClasses": {"mig": false}}),
        json!({"passthrough": {"enabled": true, "iommufd": true}}),
        json!({"vgpu": {"types": "H100-4C,H100-10C"}}),
        json!({"vgpu": {"types": "0-3=H100-4C;4-7=L40S-12Q,L40S-24Q", "compatibilityGroups": true}}),
        json!({"partitionableDevicesType": true}),
        json!({"sim": {"nodePresets": [{"preset": "l40s-vgpu", "vgpu": {"types": "L40S-12Q,L40S-1B", "compatibilityGroups": true}}]}}),
    ];
    let got: Vec<Vec<String>> = cases
        .iter()
        .map(|overrides| errors(&validator, &with(overrides.clone())))
        .collect();
    assert_eq!(got, vec![Vec::<String>::new(); cases.len()]);
}

fn yaml_files(dir: &std::path::Path) -> BTreeMap<String, String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read_to_string(&path).unwrap())
        })
        .collect()
}

#[test]
fn chart_device_classes_are_the_files_of_device_classes() {
    let want = yaml_files(&repo().join("device-classes"));
    let got = yaml_files(&chart_dir().join("files/device-classes"));
    assert!(!want.is_empty());
    assert_eq!(
        got, want,
        "copy device-classes/*.yaml to deployments/helm/gpu-dra/files/device-classes/"
    );
}

/// The calls of the `kube` API the plugin makes, found in `src/k8s/`, and the RBAC rule each
/// needs. When this fails, `src/k8s/` calls something new: grant it in
/// `templates/rbac.yaml` and update this table and `deploy_render.rs`.
#[test]
fn rbac_rules_cover_exactly_the_calls_in_src_k8s() {
    let source = |file: &str| fs::read_to_string(repo().join("src/k8s").join(file)).unwrap();
    let (claims, cluster, publisher, claim_status) = (
        source("claims.rs"),
        source("cluster.rs"),
        source("publisher.rs"),
        source("claim_status.rs"),
    );
    let (claim_lookup, events) = (source("claim_lookup.rs"), source("events.rs"));
    let calls = [
        ("resourceclaims get", claims.contains("api.get_opt(name)")),
        (
            "resourceclaims get (orphan check)",
            claim_lookup.contains("api.get_with(&claim.name, &params)"),
        ),
        (
            "events create",
            events.contains("Api::<Event>::namespaced")
                && events.contains(".create(&PostParams::default(), &event)"),
        ),
        (
            "resourceclaims get (before a status write)",
            claim_status.contains("api.get_opt(&claim.name)"),
        ),
        (
            "resourceclaims/status update",
            claim_status.contains(".replace_subresource(\"status\", &claim.name, &params, body)"),
        ),
        // Kubernetes 1.36 checks `associated-node:<verb of the request>` on the synthetic
        // resourceclaims/driver for every driver whose status.devices entries change
        // (pkg/registry/resource/utils.go, AuthorizedForDeviceStatus): a PUT is `update`.
        (
            "resourceclaims/driver associated-node:update",
            claim_status.contains("status.insert(\"devices\"")
                && claim_status.contains("replace_subresource(\"status\""),
        ),
        (
            "nodes get",
            cluster.contains("Api::<Node>::all") && cluster.contains(".get(node)"),
        ),
        (
            "resourceslices list",
            publisher.contains(".list(&ListParams"),
        ),
        (
            "resourceslices create",
            publisher.contains(".create(&params, slice)"),
        ),
        (
            "resourceslices update",
            publisher.contains(".replace(&name, &params, slice)"),
        ),
        (
            "resourceslices delete",
            publisher.contains(".delete(&delete.name, &params)"),
        ),
    ];
    let want: Vec<(&str, bool)> = calls.iter().map(|(rule, _)| (*rule, true)).collect();
    assert_eq!(calls.to_vec(), want);

    // Calls that would need more rights than the chart grants; a status write anywhere but
    // claim_status.rs, or a second one there, is one of them, and so is a hand-built request
    // (`Request::new`, which the status write uses to read only the answer's
    // resourceVersion) anywhere else.
    let mut unexpected = Vec::new();
    for entry in fs::read_dir(repo().join("src/k8s")).unwrap() {
        let path = entry.unwrap().path();
        let text = fs::read_to_string(&path).unwrap();
        for call in [
            ".patch(",
            ".patch_status(",
            "Patch::Apply",
            ".watch(",
            "watcher(",
            ".delete_collection(",
            ".get_status(",
            ".evict(",
            "Api::<Pod>",
        ] {
            if text.contains(call) {
                unexpected.push(format!("{} calls {call}", path.display()));
            }
        }
        let allowed = usize::from(path.ends_with("claim_status.rs"));
        for call in [".replace_subresource(", "Request::new("] {
            if text.matches(call).count() != allowed {
                unexpected.push(format!("{} calls {call}", path.display()));
            }
        }
        if text.contains(".replace_status(") {
            unexpected.push(format!("{} calls .replace_status(", path.display()));
        }
    }
    assert_eq!(unexpected, Vec::<String>::new());

    // And the chart grants exactly those, no more: each rule of the ClusterRole as
    // `resources verbs [resourceNames]`, read from the template without helm.
    let template = fs::read_to_string(chart_dir().join("templates/rbac.yaml")).unwrap();
    let role = template.split("---").next().unwrap();
    let mut rules: Vec<String> = Vec::new();
    for line in role.lines().map(str::trim) {
        if line.starts_with("- apiGroups:") {
            rules.push(String::new());
        } else if let Some(rule) = rules.last_mut()
            && ["resources:", "verbs:", "resourceNames:"]
                .iter()
                .any(|k| line.starts_with(k))
        {
            let value = line.split_once(':').unwrap().1.trim();
            rule.push_str(&format!("{value} "));
        }
    }
    let rules: Vec<&str> = rules.iter().map(|r| r.trim()).collect();
    let want = vec![
        r#"["resourceclaims"] ["get"]"#,
        r#"["resourceclaims/status"] ["update"]"#,
        r#"["resourceclaims/driver"] ["associated-node:update"] [{{ .Values.driverName | quote }}]"#,
        r#"["resourceslices"] ["list", "create", "update", "delete"]"#,
        r#"["nodes"] ["get"]"#,
        r#"["events"] ["create"]"#,
    ];
    assert_eq!(want, rules);
}
