//! `gpu-dra compute-domain-controller` against a fake API server at the HTTP layer (real
//! kube client, watches, status subresource, finalizers, optimistic concurrency): create,
//! status aggregation over 64 nodes, a daemon's error, delete, spec errors, and leader
//! election between two controllers.

mod cd_support;

use std::time::Duration;

use cd_support::*;
use gpu_dra::compute_domain::api;
use gpu_dra::compute_domain::controller::{self, ControllerConfig};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), controller::ControllerError>>,
}

async fn start(server: &ObjServer, dir: &std::path::Path, identity: &str, elect: bool) -> Running {
    start_with(server, dir, controller_config(identity, elect)).await
}

async fn start_with(
    server: &ObjServer,
    dir: &std::path::Path,
    config: ControllerConfig,
) -> Running {
    let client = server.client(dir).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(controller::run_with_client(client, config, stop.clone()));
    Running { stop, task }
}

fn stored_domain(server: &ObjServer, name: &str) -> Option<Value> {
    server.get(&domain_path(WORKLOAD_NS, name))
}

async fn wait_status(server: &ObjServer, name: &str, want: impl Fn(&Value) -> bool) -> Value {
    eventually("the domain's status", WAIT, || {
        stored_domain(server, name).filter(|d| want(&d["status"]))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_domain_gets_a_finalizer_both_templates_and_the_daemon_set() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 2));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let _c = start(&server, dir.path(), "c1", false).await;

    let ds_path = format!("{}/imex-{uid}", daemon_sets_path());
    let ds = eventually("the DaemonSet", WAIT, || server.get(&ds_path)).await;
    let domain = stored_domain(&server, "imex").unwrap();
    assert_eq!(domain["metadata"]["finalizers"], json!([api::FINALIZER]));

    let workload = server
        .get(&format!("{}/imex-channel", templates_path(WORKLOAD_NS)))
        .expect("the workload template");
    assert_eq!(
        workload["metadata"]["ownerReferences"],
        json!([{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                "name": "imex", "uid": uid, "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(
        workload["spec"]["spec"]["devices"],
        json!({"requests": [{"name": "channel", "exactly": {
                   "deviceClassName": "compute-domain-default-channel.nvidia.com"}}],
               "config": [{"requests": ["channel"], "opaque": {
                   "driver": "compute-domain.nvidia.com",
                   "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
                                  "kind": "ComputeDomainChannelConfig",
                                  "domainID": uid, "allocationMode": "Single"}}}]})
    );

    let daemon = server
        .get(&format!("{}/imex-{uid}", templates_path(DRIVER_NS)))
        .expect("the daemon template");
    assert_eq!(
        (
            &daemon["metadata"]["labels"],
            &daemon["metadata"]["ownerReferences"],
            &daemon["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
            &daemon["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"],
        ),
        (
            &json!({api::DOMAIN_UID_LABEL: uid}),
            &Value::Null,
            &json!("compute-domain-daemon.nvidia.com"),
            &json!({"apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "ComputeDomainDaemonConfig", "domainID": uid}),
        )
    );

    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        (
            &pod["nodeSelector"],
            &pod["resourceClaims"],
            &pod["containers"][0]["image"],
            &pod["containers"][0]["args"],
            &pod["containers"][0]["resources"]["claims"],
        ),
        (
            &json!({"resource.nvidia.com/computeDomain": uid}),
            &json!([{"name": "daemon", "resourceClaimTemplateName": format!("imex-{uid}")}]),
            &json!("registry.example/gpu-dra:0.1.0"),
            &json!(["imex-daemon"]),
            &json!([{"name": "daemon"}]),
        )
    );
    let status = wait_status(&server, "imex", |s| !s.is_null()).await["status"].clone();
    assert_eq!(
        (&status["status"], &status["reason"], &status["nodes"]),
        (&json!("NotReady"), &json!("WaitingForNodes"), &json!([]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_ready_nodes_make_the_domain_ready_with_every_node_sorted() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("big", 64));
    let _c = start(&server, dir.path(), "c1", false).await;
    // Created in reverse order, half not ready at first.
    for i in (0..64u32).rev() {
        let object = node_object(
            &created,
            &format!("node-{i:02}"),
            "cluster.1",
            i,
            i % 2 == 0,
            None,
        );
        server.create(&node_objects_path(), object);
    }
    let waiting = wait_status(&server, "big", |s| {
        s["nodes"].as_array().is_some_and(|n| n.len() == 64)
    })
    .await;
    assert_eq!(waiting["status"]["status"], json!("NotReady"));
    for i in (1..64u32).step_by(2) {
        let uid = created["metadata"]["uid"].as_str().unwrap();
        let name = api::compute_domain_node_name(uid, &format!("node-{i:02}"));
        let (code, _) = server.patch(
            &format!("{}/{name}", node_objects_path()),
            json!({"status": {"status": "Ready"}}),
        );
        assert_eq!(code, 200);
    }
    let ready = wait_status(&server, "big", |s| s["status"] == "Ready").await;
    let got: Vec<(String, u64, String)> = ready["status"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["index"].as_u64().unwrap(),
                n["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, u64, String)> = (0..64u64)
        .map(|i| (format!("node-{i:02}"), i, "Ready".to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(ready["status"].get("reason"), None);
    // One writer, merge patches of the status subresource: no write ever conflicted.
    let conflicts: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.code == 409)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(conflicts, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_error_makes_the_domain_not_ready_with_the_daemons_reason() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let _c = start(&server, dir.path(), "c1", false).await;
    server.create(
        &node_objects_path(),
        node_object(&created, "node-a", "cluster.1", 0, true, None),
    );
    wait_status(&server, "imex", |s| s["status"] == "Ready").await;
    server.create(
        &node_objects_path(),
        node_object(
            &created,
            "node-b",
            "cluster.1",
            1,
            false,
            Some((
                "DaemonStartFailed",
                "nvidia-imex: bind 0.0.0.0:50000: address in use",
            )),
        ),
    );
    let failed = wait_status(&server, "imex", |s| s["status"] == "NotReady").await;
    assert_eq!(
        (&failed["status"]["reason"], &failed["status"]["message"]),
        (
            &json!("DaemonStartFailed"),
            &json!("node node-b: nvidia-imex: bind 0.0.0.0:50000: address in use")
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_domain_removes_its_objects_node_objects_and_labels_then_the_finalizer() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let other = server.create(&domains_path(WORKLOAD_NS), domain("other", 0));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let other_uid = other["metadata"]["uid"].as_str().unwrap().to_string();
    for (n, owner) in [("node-a", &uid), ("node-b", &uid), ("node-c", &other_uid)] {
        server.create(NODES, node(n, Some(owner)));
    }
    server.create(NODES, node("node-d", None));
    for (i, n) in ["node-a", "node-b"].into_iter().enumerate() {
        server.create(
            &node_objects_path(),
            node_object(&created, n, "c.1", i as u32, true, None),
        );
    }
    server.create(
        &node_objects_path(),
        node_object(&other, "node-c", "c.1", 0, true, None),
    );
    let _c = start(&server, dir.path(), "c1", false).await;
    wait_status(&server, "imex", |s| s["status"] == "Ready").await;
    wait_status(&server, "other", |s| s["status"] == "Ready").await;

    assert_eq!(server.delete(&domain_path(WORKLOAD_NS, "imex")), 200);
    eventually("the domain to be gone", WAIT, || {
        stored_domain(&server, "imex").is_none().then_some(())
    })
    .await;
    let left = (
        server.get(&format!("{}/imex-channel", templates_path(WORKLOAD_NS))),
        server.get(&format!("{}/imex-{uid}", templates_path(DRIVER_NS))),
        server.get(&format!("{}/imex-{uid}", daemon_sets_path())),
        server.list(
            &node_objects_path(),
            &format!("{}={uid}", api::DOMAIN_UID_LABEL),
        ),
        server.list(NODES, &format!("{}={uid}", api::NODE_LABEL)),
    );
    assert_eq!(left, (None, None, None, vec![], vec![]));
    // The other domain keeps everything.
    let labelled: Vec<Value> = server
        .list(NODES, api::NODE_LABEL)
        .iter()
        .map(|n| n["metadata"]["name"].clone())
        .collect();
    assert_eq!(labelled, vec![json!("node-c")]);
    assert_eq!(server.list(&node_objects_path(), "").len(), 1);
    assert!(
        server
            .get(&format!("{}/imex-{other_uid}", daemon_sets_path()))
            .is_some()
    );
    assert!(stored_domain(&server, "other").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_without_a_channel_is_not_ready_with_invalid_spec_and_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let mut object = domain("bad", 0);
    object["spec"] = json!({"numNodes": 0});
    server.create(&domains_path(WORKLOAD_NS), object);
    let _c = start(&server, dir.path(), "c1", false).await;
    let bad = wait_status(&server, "bad", |s| !s.is_null()).await;
    assert_eq!(
        (&bad["status"]["status"], &bad["status"]["reason"]),
        (&json!("NotReady"), &json!("InvalidSpec"))
    );
    assert!(
        bad["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.channel.resourceClaimTemplate.name"),
        "{}",
        bad["status"]["message"]
    );
    let events = eventually("the Event", WAIT, || {
        let e = server.list(&format!("/api/v1/namespaces/{WORKLOAD_NS}/events"), "");
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(
        (
            events.len(),
            &events[0]["reason"],
            &events[0]["type"],
            &events[0]["involvedObject"]["kind"],
            &events[0]["involvedObject"]["name"],
        ),
        (
            1,
            &json!("InvalidSpec"),
            &json!("Warning"),
            &json!("ComputeDomain"),
            &json!("bad")
        )
    );
    assert_eq!(server.list(&daemon_sets_path(), "").len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_name_taken_by_a_foreign_template_is_a_template_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    server.create(
        &templates_path(WORKLOAD_NS),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": "imex-channel"}, "spec": {"spec": {}}}),
    );
    server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let _c = start(&server, dir.path(), "c1", false).await;
    let got = wait_status(&server, "imex", |s| !s.is_null()).await;
    assert_eq!(got["status"]["reason"], json!("TemplateConflict"));
    let message = got["status"]["message"].as_str().unwrap();
    assert!(message.contains("team-a/imex-channel exists"), "{message}");
    let foreign = server
        .get(&format!("{}/imex-channel", templates_path(WORKLOAD_NS)))
        .unwrap();
    assert_eq!(foreign["metadata"]["labels"], Value::Null, "left untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_is_written_only_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let _c = start(&server, dir.path(), "c1", false).await;
    let node = node_object(&created, "node-a", "c.1", 0, true, None);
    server.create(&node_objects_path(), node.clone());
    wait_status(&server, "imex", |s| s["status"] == "Ready").await;
    let status_writes = |server: &ObjServer| {
        server
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
            .count()
    };
    let before = status_writes(&server);
    // A daemon re-writing the same status, and a label nobody reads: events, no change.
    let path = format!(
        "{}/{}",
        node_objects_path(),
        node["metadata"]["name"].as_str().unwrap()
    );
    for i in 0..5 {
        server.patch(
            &path,
            json!({"metadata": {"annotations": {"touched": i.to_string()}}}),
        );
    }
    server.patch(
        &domain_path(WORKLOAD_NS, "imex"),
        json!({"metadata": {"labels": {"a": "b"}}}),
    );
    // The controller has seen the last change once the domain's label is back in a watch
    // event; give it the time a reconcile takes, then count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_writes(&server), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_elect_one_leader_and_the_other_takes_over_when_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let first = start(&server, dir.path(), "controller-a", true).await;
    let lease_path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{DRIVER_NS}/leases/{}",
        controller::LEASE_NAME
    );
    eventually("a leader", WAIT, || {
        server
            .get(&lease_path)
            .filter(|l| l["spec"]["holderIdentity"] == "controller-a")
    })
    .await;
    let second = start(&server, dir.path(), "controller-b", true).await;
    server.create(&domains_path(WORKLOAD_NS), domain("one", 0));
    wait_status(&server, "one", |s| !s.is_null()).await;
    // Only the leader wrote: every write but the lease's is controller-a's work, and b
    // has not touched the lease (it only reads it while a renews).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let lease = server.get(&lease_path).unwrap();
    assert_eq!(
        (
            &lease["spec"]["holderIdentity"],
            &lease["spec"]["leaseTransitions"]
        ),
        (&json!("controller-a"), &json!(0))
    );
    let daemon_sets = server
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/daemonsets"))
        .count();
    assert_eq!(daemon_sets, 1, "only the leader creates");

    // The leader dies without giving the lease up (its task is dropped).
    first.task.abort();
    let _ = first.task.await;
    let died = std::time::Instant::now();
    let lease = eventually("a takeover", WAIT, || {
        server
            .get(&lease_path)
            .filter(|l| l["spec"]["holderIdentity"] == "controller-b")
    })
    .await;
    assert!(
        died.elapsed() >= Duration::from_millis(1500),
        "not before the lease expired"
    );
    assert_eq!(lease["spec"]["leaseTransitions"], json!(1));
    // The new leader acts: a new domain gets its objects.
    server.create(&domains_path(WORKLOAD_NS), domain("two", 0));
    wait_status(&server, "two", |s| !s.is_null()).await;
    // Stopping the leader gives the lease up at once.
    second.stop.cancel();
    assert!(second.task.await.unwrap().is_ok());
    let lease = server.get(&lease_path).unwrap();
    assert_eq!(lease["spec"].get("holderIdentity"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_deleted_by_hand_is_re_created_at_the_next_resync() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let mut config = controller_config("c1", false);
    config.resync_period = Duration::from_millis(300);
    let _c = start_with(&server, dir.path(), config).await;
    let ds_path = format!("{}/imex-{uid}", daemon_sets_path());
    eventually("the DaemonSet", WAIT, || server.get(&ds_path)).await;
    assert_eq!(server.delete(&ds_path), 200);
    let again = eventually("the DaemonSet again", WAIT, || server.get(&ds_path)).await;
    assert_eq!(
        again["spec"]["template"]["spec"]["nodeSelector"],
        json!({"resource.nvidia.com/computeDomain": uid})
    );
}

/// An upgrade of the driver restarts the controller with a new image: the daemons of domains
/// that already run must get it too, and a restart with the same image must not touch them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_brings_the_daemon_set_to_its_image_and_leaves_an_up_to_date_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let ds_path = format!("{}/imex-{uid}", daemon_sets_path());
    let image = |ds: &Value| ds["spec"]["template"]["spec"]["containers"][0]["image"].clone();

    let old = start(&server, dir.path(), "c1", false).await;
    let ds = eventually("the DaemonSet", WAIT, || server.get(&ds_path)).await;
    assert_eq!(image(&ds), json!("registry.example/gpu-dra:0.1.0"));
    old.stop.cancel();
    let _ = old.task.await;

    // The same version again: it reads the DaemonSet and leaves it as it is.
    let seen = server.requests().len();
    let same = start(&server, dir.path(), "c2", false).await;
    eventually(
        "the restarted controller to read the DaemonSet",
        WAIT,
        || {
            server.requests()[seen..]
                .iter()
                .any(|r| r.method == "GET" && r.path == ds_path)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let puts: Vec<_> = server.requests()[seen..]
        .iter()
        .filter(|r| r.method == "PUT" && r.path == ds_path)
        .cloned()
        .collect();
    assert!(
        puts.is_empty(),
        "an up-to-date DaemonSet was rewritten: {puts:?}"
    );
    same.stop.cancel();
    let _ = same.task.await;

    // A new version: the template gets its image; the selector (immutable) stays.
    let mut upgraded = controller_config("c3", false);
    upgraded.settings.image = "registry.example/gpu-dra:0.2.0".into();
    let _new = start_with(&server, dir.path(), upgraded).await;
    let ds = eventually("the DaemonSet on the new image", WAIT, || {
        server
            .get(&ds_path)
            .filter(|d| image(d) == json!("registry.example/gpu-dra:0.2.0"))
    })
    .await;
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        json!({api::DOMAIN_UID_LABEL: uid})
    );
    assert_eq!(
        ds["spec"]["template"]["spec"]["nodeSelector"],
        json!({"resource.nvidia.com/computeDomain": uid})
    );
}

/// A real API server answers a write before its watch event reaches the controller, so the
/// controller's copy of a new domain can already be older than the domain: a label another
/// tool sets right after `kubectl apply` must not make the finalizer write fail. (A merge patch
/// carrying the copy's resourceVersion did: 409, a warning and a retry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_racing_the_finalizer_on_a_new_domain_does_not_fail_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    server.set_watch_latency(Duration::from_millis(50));
    let _c = start(&server, dir.path(), "c1", false).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let (code, _) = server.patch(
        &domain_path(WORKLOAD_NS, "imex"),
        json!({"metadata": {"labels": {"team": "a"}}}),
    );
    assert_eq!(code, 200);
    let got = wait_status(&server, "imex", |s| !s.is_null()).await;
    assert_eq!(
        (&got["metadata"]["finalizers"], &got["metadata"]["labels"]),
        (&json!([api::FINALIZER]), &json!({"team": "a"}))
    );
    let refused: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.code >= 400)
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.code))
        .collect();
    assert_eq!(refused, Vec::<String>::new());
}

/// Removing the finalizer tests that it is still where it was read, so a finalizer another
/// party holds (the garbage collector's `foregroundDeletion`) is never dropped with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_finalizer_keeps_the_finalizers_of_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let _c = start(&server, dir.path(), "c1", false).await;
    let path = domain_path(WORKLOAD_NS, "imex");
    eventually("the finalizer", WAIT, || {
        server
            .get(&path)
            .filter(|d| d["metadata"]["finalizers"] == json!([api::FINALIZER]))
    })
    .await;
    let (code, _) = server.patch(
        &path,
        json!({"metadata": {"finalizers": ["example.com/keep", api::FINALIZER]}}),
    );
    assert_eq!(code, 200);
    assert_eq!(server.delete(&path), 200);
    let kept = eventually("our finalizer removed", WAIT, || {
        server
            .get(&path)
            .filter(|d| d["metadata"]["finalizers"] == json!(["example.com/keep"]))
    })
    .await;
    assert_eq!(kept["metadata"]["uid"], created["metadata"]["uid"]);
}

/// What a writer that raced a finished clean-up left (a node labelled by a channel prepared
/// as its domain went, a node object of an older daemon) is swept at the next resync; what a
/// live domain owns is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_a_domain_that_no_longer_exists_are_swept_at_the_resync() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let live = server.create(&domains_path(WORKLOAD_NS), domain("live", 0));
    let live_uid = live["metadata"]["uid"].as_str().unwrap().to_string();
    let mut gone = live.clone();
    gone["metadata"]["uid"] = json!("0dead000-0000-4000-8000-000000000000");
    gone["metadata"]["name"] = json!("gone");
    server.create(NODES, node("node-live", Some(&live_uid)));
    server.create(
        NODES,
        node("node-stale", Some("0dead000-0000-4000-8000-000000000000")),
    );
    server.create(NODES, node("node-free", None));
    server.create(
        &node_objects_path(),
        node_object(&live, "node-live", "c.1", 0, true, None),
    );
    server.create(
        &node_objects_path(),
        node_object(
            &gone,
            "node-stale",
            "c.1",
            0,
            false,
            Some(("DaemonStopped", "x")),
        ),
    );
    let mut config = controller_config("c1", false);
    config.resync_period = Duration::from_millis(300);
    let _c = start_with(&server, dir.path(), config).await;
    eventually("the stale label and node object swept", WAIT, || {
        let labelled: Vec<Value> = server
            .list(NODES, api::NODE_LABEL)
            .iter()
            .map(|n| n["metadata"]["name"].clone())
            .collect();
        let objects: Vec<Value> = server
            .list(&node_objects_path(), "")
            .iter()
            .map(|o| o["spec"]["nodeName"].clone())
            .collect();
        (labelled == vec![json!("node-live")] && objects == vec![json!("node-live")]).then_some(())
    })
    .await;
    wait_status(&server, "live", |s| s["status"] == "Ready").await;
}

/// An IMEX daemon of an older version re-creates its object while the domain is deleted: the
/// clean-up, which waits for the DaemonSet's pods to be gone, deletes it again before it lets
/// the domain go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_object_recreated_while_the_daemons_stop_is_deleted_before_the_domain_goes() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    server.hold_foreground_deletions();
    server.set_watch_latency(Duration::from_millis(30));
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let _c = start(&server, dir.path(), "c1", false).await;
    let ds_path = format!("{}/imex-{uid}", daemon_sets_path());
    eventually("the DaemonSet", WAIT, || server.get(&ds_path)).await;
    let object = node_object(&created, "node-a", "c.1", 0, true, None);
    server.create(&node_objects_path(), object.clone());
    wait_status(&server, "imex", |s| s["status"] == "Ready").await;

    let path = domain_path(WORKLOAD_NS, "imex");
    assert_eq!(server.delete(&path), 200);
    let selector = format!("{}={uid}", api::DOMAIN_UID_LABEL);
    eventually("the node objects deleted", WAIT, || {
        server
            .list(&node_objects_path(), &selector)
            .is_empty()
            .then_some(())
    })
    .await;
    // The old daemon, still running, writes its object again.
    server.create(&node_objects_path(), object);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        server.get(&path).is_some(),
        "the finalizer stays while the DaemonSet's pods run"
    );
    // Its pod is gone: the garbage collector lets the DaemonSet go.
    assert!(server.finish_foreground_deletion(&ds_path));
    eventually("the domain gone", WAIT, || {
        server.get(&path).is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        server.list(&node_objects_path(), &selector),
        Vec::<Value>::new()
    );
    let domain_writes: Vec<(String, u16)> = server
        .requests()
        .iter()
        .filter(|r| r.path == path && r.is_write())
        .map(|r| (r.method.clone(), r.code))
        .collect();
    assert_eq!(
        domain_writes,
        [("PATCH".to_string(), 200), ("PATCH".to_string(), 200)]
    );
    let not_found: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.code == 404 && r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(not_found, Vec::<String>::new());
}

/// The watch delivers a domain's deletion after the finalizer removal that caused it: a
/// reconcile in between runs on a copy of the domain that is already gone. It must not clean
/// up again: every request would find nothing, and the finalizer patch's 404 was logged as
/// `reconcile failed … setting the finalizers` on every delete with node objects (their
/// DELETE events of the clean-up marked the domain again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_clean_up_is_not_run_again_on_a_stale_copy_of_the_domain() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let mut object = domain("imex", 0);
    object["metadata"]["finalizers"] = json!([api::FINALIZER]);
    server.create(&domains_path(WORKLOAD_NS), object);
    let path = domain_path(WORKLOAD_NS, "imex");
    assert_eq!(server.delete(&path), 200);
    let stale: api::ComputeDomain = serde_json::from_value(server.get(&path).unwrap()).unwrap();
    let reconciler = controller::Reconciler::new(
        server.client(dir.path()).await,
        controller_config("c1", false).settings,
    );
    assert_eq!(
        reconciler.reconcile(&stale, &[]).await.unwrap(),
        controller::Outcome::Done
    );
    assert_eq!(server.get(&path), None, "the finalizer was removed");
    let before = server.requests().len();
    assert_eq!(
        reconciler.reconcile(&stale, &[]).await.unwrap(),
        controller::Outcome::Done
    );
    let again: Vec<String> = server.requests()[before..]
        .iter()
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.code))
        .collect();
    assert_eq!(again, Vec::<String>::new());
}
