//! The GPU-as-a-service pieces of the chart: the Grafana dashboard queries only metrics the
//! plugin exports, ships identical in the chart as an optional ConfigMap, and the values for
//! per-profile DeviceClasses and per-namespace ResourceQuotas are checked by the schema and
//! render to the objects the API server's quota evaluator counts (rendering needs helm).

mod deploy_support;
mod telemetry_support;

use std::collections::BTreeSet;
use std::fs;

use deploy_support::{chart_dir, repo, run, tool, yaml_documents, yaml_file};
use serde_json::{Value, json};

/// Issue 14's per-device telemetry: the dashboard must have panels for all of it.
const DEVICE_TELEMETRY: [&str; 9] = [
    "gpu_dra_device_power_watts",
    "gpu_dra_device_power_limit_watts",
    "gpu_dra_device_sm_active_ratio",
    "gpu_dra_device_memory_used_bytes",
    "gpu_dra_device_memory_total_bytes",
    "gpu_dra_device_temperature_celsius",
    "gpu_dra_device_ecc_errors_total",
    "gpu_dra_device_xid_errors_total",
    "gpu_dra_device_retired_pages",
];

fn dashboard() -> Value {
    let text = fs::read_to_string(repo().join("deployments/grafana/gpu-dra.json")).unwrap();
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every PromQL expression of the dashboard: panel targets and templating queries.
fn expressions(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            out.push(query.to_string());
        }
    }
    out
}

/// The `gpu_dra_*` metric families an expression reads (histogram series map to their
/// family).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("gpu_dra_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &expr[start..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| f.ends_with("_seconds")))
            .unwrap_or(name);
        names.insert(family.to_string());
        i = end;
    }
    names
}

fn exported() -> BTreeSet<String> {
    gpu_dra::metrics::Metrics::new()
        .families()
        .iter()
        .map(|f| f.name.to_string())
        .collect()
}

#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let queried: BTreeSet<String> = expressions(&dashboard())
        .iter()
        .flat_map(|e| metric_names(e))
        .collect();
    let exported = exported();
    let missing: Vec<&String> = queried.iter().filter(|m| !exported.contains(*m)).collect();
    assert_eq!(missing, Vec::<&String>::new(), "queried but not exported");
    let unqueried: Vec<&str> = DEVICE_TELEMETRY
        .iter()
        .copied()
        .filter(|m| !queried.contains(*m))
        .collect();
    assert_eq!(
        unqueried,
        Vec::<&str>::new(),
        "issue 14's metrics need panels"
    );
}

/// Label names an expression matches on (`{name=...}`) or groups by (`by (a, b)`).
fn label_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = expr;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c);
        for matcher in rest[open + 1..close].split(',') {
            let name = ident(matcher);
            if !name.is_empty() {
                names.insert(name);
            }
        }
        rest = &rest[close..];
    }
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        let list = &rest[at + 4..];
        let close = list.find(')').unwrap_or(list.len());
        names.extend(
            list[..close]
                .split(',')
                .map(ident)
                .filter(|n| !n.is_empty()),
        );
        rest = &list[close..];
    }
    names
}

#[test]
fn the_device_panels_use_only_labels_the_plugin_exports() {
    let fams = gpu_dra::metrics::telemetry::families(&[telemetry_support::every_reading()]);
    for expr in expressions(&dashboard()) {
        let device_families: Vec<_> = fams
            .iter()
            .filter(|f| metric_names(&expr).contains(f.name))
            .collect();
        if device_families.is_empty() {
            continue;
        }
        // Prometheus adds `instance` (and `job`) to every series it scrapes.
        let mut known: BTreeSet<String> = ["instance", "job"].map(String::from).into();
        for family in &device_families {
            for sample in &family.samples {
                known.extend(sample.labels.iter().map(|(k, _)| k.to_string()));
            }
        }
        let unknown: Vec<String> = label_names(&expr)
            .into_iter()
            .filter(|l| !known.contains(l))
            .collect();
        assert_eq!(unknown, Vec::<String>::new(), "{expr}");
    }
}

#[test]
fn the_dashboard_has_the_panels_an_operator_asks_for() {
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().unwrap();
    let titles: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] != "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    for wanted in [
        "Power",
        "SM activity",
        "Memory used",
        "ECC errors (per interval)",
        "Devices held, by profile",
        "Prepare latency",
        "Errors by kind",
        "Unhealthy GPUs",
    ] {
        assert!(
            titles.contains(&wanted),
            "no panel {wanted:?} in {titles:?}"
        );
    }
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert!(
            panel["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "{}",
            panel["title"]
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}");
    }
    let by_holder = expressions(&dashboard)
        .into_iter()
        .filter(|e| e.contains("gpu_dra_device_power_watts{"))
        .all(|e| e.contains("namespace=~\"$namespace\"") && e.contains("pod=~\"$pod\""));
    assert!(by_holder, "device panels filter by namespace and pod");
}

#[test]
fn the_chart_ships_the_same_dashboard() {
    let canonical = fs::read(repo().join("deployments/grafana/gpu-dra.json")).unwrap();
    let in_chart = fs::read(chart_dir().join("files/grafana/gpu-dra.json")).unwrap();
    assert!(
        canonical == in_chart,
        "copy deployments/grafana/gpu-dra.json to deployments/helm/gpu-dra/files/grafana/"
    );
}

fn schema_errors(overrides: Value) -> Vec<String> {
    let text = fs::read_to_string(chart_dir().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut values = yaml_file(&chart_dir().join("values.yaml"));
    for (key, value) in overrides.as_object().unwrap() {
        match (values.get_mut(key), value) {
            (Some(Value::Object(base)), Value::Object(over)) => {
                for (k, v) in over {
                    base.insert(k.clone(), v.clone());
                }
            }
            _ => {
                values[key] = value.clone();
            }
        }
    }
    validator
        .iter_errors(&values)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn gpuaas_values() -> Value {
    json!({
        "deviceClasses": {"migProfiles": ["3g.40gb", "1g.10gb+me"]},
        "quotas": [{"namespace": "team-a", "devices": {"mig-3g40gb.nvidia.com": 2, "gpu.nvidia.com": 0}}],
        "grafanaDashboard": {"enabled": true, "namespace": "monitoring", "folder": "GPUs"}
    })
}

#[test]
fn the_schema_accepts_pools_quotas_and_the_dashboard_and_rejects_typos() {
    assert_eq!(schema_errors(gpuaas_values()), Vec::<String>::new());
    let bad = [
        json!({"deviceClasses": {"migProfiles": ["3g40gb"]}}),
        json!({"quotas": [{"namespace": "team-a", "devices": {"mig-3g40gb.nvidia.com": -1}}]}),
        json!({"quotas": [{"namespace": "team-a"}]}),
        json!({"quotas": [{"namespace": "team-a", "device": {"x": 1}}]}),
        json!({"grafanaDashboard": {"enable": true}}),
    ];
    for values in bad {
        assert!(!schema_errors(values.clone()).is_empty(), "{values}");
    }
}

#[test]
fn the_chart_renders_profile_classes_quotas_and_the_dashboard_configmap() {
    let Some(helm) = tool("helm", "rendering the GPUaaS values") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.json");
    fs::write(&values, gpuaas_values().to_string()).unwrap();
    let chart = chart_dir();
    let objects = yaml_documents(&run(
        &helm,
        &[
            "template",
            "gpu-dra",
            chart.to_str().unwrap(),
            "--namespace",
            "gpu-dra",
            "-f",
            values.to_str().unwrap(),
        ],
    ));
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let class = find("DeviceClass", "mig-3g40gb.nvidia.com");
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
    );
    find("DeviceClass", "mig-1g10gb-me.nvidia.com");
    let quota = find("ResourceQuota", "gpu-devices");
    assert_eq!(quota["metadata"]["namespace"], "team-a");
    assert_eq!(
        quota["spec"]["hard"],
        json!({"mig-3g40gb.nvidia.com.deviceclass.resource.k8s.io/devices": "2",
               "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "0"})
    );
    let config = find("ConfigMap", "gpu-dra-grafana-dashboard");
    assert_eq!(config["metadata"]["namespace"], "monitoring");
    assert_eq!(config["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(config["metadata"]["annotations"]["grafana_folder"], "GPUs");
    let shipped: Value =
        serde_json::from_str(config["data"]["gpu-dra.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, dashboard());
}
