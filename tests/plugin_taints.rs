//! GPU health into the ResourceSlices: faults injected with `gpu-dra sim-fault` become device
//! taints (`gpu.nvidia.com/unhealthy=<cause>:<effect>`) on the GPU and all its MIG placements
//! within a fraction of a second, recovery removes them, a degraded GPU clears after its
//! hold-down, a MIG-scoped XID taints only its MIG device, GPUs added at run time appear and
//! are watched for faults, and a prepared device whose GPU is gone stays published, tainted,
//! until it is unprepared.
//! Runs on both backends (`GPU_DRA_TEST_GPU_BACKEND=nvml`).

mod plugin_support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_dra::kubelet::client::DraApi;
use plugin_support::{Node, claims, eventually, probe};
use serde_json::Value;

const KEY: &str = "gpu.nvidia.com/unhealthy";

/// Every published device by name, once the pool is complete and all its slices are of one
/// generation (a change rewrites every slice with the next generation).
fn devices(node: &Node) -> Option<BTreeMap<String, Value>> {
    let pool = node.api.complete_pool()?;
    let generation = &pool[0]["spec"]["pool"]["generation"];
    if pool
        .iter()
        .any(|s| &s["spec"]["pool"]["generation"] != generation)
    {
        return None;
    }
    Some(
        pool.iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .map(|d| (d["name"].as_str().unwrap().to_string(), d))
            .collect(),
    )
}

/// `(value, effect)` of each device's health taint, for the devices that have one.
fn taints(devices: &BTreeMap<String, Value>) -> BTreeMap<String, (String, String)> {
    devices
        .iter()
        .filter_map(|(name, d)| {
            let t = d["taints"]
                .as_array()?
                .iter()
                .find(|t| t["key"] == KEY)?
                .clone();
            Some((
                name.clone(),
                (
                    t["value"].as_str().unwrap_or("").to_string(),
                    t["effect"].as_str().unwrap_or("").to_string(),
                ),
            ))
        })
        .collect()
}

fn gpu_dra_repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn names_of_gpu<'a>(devices: &'a BTreeMap<String, Value>, gpu: &str) -> Vec<&'a String> {
    devices
        .keys()
        .filter(|n| *n == gpu || n.starts_with(&format!("{gpu}-")))
        .collect()
}

/// Slice writes (create, update, delete) so far.
fn slice_writes(node: &Node) -> usize {
    node.api
        .requests()
        .iter()
        .filter(|r| r.path.contains("resourceslices") && r.method != "GET")
        .count()
}

#[tokio::test]
async fn a_critical_xid_taints_the_gpu_and_its_placements_at_once_and_a_reset_clears_them() {
    let node = Node::new();
    let plugin = node.start().await;
    let all = eventually("the first slices", || devices(&node)).await;
    assert!(taints(&all).is_empty(), "a healthy node has no taints");
    let gpu2 = names_of_gpu(&all, "gpu-2").len();
    assert!(gpu2 > 1, "gpu-2 has MIG placements: {gpu2}");

    let started = Instant::now();
    node.sim_fault(&["xid", "--gpu", "2", "--code", "79"]);
    let tainted = eventually("gpu-2's taints", || {
        let t = taints(&devices(&node)?);
        (t.len() == gpu2).then_some(t)
    })
    .await;
    let latency = started.elapsed();
    eprintln!("fault to published taint: {latency:?}");
    for (name, (value, effect)) in &tainted {
        assert!(name.starts_with("gpu-2"), "only gpu-2's devices: {name}");
        assert_eq!(
            (value.as_str(), effect.as_str()),
            ("xid-79", "NoExecute"),
            "{name}"
        );
    }
    let now = devices(&node).unwrap();
    let time_added = now["gpu-2"]["taints"][0]["timeAdded"].clone();
    assert!(time_added.is_string(), "timeAdded is set: {}", now["gpu-2"]);

    // Steady state: nothing new happens, so nothing is written.
    let writes = slice_writes(&node);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(writes, slice_writes(&node), "no writes at steady state");
    assert_eq!(
        devices(&node).unwrap()["gpu-2"]["taints"][0]["timeAdded"],
        time_added
    );

    let log_addr = probe::metrics_addr(&plugin.log()).expect("metrics address");
    let (_, metrics) = probe::get(log_addr, "/metrics").expect("scrape");
    assert!(
        metrics.contains("gpu_dra_health_transitions_total{from=\"healthy\",to=\"failed\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_dra_gpus{state=\"failed\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "gpu_dra_tainted_devices{{effect=\"NoExecute\"}} {gpu2}"
        )),
        "{metrics}"
    );

    // `explain` names the taint as the reason gpu-2 is skipped, and a toleration lets a
    // diagnostics claim have it.
    let slices: Vec<Value> = node.api.slices().into_values().collect();
    let slices_file = node.root().join("slices.json");
    std::fs::write(
        &slices_file,
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": slices}).to_string(),
    )
    .unwrap();
    let example = gpu_dra_repo().join("examples/diagnostics/tolerate-unhealthy-gpu.yaml");
    let explain = |tolerate: bool| {
        let claim = if tolerate {
            example.clone()
        } else {
            // The example without its toleration.
            let text = std::fs::read_to_string(&example).unwrap();
            let cut: String = text
                .lines()
                .filter(|l| {
                    !l.contains("tolerations:")
                        && !l.contains("gpu.nvidia.com/unhealthy")
                        && !l.contains("operator: Exists")
                })
                .map(|l| format!("{l}\n"))
                .collect();
            let path = node.root().join("claim-without-toleration.yaml");
            std::fs::write(&path, cut).unwrap();
            path
        };
        Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
            .arg("explain")
            .arg("--claim")
            .arg(&claim)
            .arg("--slices")
            .arg(&slices_file)
            .output()
            .unwrap()
    };
    let refused = explain(false);
    let text = String::from_utf8_lossy(&refused.stdout);
    assert_eq!(
        refused.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        text.contains("taint gpu.nvidia.com/unhealthy=xid-79:NoExecute not tolerated"),
        "{text}"
    );
    let tolerated = explain(true);
    assert_eq!(
        tolerated.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&tolerated.stdout),
        String::from_utf8_lossy(&tolerated.stderr)
    );

    node.sim_fault(&["recover", "--gpu", "2"]);
    eventually("the taints to go", || {
        taints(&devices(&node)?).is_empty().then_some(())
    })
    .await;
    assert!(
        plugin.log().contains("GPU health changed"),
        "{}",
        plugin.log()
    );
}

#[tokio::test]
async fn a_policy_file_sets_effects_and_a_degraded_gpu_clears_after_its_hold_down() {
    let node = Node::new();
    let policy = node.root().join("health-policy.yaml");
    std::fs::write(
        &policy,
        "effects: {degraded: NoSchedule, failed: None}\nholdDown: 2s\nxid: {degraded: [31]}\n",
    )
    .unwrap();
    let mut command = node.command();
    command.arg("--health-policy").arg(&policy);
    let mut plugin = node.spawn_command(command, &[]);
    plugin.wait_registrable().await;
    eventually("the first slices", || devices(&node)).await;

    node.sim_fault(&["xid", "--gpu", "4", "--code", "31"]);
    let t = eventually("a degraded taint", || {
        let t = taints(&devices(&node)?);
        (!t.is_empty()).then_some(t)
    })
    .await;
    assert_eq!(t["gpu-4"], ("xid-31".to_string(), "NoSchedule".to_string()));
    eventually("the hold-down to end", || {
        taints(&devices(&node)?).is_empty().then_some(())
    })
    .await;

    node.sim_fault(&["ecc", "--gpu", "5", "--double-bit"]);
    let t = eventually("a failed taint", || {
        let t = taints(&devices(&node)?);
        (!t.is_empty()).then_some(t)
    })
    .await;
    assert_eq!(
        t["gpu-5"],
        ("ecc-double-bit".to_string(), "None".to_string()),
        "the policy made failed informational"
    );

    // A bad policy is refused at start, naming the field, the value and the choices.
    let bad = node.root().join("bad-policy.yaml");
    std::fs::write(&bad, "effects: {failed: Evict}\n").unwrap();
    let out = node
        .command()
        .arg("--health-policy")
        .arg(&bad)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("effects.failed")
            && err.contains("\"Evict\"")
            && err.contains("None, NoSchedule, NoExecute"),
        "{err}"
    );
    plugin.kill().await;
}

/// The GPU instance id of the MIG device the simulator holds on GPU `gpu` at `start`.
fn gi_at(node: &Node, gpu: usize, start: u64) -> u64 {
    let text = std::fs::read_to_string(node.state_dir().join("sim/sim-gpu-state.json"))
        .expect("sim state");
    let v: Value = serde_json::from_str(&text).unwrap();
    let state = if v.get("state").is_some() {
        &v["state"]
    } else {
        &v
    };
    state["gpus"][gpu]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["start"] == start)
        .expect("the carved instance")["giId"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn a_mig_scoped_xid_taints_only_its_mig_device() {
    let node = Node::new();
    node.api.put_claim(claims::on_node(
        "inference",
        "uid-mig",
        &["gpu-0-mig-3g40gb-4"],
    ));
    // Every profile on every GPU: the default `split` gives GPU 0 no 3g.40gb.
    let plugin = node.start_with(&[("GPU_DRA_MIG_PROFILES", "all")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    kubelet
        .prepare(&[claims::claim_ref("inference", "uid-mig")])
        .await
        .unwrap()["uid-mig"]
        .as_ref()
        .expect("prepared");
    let gi = gi_at(&node, 0, 4).to_string();
    node.sim_fault(&["xid", "--gpu", "0", "--code", "94", "--gpu-instance", &gi]);
    let t = eventually("the MIG device's taint", || {
        let t = taints(&devices(&node)?);
        (!t.is_empty()).then_some(t)
    })
    .await;
    assert_eq!(
        t.keys().collect::<Vec<_>>(),
        ["gpu-0-mig-3g40gb-4"],
        "only the MIG device NVML named"
    );
    assert_eq!(t["gpu-0-mig-3g40gb-4"].0, "xid-94");

    // An unknown GPU instance is refused with the ones that exist.
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["sim-fault", "--state-dir"])
        .arg(node.state_dir())
        .args(["xid", "--gpu", "0", "--code", "94", "--gpu-instance", "99"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("--gpu-instance")
            && err.contains("no GPU instance 99"),
        "{err}"
    );
}

#[tokio::test]
async fn gpus_added_at_run_time_appear_and_a_prepared_device_of_a_removed_gpu_stays_tainted() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("training", "uid-full", &["gpu-6"]));
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claims::claim_ref("training", "uid-full");
    kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap()["uid-full"]
        .as_ref()
        .expect("prepared");
    eventually("the first slices", || devices(&node)).await;

    let printed = node.sim_fault(&["add-gpu", "--model", "H100-SXM5-80GB"]);
    assert!(printed.contains("added GPU 8"), "{printed}");
    eventually("the added GPU", || {
        devices(&node)?.contains_key("gpu-8").then_some(())
    })
    .await;

    node.sim_fault(&["remove-gpu", "--gpu", "6"]);
    let t = eventually("the held device, tainted", || {
        let d = devices(&node)?;
        let t = taints(&d);
        (t.contains_key("gpu-6") && !d.contains_key("gpu-6-mig-1g10gb-0")).then_some(t)
    })
    .await;
    assert_eq!(
        t["gpu-6"],
        ("gpu-gone".to_string(), "NoExecute".to_string())
    );
    assert_eq!(t.len(), 1, "only the held device is kept: {t:?}");
    let d = devices(&node).unwrap();
    assert!(
        d["gpu-6"]
            .get("consumesCounters")
            .is_none_or(Value::is_null),
        "{}",
        d["gpu-6"]
    );

    kubelet.unprepare(&[claim]).await.unwrap()["uid-full"]
        .as_ref()
        .expect("unprepared");
    eventually("the gone GPU's device to go", || {
        (!devices(&node)?.contains_key("gpu-6")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_gpu_added_at_run_time_is_watched_for_faults() {
    let node = Node::new();
    let plugin = node.start().await;
    eventually("the first slices", || devices(&node)).await;
    node.sim_fault(&["add-gpu", "--model", "H100-SXM5-80GB"]);
    eventually("the added GPU", || {
        devices(&node)?.contains_key("gpu-8").then_some(())
    })
    .await;
    if plugin_support::nvml_backend() {
        // NVML does not replay events to a set that registers a GPU later: the event thread
        // registers it after the wait during which the inventory listed it (at most 5 s).
        eventually("gpu 8 registered for NVML events", || {
            plugin
                .log()
                .lines()
                .any(|l| l.contains("watching NVML events") && l.contains("gpu=8"))
                .then_some(())
        })
        .await;
    }
    node.sim_fault(&["xid", "--gpu", "8", "--code", "79"]);
    let t = eventually("the added GPU's taint", || {
        let t = taints(&devices(&node)?);
        t.contains_key("gpu-8").then_some(t)
    })
    .await;
    assert_eq!(t["gpu-8"], ("xid-79".to_string(), "NoExecute".to_string()));
    assert!(
        t.keys().all(|name| name.starts_with("gpu-8")),
        "only the added GPU's devices: {t:?}"
    );
}

#[tokio::test]
async fn mig_changes_made_behind_the_plugins_back_are_republished() {
    use gpu_dra::hardware::GpuBackend;
    use gpu_dra::hardware::sim::SimBackend;
    let node = Node::new().with_sim_node("dgx-a100");
    let _plugin = node.start().await;
    let before = eventually("the first slices", || devices(&node)).await;
    let migs =
        |d: &BTreeMap<String, Value>| d.keys().filter(|n| n.starts_with("gpu-0-mig-")).count();
    assert!(migs(&before) > 1, "GPU 0 is pre-partitioned");
    assert!(before.contains_key("gpu-5"), "GPU 5 has MIG off");

    // An admin destroys a MIG device and turns MIG mode on for GPU 5 (an A100: a reset
    // applies it), as `nvidia-smi mig -dci/-dgi` and `nvidia-smi -mig 1 -i 5; nvidia-smi -r`
    // would.
    let hw = SimBackend::open_state_dir(&node.state_dir().join("sim")).expect("the simulator");
    let inventory = hw.inventory().unwrap();
    let victim = inventory.gpus[0].mig_devices[0].clone();
    hw.destroy_mig_device(0, victim.gi_id, victim.ci_id)
        .unwrap();
    hw.set_mig_mode(5, true).unwrap();
    hw.reset_gpu(5).unwrap();
    let after = eventually("the changes to be published", || {
        let d = devices(&node)?;
        (migs(&d) == migs(&before) - 1 && !d.contains_key("gpu-5")).then_some(d)
    })
    .await;
    assert!(
        after.contains_key("gpu-4"),
        "other GPUs stay: {:?}",
        after.keys()
    );
}

/// Per published device, the index of the stored slice holding it.
fn slice_of_each_device(node: &Node) -> BTreeMap<String, String> {
    node.api
        .slices()
        .into_iter()
        .flat_map(|(slice, s)| {
            s["spec"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |d| (d["name"].as_str().unwrap().to_string(), slice.clone()))
        })
        .collect()
}

#[tokio::test]
async fn by_profile_slices_are_published_and_a_faulty_gpu_is_tainted_across_them() {
    let node = Node::new();
    // Every profile on every GPU (208 devices), so the profiles fill several slices: the
    // default `split`'s 62 devices would all fit in one.
    let _plugin = node
        .start_with(&[
            ("GPU_DRA_SLICE_LAYOUT", "by-profile"),
            ("GPU_DRA_MIG_PROFILES", "all"),
        ])
        .await;
    let all = eventually("the first slices", || devices(&node)).await;
    assert_eq!(all.len(), 208);
    let homes = slice_of_each_device(&node);
    // Each profile of every GPU in one slice: gpu-2's devices spread over all device slices.
    let gpu2: Vec<&String> = names_of_gpu(&all, "gpu-2");
    let gpu2_slices: std::collections::BTreeSet<&String> =
        gpu2.iter().map(|n| &homes[n.as_str()]).collect();
    assert_eq!(gpu2_slices.len(), 4, "{gpu2_slices:?}");
    assert_eq!(homes["gpu-0-mig-1g10gb-6"], homes["gpu-7-mig-1g10gb-0"]);
    assert_eq!(homes["gpu-0"], homes["gpu-7"]);

    node.sim_fault(&["xid", "--gpu", "2", "--code", "79"]);
    let tainted = eventually("gpu-2's taints in every slice", || {
        let t = taints(&devices(&node)?);
        (t.len() == gpu2.len()).then_some(t)
    })
    .await;
    assert!(
        tainted.keys().all(|n| n.starts_with("gpu-2")),
        "{tainted:?}"
    );
}
