//! The ComputeDomain controller's binding conditions (`--binding-conditions`, issue 33)
//! against the fake API server: the scheduler's side is played by the test (it creates
//! claims as the scheduler leaves them in PreBind), the IMEX daemons' by writing their
//! `ComputeDomainNode` objects.

mod cd_support;

use std::time::Duration;

use cd_support::*;
use gpu_dra::compute_domain::api;
use gpu_dra::compute_domain::controller::{self, ControllerConfig};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);
const SHARE_A: &str = "8c4f2b1e-0000-4000-8000-00000000000a";

fn config(binding: Option<Duration>) -> ControllerConfig {
    ControllerConfig {
        binding_conditions: binding.is_some(),
        binding_timeout: binding.unwrap_or(controller::binding::BINDING_TIMEOUT),
        ..controller_config("c1", false)
    }
}

struct Running {
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A server with nodes `node-a`, `node-b`, a domain `imex` (its UID returned) and a
/// controller with `binding` (the `--binding-timeout`, or off), once the domain's DaemonSet
/// exists.
async fn setup(dir: &std::path::Path, binding: Option<Duration>) -> (ObjServer, String, Running) {
    let server = ObjServer::start();
    for name in ["node-a", "node-b"] {
        server.create(NODES, node(name, None));
    }
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let client = server.client(dir).await;
    let stop = CancellationToken::new();
    tokio::spawn(controller::run_with_client(
        client,
        config(binding),
        stop.clone(),
    ));
    let ds_path = format!("{}/imex-{uid}", daemon_sets_path());
    eventually("the DaemonSet", WAIT, || server.get(&ds_path)).await;
    (server, uid, Running { stop })
}

fn label_of(server: &ObjServer, node: &str) -> Value {
    server.get(&format!("{NODES}/{node}")).unwrap()["metadata"]["labels"][api::NODE_LABEL].clone()
}

fn claim(server: &ObjServer, name: &str) -> Value {
    server
        .get(&format!("{}/{name}", claims_path(WORKLOAD_NS)))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_channel_labels_its_node_at_allocation_and_turns_ready_with_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (server, uid, _c) = setup(dir.path(), Some(Duration::from_secs(60))).await;
    // A GPU driver's entry for another device of the claim, which must survive our write.
    let gpu_entry = json!([{"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
                            "conditions": [{"type": "Healthy", "status": "True",
                                            "reason": "Ok", "message": "",
                                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]);
    server.create(
        &claims_path(WORKLOAD_NS),
        allocated_channel_claim("worker-0-imex", "node-a", &uid, SHARE_A, gpu_entry.clone()),
    );

    // The node is labelled while the pod still waits in PreBind: the DaemonSet starts the
    // daemon before the pod is bound.
    eventually("node-a labelled for the domain", WAIT, || {
        (label_of(&server, "node-a") == json!(uid)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        device_condition(
            &claim(&server, "worker-0-imex"),
            "node-a",
            "IMEXDaemonReady"
        ),
        None,
        "no condition before the daemon is Ready"
    );

    let stored = server.get(&domain_path(WORKLOAD_NS, "imex")).unwrap();
    server.create(
        &node_objects_path(),
        node_object(
            &stored,
            "node-a",
            "c.1",
            0,
            false,
            Some(("DaemonStarting", "starting")),
        ),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        device_condition(
            &claim(&server, "worker-0-imex"),
            "node-a",
            "IMEXDaemonReady"
        ),
        None,
        "a starting daemon is waited for"
    );
    let name = api::compute_domain_node_name(&uid, "node-a");
    server.patch(
        &format!("{}/{name}", node_objects_path()),
        json!({"status": {"status": "Ready", "reason": null, "message": null}}),
    );

    let got = eventually("IMEXDaemonReady on the claim", WAIT, || {
        let c = claim(&server, "worker-0-imex");
        device_condition(&c, "node-a", "IMEXDaemonReady").map(|r| (r, c))
    })
    .await;
    assert_eq!(got.0, ("True".to_string(), "DaemonReady".to_string()));
    let entries = got.1["status"]["devices"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[0], gpu_entry[0], "the other driver's entry is kept");
    assert_eq!(
        (
            &entries[1]["driver"],
            &entries[1]["pool"],
            &entries[1]["device"],
            &entries[1]["shareID"]
        ),
        (
            &json!("compute-domain.nvidia.com"),
            &json!("node-a"),
            &json!("channel-0"),
            &json!(SHARE_A)
        )
    );
    assert_eq!(device_condition(&got.1, "node-a", "IMEXDaemonFailed"), None);
    // The write was one JSON patch of the status subresource, testing the resourceVersion.
    let writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_write() && r.path.contains("/resourceclaims/"))
        .collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].path,
        format!("{}/worker-0-imex/status", claims_path(WORKLOAD_NS))
    );
    assert_eq!(writes[0].body.as_ref().unwrap()[0]["op"], "test");
    assert_eq!(
        writes[0].body.as_ref().unwrap()[0]["path"],
        "/metadata/resourceVersion"
    );

    // The claim turned Ready on the node: the label is the domain's now, and stays.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(label_of(&server, "node-a"), json!(uid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_never_ready_fails_the_channel_at_the_timeout_and_the_label_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (server, uid, _c) = setup(dir.path(), Some(Duration::from_secs(1))).await;
    server.create(
        &claims_path(WORKLOAD_NS),
        allocated_channel_claim("worker-1-imex", "node-b", &uid, SHARE_A, Value::Null),
    );
    eventually("node-b labelled for the domain", WAIT, || {
        (label_of(&server, "node-b") == json!(uid)).then_some(())
    })
    .await;
    // The daemon starts but never reaches quorum.
    let stored = server.get(&domain_path(WORKLOAD_NS, "imex")).unwrap();
    server.create(
        &node_objects_path(),
        node_object(
            &stored,
            "node-b",
            "c.1",
            0,
            false,
            Some(("WaitingForQuorum", "1 of 2")),
        ),
    );

    let failed = eventually("IMEXDaemonFailed on the claim", WAIT, || {
        device_condition(
            &claim(&server, "worker-1-imex"),
            "node-b",
            "IMEXDaemonFailed",
        )
    })
    .await;
    assert_eq!(
        failed,
        ("True".to_string(), "DaemonNotReadyInTime".to_string())
    );
    assert_eq!(
        device_condition(
            &claim(&server, "worker-1-imex"),
            "node-b",
            "IMEXDaemonReady"
        ),
        None
    );
    // No claim holds the node any more: its label goes (the DaemonSet stops the daemon).
    eventually("node-b's label removed", WAIT, || {
        label_of(&server, "node-b").is_null().then_some(())
    })
    .await;
    // The stopped daemon marks its object; the node left the domain, so the object goes.
    let name = api::compute_domain_node_name(&uid, "node-b");
    let path = format!("{}/{name}", node_objects_path());
    server.patch(
        &path,
        json!({"status": {"status": "NotReady", "reason": "DaemonStopped", "message": "SIGTERM"}}),
    );
    eventually("node-b's ComputeDomainNode deleted", WAIT, || {
        server.get(&path).is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_reporting_a_config_error_fails_the_channel_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (server, uid, _c) = setup(dir.path(), Some(Duration::from_secs(60))).await;
    let stored = server.get(&domain_path(WORKLOAD_NS, "imex")).unwrap();
    server.create(
        &node_objects_path(),
        node_object(
            &stored,
            "node-a",
            "c.1",
            0,
            false,
            Some(("ConfigError", "bad nodes config")),
        ),
    );
    server.create(
        &claims_path(WORKLOAD_NS),
        allocated_channel_claim("worker-2-imex", "node-a", &uid, SHARE_A, Value::Null),
    );
    let failed = eventually(
        "IMEXDaemonFailed on the claim",
        Duration::from_secs(10),
        || {
            device_condition(
                &claim(&server, "worker-2-imex"),
                "node-a",
                "IMEXDaemonFailed",
            )
        },
    )
    .await;
    assert_eq!(failed, ("True".to_string(), "DaemonFailed".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serving_another_domain_fails_the_channel_and_keeps_its_label() {
    let dir = tempfile::tempdir().unwrap();
    let (server, uid, _c) = setup(dir.path(), Some(Duration::from_secs(60))).await;
    let other = server.create(&domains_path(WORKLOAD_NS), domain("other", 0));
    let other_uid = other["metadata"]["uid"].as_str().unwrap().to_string();
    server.patch(
        &format!("{NODES}/node-a"),
        json!({"metadata": {"labels": {api::NODE_LABEL: other_uid}}}),
    );
    server.create(
        &claims_path(WORKLOAD_NS),
        allocated_channel_claim("worker-3-imex", "node-a", &uid, SHARE_A, Value::Null),
    );
    let failed = eventually("IMEXDaemonFailed on the claim", WAIT, || {
        device_condition(
            &claim(&server, "worker-3-imex"),
            "node-a",
            "IMEXDaemonFailed",
        )
    })
    .await;
    assert_eq!(
        failed,
        ("True".to_string(), "NodeInOtherComputeDomain".to_string())
    );
    assert_eq!(label_of(&server, "node-a"), json!(other_uid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_claims_are_not_watched_and_nothing_is_labelled_or_written() {
    let dir = tempfile::tempdir().unwrap();
    let (server, uid, _c) = setup(dir.path(), None).await;
    server.create(
        &claims_path(WORKLOAD_NS),
        allocated_channel_claim("worker-4-imex", "node-a", &uid, SHARE_A, Value::Null),
    );
    let stored = server.get(&domain_path(WORKLOAD_NS, "imex")).unwrap();
    server.create(
        &node_objects_path(),
        node_object(&stored, "node-a", "c.1", 0, true, None),
    );
    eventually("the domain Ready", WAIT, || {
        let d = server.get(&domain_path(WORKLOAD_NS, "imex"))?;
        (d["status"]["status"] == "Ready").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(label_of(&server, "node-a").is_null());
    assert_eq!(
        claim(&server, "worker-4-imex")["status"]["devices"],
        Value::Null
    );
    let touched: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("resourceclaims") || r.path.starts_with(NODES))
        .collect();
    assert_eq!(touched, vec![], "no request about claims or nodes");
}
