//! The plugin process as a whole: what it sends the API server, how it copes with garbage on
//! its sockets, and how it ends.

mod plugin_support;

use std::collections::BTreeSet;
use std::time::Duration;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::apiserver::{NODE_UID, Recorded, SLICES};
use plugin_support::claims::{self, DRIVER, NODE, claim_ref};
use plugin_support::{Node, SIGTERM, eventually};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every device name in the published slices.
fn published_devices(slices: &[Value]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
}

fn line(r: &Recorded) -> String {
    let query: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{} {}?{}", r.method, r.path, query.join("&"))
}

#[tokio::test]
async fn slices_are_published_once_owned_by_the_node_and_not_rewritten_at_steady_state() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("mig", "uid-mig", &["gpu-3-mig-2g20gb-2"]));
    node.api
        .put_claim(claims::on_node("full", "uid-full", &["gpu-5"]));
    let plugin = node.start().await;
    let slices = eventually("the first publish", || node.api.complete_pool()).await;
    // The default `--mig-profiles split` shares the MIG placements out: GPU 0 the one-slice
    // variants (12), GPUs 1-2 3g/4g (4), GPUs 3-4 2g and a 1g.10gb (5), GPUs 5-7 1g.10gb (8),
    // each with its 7g.80gb, plus each full GPU.
    let per_gpu = [13, 5, 5, 6, 6, 9, 9, 9];
    assert_eq!(62, published_devices(&slices).len(), "devices published");

    let devices = published_devices(&slices);
    let unique: BTreeSet<&String> = devices.iter().collect();
    assert_eq!(devices.len(), unique.len(), "device names are unique");
    for (gpu, want) in per_gpu.into_iter().enumerate() {
        let of_gpu = devices
            .iter()
            .filter(|d| *d == &format!("gpu-{gpu}") || d.starts_with(&format!("gpu-{gpu}-")))
            .count();
        assert_eq!(want, of_gpu, "devices of GPU {gpu}");
    }
    let owner = json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID,
                        "controller": true}]);
    for slice in &slices {
        let name = &slice["metadata"]["name"];
        assert_eq!(
            owner, slice["metadata"]["ownerReferences"],
            "owner of {name}"
        );
        assert_eq!(json!(NODE), slice["spec"]["nodeName"], "node of {name}");
        assert_eq!(json!(DRIVER), slice["spec"]["driver"], "driver of {name}");
        assert_eq!(json!(NODE), slice["spec"]["pool"]["name"], "pool of {name}");
        assert_eq!(
            json!(1),
            slice["spec"]["pool"]["generation"],
            "generation of {name}"
        );
    }

    // What kube's client sent to get there: the Node once, one filtered list, then creates.
    let startup: Vec<String> = node.api.requests().iter().map(line).collect();
    let mut want = vec![
        format!("GET /api/v1/nodes/{NODE}?"),
        format!("GET {SLICES}?fieldSelector=spec.nodeName={NODE},spec.driver={DRIVER}"),
    ];
    want.extend((0..slices.len()).map(|_| format!("POST {SLICES}?fieldManager=gpu-dra")));
    assert_eq!(want, startup);

    // Prepares and unprepares change the hardware (a MIG device carved, MIG mode switched
    // off for a whole GPU) but never the published devices; several inventory rounds pass.
    let mut kubelet = plugin.register(DraApi::V1).await;
    let both = [claim_ref("mig", "uid-mig"), claim_ref("full", "uid-full")];
    let prepared = kubelet.prepare(&both).await.unwrap();
    assert!(prepared.values().all(Result::is_ok), "{prepared:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    kubelet.unprepare(&both).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut later: Vec<String> = node.api.requests()[startup.len()..]
        .iter()
        .map(line)
        .collect();
    let read = |name: &str| {
        format!(
            "GET /apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{name}?",
            claims::NAMESPACE
        )
    };
    let write_status = |name: &str| {
        format!(
            "PUT /apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{name}/status?fieldManager=gpu-dra",
            claims::NAMESPACE
        )
    };
    // Each claim is read once, for prepare; its status.devices is written after the prepare
    // from that read, and after the unprepare from what that write returned (in no set
    // order between claims).
    let mut claim_traffic = Vec::new();
    for name in ["mig", "full"] {
        claim_traffic.extend([read(name), write_status(name)]);
        claim_traffic.push(write_status(name));
    }
    // The kubelet's registration makes the publisher look at the slices twice (a starting
    // kubelet deletes them, just before or just after it registers the plugin): two LISTs,
    // no write.
    claim_traffic.extend(
        [0, 1].map(|_| {
            format!("GET {SLICES}?fieldSelector=spec.nodeName={NODE},spec.driver={DRIVER}")
        }),
    );
    claim_traffic.sort();
    later.sort();
    assert_eq!(
        claim_traffic, later,
        "at steady state only claims are read and their status written (and the slices \
         listed after a registration)"
    );
}

/// Writes `bytes` to the Unix socket at `path`, closes the write side and reads whatever the
/// server says until it hangs up.
async fn scribble(path: &std::path::Path, bytes: &[u8]) -> Vec<u8> {
    let mut stream = tokio::net::UnixStream::connect(path).await.unwrap();
    // The server may hang up before reading everything; that is its right.
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer));
    assert!(
        read.await.is_ok(),
        "the server kept a garbage connection open"
    );
    answer
}

fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

#[tokio::test]
async fn garbage_on_both_sockets_is_dropped_and_the_plugin_keeps_serving() {
    let node = Node::new();
    node.api.put_claim(claims::on_node(
        "after",
        "uid-after",
        &["gpu-1-mig-1g10gb-0"],
    ));
    // Every profile on every GPU: the default `split` gives GPU 1 no 1g.10gb.
    let mut plugin = node.start_with(&[("GPU_DRA_MIG_PROFILES", "all")]).await;
    let mut prefaced = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    prefaced.extend(noise(4096, 7));
    let garbage: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &noise(65536, 42),
        &prefaced,
        b"",
    ];
    for socket in [node.registration_socket(), node.dra_socket()] {
        for bytes in garbage {
            scribble(&socket, bytes).await;
        }
    }
    assert!(plugin.is_running(), "{}", plugin.log());
    let before = node.snapshot();
    assert!(before.checkpoint.is_empty() && before.cdi_files.is_empty());

    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claim_ref("after", "uid-after");
    let got = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert!(got["uid-after"].is_ok(), "{got:?}");
    node.snapshot()
        .assert_converged(&["uid-after"], "after the garbage");
    kubelet.unprepare(&[claim]).await.unwrap();
    node.snapshot().assert_converged(&[], "after unprepare");
}

#[tokio::test]
async fn sigterm_ends_the_plugin_cleanly_and_removes_its_sockets() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("kept", "uid-kept", &["gpu-4-mig-7g80gb-0"]));
    let mut plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("kept", "uid-kept")])
        .await
        .unwrap();
    assert!(got["uid-kept"].is_ok(), "{got:?}");
    let prepared = node.snapshot();
    assert!(node.registration_socket().exists() && node.dra_socket().exists());
    // A current kubelet keeps a health stream open; shutting down must end it, not wait on it.
    let mut health = kubelet.watch_health().await.unwrap();
    let first = health.next().await.unwrap().unwrap();
    // 62: the devices the default `--mig-profiles split` publishes.
    assert_eq!(62, first.len(), "one health entry per published device");

    // Publishing runs beside registration: wait for it, so "slices stay" below means
    // something on a loaded machine.
    eventually("the slices to be published", || {
        node.api.complete_pool().map(drop)
    })
    .await;
    plugin.signal(SIGTERM);
    let status = plugin.wait_exit().await;
    assert_eq!(Some(0), status.code(), "exit status\n{}", plugin.log());
    assert!(
        !matches!(health.next().await, Ok(Some(_))),
        "the health stream ended"
    );
    assert!(
        !node.registration_socket().exists(),
        "registration socket left"
    );
    assert!(!node.dra_socket().exists(), "DRA socket left");
    assert_eq!(
        prepared,
        node.snapshot(),
        "a prepared claim outlives the plugin: hardware, checkpoint and spec stay"
    );
    assert!(
        !node.api.slices().is_empty(),
        "slices stay for the next start"
    );

    // The next start picks up where this one stopped: the claim can still be unprepared.
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1beta1).await;
    kubelet
        .unprepare(&[claim_ref("kept", "uid-kept")])
        .await
        .unwrap();
    node.snapshot().assert_converged(&[], "after the restart");
}
