//! The slice publisher against a fake API server: first publish, steady state, generation
//! bumps with a safe write order, retries, permanent refusals, unpublish.

mod k8s_support;

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_dra::devices::DeviceModel;
use gpu_dra::k8s::{Backoff, K8sError, PublishOutcome, PublisherOptions, SlicePublisher, Step};
use gpu_dra::slices::{self, PoolOptions};
use k8s_support::fixtures::{self, DRIVER, NODE_UID};
use k8s_support::{Answer, FakeApi, Fault, SLICES};
use serde_json::{Value, json};

fn options() -> PublisherOptions {
    PublisherOptions {
        retry: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            attempts: 4,
        },
        resync: None,
        ..Default::default()
    }
}

fn setup(preset: &str) -> (FakeApi, SlicePublisher, String) {
    let (node, _) = fixtures::model(preset, None);
    let (fake, client) = FakeApi::start(vec![fixtures::node(&node)]);
    let publisher = SlicePublisher::new(client, DRIVER, node.clone()).with_options(options());
    (fake, publisher, node)
}

/// The slices `slices::build` makes, as JSON, by name.
fn built(model: &DeviceModel, node: &str, generation: i64) -> BTreeMap<String, Value> {
    let pool = PoolOptions {
        driver_name: DRIVER.into(),
        node_name: node.into(),
        generation,
    };
    slices::build(model, &pool)
        .unwrap()
        .into_iter()
        .map(|s| {
            let name = s.metadata.name.clone().unwrap();
            (name, serde_json::to_value(&s.spec).unwrap())
        })
        .collect()
}

/// The stored slices' specs by name.
fn stored_specs(fake: &FakeApi) -> BTreeMap<String, Value> {
    fake.slices()
        .into_iter()
        .map(|(name, o)| (name, o["spec"].clone()))
        .collect()
}

fn lines(requests: &[k8s_support::Recorded]) -> Vec<String> {
    requests.iter().map(|r| r.line()).collect()
}

#[tokio::test]
async fn first_publish_creates_every_slice_owned_by_the_node_at_generation_one() {
    let (fake, publisher, node) = setup("dgx-h100");
    let (_, model) = fixtures::model("dgx-h100", None);
    let want_specs = built(&model, &node, 1);

    let got = publisher.publish(&model).await.unwrap();

    let n = want_specs.len();
    let want = PublishOutcome {
        generation: 1,
        slices: n,
        created: n,
        updated: 0,
        deleted: 0,
        attempts: 1,
    };
    assert_eq!(want, got);
    let requests = fake.take_requests();
    let mut want_lines = vec![format!("GET /api/v1/nodes/{node}"), format!("GET {SLICES}")];
    want_lines.extend(std::iter::repeat_n(format!("POST {SLICES}"), n));
    assert_eq!(want_lines, lines(&requests));
    assert_eq!(
        Some(&format!("spec.nodeName={node},spec.driver={DRIVER}")),
        requests[1].query.get("fieldSelector")
    );
    let owner = json!([{"apiVersion": "v1", "kind": "Node", "name": node,
                        "uid": NODE_UID, "controller": true}]);
    for post in &requests[2..] {
        let body = post.body.as_ref().unwrap();
        assert_eq!(owner, body["metadata"]["ownerReferences"]);
        assert_eq!(Some(&"gpu-dra".to_string()), post.query.get("fieldManager"));
        let name = body["metadata"]["name"].as_str().unwrap();
        assert_eq!(want_specs[name], body["spec"], "slice {name}");
    }
    assert_eq!(want_specs, stored_specs(&fake));
}

#[tokio::test]
async fn publishing_what_the_cluster_holds_writes_nothing() {
    let (fake, publisher, node) = setup("dgx-h100");
    let (_, model) = fixtures::model("dgx-h100", None);
    publisher.publish(&model).await.unwrap();
    fake.take_requests();

    let again = publisher.publish(&model).await.unwrap();
    assert!(again.wrote_nothing(), "{again:?}");
    assert_eq!(1, again.generation);
    assert_eq!(vec![format!("GET {SLICES}")], lines(&fake.take_requests()));

    // A restarted plugin looks the Node up again, then finds nothing to do either, although
    // the stored slices carry server-set metadata (uid, resourceVersion, managedFields).
    let restarted =
        SlicePublisher::new(fake.client(), DRIVER, node.clone()).with_options(options());
    let restarted = restarted.publish(&model).await.unwrap();
    assert!(restarted.wrote_nothing(), "{restarted:?}");
    let want = vec![format!("GET /api/v1/nodes/{node}"), format!("GET {SLICES}")];
    assert_eq!(want, lines(&fake.take_requests()));
}

/// A kube-apiserver with a DRA feature gate off drops that feature's fields from every slice
/// it stores (here `DRAPartitionableDevices`: counters). Rewriting cannot bring them back, so
/// once the publisher has seen the server drop them it must not rewrite (and bump the
/// generation) at every resync; a real change still gets written.
#[tokio::test]
async fn fields_an_api_server_drops_for_a_gate_that_is_off_are_not_rewritten_forever() {
    let (fake, publisher, _) = setup("dgx-h100");
    let (_, model) = fixtures::model("dgx-h100", None);
    fake.drop_fields_on_write(&["sharedCounters", "consumesCounters"]);
    let first = publisher.publish(&model).await.unwrap();
    assert_eq!((1, first.slices), (first.generation, first.created));
    assert!(
        fake.slices()
            .values()
            .all(|s| s["spec"].get("sharedCounters").is_none()),
        "the server dropped the counters"
    );
    fake.take_requests();

    let again = publisher.publish(&model).await.unwrap();
    assert!(again.wrote_nothing(), "{again:?}");
    assert_eq!(1, again.generation);
    assert_eq!(vec![format!("GET {SLICES}")], lines(&fake.take_requests()));

    // A change of what the server keeps still counts: the model without MIG is written.
    let (_, fewer) = fixtures::model("dgx-h100", Some(gpu_dra::hardware::MigPolicy::Disabled));
    let changed = publisher.publish(&fewer).await.unwrap();
    assert_eq!(2, changed.generation, "{changed:?}");
}

#[tokio::test]
async fn a_changed_model_bumps_the_generation_and_writes_every_slice_before_deleting() {
    let (fake, publisher, node) = setup("dgx-h100");
    let (_, big) = fixtures::model("dgx-h100", None);
    let small = fixtures::first_gpus(&big, 4);
    let big_specs = built(&big, &node, 1);
    publisher.publish(&big).await.unwrap();
    fake.take_requests();

    let got = publisher.publish(&small).await.unwrap();

    let want_specs = built(&small, &node, 2);
    let (kept, gone) = (want_specs.len(), big_specs.len() - want_specs.len());
    assert!(kept > 0 && gone > 0, "{kept} slices kept, {gone} gone");
    let want = PublishOutcome {
        generation: 2,
        slices: kept,
        created: 0,
        updated: kept,
        deleted: gone,
        attempts: 1,
    };
    assert_eq!(want, got);
    let requests = fake.take_requests();
    let kinds: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
    let mut want_kinds = vec!["GET"];
    want_kinds.extend(std::iter::repeat_n("PUT", kept));
    want_kinds.extend(std::iter::repeat_n("DELETE", gone));
    assert_eq!(want_kinds, kinds, "all writes come before any delete");
    for put in requests.iter().filter(|r| r.method == "PUT") {
        let pool = &put.body.as_ref().unwrap()["spec"]["pool"];
        let want = json!({"name": node, "generation": 2, "resourceSliceCount": kept});
        assert_eq!(&want, pool, "{}", put.path);
    }
    for delete in requests.iter().filter(|r| r.method == "DELETE") {
        let uid = &delete.body.as_ref().unwrap()["preconditions"]["uid"];
        assert!(
            uid.is_string(),
            "{} deletes by UID precondition",
            delete.path
        );
    }
    assert_eq!(want_specs, stored_specs(&fake));

    // Growing back: generation 3, the kept slices updated, the others created.
    let grown = publisher.publish(&big).await.unwrap();
    assert_eq!(
        (3, kept, gone, 0),
        (
            grown.generation,
            grown.updated,
            grown.created,
            grown.deleted
        )
    );
    assert_eq!(built(&big, &node, 3), stored_specs(&fake));
}

#[tokio::test(start_paused = true)]
async fn a_503_in_the_middle_of_a_change_is_retried_within_the_same_generation() {
    let (fake, publisher, node) = setup("dgx-h100");
    let (_, big) = fixtures::model("dgx-h100", None);
    let small = fixtures::first_gpus(&big, 4);
    publisher.publish(&small).await.unwrap();
    let second = slices::slice_name(&node, DRIVER, 1, built(&big, &node, 2).len());
    fake.fail(Fault::new(
        "PUT",
        &second,
        Answer::Status(503, "ServiceUnavailable", "etcd leader changed".into()),
    ));
    fake.take_requests();

    let got = publisher.publish(&big).await.unwrap();

    assert_eq!((2, 2), (got.generation, got.attempts));
    assert_eq!(built(&big, &node, 2), stored_specs(&fake));
    let requests = lines(&fake.take_requests());
    let want_start = vec![
        format!("GET {SLICES}"),
        format!(
            "PUT {SLICES}/{}",
            slices::slice_name(&node, DRIVER, 0, built(&big, &node, 2).len())
        ),
        format!("PUT {SLICES}/{second}"),
        format!("GET {SLICES}"),
    ];
    assert_eq!(want_start, requests[..4]);
    assert!(
        !requests[4..].contains(&want_start[1]),
        "the slice written before the failure is already at generation 2: {requests:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_api_server_is_retried_until_it_answers() {
    let (fake, publisher, _) = setup("mixed");
    let (_, model) = fixtures::model("mixed", None);
    fake.fail(Fault::new("GET", "resourceslices", Answer::Disconnect));
    fake.fail(Fault::new(
        "GET",
        "resourceslices",
        Answer::Status(429, "TooManyRequests", "slow down".into()),
    ));

    let got = publisher.publish(&model).await.unwrap();

    assert_eq!(3, got.attempts);
    assert_eq!(got.slices, got.created);
}

#[tokio::test(start_paused = true)]
async fn an_api_server_that_stays_down_fails_after_the_last_try() {
    let (fake, publisher, node) = setup("mixed");
    let (_, model) = fixtures::model("mixed", None);
    for _ in 0..4 {
        fake.fail(Fault::new("GET", "resourceslices", Answer::Disconnect));
    }

    let err = publisher.publish(&model).await.unwrap_err();

    let K8sError::Unreachable { step, .. } = &err else {
        panic!("want Unreachable, got {err:?}");
    };
    let want = Step::ListSlices {
        node: node.clone(),
        driver: DRIVER.into(),
    };
    assert_eq!(&want, step);
    let lists = fake
        .take_requests()
        .iter()
        .filter(|r| r.path == SLICES)
        .count();
    assert_eq!(4, lists);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_slice_is_reported_with_its_name_and_the_servers_message_at_once() {
    let (fake, publisher, node) = setup("dgx-h100");
    let (_, model) = fixtures::model("dgx-h100", None);
    let third = slices::slice_name(&node, DRIVER, 2, built(&model, &node, 1).len());
    let message = format!(
        "ResourceSlice.resource.k8s.io \"{third}\" is invalid: spec.devices[0].attributes: \
         Too many: 33: must have at most 32 items"
    );
    fake.fail(Fault::new(
        "POST",
        &third,
        Answer::Status(422, "Invalid", message.clone()),
    ));

    let err = publisher.publish(&model).await.unwrap_err();

    match &err {
        K8sError::Api {
            step: Step::CreateSlice { name },
            code: 422,
            message: got,
            ..
        } => assert_eq!((&third, &message), (name, got)),
        other => panic!("want a 422 for {third}, got {other:?}"),
    }
    assert!(err.to_string().contains(&third), "{err}");
    assert!(!err.is_transient());
    let requests = fake.take_requests();
    assert_eq!(
        Some(&format!("POST {SLICES}")),
        requests.last().map(|r| r.line()).as_ref()
    );
    assert_eq!(
        1,
        requests
            .iter()
            .filter(|r| r.path == SLICES && r.method == "GET")
            .count()
    );
}

#[tokio::test]
async fn a_forbidden_list_is_not_retried() {
    let (fake, publisher, _) = setup("mixed");
    let (_, model) = fixtures::model("mixed", None);
    fake.fail(Fault::new(
        "GET",
        "resourceslices",
        Answer::Status(403, "Forbidden", "cannot list resourceslices".into()),
    ));

    let err = publisher.publish(&model).await.unwrap_err();

    assert_eq!(Some(403), err.status_code());
    assert_eq!(2, fake.take_requests().len(), "one node lookup, one list");
}

#[tokio::test]
async fn unpublish_deletes_only_this_nodes_slices_of_this_driver() {
    let (fake, publisher, node) = setup("mixed");
    let (_, model) = fixtures::model("mixed", None);
    publisher.publish(&model).await.unwrap();
    let foreign = [("other-node", DRIVER), (node.as_str(), "other.example.com")];
    for (i, (other_node, driver)) in foreign.iter().enumerate() {
        fake.insert(
            &format!("{SLICES}/foreign-{i}"),
            json!({"metadata": {"name": format!("foreign-{i}")},
                   "spec": {"driver": driver, "nodeName": other_node,
                            "pool": {"name": other_node, "generation": 1,
                                     "resourceSliceCount": 1}}}),
        );
    }
    let ours = fake.slices().len() - foreign.len();

    let got = publisher.unpublish().await.unwrap();

    assert_eq!(ours, got.deleted);
    let left: Vec<String> = fake.slices().into_keys().collect();
    assert_eq!(vec!["foreign-0".to_string(), "foreign-1".to_string()], left);
}
