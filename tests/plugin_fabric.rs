//! Fabric Manager partitions with the real plugin binary (`--fabric-manager`) on a simulated
//! HGX H100 baseboard whose Fabric Manager runs in shared NVSwitch mode: the simulated `fmpm`
//! (the binary itself) keeps the active partitions in the node's state directory, so every
//! assertion reads what FM itself would list.

mod plugin_support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use gpu_dra::crashpoint;
use gpu_dra::fabric_manager::sim;
use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::claims::{self, claim_ref};
use plugin_support::{Node, Plugin, SIGABRT};

fn node_file() -> String {
    format!(
        "{}/tests/fixtures/hgx-fm-node.yaml",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn fm_node() -> Node {
    Node::new().with_sim_node(node_file())
}

fn sim_state(node: &Node) -> PathBuf {
    node.state_dir().join("sim")
}

/// The partitions the node's Fabric Manager has active.
fn active(node: &Node) -> BTreeSet<u32> {
    sim::active(&sim_state(node))
}

async fn start_fm(node: &Node, env: &[(&str, &str)]) -> Plugin {
    let mut command = node.command();
    command.arg("--fabric-manager");
    let mut plugin = node.spawn_command(command, env);
    plugin.wait_registrable().await;
    plugin
}

/// Runs the node's simulated `fmpm` (installed by the plugin) with `args`.
fn fmpm(node: &Node, args: &[&str]) -> std::process::Output {
    let state = sim_state(node);
    Command::new(state.join("fabricmanager/bin/fmpm"))
        .args(args)
        .env(sim::STATE_DIR_ENV, &state)
        .output()
        .expect("run the simulated fmpm")
}

async fn prepare_one(kubelet: &mut KubeletClient, name: &str, uid: &str) -> Result<(), String> {
    let got = kubelet.prepare(&[claim_ref(name, uid)]).await.unwrap();
    got[uid].clone().map(|_| ())
}

async fn unprepare_one(kubelet: &mut KubeletClient, name: &str, uid: &str) {
    let got = kubelet.unprepare(&[claim_ref(name, uid)]).await.unwrap();
    assert_eq!(Some(&Ok(())), got.get(uid), "unprepare {uid}");
}

#[tokio::test]
async fn each_partition_size_activates_on_prepare_and_deactivates_on_unprepare() {
    let node = fm_node();
    let plugin = start_fm(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let cases: [(&[&str], u32); 4] = [
        (&["gpu-6"], 13),
        (&["gpu-1", "gpu-3"], 4),
        (&["gpu-4", "gpu-5", "gpu-6", "gpu-7"], 2),
        (
            &[
                "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7",
            ],
            0,
        ),
    ];
    for (i, (devices, partition)) in cases.into_iter().enumerate() {
        let (name, uid) = (format!("size-{}", devices.len()), format!("uid-{i}"));
        node.api.put_claim(claims::on_node(&name, &uid, devices));
        prepare_one(&mut kubelet, &name, &uid)
            .await
            .unwrap_or_else(|e| panic!("{devices:?}: {e}\n{}", plugin.log()));
        assert_eq!(
            BTreeSet::from([partition]),
            active(&node),
            "{devices:?} activates partition {partition}"
        );
        node.snapshot()
            .assert_converged(&[uid.as_str()], &format!("{devices:?} prepared"));
        unprepare_one(&mut kubelet, &name, &uid).await;
        assert!(active(&node).is_empty(), "{devices:?}: deactivated");
        node.snapshot()
            .assert_converged(&[], &format!("{devices:?} unprepared"));
    }
}

#[tokio::test]
async fn full_gpus_publish_their_module_id_and_partitions() {
    let node = fm_node();
    let plugin = start_fm(&node, &[]).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let pool = loop {
        if let Some(pool) = node.api.complete_pool() {
            break pool;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no slices:\n{}",
            plugin.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let gpu2 = pool
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == "gpu-2")
        .expect("gpu-2 published");
    let attrs = &gpu2["attributes"];
    // NVIDIA's table for module 3: partition1 9, partition2 3, partition4 1, partition8 0.
    let got: Vec<i64> = [
        "gpuModuleID",
        "partition1",
        "partition2",
        "partition4",
        "partition8",
    ]
    .iter()
    .map(|k| attrs[*k]["int"].as_i64().unwrap_or(-1))
    .collect();
    assert_eq!(vec![3, 9, 3, 1, 0], got, "{attrs}");
}

#[tokio::test]
async fn a_mismatched_claim_is_refused_naming_the_partitions_that_fit_and_leaves_nothing() {
    let node = fm_node();
    let plugin = start_fm(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    node.api.put_claim(claims::on_node(
        "three",
        "uid-three",
        &["gpu-0", "gpu-1", "gpu-2"],
    ));
    node.api
        .put_claim(claims::on_node("apart", "uid-apart", &["gpu-0", "gpu-4"]));
    let three = prepare_one(&mut kubelet, "three", "uid-three")
        .await
        .unwrap_err();
    for want in [
        "modules 1,2,3",
        "partition 1 (4 GPUs: modules 1,2,3,4)",
        "partition 0 (8 GPUs",
        "matchAttribute: gpu.nvidia.com/partitionN",
    ] {
        assert!(three.contains(want), "{want:?} in {three}");
    }
    let apart = prepare_one(&mut kubelet, "apart", "uid-apart")
        .await
        .unwrap_err();
    assert!(apart.contains("modules 1,5"), "{apart}");
    assert!(
        apart.contains("partitions that contain them: partition 0 (8 GPUs"),
        "{apart}"
    );
    assert!(active(&node).is_empty());
    node.snapshot().assert_converged(&[], "after the refusals");
}

#[tokio::test]
async fn single_gpu_partitions_of_different_gpus_are_independent() {
    let node = fm_node();
    let plugin = start_fm(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    node.api
        .put_claim(claims::on_node("a", "uid-a", &["gpu-0"]));
    node.api
        .put_claim(claims::on_node("b", "uid-b", &["gpu-1"]));
    prepare_one(&mut kubelet, "a", "uid-a").await.unwrap();
    prepare_one(&mut kubelet, "b", "uid-b").await.unwrap();
    assert_eq!(BTreeSet::from([7, 8]), active(&node));
    unprepare_one(&mut kubelet, "a", "uid-a").await;
    assert_eq!(BTreeSet::from([8]), active(&node), "b keeps its partition");
    unprepare_one(&mut kubelet, "b", "uid-b").await;
    assert!(active(&node).is_empty());
}

#[tokio::test]
async fn a_busy_partition_is_named_and_nothing_is_left_behind() {
    let node = fm_node();
    let plugin = start_fm(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    // Another tenant (or a stale activation) holds all eight GPUs.
    let out = fmpm(&node, &["-a", "0"]);
    assert!(out.status.success(), "{out:?}");
    node.api
        .put_claim(claims::on_node("one", "uid-one", &["gpu-0"]));
    let err = prepare_one(&mut kubelet, "one", "uid-one")
        .await
        .unwrap_err();
    assert!(err.contains("Fabric Manager partition 7 is busy"), "{err}");
    assert_eq!(BTreeSet::from([0]), active(&node), "partition 0 untouched");
    node.snapshot()
        .assert_converged(&[], "after the busy refusal");
}

#[tokio::test]
async fn an_unreachable_fabric_manager_is_named() {
    let node = fm_node();
    let plugin = start_fm(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    std::fs::remove_file(sim::socket(&sim_state(&node))).expect("FM's socket");
    node.api
        .put_claim(claims::on_node("one", "uid-one", &["gpu-0"]));
    let err = prepare_one(&mut kubelet, "one", "uid-one")
        .await
        .unwrap_err();
    assert!(err.contains("Fabric Manager unreachable"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    node.snapshot().assert_converged(&[], "after the refusal");
}

#[tokio::test]
async fn simulated_fmpm_answers_as_fabric_manager_does() {
    let node = fm_node();
    let _plugin = start_fm(&node, &[]).await;
    let code = |out: &std::process::Output| out.status.code();
    let stdout = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let ok = fmpm(&node, &["-a", "1"]);
    assert_eq!(Some(0), code(&ok));
    // fmpm returns FM's fmReturn_t from main: -24 exits 232, -4 exits 252.
    let overlap = fmpm(&node, &["-a", "3"]);
    assert_eq!(
        (
            Some(232),
            "Failed to activate partition. fmReturn: -24\n".to_string()
        ),
        (code(&overlap), stdout(&overlap))
    );
    let inactive = fmpm(&node, &["-d", "2"]);
    assert_eq!(
        (
            Some(252),
            "Failed to deactivate partition. fmReturn: -4\n".to_string()
        ),
        (code(&inactive), stdout(&inactive))
    );
    let elsewhere = fmpm(
        &node,
        &["-l", "--unix-domain-socket", "/nonexistent/socket"],
    );
    assert_eq!(
        (
            Some(247),
            "Failed to connect to Fabric Manager instance.\n".to_string()
        ),
        (code(&elsewhere), stdout(&elsewhere))
    );
}

/// Aborts the plugin at `point`, restarts it, lets the kubelet retry, and checks that FM's
/// active partitions follow the checkpoint.
async fn crash_and_recover(point: &str) {
    let node = fm_node();
    let uid = "uid-crash";
    node.api.put_claim(claims::on_node(
        "crash",
        uid,
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
    ));
    let claim = [claim_ref("crash", uid)];
    let in_prepare = point.starts_with("prepare-");
    let mut plugin = start_fm(&node, &[(crashpoint::ENV, point)]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    if in_prepare {
        assert!(kubelet.prepare(&claim).await.is_err(), "{point}");
    } else {
        let prepared = kubelet.prepare(&claim).await.unwrap();
        assert!(prepared[uid].is_ok(), "{point}: {prepared:?}");
        assert!(kubelet.unprepare(&claim).await.is_err(), "{point}");
    }
    let status = plugin.wait_exit().await;
    assert_eq!(
        Some(SIGABRT),
        Plugin::ended_by(&status),
        "{point}: {status}"
    );

    let plugin = start_fm(&node, &[]).await;
    let recovered = node.snapshot();
    let recorded: Vec<&str> = recovered.checkpoint.keys().map(String::as_str).collect();
    recovered.assert_converged(&recorded, &format!("{point}: after recovery"));
    let want: BTreeSet<u32> = if recorded.is_empty() {
        BTreeSet::new()
    } else {
        BTreeSet::from([1])
    };
    assert_eq!(want, active(&node), "{point}: FM follows the checkpoint");

    let mut kubelet = plugin.register(DraApi::V1).await;
    if in_prepare {
        let retried = kubelet.prepare(&claim).await.unwrap();
        assert!(retried[uid].is_ok(), "{point}: retry: {retried:?}");
        assert_eq!(
            BTreeSet::from([1]),
            active(&node),
            "{point}: after the retry"
        );
    }
    let retried = kubelet.unprepare(&claim).await.unwrap();
    assert_eq!(Some(&Ok(())), retried.get(uid), "{point}: unprepare");
    assert!(active(&node).is_empty(), "{point}: deactivated at the end");
    node.snapshot()
        .assert_converged(&[], &format!("{point}: at the end"));
}

#[tokio::test]
async fn a_crash_at_every_fabric_crash_point_converges_after_restart_and_retry() {
    for point in crashpoint::FABRIC_POINTS {
        crash_and_recover(point).await;
    }
}

#[tokio::test]
async fn two_shares_of_one_gpu_hold_its_partition_until_the_last_one_leaves() {
    use plugin_support::sharing::as_share;
    let node = fm_node();
    let plugin = start_fm(&node, &[("GPU_DRA_SHARED_GPUS", "4")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let share = |name: &str, uid: &str, id: &str| {
        as_share(
            claims::on_node(name, uid, &["gpu-0"]),
            0,
            id,
            serde_json::json!({"memory": "20Gi"}),
        )
    };
    node.api.put_claim(share("a", "uid-a", "aaaa1111"));
    node.api.put_claim(share("b", "uid-b", "bbbb2222"));
    prepare_one(&mut kubelet, "a", "uid-a")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plugin.log()));
    prepare_one(&mut kubelet, "b", "uid-b").await.unwrap();
    assert_eq!(BTreeSet::from([7]), active(&node));
    unprepare_one(&mut kubelet, "a", "uid-a").await;
    assert_eq!(
        BTreeSet::from([7]),
        active(&node),
        "b still holds partition 7"
    );
    unprepare_one(&mut kubelet, "b", "uid-b").await;
    assert!(active(&node).is_empty(), "the last one out deactivates it");
}

#[tokio::test]
async fn a_prepare_costs_one_fmpm_call_and_an_unprepare_one() {
    let node = fm_node();
    let plugin = start_fm(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    node.api
        .put_claim(claims::on_node("pair", "uid-pair", &["gpu-4", "gpu-6"]));
    let socket = sim::socket(&sim_state(&node));
    let endpoint = format!("--unix-domain-socket {}", socket.display());
    let before = sim::calls(&sim_state(&node)).len();
    prepare_one(&mut kubelet, "pair", "uid-pair").await.unwrap();
    let prepared = sim::calls(&sim_state(&node)).len();
    unprepare_one(&mut kubelet, "pair", "uid-pair").await;
    let calls = sim::calls(&sim_state(&node));
    assert_eq!(
        (
            vec![format!("-a 5 {endpoint}")],
            vec![format!("-d 5 {endpoint}")]
        ),
        (calls[before..prepared].to_vec(), calls[prepared..].to_vec()),
        "one call each, as the kubelet's request path pays it"
    );
}

/// `gpu-dra doctor --fabric-manager` on this node, as JSON: the `fabric-manager` check.
fn doctor_fm_check(node: &Node) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["doctor", "--gpu-backend", "sim", "--sim-node", &node_file()])
        .arg("--state-dir")
        .arg(node.state_dir())
        .arg("--plugin-dir")
        .arg(node.plugin_dir())
        .arg("--registry-dir")
        .arg(node.registry_dir())
        .arg("--cdi-root")
        .arg(node.cdi_root())
        .args(["--fabric-manager", "-o", "json"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run gpu-dra doctor");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "fabric-manager")
        .cloned()
        .unwrap_or_else(|| panic!("no fabric-manager check: {report:#}"))
}

#[tokio::test]
async fn doctor_checks_that_fabric_manager_answers_with_its_partitions() {
    let node = fm_node();
    let _plugin = start_fm(&node, &[]).await;
    let check = doctor_fm_check(&node);
    assert_eq!("ok", check["status"], "{check:#}");
    let found = check["found"].as_str().unwrap();
    assert!(
        found.contains("15 partitions") && found.contains("sizes 1, 2, 4, 8"),
        "{found}"
    );
    std::fs::remove_file(sim::socket(&sim_state(&node))).expect("FM's socket");
    let check = doctor_fm_check(&node);
    assert_eq!("fail", check["status"], "{check:#}");
    assert!(
        check["found"]
            .as_str()
            .unwrap()
            .contains("Fabric Manager unreachable"),
        "{check:#}"
    );
    assert!(
        check["fix"].as_str().unwrap().contains("FABRIC_MODE=1"),
        "{check:#}"
    );
}

#[tokio::test]
async fn the_plugin_does_not_start_with_fabric_manager_on_a_node_without_it() {
    // The plain DGX H100 preset: no NVSwitch board declared, FM not in shared mode.
    let node = Node::new();
    let mut command = node.command();
    command.arg("--fabric-manager");
    let mut plugin = node.spawn_command(command, &[]);
    let status = plugin.wait_exit().await;
    assert!(!status.success(), "{status}");
    let log = plugin.log();
    assert!(
        log.contains("Fabric Manager (--fabric-manager)")
            && log.contains("Fabric Manager unreachable"),
        "{log}"
    );
}

#[tokio::test]
async fn simulated_fabric_manager_refuses_a_node_not_in_shared_mode() {
    // FM answering on a node whose FABRIC_MODE is not 1: FM_ST_NOT_SUPPORTED.
    let node = fm_node();
    let _plugin = start_fm(&node, &[]).await;
    let plain = tempfile::tempdir().unwrap();
    let state = plain.path().join("sim");
    let inventory = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args([
            "inventory",
            "--gpu-backend",
            "sim",
            "--sim-node",
            "dgx-h100",
        ])
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    assert!(inventory.status.success(), "{inventory:?}");
    let sock = sim::socket(&state);
    std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let out = Command::new(sim_state(&node).join("fabricmanager/bin/fmpm"))
        .arg("-l")
        .env(sim::STATE_DIR_ENV, &state)
        .output()
        .unwrap();
    assert_eq!(
        (
            Some(253),
            "Failed to get partition list. fmReturn: -3\n".to_string()
        ),
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
        )
    );
}
