//! A kubelet that restarts, and a plugin directory that someone wipes, under the real plugin
//! binary: the registration and DRA sockets come back by themselves, the kubelet registers the
//! plugin again without a plugin restart, and the slices a starting kubelet deletes are
//! published again.

mod plugin_support;

use std::collections::BTreeSet;
use std::time::Duration;

use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::claims::{self, claim_ref};
use plugin_support::{Node, eventually};

async fn prepare(kubelet: &mut KubeletClient, name: &str, uid: &str) -> Result<usize, String> {
    let got = kubelet.prepare(&[claim_ref(name, uid)]).await.unwrap();
    got[uid].clone().map(|devices| devices.len())
}

/// The device names of the node's complete pool, once it is complete.
fn published_devices(node: &Node) -> Option<BTreeSet<String>> {
    let slices = node.api.complete_pool()?;
    Some(
        slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect(),
    )
}

#[tokio::test]
async fn a_wiped_registry_directory_gets_the_socket_back_and_the_kubelet_registers_the_plugin_again()
 {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("before", "uid-before", &["gpu-1"]));
    node.api
        .put_claim(claims::on_node("after", "uid-after", &["gpu-2"]));
    let mut plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "before", "uid-before").await);

    std::fs::remove_dir_all(node.registry_dir()).unwrap();
    eventually("the registration socket back", || {
        node.registration_socket().exists().then_some(())
    })
    .await;
    // The kubelet's plugin watcher sees it appear: GetInfo, NotifyRegistrationStatus, then
    // calls on the DRA endpoint it was told.
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "after", "uid-after").await);
    assert!(
        plugin
            .log()
            .contains("socket was deleted; created it again"),
        "{}",
        plugin.log()
    );
    assert!(plugin.is_running());
    node.snapshot()
        .assert_converged(&["uid-after", "uid-before"], "after re-registration");
}

#[tokio::test]
async fn a_deleted_dra_socket_is_created_again_and_claims_are_served_on_it() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("late", "uid-late", &["gpu-3"]));
    let plugin = node.start().await;
    let _kubelet = plugin.register(DraApi::V1).await;

    std::fs::remove_file(node.dra_socket()).unwrap();
    eventually("the DRA socket back", || {
        node.dra_socket().exists().then_some(())
    })
    .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "late", "uid-late").await);
}

#[tokio::test]
async fn the_slices_a_restarting_kubelet_deletes_are_published_again_when_it_registers_the_plugin()
{
    let node = Node::new();
    let plugin = node.start().await;
    let _kubelet = plugin.register(DraApi::V1).await;
    let devices = eventually("the pool published", || published_devices(&node)).await;
    // Past the second look the plugin takes 5 s after each registration.
    tokio::time::sleep(Duration::from_millis(6500)).await;

    // The kubelet restarts: it deletes the node's slices ...
    node.api.remove_slices();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        None,
        published_devices(&node),
        "nothing republishes before the kubelet is back (the periodic resync is a minute)"
    );
    // ... and registers the plugin again, which republishes them at once.
    let _kubelet = plugin.register(DraApi::V1).await;
    let again = eventually("the pool published again", || published_devices(&node)).await;
    assert_eq!(devices, again);

    // A deletion that lands just after the registration is repaired by the second look.
    node.api.remove_slices();
    let again = eventually("the pool published a third time", || {
        published_devices(&node)
    })
    .await;
    assert_eq!(devices, again);
}
