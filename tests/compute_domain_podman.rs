//! The compute-domain plugin's CDI specs through a real container runtime (podman + runc,
//! the reference CDI library), with the CDI IDs exactly as the plugin returned them: a
//! workload container sees its IMEX channel's device node and no other, and the IMEX daemon's
//! container sees the domain's config directory at `/etc/nvidia-imex` and its environment.
//!
//! Needs podman, runc, busybox-static and root, as `tests/cdi_podman.rs`; elsewhere each test
//! skips with one line, and under `CI=true` a missing tool fails it.

mod plugin_support;
mod podman_support;

use std::time::{SystemTime, UNIX_EPOCH};

use gpu_dra::compute_domain::plugin::cdi::SIM_IMEX_CHANNELS_MAJOR;
use gpu_dra::kubelet::client::DraApi;
use plugin_support::Node;
use plugin_support::cdnode::{
    self, CLIQUE, channel_config, compute_domain, daemon_config, domain_node,
};
use plugin_support::claims::{NODE, claim_ref};
use podman_support::{InstalledSpecs, podman_or_skip};

const DOMAIN: &str = "0a1b2c3d-0000-1111-2222-333344445555";

/// A claim UID unique to this run: the runtime reads every spec in `/etc/cdi`.
fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("p{}-{nanos}-{name}", std::process::id())
}

#[tokio::test]
async fn a_workload_gets_its_channel_node_and_the_daemon_its_config_dir_and_environment() {
    if podman_or_skip().is_none() {
        return;
    }
    let node = Node::new();
    node.api
        .put_compute_domain(compute_domain("team-a", "imex", DOMAIN));
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    let (work, daemon) = (unique("work"), unique("daemon"));
    node.api.put_claim(cdnode::claim(
        "work",
        &work,
        "channel-3",
        channel_config(DOMAIN, "Single"),
    ));
    node.api.put_claim(cdnode::claim(
        "daemon",
        &daemon,
        "daemon-0",
        daemon_config(DOMAIN),
    ));
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("work", &work), claim_ref("daemon", &daemon)])
        .await
        .unwrap();
    let ids = |uid: &str| match &got[uid] {
        Ok(devices) => devices[0].cdi_device_ids.clone(),
        Err(e) => panic!("prepare of {uid}: {e}\n{}", plugin.log()),
    };
    let _installed = InstalledSpecs::install(&node.cdi_root());

    let inside = podman_support::run(&ids(&work), &[]);
    let channels: Vec<_> = inside
        .nvidia_nodes
        .iter()
        .filter(|(path, _)| path.starts_with("/dev/nvidia-caps-imex-channels/"))
        .collect();
    assert_eq!(channels.len(), 1, "{inside:#?}");
    let (path, channel) = channels[0];
    assert_eq!(path, "/dev/nvidia-caps-imex-channels/channel3");
    assert_eq!(
        (
            channel.kind.as_str(),
            channel.major,
            channel.minor,
            channel.mode
        ),
        ("character special file", SIM_IMEX_CHANNELS_MAJOR, 3, 0o666)
    );

    let inside = podman_support::run(&ids(&daemon), &["/etc/nvidia-imex"]);
    assert!(inside.mount_points.iter().any(|m| m == "/etc/nvidia-imex"));
    let config = &inside.contents["/etc/nvidia-imex/config.cfg"];
    assert!(config.contains("IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg"));
    assert_eq!(
        inside.contents["/etc/nvidia-imex/nodes_config.cfg"].trim(),
        "10.0.0.1"
    );
    for (key, value) in [
        ("COMPUTE_DOMAIN_UUID", DOMAIN),
        ("COMPUTE_DOMAIN_NAME", "imex"),
        ("COMPUTE_DOMAIN_NAMESPACE", "team-a"),
        ("CLIQUE_ID", CLIQUE),
        ("IMEX_CONFIG_DIR", "/etc/nvidia-imex"),
    ] {
        assert_eq!(
            inside.env.get(key).map(String::as_str),
            Some(value),
            "{key}"
        );
    }
    assert!(
        !inside
            .nvidia_nodes
            .keys()
            .any(|p| p.starts_with("/dev/nvidia-caps-imex-channels/")),
        "the daemon's container gets no channel"
    );
}

#[tokio::test]
async fn two_pods_of_a_domain_sharing_channel_0_each_see_channel0_through_their_share_named_cdi_ids()
 {
    if podman_or_skip().is_none() {
        return;
    }
    let node = Node::new();
    node.api
        .put_domain_node(domain_node(DOMAIN, NODE, CLIQUE, 0, "10.0.0.1", true));
    let pods = [
        (unique("pod-a"), "7d2f9c1e-0b4a-4e6f-8a3d-5c1b2e9f0a11"),
        (unique("pod-b"), "7d2f9c1e-0b4a-4e6f-8a3d-5c1b2e9f0a22"),
    ];
    for (uid, share) in &pods {
        let mut claim = cdnode::claim(uid, uid, "channel-0", channel_config(DOMAIN, "Single"));
        // The scheduler's share of a device with allowMultipleAllocations.
        claim["status"]["allocation"]["devices"]["results"][0]["shareID"] = (*share).into();
        node.api.put_claim(claim);
    }
    let plugin = node.cd_start(5).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let refs: Vec<_> = pods.iter().map(|(uid, _)| claim_ref(uid, uid)).collect();
    let got = kubelet.prepare(&refs).await.unwrap();
    let _installed = InstalledSpecs::install(&node.cdi_root());
    for (uid, share) in &pods {
        let ids = match &got[uid] {
            Ok(devices) => devices[0].cdi_device_ids.clone(),
            Err(e) => panic!("prepare of {uid}: {e}\n{}", plugin.log()),
        };
        assert!(ids[0].ends_with(&format!("-channel-0-{share}")), "{ids:?}");
        let inside = podman_support::run(&ids, &[]);
        let channels: Vec<(&String, u32)> = inside
            .nvidia_nodes
            .iter()
            .filter(|(path, _)| path.starts_with("/dev/nvidia-caps-imex-channels/"))
            .map(|(path, node)| (path, node.minor))
            .collect();
        let want = "/dev/nvidia-caps-imex-channels/channel0".to_string();
        assert_eq!(channels, vec![(&want, 0)], "{uid}: {inside:#?}");
    }
}
