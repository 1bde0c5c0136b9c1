//! The publisher's background loop: new models, failed rounds, resync after the kubelet
//! deleted the node's slices, and a model that cannot be published.

mod k8s_support;

use std::time::Duration;

use gpu_dra::devices::DeviceModel;
use gpu_dra::k8s::{Backoff, PublishStatus, PublisherOptions, SlicePublisher};
use gpu_dra::slices::{self, PoolOptions};
use k8s_openapi::api::resource::v1::DeviceAttribute;
use k8s_support::fixtures::{self, DRIVER};
use k8s_support::{Answer, FakeApi, Fault, SLICES};
use serde_json::Value;
use tokio::sync::watch;

fn publisher(fake: &FakeApi, node: &str, resync: Option<Duration>) -> SlicePublisher {
    let options = PublisherOptions {
        retry: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            attempts: 1,
        },
        resync,
        ..Default::default()
    };
    SlicePublisher::new(fake.client(), DRIVER, node).with_options(options)
}

fn specs(model: &DeviceModel, node: &str, generation: i64) -> Vec<Value> {
    let pool = PoolOptions {
        driver_name: DRIVER.into(),
        node_name: node.into(),
        generation,
    };
    slices::build(model, &pool)
        .unwrap()
        .iter()
        .map(|s| serde_json::to_value(&s.spec).unwrap())
        .collect()
}

fn stored(fake: &FakeApi) -> Vec<Value> {
    fake.slices()
        .into_values()
        .map(|o| o["spec"].clone())
        .collect()
}

fn published_at(generation: i64) -> impl FnMut(&PublishStatus) -> bool {
    move |s| matches!(s, PublishStatus::Published(o) if o.generation == generation)
}

#[tokio::test]
async fn each_new_model_is_published_until_the_sender_is_dropped() {
    let (node, big) = fixtures::model("dgx-h100", None);
    let small = fixtures::first_gpus(&big, 4);
    let (fake, _) = FakeApi::start(vec![fixtures::node(&node)]);
    let publisher = publisher(&fake, &node, None);
    let mut status = publisher.status();
    let (models, receiver) = watch::channel(small);
    let task = tokio::spawn({
        let publisher = publisher.clone();
        async move { publisher.run(receiver).await }
    });

    status.wait_for(published_at(1)).await.unwrap();
    models.send(big.clone()).unwrap();
    status.wait_for(published_at(2)).await.unwrap();
    drop(models);
    task.await.unwrap();

    assert_eq!(specs(&big, &node, 2), stored(&fake));
}

#[tokio::test(start_paused = true)]
async fn a_failed_round_is_tried_again_in_the_background() {
    let (node, model) = fixtures::model("mixed", None);
    let (fake, _) = FakeApi::start(vec![fixtures::node(&node)]);
    for _ in 0..2 {
        fake.fail(Fault::new("GET", "resourceslices", Answer::Disconnect));
    }
    let publisher = publisher(&fake, &node, None);
    let mut status = publisher.status();
    let (_models, receiver) = watch::channel(model.clone());
    tokio::spawn({
        let publisher = publisher.clone();
        async move { publisher.run(receiver).await }
    });

    status.wait_for(published_at(1)).await.unwrap();

    let lists = fake
        .take_requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == SLICES)
        .count();
    assert_eq!(3, lists, "two failed rounds, then one that succeeded");
    assert_eq!(specs(&model, &node, 1), stored(&fake));
}

#[tokio::test(start_paused = true)]
async fn slices_the_kubelet_deleted_are_restored_at_the_next_resync() {
    let (node, model) = fixtures::model("mixed", None);
    let (fake, _) = FakeApi::start(vec![fixtures::node(&node)]);
    let publisher = publisher(&fake, &node, Some(Duration::from_secs(60)));
    let mut status = publisher.status();
    let (_models, receiver) = watch::channel(model.clone());
    tokio::spawn({
        let publisher = publisher.clone();
        async move { publisher.run(receiver).await }
    });
    status.wait_for(published_at(1)).await.unwrap();

    fake.remove_slices();
    while fake.slices().is_empty() {
        status.changed().await.unwrap();
    }

    assert_eq!(specs(&model, &node, 1), stored(&fake));
}

#[tokio::test]
async fn a_model_breaking_an_api_limit_is_reported_and_the_next_model_published() {
    let (node, model) = fixtures::model("mixed", None);
    let mut broken = model.clone();
    let attributes = broken.devices[0].device.attributes.get_or_insert_default();
    for i in 0..40 {
        attributes.insert(format!("extra{i}"), DeviceAttribute::default());
    }
    let (fake, _) = FakeApi::start(vec![fixtures::node(&node)]);
    let publisher = publisher(&fake, &node, None);
    let mut status = publisher.status();
    let (models, receiver) = watch::channel(broken);
    tokio::spawn({
        let publisher = publisher.clone();
        async move { publisher.run(receiver).await }
    });

    let failed = status
        .wait_for(|s| matches!(s, PublishStatus::Failed { .. }))
        .await
        .unwrap()
        .clone();
    let PublishStatus::Failed {
        error, transient, ..
    } = failed
    else {
        unreachable!()
    };
    assert!(!transient);
    assert!(error.contains("attributes"), "{error}");
    assert_eq!(
        0,
        fake.take_requests().len(),
        "nothing is sent for a broken model"
    );

    models.send(model.clone()).unwrap();
    status.wait_for(published_at(1)).await.unwrap();
    assert_eq!(specs(&model, &node, 1), stored(&fake));
}
