//! The chart's `healthPolicy` value: rendered into a ConfigMap the plugin reads with
//! `--health-policy` (the file parses to the policy the values describe), mounted and named
//! in the DaemonSet, a change rolls the pods, and bad values are refused by the schema.
//! Skipped with a notice when helm is absent; `.ci/run` installs it.

mod deploy_support;

use std::process::Command;

use deploy_support::{chart_dir, render_chart, tool};
use gpu_dra::hardware::health::FaultKind;
use gpu_dra::health::{HealthPolicy, HealthState, TaintEffect};
use serde_json::Value;

fn plugin_container(objects: &[Value]) -> &Value {
    let ds = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("DaemonSet");
    &ds["spec"]["template"]["spec"]["containers"][0]
}

fn env(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap_or("").to_string())
}

#[test]
fn a_health_policy_value_becomes_the_file_the_plugin_reads() {
    let Some(helm) = tool("helm", "the health-policy chart checks") else {
        return;
    };
    let plain = render_chart(&helm, &[]);
    assert!(
        !plain.iter().any(|o| o["kind"] == "ConfigMap"),
        "no policy, no ConfigMap"
    );
    assert_eq!(env(plugin_container(&plain), "GPU_DRA_HEALTH_POLICY"), None);

    let values = r#"healthPolicy={"effects":{"failed":"NoSchedule"},"holdDown":"10m","xid":{"degraded":[31]}}"#;
    let objects = render_chart(&helm, &["--set-json", values]);
    let cm = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "gpu-dra-health-policy")
        .expect("the policy ConfigMap");
    let text = cm["data"]["health-policy.yaml"].as_str().unwrap();
    let policy = HealthPolicy::parse(text).expect("the rendered policy parses");
    assert_eq!(policy.failed_effect, TaintEffect::NoSchedule);
    assert_eq!(policy.hold_down_seconds, 600);
    assert_eq!(
        policy.state_of(FaultKind::Xid { code: 31 }),
        HealthState::Degraded
    );

    let container = plugin_container(&objects);
    let path = env(container, "GPU_DRA_HEALTH_POLICY").expect("the env var");
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "health-policy")
        .expect("the mount");
    assert_eq!(
        format!(
            "{}/health-policy.yaml",
            mount["mountPath"].as_str().unwrap()
        ),
        path
    );
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let volume = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "health-policy")
        .expect("the volume");
    assert_eq!(volume["configMap"]["name"], "gpu-dra-health-policy");
    let checksum =
        ds["spec"]["template"]["metadata"]["annotations"]["gpu-dra.dev/health-policy-checksum"]
            .clone();
    assert!(checksum.is_string(), "a policy change rolls the pods");
    let other = render_chart(&helm, &["--set-json", r#"healthPolicy={"holdDown":"5m"}"#]);
    let ds2 = other.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    assert_ne!(
        ds2["spec"]["template"]["metadata"]["annotations"]["gpu-dra.dev/health-policy-checksum"],
        checksum
    );
}

#[test]
fn bad_health_policy_values_are_refused_by_the_schema() {
    let Some(helm) = tool("helm", "the health-policy chart checks") else {
        return;
    };
    let chart = chart_dir();
    for bad in [
        r#"healthPolicy={"effects":{"failed":"Evict"}}"#,
        r#"healthPolicy={"gpuLost":"broken"}"#,
        r#"healthPolicy={"holdDown":"5 minutes"}"#,
        r#"healthPolicy={"taintkey":"x"}"#,
    ] {
        let out = Command::new(&helm)
            .args([
                "template",
                "gpu-dra",
                chart.to_str().unwrap(),
                "--set-json",
                bad,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("healthPolicy"), "{bad}: {err}");
    }
}
