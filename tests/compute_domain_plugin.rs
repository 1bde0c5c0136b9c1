//! `gpu-dra compute-domain-plugin` as the kubelet and the API server see it: the real binary
//! over real Unix sockets, registering, publishing channel and daemon devices, preparing
//! channel claims once the node's IMEX daemon reports Ready, writing the daemon's IMEX config,
//! and cleaning up after unprepare, a crash and a kubelet restart.

mod plugin_support;

use std::collections::BTreeSet;
use std::time::Duration;

use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::cdnode::{
    self, CD_DRIVER, CLIQUE, DRIVER_NAMESPACE, NODE_LABEL, channel_config, compute_domain,
    daemon_config, domain_node,
};
use plugin_support::claims::{NODE, claim_ref};
use plugin_support::{Node, eventually};

const DOMAIN: &str = "0a1b2c3d-0000-1111-2222-333344445555";
const OTHER_DOMAIN: &str = "9f8e7d6c-0000-1111-2222-333344445555";

/// The device names of the plugin's complete pool.
fn published(node: &Node) -> Option<BTreeSet<String>> {
    let slices: Vec<_> = node
        .api
        .slices()
        .into_values()
        .filter(|s| s["spec"]["driver"] == CD_DRIVER)
        .collect();
    let complete = !slices.is_empty()
        && slices
            .iter()
            .all(|s| s["spec"]["pool"]["resourceSliceCount"] == serde_json::json!(slices.len()));
    complete.then(|| {
        slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect()
    })
}

fn every_device() -> BTreeSet<String> {
    (0..8)
        .flat_map(|i| [format!("channel-{i}"), format!("daemon-{i}")])
        .collect()
}

async fn prepare_one(
    kubelet: &mut KubeletClient,
    name: &str,
    uid: &str,
) -> Result<Vec<gpu_dra::kubelet::PreparedDevice>, String> {
    let got = kubelet
        .prepare(&[claim_ref(name, uid)])
        .await
        .expect("prepare call");
    got[uid].clone()
}

async fn unprepare_one(kubelet: &mut KubeletClient, name: &str, uid: &str) {
    let got = kubelet
        .unprepare(&[claim_ref(name, uid)])
        .await
        .expect("unprepare call");
    assert_eq!(got[uid], Ok(()));
}

fn label(node: &Node) -> Option<String> {
    node.api.node_labels().get(NODE_LABEL).cloned()
}

#[tokio::test]
async fn the_plugin_registers_as_compute_domain_driver_and_publishes_channels_and_daemons() {
    let node = Node::new();
    let plugin = node.cd_start(5).await;
    let mut client = KubeletClient::connect(&node.cd_registration_socket())
        .await
        .unwrap();
    let info = client.get_info().await.unwrap();
    assert_eq!(info.name, CD_DRIVER);
    assert!(
        info.endpoint
            .ends_with("plugins/compute-domain.nvidia.com/dra.sock")
    );
    let _kubelet = plugin.register(DraApi::V1).await;
    let devices = eventually("the compute-domain pool", || published(&node)).await;
    assert_eq!(devices, every_device());
    let slice = node
        .api
        .slices()
        .into_values()
        .find(|s| s["spec"]["driver"] == CD_DRIVER)
        .unwrap();
    let channel = &slice["spec"]["devices"][0];
    assert_eq!(channel["attributes"]["type"]["string"], "channel");
    assert_eq!(channel["attributes"]["id"]["int"], 0);
    // channel-0, the one the default channel class selects, may be allocated to every pod of
    // the domain; the others, and every daemon device, to one claim each.
    let multiple: Vec<(String, Option<bool>)> = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .take(4)
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["allowMultipleAllocations"].as_bool(),
            )
        })
        .collect();
    let want = vec![
        ("channel-0".to_string(), Some(true)),
        ("daemon-0".to_string(), None),
        ("channel-1".to_string(), None),
        ("daemon-1".to_string(), None),
    ];
    assert_eq!(multiple, want);
}

/// A channel claim of `domain` allocated `channel-0` as share `share` (the scheduler records
/// a share ID for each allocation of a device with `allowMultipleAllocations`).
fn channel_0_share(name: &str, uid: &str, domain: &str, share: &str) -> serde_json::Value {
    let mut claim = cdnode::claim(name, uid, "channel-0", channel_config(domain, "Single"));
    claim["status"]["allocation"]["devices"]["results"][0]["shareID"] = share.into();
    claim
}

/// Prepares every `(name, uid)` at once, each over its own kubelet connection (one pod
/// each), and returns the answers in order.
async fn prepare_concurrently(
    plugin: &plugin_support::Plugin,
    claims: &[(&str, &str)],
) -> Vec<Result<Vec<gpu_dra::kubelet::PreparedDevice>, String>> {
    let mut calls = Vec::new();
    for (name, uid) in claims {
        let mut kubelet = plugin.register(DraApi::V1).await;
        let (name, uid) = (name.to_string(), uid.to_string());
        calls.push(tokio::spawn(async move {
            prepare_one(&mut kubelet, &name, &uid).await
        }));
    }
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers
}

/// The node PATCHes made since `from`.
fn node_patches_since(node: &Node, from: usize) -> usize {
    node.api.requests()[from..]
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == format!("/api/v1/nodes/{NODE}"))
        .count()
}

#[tokio::test]
async fn four_pods_of_one_domain_all_get_channel_0_and_the_label_outlives_their_unprepares() {
    let node = Node::new();
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    let pods: Vec<(String, String, String)> = (1..=4)
        .map(|i| {
            (
                format!("w{i}"),
                format!("uid-w{i}"),
                format!("5f0c2a9e-1d3b-4c7a-9e8f-00000000000{i}"),
            )
        })
        .collect();
    for (name, uid, share) in &pods {
        node.api
            .put_claim(channel_0_share(name, uid, DOMAIN, share));
    }
    let plugin = node.cd_start(5).await;
    // Slow reads, so that the four read-aheads overlap as the pods of a job started together
    // do.
    node.api.set_get_latency(Duration::from_millis(150));
    let from = node.api.requests().len();
    let claims: Vec<(&str, &str)> = pods
        .iter()
        .map(|(name, uid, _)| (name.as_str(), uid.as_str()))
        .collect();
    let answers = prepare_concurrently(&plugin, &claims).await;
    node.api.set_get_latency(Duration::ZERO);
    for ((_, uid, share), answer) in pods.iter().zip(answers) {
        let devices = answer.unwrap_or_else(|e| panic!("{uid}: {e}\n{}", plugin.log()));
        let got: Vec<(&str, Option<&str>, Vec<String>)> = devices
            .iter()
            .map(|d| {
                (
                    d.device_name.as_str(),
                    d.share_id.as_deref(),
                    d.cdi_device_ids.clone(),
                )
            })
            .collect();
        let want = vec![(
            "channel-0",
            Some(share.as_str()),
            vec![
                format!("k8s.compute-domain.nvidia.com/claim={uid}-channel-0-{share}"),
                format!("k8s.compute-domain.nvidia.com/claim={uid}-metadata-gpu-0"),
            ],
        )];
        assert_eq!(got, want);
        let spec = node.cd_spec(uid).expect("each claim has its own spec");
        let paths: Vec<&str> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| {
                d["containerEdits"]["deviceNodes"]
                    .as_array()
                    .into_iter()
                    .flatten()
            })
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            vec!["/dev/nvidia-caps-imex-channels/channel0"],
            "{uid}"
        );
    }
    assert_eq!(label(&node).as_deref(), Some(DOMAIN));
    assert_eq!(
        node_patches_since(&node, from),
        1,
        "the node is labelled once, however many pods of the domain start together"
    );

    let mut kubelet = plugin.register(DraApi::V1).await;
    let from = node.api.requests().len();
    for (name, uid, _) in &pods {
        unprepare_one(&mut kubelet, name, uid).await;
        assert_eq!(node.cd_spec(uid), None);
        assert_eq!(label(&node).as_deref(), Some(DOMAIN), "{uid} unprepared");
    }
    // The domain still exists: its IMEX daemon stays on the node for the next pod, and only
    // the controller removes the label, when the domain is deleted.
    assert_eq!(node_patches_since(&node, from), 0);
    assert_eq!(node.cd_leftovers(), Vec::<String>::new());
}

/// A job whose pods restart one at a time (the Job controller replaces a failed pod, a
/// rolling restart) must not lose its IMEX daemon in between: with the label gone, the
/// DaemonSet would take the daemon away, the domain would turn NotReady, and the next pod
/// would wait for a new daemon to start and settle its index.
#[tokio::test]
async fn a_pod_of_the_domain_restarting_on_the_node_keeps_the_label_and_its_daemon() {
    let node = Node::new();
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    for (name, uid) in [("w-a", "uid-w-a"), ("w-b", "uid-w-b")] {
        node.api
            .put_claim(channel_0_share(name, uid, DOMAIN, &format!("s-{uid}")));
    }
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    prepare_one(&mut kubelet, "w-a", "uid-w-a").await.unwrap();
    let from = node.api.requests().len();
    // The pod ends (its claim is unprepared), and its replacement's claim is prepared.
    unprepare_one(&mut kubelet, "w-a", "uid-w-a").await;
    assert_eq!(
        label(&node).as_deref(),
        Some(DOMAIN),
        "kept between the pods"
    );
    prepare_one(&mut kubelet, "w-b", "uid-w-b").await.unwrap();
    assert_eq!(
        node_patches_since(&node, from),
        0,
        "the node was neither unlabelled nor labelled again"
    );
}

/// The label outlives the pods only while its domain exists: a label whose domain is gone
/// (a channel prepared just as that domain's clean-up finished) does not keep another
/// domain off the node.
#[tokio::test]
async fn a_label_whose_domain_no_longer_exists_is_taken_over_by_another_domain() {
    let node = Node::new();
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    node.api.put_claim(cdnode::claim(
        "work",
        "uid-work",
        "channel-0",
        channel_config(DOMAIN, "Single"),
    ));
    let plugin = node.cd_start(5).await;
    node.api.set_node_label(NODE_LABEL, Some(OTHER_DOMAIN));
    let mut kubelet = plugin.register(DraApi::V1).await;
    prepare_one(&mut kubelet, "work", "uid-work")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    assert_eq!(label(&node).as_deref(), Some(DOMAIN));
}

#[tokio::test]
async fn two_domains_reaching_a_free_node_at_once_label_it_once_and_the_other_is_refused() {
    let node = Node::new();
    for (name, domain) in [("imex", DOMAIN), ("other", OTHER_DOMAIN)] {
        node.api
            .put_compute_domain(compute_domain("team-a", name, domain));
        node.api
            .put_domain_node(domain_node(domain, NODE, CLIQUE, 0, "10.0.0.1", true));
    }
    node.api
        .put_claim(channel_0_share("a", "uid-a", DOMAIN, "share-a"));
    node.api
        .put_claim(channel_0_share("b", "uid-b", OTHER_DOMAIN, "share-b"));
    let plugin = node.cd_start(5).await;
    // Both read-aheads read the free node before either labels it, unless the plugin
    // decides one label at a time.
    node.api.set_get_latency(Duration::from_millis(150));
    let answers = prepare_concurrently(&plugin, &[("a", "uid-a"), ("b", "uid-b")]).await;
    node.api.set_get_latency(Duration::ZERO);
    let winner = label(&node).expect("the node is labelled");
    let (won, lost) = if winner == DOMAIN {
        (&answers[0], &answers[1])
    } else {
        (&answers[1], &answers[0])
    };
    assert!(won.is_ok(), "{won:?}\n{}", plugin.log());
    let error = lost.as_ref().unwrap_err();
    assert!(
        error.contains(DOMAIN) && error.contains(OTHER_DOMAIN),
        "{error}"
    );
    assert!(error.contains("one ComputeDomain at a time"), "{error}");
}

#[tokio::test]
async fn a_channel_prepare_labels_the_node_waits_for_its_daemon_then_injects_the_channel() {
    let node = Node::new();
    node.api.put_claim(cdnode::claim(
        "work",
        "uid-work",
        "channel-2",
        channel_config(DOMAIN, "Single"),
    ));
    let plugin = node.cd_start(30).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let waiting = tokio::spawn(async move {
        let got = prepare_one(&mut kubelet, "work", "uid-work").await;
        (kubelet, got)
    });
    eventually("the node labelled for the domain", || {
        (label(&node).as_deref() == Some(DOMAIN)).then_some(())
    })
    .await;
    // The daemon starts (it can: the node is labelled), then reports Ready.
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", false));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "prepared before the daemon was Ready"
    );
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    let (mut kubelet, got) = waiting.await.unwrap();
    let devices = got.expect("prepared");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device_name, "channel-2");
    assert_eq!(devices[0].pool_name, NODE);
    // The channel, and the device metadata of its request (KEP-5304), in the claim's spec.
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![
            "k8s.compute-domain.nvidia.com/claim=uid-work-channel-2",
            "k8s.compute-domain.nvidia.com/claim=uid-work-metadata-gpu-0"
        ]
    );
    let metadata = node
        .cd_plugin_dir()
        .join("dra-device-metadata/uid-work_gpu-0.json");
    let text = std::fs::read_to_string(&metadata).expect("the metadata file");
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(
        first["requests"][0]["devices"][0],
        serde_json::json!({
            "driver": "compute-domain.nvidia.com",
            "pool": NODE,
            "name": "channel-2",
            "attributes": {"type": {"string": "channel"}, "id": {"int": 2}},
        })
    );
    let spec = node.cd_spec("uid-work").expect("spec written");
    let mount = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "uid-work-metadata-gpu-0")
        .map(|d| d["containerEdits"]["mounts"][0]["containerPath"].clone());
    assert_eq!(
        mount,
        Some(serde_json::json!(
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/work/gpu-0/compute-domain.nvidia.com-metadata.json"
        ))
    );
    let nodes = &spec["devices"][0]["containerEdits"]["deviceNodes"];
    assert_eq!(nodes.as_array().unwrap().len(), 1);
    assert_eq!(nodes[0]["path"], "/dev/nvidia-caps-imex-channels/channel2");

    // Prepared once: a repeated prepare answers from the checkpoint.
    let again = prepare_one(&mut kubelet, "work", "uid-work").await.unwrap();
    assert_eq!(again, devices);

    unprepare_one(&mut kubelet, "work", "uid-work").await;
    assert_eq!(node.cd_spec("uid-work"), None);
    assert_eq!(
        label(&node).as_deref(),
        Some(DOMAIN),
        "the domain's until it is deleted"
    );
    assert_eq!(node.cd_leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_daemon_that_never_turns_ready_fails_the_prepare_naming_domain_node_and_reason() {
    let node = Node::new();
    node.api.put_claim(cdnode::claim(
        "work",
        "uid-work",
        "channel-0",
        channel_config(DOMAIN, "Single"),
    ));
    let mut crashed = domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", false);
    crashed["status"]["reason"] = "DaemonCrashed".into();
    crashed["status"]["message"] = "nvidia-imex exited with status 1".into();
    node.api.put_domain_node(crashed);
    let plugin = node.cd_start(1).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let error = prepare_one(&mut kubelet, "work", "uid-work")
        .await
        .unwrap_err();
    for part in [
        DOMAIN,
        NODE,
        "DaemonCrashed",
        "nvidia-imex exited with status 1",
        DRIVER_NAMESPACE,
        "not ready after 1 s",
    ] {
        assert!(error.contains(part), "{part:?} missing in: {error}");
    }
    assert_eq!(node.cd_spec("uid-work"), None);
    // The label stays for the kubelet's retry, and after the claim is unprepared: it is the
    // domain's until the domain is deleted.
    assert_eq!(label(&node).as_deref(), Some(DOMAIN));
    unprepare_one(&mut kubelet, "work", "uid-work").await;
    assert_eq!(label(&node).as_deref(), Some(DOMAIN));
}

#[tokio::test]
async fn all_mode_injects_every_channel_of_the_node() {
    let node = Node::new();
    node.api.put_claim(cdnode::claim(
        "all",
        "uid-all",
        "channel-0",
        channel_config(DOMAIN, "All"),
    ));
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1beta1).await;
    prepare_one(&mut kubelet, "all", "uid-all").await.unwrap();
    let spec = node.cd_spec("uid-all").unwrap();
    let paths: Vec<String> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths.len(), 2048);
    assert_eq!(paths[0], "/dev/nvidia-caps-imex-channels/channel0");
    assert_eq!(paths[2047], "/dev/nvidia-caps-imex-channels/channel2047");
}

#[tokio::test]
async fn a_node_serving_another_domain_refuses_a_channel_naming_both_domains() {
    let node = Node::new();
    node.api
        .put_compute_domain(compute_domain("team-b", "other", OTHER_DOMAIN));
    node.api.set_node_label(NODE_LABEL, Some(OTHER_DOMAIN));
    node.api.put_claim(cdnode::claim(
        "work",
        "uid-work",
        "channel-0",
        channel_config(DOMAIN, "Single"),
    ));
    let plugin = node.cd_start(5).await;
    assert_eq!(
        label(&node).as_deref(),
        Some(OTHER_DOMAIN),
        "a start-up keeps the label of a domain it holds no claim of"
    );
    let mut kubelet = plugin.register(DraApi::V1).await;
    let error = prepare_one(&mut kubelet, "work", "uid-work")
        .await
        .unwrap_err();
    assert!(
        error.contains(DOMAIN) && error.contains(OTHER_DOMAIN),
        "{error}"
    );
    assert!(error.contains("one ComputeDomain at a time"), "{error}");
    assert!(
        error.contains(&format!("once ComputeDomain {OTHER_DOMAIN} is deleted")),
        "{error}"
    );
    assert_eq!(label(&node).as_deref(), Some(OTHER_DOMAIN));
}

#[tokio::test]
async fn a_bad_channel_config_fails_naming_the_field_the_value_and_the_choices() {
    let node = Node::new();
    node.api.put_claim(cdnode::claim(
        "work",
        "uid-work",
        "channel-0",
        channel_config(DOMAIN, "Some"),
    ));
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let error = prepare_one(&mut kubelet, "work", "uid-work")
        .await
        .unwrap_err();
    assert!(error.contains("allocationMode"), "{error}");
    assert!(error.contains("\"Some\""), "{error}");
    assert!(
        error.contains("\"Single\"") && error.contains("\"All\""),
        "{error}"
    );
    assert_eq!(
        label(&node),
        None,
        "nothing labelled for a claim that cannot work"
    );
}

#[tokio::test]
async fn a_daemon_prepare_writes_the_imex_config_of_its_clique_and_a_spec_mounting_it() {
    let node = Node::new();
    node.api
        .put_compute_domain(compute_domain("team-a", "imex", DOMAIN));
    for (peer, clique, index, ip) in [
        ("node-b", CLIQUE, 1, "10.0.0.2"),
        ("node-a", CLIQUE, 0, "10.0.0.1"),
        ("node-x", "other-cluster.7", 0, "10.9.9.9"),
    ] {
        node.api
            .put_domain_node(domain_node(DOMAIN, peer, clique, index, ip, true));
    }
    node.api.put_claim(cdnode::claim(
        "daemon",
        "uid-daemon",
        "daemon-0",
        daemon_config(DOMAIN),
    ));
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let devices = prepare_one(&mut kubelet, "daemon", "uid-daemon")
        .await
        .unwrap();
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![
            "k8s.compute-domain.nvidia.com/claim=uid-daemon-daemon-0",
            "k8s.compute-domain.nvidia.com/claim=uid-daemon-metadata-gpu-0"
        ]
    );
    let dir = node.cd_config_dir(DOMAIN);
    let config = std::fs::read_to_string(dir.join("config.cfg")).unwrap();
    for line in [
        "SERVER_PORT=50000",
        "IMEX_CMD_PORT=50005",
        "IMEX_CMD_ENABLED=1",
        "IMEX_WAIT_FOR_QUORUM=RECOVERY",
        "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg",
    ] {
        assert!(config.lines().any(|l| l == line), "{line} in:\n{config}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("nodes_config.cfg")).unwrap(),
        "10.0.0.1\n10.0.0.2\n"
    );
    let spec = node.cd_spec("uid-daemon").unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    let env: Vec<&str> = edits["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let want_env = [
        format!("COMPUTE_DOMAIN_UUID={DOMAIN}"),
        "COMPUTE_DOMAIN_NAME=imex".to_string(),
        "COMPUTE_DOMAIN_NAMESPACE=team-a".to_string(),
        format!("CLIQUE_ID={CLIQUE}"),
        "IMEX_CONFIG_DIR=/etc/nvidia-imex".to_string(),
    ];
    assert_eq!(env, want_env);
    assert_eq!(
        edits["mounts"][0]["hostPath"],
        dir.to_string_lossy().as_ref()
    );
    assert_eq!(edits["mounts"][0]["containerPath"], "/etc/nvidia-imex");

    unprepare_one(&mut kubelet, "daemon", "uid-daemon").await;
    assert!(!dir.exists());
    assert_eq!(node.cd_leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn two_domains_in_one_clique_get_separate_configs_that_never_list_each_others_nodes() {
    let node = Node::new();
    node.api
        .put_compute_domain(compute_domain("team-a", "imex", DOMAIN));
    node.api
        .put_compute_domain(compute_domain("team-b", "other", OTHER_DOMAIN));
    node.api
        .put_domain_node(domain_node(DOMAIN, "node-a", CLIQUE, 0, "10.0.0.1", true));
    node.api.put_domain_node(domain_node(
        OTHER_DOMAIN,
        "node-b",
        CLIQUE,
        0,
        "10.0.0.2",
        true,
    ));
    node.api.put_claim(cdnode::claim(
        "d1",
        "uid-d1",
        "daemon-0",
        daemon_config(DOMAIN),
    ));
    node.api.put_claim(cdnode::claim(
        "d2",
        "uid-d2",
        "daemon-1",
        daemon_config(OTHER_DOMAIN),
    ));
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    prepare_one(&mut kubelet, "d1", "uid-d1").await.unwrap();
    prepare_one(&mut kubelet, "d2", "uid-d2").await.unwrap();
    let nodes_of = |domain: &str| {
        std::fs::read_to_string(node.cd_config_dir(domain).join("nodes_config.cfg")).unwrap()
    };
    assert_eq!(nodes_of(DOMAIN), "10.0.0.1\n");
    assert_eq!(nodes_of(OTHER_DOMAIN), "10.0.0.2\n");
    let mount_of = |uid: &str| {
        node.cd_spec(uid).unwrap()["devices"][0]["containerEdits"]["mounts"][0]["hostPath"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_ne!(mount_of("uid-d1"), mount_of("uid-d2"));
    // Releasing one domain leaves the other's config alone.
    unprepare_one(&mut kubelet, "d1", "uid-d1").await;
    assert!(!node.cd_config_dir(DOMAIN).exists());
    assert_eq!(nodes_of(OTHER_DOMAIN), "10.0.0.2\n");
}

#[tokio::test]
async fn a_crash_between_prepare_steps_leaves_no_spec_or_config_after_restart() {
    let node = Node::new();
    node.api
        .put_compute_domain(compute_domain("team-a", "imex", DOMAIN));
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    node.api.put_claim(cdnode::claim(
        "d",
        "uid-d",
        "daemon-0",
        daemon_config(DOMAIN),
    ));
    node.api.put_claim(cdnode::claim(
        "w",
        "uid-w",
        "channel-0",
        channel_config(DOMAIN, "Single"),
    ));
    for (name, uid) in [("d", "uid-d"), ("w", "uid-w")] {
        let mut plugin = node.cd_spawn(
            node.cd_command(5),
            &[(gpu_dra::crashpoint::ENV, "cd-prepare-spec-written")],
        );
        plugin.wait_registrable().await;
        let mut kubelet = plugin.register(DraApi::V1).await;
        let _ = kubelet.prepare(&[claim_ref(name, uid)]).await;
        let status = plugin.wait_exit().await;
        assert!(!status.success(), "the crash point aborts");
        assert!(
            !node.cd_leftovers().is_empty(),
            "the crash left files behind"
        );
    }
    assert_eq!(label(&node).as_deref(), Some(DOMAIN));
    let plugin = node.cd_start(5).await;
    assert_eq!(
        node.cd_leftovers(),
        Vec::<String>::new(),
        "{}",
        plugin.log()
    );
    assert_eq!(
        label(&node).as_deref(),
        Some(DOMAIN),
        "the label is the domain's: a restart keeps it\n{}",
        plugin.log()
    );
    // The kubelet's retry prepares both from scratch.
    let mut kubelet = plugin.register(DraApi::V1).await;
    prepare_one(&mut kubelet, "d", "uid-d").await.unwrap();
    prepare_one(&mut kubelet, "w", "uid-w").await.unwrap();
    assert_eq!(label(&node).as_deref(), Some(DOMAIN));
}

#[tokio::test]
async fn a_restarted_plugin_keeps_prepared_claims_and_a_restarted_kubelet_gets_the_slice_back() {
    let node = Node::new();
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    node.api.put_claim(cdnode::claim(
        "w",
        "uid-w",
        "channel-1",
        channel_config(DOMAIN, "Single"),
    ));
    let mut plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let devices = prepare_one(&mut kubelet, "w", "uid-w").await.unwrap();
    eventually("the pool", || published(&node)).await;
    plugin.kill().await;
    let plugin = node.cd_start(5).await;
    assert!(node.cd_spec("uid-w").is_some(), "{}", plugin.log());
    assert_eq!(label(&node).as_deref(), Some(DOMAIN));
    // A starting kubelet deletes the node's slices, then registers the plugin again.
    node.api.remove_slices();
    let mut kubelet = plugin.register(DraApi::V1).await;
    let devices_after = eventually("the pool published again", || published(&node)).await;
    assert_eq!(devices_after, every_device());
    assert_eq!(
        prepare_one(&mut kubelet, "w", "uid-w").await.unwrap(),
        devices
    );
}

#[tokio::test]
async fn a_node_in_no_clique_refuses_a_daemon_claim_saying_why_and_what_to_do() {
    let node = Node::new();
    node.api
        .put_compute_domain(compute_domain("team-a", "imex", DOMAIN));
    node.api.put_claim(cdnode::claim(
        "d",
        "uid-d",
        "daemon-0",
        daemon_config(DOMAIN),
    ));
    let mut plugin = node.cd_spawn(node.cd_command_in("", 5), &[]);
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let error = prepare_one(&mut kubelet, "d", "uid-d").await.unwrap_err();
    assert!(error.contains("no NVLink clique"), "{error}");
    assert!(error.contains("--clique-id"), "{error}");
    assert_eq!(node.cd_leftovers(), Vec::<String>::new());
}

/// The API requests made since `from`, as `METHOD path`, without the slice publisher's.
fn requests_since(node: &Node, from: usize) -> Vec<String> {
    node.api.requests()[from..]
        .iter()
        .filter(|r| !r.path.contains("resourceslices"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[tokio::test]
async fn a_channel_prepare_and_unprepare_cost_one_request_per_fact_they_need() {
    let node = Node::new();
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    for (name, device) in [("w1", "channel-0"), ("w2", "channel-1")] {
        node.api.put_claim(cdnode::claim(
            name,
            &format!("uid-{name}"),
            device,
            channel_config(DOMAIN, "Single"),
        ));
    }
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("the pool", || published(&node)).await;
    let claim = |name: &str| {
        format!("GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/{name}")
    };
    let get_node = format!("GET /api/v1/nodes/{NODE}");
    let patch_node = format!("PATCH /api/v1/nodes/{NODE}");
    let get_daemon = format!(
        "GET /apis/resource.nvidia.com/v1beta1/namespaces/{DRIVER_NAMESPACE}/computedomainnodes/{}",
        gpu_dra::compute_domain::api::compute_domain_node_name(DOMAIN, NODE)
    );

    let from = node.api.requests().len();
    prepare_one(&mut kubelet, "w1", "uid-w1").await.unwrap();
    let first = vec![
        claim("w1"),
        get_node.clone(),
        patch_node.clone(),
        get_daemon.clone(),
    ];
    assert_eq!(
        requests_since(&node, from),
        first,
        "first channel of the domain"
    );

    let from = node.api.requests().len();
    prepare_one(&mut kubelet, "w2", "uid-w2").await.unwrap();
    let second = vec![claim("w2"), get_node.clone(), get_daemon.clone()];
    assert_eq!(
        requests_since(&node, from),
        second,
        "the node is labelled already"
    );

    let from = node.api.requests().len();
    prepare_one(&mut kubelet, "w2", "uid-w2").await.unwrap();
    assert_eq!(
        requests_since(&node, from),
        Vec::<String>::new(),
        "prepared already"
    );

    // The label is the domain's until the domain is deleted: an unprepare asks nothing.
    for (name, uid) in [("w1", "uid-w1"), ("w2", "uid-w2")] {
        let from = node.api.requests().len();
        unprepare_one(&mut kubelet, name, uid).await;
        assert_eq!(requests_since(&node, from), Vec::<String>::new(), "{name}");
    }
}

/// What one call of `operation` cost on the request path (file system and checkpoint), as the
/// plugin counts it in `gpu_dra_request_path_costs_total`: the costs that grew during `call`.
async fn file_costs<F: std::future::Future<Output = ()>>(
    plugin: &plugin_support::Plugin,
    operation: &str,
    call: F,
) -> std::collections::BTreeMap<String, u64> {
    let scrape =
        || plugin_support::probe::request_path_costs(&plugin.log(), operation).unwrap_or_default();
    let (calls_before, before) = scrape();
    call.await;
    let (calls_after, after) = scrape();
    assert_eq!(
        calls_after - calls_before,
        1,
        "{operation}: one call counted"
    );
    after
        .into_iter()
        .map(|(cost, n)| (cost.clone(), n - before.get(&cost).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// House rule 15 for the second driver: what a channel prepare and unprepare cost on the
/// kubelet's request path is counted, so a change that adds an fsync, a re-read or a write
/// fails here, naming the cost. The state file is read once per call (no cache: channel
/// claims are one per pod) and written twice per claim, preparing then prepared.
#[tokio::test]
async fn a_channel_prepare_and_unprepare_cost_a_fixed_number_of_file_operations() {
    let node = Node::new();
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    node.api.put_claim(cdnode::claim(
        "w1",
        "uid-w1",
        "channel-0",
        channel_config(DOMAIN, "Single"),
    ));
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("the pool", || published(&node)).await;
    eventually("the metrics", || {
        plugin_support::probe::request_path_costs(&plugin.log(), "prepare")
    })
    .await;
    let costs = |pairs: &[(&str, u64)]| -> std::collections::BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };

    // A first prepare: no state file yet (nothing to parse); the record as preparing, the
    // device metadata file, the spec, the record as prepared. No fsync: a reboot
    // invalidates them all.
    let prepare = file_costs(&plugin, "prepare", async {
        prepare_one(&mut kubelet, "w1", "uid-w1").await.unwrap();
    })
    .await;
    assert_eq!(prepare, costs(&[("cdi_spec_write", 1), ("file_write", 4)]));
    // Prepared already: one read of the state, nothing written.
    let again = file_costs(&plugin, "prepare", async {
        prepare_one(&mut kubelet, "w1", "uid-w1").await.unwrap();
    })
    .await;
    assert_eq!(again, costs(&[("checkpoint_parse", 1)]));
    // Unprepare: one read, the spec, NVIDIA's `.yaml` name and the metadata directory
    // removed, one state write.
    let unprepare = file_costs(&plugin, "unprepare", async {
        unprepare_one(&mut kubelet, "w1", "uid-w1").await;
    })
    .await;
    assert_eq!(
        unprepare,
        costs(&[
            ("checkpoint_parse", 1),
            ("file_remove", 3),
            ("file_write", 1)
        ])
    );
}

#[tokio::test]
async fn a_channel_waiting_for_its_daemon_never_holds_up_the_daemons_own_claim() {
    let node = Node::new();
    node.api
        .put_compute_domain(compute_domain("team-a", "imex", DOMAIN));
    node.api.put_claim(cdnode::claim(
        "work",
        "uid-work",
        "channel-0",
        channel_config(DOMAIN, "Single"),
    ));
    node.api.put_claim(cdnode::claim(
        "d",
        "uid-d",
        "daemon-0",
        daemon_config(DOMAIN),
    ));
    let plugin = node.cd_start(30).await;
    let mut workload = plugin.register(DraApi::V1).await;
    let waiting = tokio::spawn(async move {
        let got = prepare_one(&mut workload, "work", "uid-work").await;
        (workload, got)
    });
    eventually("the node labelled", || {
        (label(&node).as_deref() == Some(DOMAIN)).then_some(())
    })
    .await;
    // The DaemonSet's pod lands on the labelled node; its claim is prepared at once, by the
    // same plugin, while the workload's prepare still waits.
    let mut daemon_pod = plugin.register(DraApi::V1).await;
    prepare_one(&mut daemon_pod, "d", "uid-d").await.unwrap();
    assert!(!waiting.is_finished());
    assert!(node.cd_config_dir(DOMAIN).join("config.cfg").exists());
    // The daemon starts with that config and reports Ready; the workload gets its channel.
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    let (_, got) = waiting.await.unwrap();
    assert_eq!(got.unwrap()[0].device_name, "channel-0");
}

/// A simulated host `nvidia-imex.service` on `ip` whose command service answers on
/// `<dir>/imex_ctrl.sock`; with `peer`, at full quorum with that absent peer (so it is
/// `WAITING_FOR_PEERS`), else alone and `READY`. Killed when dropped.
struct HostImex {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl HostImex {
    fn start(dir: &std::path::Path, ip: &str, peer: Option<&str>) -> HostImex {
        let (imex, _) = gpu_dra::compute_domain::imex::install_simulated(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-dra")),
            &dir.join("bin"),
        )
        .unwrap();
        let socket = dir.join("imex_ctrl.sock");
        let nodes: String = std::iter::once(ip)
            .chain(peer)
            .map(|n| format!("{n}\n"))
            .collect();
        std::fs::write(dir.join("nodes_config.cfg"), nodes).unwrap();
        let quorum = if peer.is_some() { "FULL" } else { "RECOVERY" };
        let config = dir.join("config.cfg");
        std::fs::write(
            &config,
            format!(
                "BIND_INTERFACE_IP={ip}\nIMEX_CMD_ENABLED=1\nIMEX_WAIT_FOR_QUORUM={quorum}\nIMEX_NODE_CONFIG_FILE={}\nIMEX_CMD_UNIX_DOMAIN_PATH={}\nLOG_FILE_NAME={}\n",
                dir.join("nodes_config.cfg").display(),
                socket.display(),
                dir.join("imex.log").display(),
            ),
        )
        .unwrap();
        let child = std::process::Command::new(imex)
            .arg("-c")
            .arg(&config)
            .spawn()
            .unwrap();
        HostImex { child, socket }
    }
}

impl Drop for HostImex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plugin in host-managed IMEX mode, asking the service at `socket`.
async fn host_managed_plugin(node: &Node, socket: &std::path::Path) -> plugin_support::Plugin {
    let mut command = node.cd_command(5);
    command
        .args(["--imex-mode", "HostManaged"])
        .arg("--imex-host-socket")
        .arg(socket);
    let mut plugin = node.cd_spawn(command, &[]);
    plugin.wait_registrable().await;
    plugin
}

fn channel_paths(node: &Node, uid: &str) -> Vec<String> {
    node.cd_spec(uid).expect("spec written")["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn host_managed_imex_gives_every_domain_channel_0_while_the_host_service_is_ready() {
    let files = tempfile::tempdir().unwrap();
    let service = HostImex::start(files.path(), "127.0.0.42", None);
    let node = Node::new();
    for (name, uid, device, domain, mode) in [
        ("a", "uid-a", "channel-0", DOMAIN, "Single"),
        ("b", "uid-b", "channel-3", OTHER_DOMAIN, "All"),
    ] {
        node.api.put_claim(cdnode::claim(
            name,
            uid,
            device,
            channel_config(domain, mode),
        ));
    }
    node.api.put_claim(cdnode::claim(
        "d",
        "uid-d",
        "daemon-0",
        daemon_config(DOMAIN),
    ));
    let plugin = host_managed_plugin(&node, &service.socket).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("the host socket", || service.socket.exists().then_some(())).await;

    // Two domains on one node, no ComputeDomainNode and no label: both get channel 0.
    let a = prepare_one(&mut kubelet, "a", "uid-a").await;
    let b = prepare_one(&mut kubelet, "b", "uid-b").await;
    assert_eq!(
        (
            a.map(|d| d[0].device_name.clone()),
            b.map(|d| d[0].device_name.clone())
        ),
        (Ok("channel-0".to_string()), Ok("channel-3".to_string())),
        "{}",
        plugin.log()
    );
    let channel_0 = vec!["/dev/nvidia-caps-imex-channels/channel0".to_string()];
    assert_eq!(
        (channel_paths(&node, "uid-a"), channel_paths(&node, "uid-b")),
        (channel_0.clone(), channel_0)
    );
    assert_eq!(label(&node), None, "no per-domain daemon is placed");
    let error = prepare_one(&mut kubelet, "d", "uid-d").await.unwrap_err();
    assert!(
        error.contains("is host-managed (--imex-mode HostManaged)")
            && error.contains("no IMEX daemon claim is prepared"),
        "{error}"
    );
    unprepare_one(&mut kubelet, "a", "uid-a").await;
    unprepare_one(&mut kubelet, "b", "uid-b").await;
    unprepare_one(&mut kubelet, "d", "uid-d").await;
    assert_eq!(node.cd_leftovers(), Vec::<String>::new());
}

#[tokio::test]
async fn host_managed_imex_refuses_a_channel_naming_the_host_service_and_the_fix() {
    let files = tempfile::tempdir().unwrap();
    let socket = files.path().join("imex_ctrl.sock");
    let node = Node::new();
    node.api.put_claim(cdnode::claim(
        "work",
        "uid-work",
        "channel-0",
        channel_config(DOMAIN, "Single"),
    ));
    let plugin = host_managed_plugin(&node, &socket).await;
    let mut kubelet = plugin.register(DraApi::V1).await;

    // No service at all.
    let error = prepare_one(&mut kubelet, "work", "uid-work")
        .await
        .unwrap_err();
    let fix = format!(
        "start the nvidia-imex service on the node (systemctl enable --now nvidia-imex) with \
         IMEX_CMD_ENABLED=1 and IMEX_CMD_UNIX_DOMAIN_PATH={}",
        socket.display()
    );
    for part in [
        format!(
            "IMEX on node {NODE} is host-managed (--imex-mode HostManaged), but the host's nvidia-imex service is not ready"
        ),
        format!("-q --u={}` answered UNAVAILABLE", socket.display()),
        fix.clone(),
    ] {
        assert!(error.contains(&part), "{part:?} missing in: {error}");
    }
    assert_eq!(node.cd_spec("uid-work"), None);

    // A service that runs but waits for a peer.
    let _service = HostImex::start(files.path(), "127.0.0.43", Some("127.0.0.44"));
    eventually("the host socket", || socket.exists().then_some(())).await;
    let error = prepare_one(&mut kubelet, "work", "uid-work")
        .await
        .unwrap_err();
    assert!(error.contains("answered WAITING_FOR_PEERS;"), "{error}");
    assert!(error.contains(&fix), "{error}");
    assert_eq!(node.cd_spec("uid-work"), None);
    assert_eq!(node.cd_leftovers(), Vec::<String>::new());
}
