//! Who holds a claim's devices (the pods of `status.reservedFor`, for telemetry labels) is kept
//! beside the checkpoint in `holders.json`, never in it: the checkpoint stays in the format
//! released plugins decode (they refuse unknown fields, and a refused checkpoint would have
//! their recovery destroy running pods' MIG devices). The holders survive a restart, and a
//! corrupt holders file is moved aside without stopping the plugin.

mod plugin_support;

use std::net::SocketAddr;

use gpu_dra::k8s::ReservedPod;
use gpu_dra::kubelet::client::DraApi;
use k8s_openapi::api::resource::v1::ResourceClaim;
use plugin_support::claims::{self, claim_ref};
use plugin_support::probe;
use plugin_support::{Node, Plugin, eventually};
use serde_json::{Value, json};

const DEVICE: &str = "gpu-2";
const UID: &str = "uid-training";
const TELEMETRY: [(&str, &str); 1] = [("GPU_DRA_TELEMETRY_INTERVAL", "1")];

/// The `pod` labels of `device`'s memory series on /metrics, sorted.
fn pods_on_metrics(addr: SocketAddr, device: &str) -> Option<Vec<String>> {
    let (status, body) = probe::get(addr, "/metrics")?;
    if status != 200 {
        return None;
    }
    let mut pods: Vec<String> = body
        .lines()
        .filter_map(|line| line.strip_prefix("gpu_dra_device_memory_total_bytes{"))
        .filter(|labels| labels.contains(&format!("device=\"{device}\"")))
        .filter_map(|labels| {
            let rest = &labels[labels.find("pod=\"")? + 5..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect();
    pods.sort();
    Some(pods)
}

/// Every object key anywhere in `value`.
/// Registers as the kubelet, prepares the training claim and waits until its pod labels the
/// device on /metrics.
async fn prepare_until_labelled(plugin: &Plugin) {
    let addr = eventually("the metrics address", || probe::metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let prepared = kubelet
        .prepare(&[claim_ref("training", UID)])
        .await
        .unwrap();
    assert!(prepared[UID].is_ok(), "{prepared:?}");
    eventually("the pod on /metrics", || {
        (pods_on_metrics(addr, DEVICE)? == ["pod-training"]).then_some(())
    })
    .await;
}

fn keys(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                out.push(k.clone());
                keys(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

fn holders_file(node: &Node) -> Option<Value> {
    let bytes = std::fs::read(node.state_dir().join("holders.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn want_holders() -> Value {
    json!({"version": "v1", "claims": {UID: [
        {"name": "pod-training", "uid": format!("pod-uid-{UID}")}]}})
}

#[tokio::test]
async fn holders_stay_out_of_the_checkpoint_and_survive_a_restart_through_holders_json() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("training", UID, &[DEVICE]));
    let mut plugin = node.start_with(&TELEMETRY).await;
    prepare_until_labelled(&plugin).await;

    // (a) The checkpoint is in the released format: each claim record has exactly the
    // fields of the first `v1` release, and no `pods` anywhere.
    let bytes = std::fs::read(node.state_dir().join(gpu_dra::checkpoint::CHECKPOINT_FILE)).unwrap();
    let file: Value = serde_json::from_slice(&bytes).unwrap();
    let mut all_keys = Vec::new();
    keys(&file, &mut all_keys);
    assert!(!all_keys.iter().any(|k| k == "pods"), "{file:#}");
    let record = file["payload"]["claims"][UID].as_object().unwrap();
    let mut fields: Vec<&str> = record.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "devices",
            "name",
            "namespace",
            "phase",
            "uid",
            "updatedUnix"
        ]
    );
    let decoded = gpu_dra::checkpoint::decode(&bytes).unwrap();
    assert!(decoded.claims.contains_key(UID));

    // (b) The holders are in holders.json, written by the sampling task.
    let written = eventually("holders.json with the pod", || {
        holders_file(&node).filter(|h| *h == want_holders())
    })
    .await;
    assert_eq!(written, want_holders());

    // A crash, and the claim no longer names its pod in the API: after the restart only
    // holders.json can say who holds the device.
    plugin.kill().await;
    node.api.edit_claim(claims::NAMESPACE, "training", |claim| {
        claim["status"]["reservedFor"] = json!([]);
    });
    let plugin = node.start_with(&TELEMETRY).await;
    let addr = eventually("the metrics address", || probe::metrics_addr(&plugin.log())).await;
    eventually("the pod on /metrics after the restart", || {
        (pods_on_metrics(addr, DEVICE)? == ["pod-training"]).then_some(())
    })
    .await;

    // Unprepared: the claim leaves the checkpoint, then holders.json and /metrics.
    let mut kubelet = plugin.register(DraApi::V1).await;
    let unprepared = kubelet
        .unprepare(&[claim_ref("training", UID)])
        .await
        .unwrap();
    assert!(unprepared[UID].is_ok(), "{unprepared:?}");
    eventually("holders.json without the claim", || {
        let h = holders_file(&node)?;
        (h == json!({"version": "v1", "claims": {}})).then_some(())
    })
    .await;
    eventually("the free device on /metrics", || {
        (pods_on_metrics(addr, DEVICE)? == [""]).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_corrupt_holders_file_is_moved_aside_with_a_warning_and_the_plugin_runs() {
    let node = Node::new();
    std::fs::create_dir_all(node.state_dir()).unwrap();
    let path = node.state_dir().join("holders.json");
    std::fs::write(&path, b"{\"version\": \"v1\", \"claims\": [tor").unwrap();
    node.api
        .put_claim(claims::on_node("training", UID, &[DEVICE]));
    let plugin = node.start_with(&TELEMETRY).await;

    let log = plugin.log();
    let warning = log
        .lines()
        .find(|l| l.contains("holder pods file unreadable"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains(&path.display().to_string()), "{warning}");
    let aside = std::fs::read(node.state_dir().join("holders.json.bad")).unwrap();
    assert_eq!(aside, b"{\"version\": \"v1\", \"claims\": [tor");

    // The plugin prepares, labels and records holders as if it had started without a file.
    prepare_until_labelled(&plugin).await;
    eventually("a new holders.json", || {
        holders_file(&node).filter(|h| *h == want_holders())
    })
    .await;
}

#[test]
fn only_pods_of_reserved_for_are_holders() {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "team-a", "uid": "u"},
        "spec": {},
        "status": {"reservedFor": [
            {"resource": "pods", "name": "p1", "uid": "pu1"},
            {"apiGroup": "batch.example.com", "resource": "jobs", "name": "j", "uid": "ju"},
            {"apiGroup": "", "resource": "pods", "name": "p2", "uid": "pu2"}
        ]}
    }))
    .unwrap();
    let got = gpu_dra::k8s::claims::reserved_pods(&claim);
    let want = vec![
        ReservedPod {
            name: "p1".into(),
            uid: "pu1".into(),
        },
        ReservedPod {
            name: "p2".into(),
            uid: "pu2".into(),
        },
    ];
    assert_eq!(got, want);
}
