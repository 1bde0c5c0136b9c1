//! The real plugin exports per-device telemetry labelled with the claim and pod that hold
//! each GPU and MIG device, follows a load set with `gpu-dra sim-fault load`, and counts an
//! injected double-bit ECC error. Runs on both backends (`GPU_DRA_TEST_GPU_BACKEND=nvml`:
//! the NVML backend over the simulated libnvidia-ml).

mod plugin_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims::{self, claim_ref};
use plugin_support::probe::{self, metrics_addr};
use plugin_support::{Node, Plugin, eventually};

/// The body of `/metrics`, or `None` when it cannot be read.
fn scrape(addr: SocketAddr) -> Option<String> {
    probe::get(addr, "/metrics").map(|(_, body)| body)
}

/// Every sample of `name`: its labels and value.
fn series(metrics: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let labels = labels
                .split("\",")
                .filter_map(|pair| {
                    let (k, v) = pair.split_once("=\"")?;
                    Some((k.to_string(), v.trim_end_matches('"').to_string()))
                })
                .collect();
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

/// The value of `name` for the series of `device` (held by `pod`), with `extra` labels.
fn value(metrics: &str, name: &str, device: &str, extra: &[(&str, &str)]) -> Option<f64> {
    series(metrics, name)
        .into_iter()
        .find(|(labels, _)| {
            labels.get("device").map(String::as_str) == Some(device)
                && extra
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
}

const FULL: &str = "gpu-2";
/// A 1g.10gb of GPU 0, published with every profile on every GPU (the default `split` gives
/// GPU 0 the one-slice variants): [`plugin_holding`] starts the plugin so.
const MIG: &str = "gpu-0-mig-1g10gb-2";

/// Starts the plugin sampling every second, with each (claim, UID, device) of `held`
/// allocated on the node and prepared; returns it with its `/metrics` address.
async fn plugin_holding(node: &Node, held: &[(&str, &str, &str)]) -> (Plugin, SocketAddr) {
    for (name, uid, device) in held {
        node.api.put_claim(claims::on_node(name, uid, &[device]));
    }
    let plugin = node
        .start_with(&[
            ("GPU_DRA_TELEMETRY_INTERVAL", "1"),
            ("GPU_DRA_MIG_PROFILES", "all"),
        ])
        .await;
    let addr = eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let refs: Vec<_> = held
        .iter()
        .map(|(name, uid, _)| claim_ref(name, uid))
        .collect();
    let prepared = kubelet.prepare(&refs).await.unwrap();
    assert!(prepared.values().all(Result::is_ok), "{prepared:?}");
    (plugin, addr)
}

#[tokio::test]
async fn prepared_devices_report_telemetry_labelled_with_their_pods_and_count_ecc_errors() {
    let node = Node::new();
    let (_plugin, addr) = plugin_holding(
        &node,
        &[
            ("training", "uid-full", FULL),
            ("inference", "uid-mig", MIG),
        ],
    )
    .await;
    node.sim_fault(&["load", "--gpu", "2", "--sm", "0.8", "--power", "550"]);

    let holder = |pod: &'static str, claim: &'static str| {
        [
            ("namespace", claims::NAMESPACE),
            ("claim", claim),
            ("pod", pod),
        ]
    };
    let full = holder("pod-training", "training");
    let mig = holder("pod-inference", "inference");
    let metrics = eventually("the load and both holders on /metrics", || {
        let m = scrape(addr)?;
        let loaded = value(&m, "gpu_dra_device_power_watts", FULL, &full) == Some(550.0);
        // The NVML backend's MIG figure (GPM) needs two samples of the instance.
        let mig_seen = value(&m, "gpu_dra_device_sm_active_ratio", MIG, &mig).is_some();
        (loaded && mig_seen).then_some(m)
    })
    .await;

    let total = value(&metrics, "gpu_dra_device_memory_total_bytes", FULL, &full).unwrap();
    // 80 % of the GPU's memory in use, in whole MiB as NVML counts it.
    let mib = 1024.0 * 1024.0;
    let busy_memory = ((total / mib) * 0.8).floor() * mib;
    let got_full = [
        value(&metrics, "gpu_dra_device_power_watts", FULL, &full),
        value(&metrics, "gpu_dra_device_power_limit_watts", FULL, &full),
        value(&metrics, "gpu_dra_device_sm_active_ratio", FULL, &full),
        value(&metrics, "gpu_dra_device_memory_used_bytes", FULL, &full),
    ];
    assert_eq!(
        got_full,
        [Some(550.0), Some(700.0), Some(0.8), Some(busy_memory)],
        "{metrics}"
    );
    let ecc = |m: &str, device, labels: &[(&str, &str)]| {
        let mut want = labels.to_vec();
        want.extend([("type", "double_bit"), ("scope", "volatile")]);
        value(m, "gpu_dra_device_ecc_errors_total", device, &want)
    };
    assert_eq!(ecc(&metrics, FULL, &full), Some(0.0));

    // The MIG device: its own memory and activity, its parent's power and ECC.
    let mig_memory = value(&metrics, "gpu_dra_device_memory_total_bytes", MIG, &mig).unwrap();
    assert!(
        mig_memory > 9.0 * 1024.0 * 1024.0 * 1024.0 && mig_memory < total / 7.0,
        "a 1g.10gb instance's memory, not the GPU's: {mig_memory}"
    );
    let used = value(&metrics, "gpu_dra_device_memory_used_bytes", MIG, &mig).unwrap();
    assert!(used > 0.0, "a carved MIG device runs a workload: {used}");
    let parent_power = value(&metrics, "gpu_dra_device_power_watts", "gpu-0", &[]);
    assert_eq!(
        value(&metrics, "gpu_dra_device_power_watts", MIG, &mig),
        parent_power
    );
    assert!(parent_power.unwrap() > 700.0 / 8.0, "{metrics}");
    // A carved instance runs the model's workload: 60 % (through GPM on the NVML backend).
    let mig_sm = value(&metrics, "gpu_dra_device_sm_active_ratio", MIG, &mig);
    assert_eq!(mig_sm, Some(0.6), "{metrics}");
    // NVML has no utilisation for a GPU in MIG mode: no figure, no series.
    assert_eq!(
        value(&metrics, "gpu_dra_device_sm_active_ratio", "gpu-0", &[]),
        None
    );
    assert_eq!(ecc(&metrics, MIG, &mig), Some(0.0));
    let profile = series(&metrics, "gpu_dra_device_power_watts")
        .into_iter()
        .find(|(l, _)| l["device"] == MIG)
        .map(|(l, _)| l["profile"].clone());
    assert_eq!(profile.as_deref(), Some("1g.10gb"));

    // Cardinality: the 8 GPUs and the one MIG device carved, not the node's hundreds of
    // published (uncarved) dynamic-MIG placements.
    let devices: std::collections::BTreeSet<String> =
        series(&metrics, "gpu_dra_device_memory_total_bytes")
            .into_iter()
            .map(|(l, _)| l["device"].clone())
            .collect();
    assert_eq!(devices.len(), 9, "{devices:?}");
    assert!(devices.contains(MIG));

    // A free GPU: empty holder labels.
    assert!(
        value(
            &metrics,
            "gpu_dra_device_power_watts",
            "gpu-5",
            &[("namespace", ""), ("claim", ""), ("pod", "")]
        )
        .is_some(),
        "{metrics}"
    );

    node.sim_fault(&["ecc", "--gpu", "0", "--double-bit"]);
    let after = eventually("the double-bit error counted", || {
        let m = scrape(addr)?;
        (ecc(&m, MIG, &mig) == Some(1.0)).then_some(m)
    })
    .await;
    assert_eq!(ecc(&after, "gpu-0", &[]), Some(1.0));
    // The XID 48 a double-bit error raises is the whole GPU's: the parent counts it, the
    // MIG device (which counts its own instance's XIDs only) does not.
    let xid48 = |device| value(&after, XID, device, &[("xid", "48")]);
    assert_eq!((xid48("gpu-0"), xid48(MIG)), (Some(1.0), None), "{after}");
}

const XID: &str = "gpu_dra_device_xid_errors_total";

/// The GPU instance id of the MIG device at `start` on GPU `gpu`, as the simulated node
/// the plugin runs on (either backend) holds it.
fn gpu_instance_at(node: &Node, gpu: u32, start: u32) -> u32 {
    let sim = gpu_dra::hardware::sim::SimBackend::open_state_dir(&node.state_dir().join("sim"))
        .expect("the simulated node's state");
    let inventory = gpu_dra::hardware::GpuBackend::inventory(&sim).expect("inventory");
    inventory
        .gpus
        .iter()
        .find(|g| g.index == gpu)
        .and_then(|g| g.mig_devices.iter().find(|d| d.placement.start == start))
        .expect("the carved MIG device")
        .gi_id
}

#[tokio::test]
async fn a_mig_scoped_xid_counts_for_its_mig_device_and_the_parent_and_a_gpu_wide_one_for_the_parent_only()
 {
    const OTHER: &str = "gpu-0-mig-1g10gb-3";
    let node = Node::new();
    let (_plugin, addr) = plugin_holding(
        &node,
        &[("hit", "uid-hit", MIG), ("spared", "uid-spared", OTHER)],
    )
    .await;
    // Counting starts with the plugin's first sample of the carved devices.
    eventually("both MIG devices on /metrics", || {
        let m = scrape(addr)?;
        let rows =
            [MIG, OTHER].map(|d| value(&m, "gpu_dra_device_memory_total_bytes", d, &[]).is_some());
        (rows == [true, true]).then_some(())
    })
    .await;

    let gi = gpu_instance_at(&node, 0, 2).to_string();
    node.sim_fault(&["xid", "--gpu", "0", "--code", "31", "--gpu-instance", &gi]);
    node.sim_fault(&["xid", "--gpu", "0", "--code", "43"]);
    let metrics = eventually("both XIDs counted on the parent", || {
        let m = scrape(addr)?;
        let parent = ["31", "43"].map(|x| value(&m, XID, "gpu-0", &[("xid", x)]));
        (parent == [Some(1.0), Some(1.0)]).then_some(m)
    })
    .await;
    let xids = |device| -> Vec<(String, f64)> {
        series(&metrics, XID)
            .into_iter()
            .filter(|(l, _)| l["device"] == device)
            .map(|(l, v)| (l["xid"].clone(), v))
            .collect()
    };
    assert_eq!(xids(MIG), [("31".to_string(), 1.0)], "{metrics}");
    assert_eq!(xids(OTHER), [], "another instance of the same GPU");
    assert_eq!(xids("gpu-1"), [], "another GPU");
    // The MIG series carries its holder: the error is the pod's.
    let holder = series(&metrics, XID)
        .into_iter()
        .find(|(l, _)| l["device"] == MIG)
        .map(|(l, _)| (l["claim"].clone(), l["pod"].clone()));
    assert_eq!(
        holder,
        Some(("hit".to_string(), "pod-hit".to_string())),
        "{metrics}"
    );
}

/// The pods labelling the full GPU's telemetry series, sorted.
fn pods_of_full_gpu(metrics: &str) -> Vec<String> {
    let mut pods: Vec<String> = series(metrics, "gpu_dra_device_power_watts")
        .into_iter()
        .filter(|(l, _)| l["device"] == FULL)
        .map(|(l, _)| l["pod"].clone())
        .collect();
    pods.sort();
    pods
}

#[tokio::test]
async fn a_pod_that_joins_a_shared_claim_is_labelled_once_the_kubelet_prepares_it_for_that_pod() {
    let node = Node::new();
    let mut claim = claims::on_node("shared", "uid-shared", &[FULL]);
    node.api.put_claim(claim.clone());
    let plugin = node
        .start_with(&[("GPU_DRA_TELEMETRY_INTERVAL", "1")])
        .await;
    let addr = eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let shared = claim_ref("shared", "uid-shared");
    let first = kubelet
        .prepare(std::slice::from_ref(&shared))
        .await
        .unwrap();
    assert!(first["uid-shared"].is_ok());
    eventually("the first pod on /metrics", || {
        (pods_of_full_gpu(&scrape(addr)?) == ["pod-shared"]).then_some(())
    })
    .await;

    // The scheduler reserves the claim for a second pod; the kubelet prepares it for that pod.
    claim["status"]["reservedFor"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"resource": "pods", "name": "pod-second", "uid": "pod-uid-2"}));
    node.api.put_claim(claim);
    let again = kubelet
        .prepare(std::slice::from_ref(&shared))
        .await
        .unwrap();
    assert!(again["uid-shared"].is_ok());
    eventually("both pods on /metrics", || {
        (pods_of_full_gpu(&scrape(addr)?) == ["pod-second", "pod-shared"]).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_pod_that_leaves_a_shared_claim_leaves_the_labels_within_the_refresh_interval() {
    let node = Node::new();
    let mut claim = claims::on_node("shared", "uid-shared", &[FULL]);
    claim["status"]["reservedFor"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"resource": "pods", "name": "pod-second", "uid": "pod-uid-2"}));
    node.api.put_claim(claim.clone());
    let plugin = node
        .start_with(&[
            ("GPU_DRA_TELEMETRY_INTERVAL", "1"),
            ("GPU_DRA_HOLDERS_REFRESH_INTERVAL", "1s"),
        ])
        .await;
    let addr = eventually("the metrics address", || metrics_addr(&plugin.log())).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let shared = claim_ref("shared", "uid-shared");
    let prepared = kubelet
        .prepare(std::slice::from_ref(&shared))
        .await
        .unwrap();
    assert!(prepared["uid-shared"].is_ok());
    eventually("both pods on /metrics", || {
        (pods_of_full_gpu(&scrape(addr)?) == ["pod-second", "pod-shared"]).then_some(())
    })
    .await;

    // The first pod ends: the controller drops it from reservedFor; the kubelet calls nothing.
    claim["status"]["reservedFor"]
        .as_array_mut()
        .unwrap()
        .retain(|r| r["name"] != "pod-shared");
    node.api.put_claim(claim);
    eventually("only the remaining pod on /metrics", || {
        (pods_of_full_gpu(&scrape(addr)?) == ["pod-second"]).then_some(())
    })
    .await;
    // Nothing was unprepared: the device is still held by the claim.
    let metrics = scrape(addr).unwrap();
    assert!(
        value(
            &metrics,
            "gpu_dra_device_power_watts",
            FULL,
            &[("claim", "shared"), ("pod", "pod-second")]
        )
        .is_some(),
        "{metrics}"
    );
}
