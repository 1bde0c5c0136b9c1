//! The real plugin binary writes a prepared claim's `status.devices` (KEP-4817) through the
//! fake API server's status subresource: one `Ready` entry per device with its UUIDs, other
//! drivers' entries left alone, a failing endpoint retried without failing the prepare,
//! `Ready=False` while the GPU is unhealthy, entries removed on unprepare and restored after
//! a restart. Runs on both backends (`GPU_DRA_TEST_GPU_BACKEND=nvml`).

mod plugin_support;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::apiserver::Fault;
use plugin_support::claims::{self, DRIVER, NAMESPACE, NODE, claim_ref};
use plugin_support::{Node, eventually, probe};
use serde_json::{Value, json};

const OTHER_DRIVER: &str = "nic.example.com";

/// A claim of `devices` on this node plus a NIC of another driver, whose entry that driver
/// already wrote.
fn claim_with_a_nic(name: &str, uid: &str, devices: &[&str]) -> Value {
    let mut results: Vec<(&str, &str, &str)> = devices.iter().map(|d| (DRIVER, NODE, *d)).collect();
    results.push((OTHER_DRIVER, NODE, "eth1"));
    let mut claim = claims::allocated(name, uid, &results);
    claim["status"]["devices"] = json!([nic_entry()]);
    claim
}

fn nic_entry() -> Value {
    json!({"driver": OTHER_DRIVER, "pool": NODE, "device": "eth1",
           "conditions": [{"type": "Ready", "status": "True", "reason": "Up",
                           "lastTransitionTime": "2026-07-01T00:00:00Z", "message": ""}],
           "networkData": {"interfaceName": "eth1", "ips": ["10.0.0.7/24"]}})
}

/// The claim's `status.devices` as stored.
fn entries(node: &Node, name: &str) -> Vec<Value> {
    let claim = node.api.claim(NAMESPACE, name).expect("the claim");
    claim["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn ours(node: &Node, name: &str) -> Vec<Value> {
    entries(node, name)
        .into_iter()
        .filter(|e| e["driver"] == json!(DRIVER))
        .collect()
}

/// `(device, Ready status, reason)` of this driver's entries.
fn readiness(node: &Node, name: &str) -> Vec<(String, String, String)> {
    ours(node, name)
        .iter()
        .map(|e| {
            let ready = &e["conditions"][0];
            assert_eq!(json!("Ready"), ready["type"], "{e}");
            (
                e["device"].as_str().unwrap_or_default().to_string(),
                ready["status"].as_str().unwrap_or_default().to_string(),
                ready["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn ready(device: &str, status: &str, reason: &str) -> Vec<(String, String, String)> {
    vec![(device.into(), status.into(), reason.into())]
}

/// The `uuid` attribute of a published device.
fn published_uuid(node: &Node, device: &str) -> String {
    node.api
        .slices()
        .values()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == json!(device))
        .and_then(|d| {
            d["attributes"]["uuid"]["string"]
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("{device} is not published with a uuid"))
}

fn status_puts(node: &Node, name: &str) -> usize {
    let path = format!("/resourceclaims/{name}/status");
    node.api
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with(&path))
        .count()
}

#[tokio::test]
async fn a_prepared_claim_shows_its_gpu_and_mig_uuids_and_unprepare_removes_only_its_entries() {
    let node = Node::new();
    let mig = "gpu-0-mig-3g40gb-4";
    node.api
        .put_claim(claim_with_a_nic("train", "uid-train", &["gpu-2", mig]));
    // Every profile on every GPU: the default `split` gives GPU 0 no 3g.40gb.
    let plugin = node.start_with(&[("GPU_DRA_MIG_PROFILES", "all")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("slices", || node.api.complete_pool()).await;

    let got = kubelet
        .prepare(&[claim_ref("train", "uid-train")])
        .await
        .unwrap();
    assert!(got["uid-train"].is_ok(), "{got:?}");
    let shown = eventually("both entries", || {
        let ours = ours(&node, "train");
        (ours.len() == 2).then_some(ours)
    })
    .await;

    let mig_uuid = node
        .snapshot()
        .hardware_mig_uuids()
        .pop()
        .expect("the carved MIG device");
    let data: Vec<(Value, Value)> = shown
        .iter()
        .map(|e| (e["device"].clone(), e["data"].clone()))
        .collect();
    let want = vec![
        (
            json!("gpu-2"),
            json!({"type": "gpu", "uuid": published_uuid(&node, "gpu-2")}),
        ),
        (
            json!(mig),
            json!({"type": "mig", "uuid": mig_uuid, "parentUUID": published_uuid(&node, "gpu-0"),
                   "profile": "3g.40gb", "placement": {"start": 4, "size": 4}}),
        ),
    ];
    assert_eq!(want, data, "{}", plugin.log());
    for e in &shown {
        let ready = &e["conditions"][0];
        assert_eq!(
            (json!(NODE), json!("True"), json!("Prepared")),
            (
                e["pool"].clone(),
                ready["status"].clone(),
                ready["reason"].clone()
            ),
            "{e}"
        );
        assert!(
            ready["lastTransitionTime"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z')),
            "{e}"
        );
    }
    assert_eq!(
        nic_entry(),
        entries(&node, "train")[0],
        "the other driver's entry is kept as it was"
    );

    let got = kubelet
        .unprepare(&[claim_ref("train", "uid-train")])
        .await
        .unwrap();
    assert_eq!(Ok(()), got["uid-train"]);
    let left = eventually("this driver's entries removed", || {
        let all = entries(&node, "train");
        (all.len() == 1).then_some(all)
    })
    .await;
    assert_eq!(vec![nic_entry()], left);
}

#[tokio::test]
async fn a_failing_status_endpoint_does_not_fail_the_prepare_and_is_retried_until_it_succeeds() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("infer", "uid-infer", &["gpu-5"]));
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("slices", || node.api.complete_pool()).await;
    node.api.inject(
        Some("PUT"),
        "/resourceclaims/infer/status",
        Fault::Status {
            code: 503,
            reason: "ServiceUnavailable",
            retry_after: None,
        },
        Some(3),
    );

    let got = kubelet
        .prepare(&[claim_ref("infer", "uid-infer")])
        .await
        .unwrap();
    assert!(got["uid-infer"].is_ok(), "the prepare succeeds: {got:?}");
    eventually("the entry, after the failures", || {
        (readiness(&node, "infer") == ready("gpu-5", "True", "Prepared")).then_some(())
    })
    .await;
    assert_eq!(
        4,
        status_puts(&node, "infer"),
        "three 503s, then the write that went through\n{}",
        plugin.log()
    );
    let log = plugin.log();
    assert_eq!(
        3,
        log.matches("writing status.devices failed; will retry")
            .count(),
        "{log}"
    );
    let addr = probe::metrics_addr(&log).expect("the metrics address in the log");
    let (_, metrics) = probe::get(addr, "/metrics").expect("/metrics");
    let writes: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("gpu_dra_claim_status_writes_total{"))
        .collect();
    assert_eq!(
        vec![
            r#"gpu_dra_claim_status_writes_total{result="success"} 1"#,
            r#"gpu_dra_claim_status_writes_total{result="error"} 3"#,
        ],
        writes
    );
}

#[tokio::test]
async fn an_unhealthy_gpu_turns_its_entry_not_ready_and_a_recovery_ready_again() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("sick", "uid-sick", &["gpu-3"]));
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("slices", || node.api.complete_pool()).await;
    let got = kubelet
        .prepare(&[claim_ref("sick", "uid-sick")])
        .await
        .unwrap();
    assert!(got["uid-sick"].is_ok(), "{got:?}");
    eventually("Ready=True", || {
        (readiness(&node, "sick") == ready("gpu-3", "True", "Prepared")).then_some(())
    })
    .await;

    node.sim_fault(&["lost", "--gpu", "3"]);
    let entry = eventually("Ready=False", || {
        let ours = ours(&node, "sick");
        (readiness(&node, "sick") == ready("gpu-3", "False", "Unhealthy")).then(|| ours[0].clone())
    })
    .await;
    // The message is the health report's (its wording belongs to the health policy); it
    // names the GPU.
    let message = entry["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains(&published_uuid(&node, "gpu-3")),
        "the health message names the GPU: {entry}\n{}",
        plugin.log()
    );

    node.sim_fault(&["recover", "--gpu", "3"]);
    eventually("Ready=True again", || {
        (readiness(&node, "sick") == ready("gpu-3", "True", "Prepared")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn after_a_restart_a_prepared_claim_gets_its_lost_entry_back() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("long", "uid-long", &["gpu-6"]));
    let mut plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("long", "uid-long")])
        .await
        .unwrap();
    assert!(got["uid-long"].is_ok(), "{got:?}");
    eventually("the entry", || {
        (readiness(&node, "long") == ready("gpu-6", "True", "Prepared")).then_some(())
    })
    .await;
    plugin.kill().await;
    drop(kubelet);

    // Lost while the plugin was down (e.g. a restore from backup): the next start repairs it.
    node.api.edit_claim(NAMESPACE, "long", |c| {
        c["status"].as_object_mut().unwrap().remove("devices");
    });
    let plugin = node.start().await;
    eventually("the entry restored", || {
        (readiness(&node, "long") == ready("gpu-6", "True", "Prepared")).then_some(())
    })
    .await;
    drop(plugin);
}

#[tokio::test]
async fn a_consumable_capacity_share_gets_its_own_entry_with_its_mps_client_limits() {
    let node = Node::new();
    let claim = plugin_support::sharing::as_share(
        claims::on_node("slice", "uid-slice", &["gpu-4"]),
        0,
        "aaaa1111",
        json!({"memory": "20Gi", "multiprocessors": "33"}),
    );
    node.api.put_claim(claim);
    let plugin = node.start_with(&[("GPU_DRA_SHARED_GPUS", "4")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("slice", "uid-slice")])
        .await
        .unwrap();
    assert!(got["uid-slice"].is_ok(), "{got:?}\n{}", plugin.log());
    let entry = eventually("the share's entry", || ours(&node, "slice").pop()).await;
    let sharing = &entry["data"]["sharing"];
    assert_eq!(
        (json!("aaaa1111"), json!("gpu"), json!("MPS"), json!(true)),
        (
            entry["shareID"].clone(),
            entry["data"]["type"].clone(),
            sharing["strategy"].clone(),
            sharing["perShare"].clone()
        ),
        "{entry}"
    );
    let threads = sharing["activeThreadPercentage"].as_u64().unwrap_or(0);
    assert!((1..=100).contains(&threads), "{entry}");
    let got = kubelet
        .unprepare(&[claim_ref("slice", "uid-slice")])
        .await
        .unwrap();
    assert_eq!(Ok(()), got["uid-slice"]);
    eventually("the entry removed", || {
        ours(&node, "slice").is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_refused_write_is_logged_once_and_not_retried_in_a_loop() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("denied", "uid-denied", &["gpu-1"]));
    // What the API server answers a plugin without the resourceclaims/driver permission.
    node.api.inject(
        Some("PUT"),
        "/resourceclaims/denied/status",
        Fault::Status {
            code: 422,
            reason: "Invalid",
            retry_after: None,
        },
        None,
    );
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("denied", "uid-denied")])
        .await
        .unwrap();
    assert!(got["uid-denied"].is_ok(), "the prepare succeeds: {got:?}");
    eventually("the refusal logged", || {
        plugin
            .log()
            .contains("writing status.devices failed; not retrying")
            .then_some(())
    })
    .await;
    // Several backoff periods (the first retry would come after at most 0.5 s).
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(1, status_puts(&node, "denied"), "{}", plugin.log());
    assert!(ours(&node, "denied").is_empty());
}
