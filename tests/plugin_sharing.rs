//! Sharing through the real plugin process: opaque config (MPS with limits, time-slicing, MPS
//! on a carved MIG device), invalid config, daemon supervision, plugin restarts, and
//! consumable-capacity shares — on a simulated DGX H100 whose `nvidia-smi` and
//! `nvidia-cuda-mps-control` are the simulated tools (real child processes) the plugin uses
//! with the sim backend.

mod plugin_support;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{
    as_share, daemon_dirs, daemon_pid, kill9, live_daemons, mps_config, smi_state, tool_calls,
    with_config,
};
use plugin_support::{Node, eventually};
use serde_json::json;

const GPU3_UUID_PREFIX: &str = "GPU-";

fn gpu_uuid(node: &Node, device: &str) -> String {
    let slices = node.api.slices();
    slices
        .values()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == device)
        .and_then(|d| d["attributes"]["uuid"]["string"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("{device} is not published"))
}

/// `--mig-profiles all`, for the tests whose claims hold a 3g.40gb of GPU 0: the default
/// `split` gives GPU 0 the one-slice variants.
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

/// Puts a claim of `device` with one opaque config entry, starts the plugin, registers and
/// prepares the claim (which must succeed).
async fn prepared_with(
    node: &Node,
    name: &str,
    uid: &str,
    device: &str,
    config: serde_json::Value,
) -> (
    plugin_support::Plugin,
    gpu_dra::kubelet::client::KubeletClient,
) {
    prepared_with_env(node, &[], name, uid, device, config).await
}

/// [`prepared_with`], the plugin started with extra `env`.
async fn prepared_with_env(
    node: &Node,
    env: &[(&str, &str)],
    name: &str,
    uid: &str,
    device: &str,
    config: serde_json::Value,
) -> (
    plugin_support::Plugin,
    gpu_dra::kubelet::client::KubeletClient,
) {
    node.api.put_claim(with_config(
        claims::on_node(name, uid, &[device]),
        &[],
        config,
    ));
    let plugin = node.start_with(env).await;
    // The callers read the device's UUID from the slices: a prepare does not wait for the
    // first publish, so wait for it here.
    eventually("slices", || node.api.complete_pool()).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet.prepare(&[claim_ref(name, uid)]).await.unwrap();
    assert!(got[uid].is_ok(), "{got:?}\n{}", plugin.log());
    (plugin, kubelet)
}

#[tokio::test]
async fn an_mps_claim_gets_its_own_daemon_with_verified_limits_and_unprepare_stops_it() {
    let node = Node::new();
    let claim = with_config(
        claims::on_node("mps", "uid-mps", &["gpu-3"]),
        &[],
        mps_config("GpuConfig", 50, "10Gi"),
    );
    node.api.put_claim(claim);
    let plugin = node.start().await;
    eventually("slices", || node.api.complete_pool()).await;
    let uuid = gpu_uuid(&node, "gpu-3");
    assert!(uuid.starts_with(GPU3_UUID_PREFIX));
    let mut kubelet = plugin.register(DraApi::V1).await;

    let got = kubelet
        .prepare(&[claim_ref("mps", "uid-mps")])
        .await
        .unwrap();
    assert!(got["uid-mps"].is_ok(), "{got:?}\n{}", plugin.log());
    let daemons = daemon_dirs(&node);
    assert_eq!(1, daemons.len(), "{daemons:?}");
    let pid = daemon_pid(&node, &daemons[0]).expect("pid file");
    assert_eq!(vec![pid], live_daemons(node.root()));
    assert_eq!(
        ("EXCLUSIVE_PROCESS".to_string(), 0),
        smi_state(&node, &uuid)
    );
    let calls = tool_calls(&node);
    let want = [
        format!("nvidia-smi -i {uuid} -c EXCLUSIVE_PROCESS"),
        format!("CUDA_VISIBLE_DEVICES={uuid} nvidia-cuda-mps-control -d"),
        "echo set_default_active_thread_percentage 50 | nvidia-cuda-mps-control".to_string(),
        "echo set_default_device_pinned_mem_limit 0 10240M | nvidia-cuda-mps-control".to_string(),
        "echo get_default_active_thread_percentage | nvidia-cuda-mps-control".to_string(),
        "echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control".to_string(),
    ];
    for w in &want {
        assert!(
            calls.iter().any(|c| c.contains(w.as_str())),
            "missing {w:?} in {calls:#?}"
        );
    }
    let spec = node.spec("uid-mps").expect("CDI spec");
    for w in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
        "\"containerPath\": \"/dev/shm\"",
    ] {
        assert!(spec.contains(w), "spec lacks {w}: {spec}");
    }

    kubelet
        .unprepare(&[claim_ref("mps", "uid-mps")])
        .await
        .unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
    assert_eq!(Vec::<String>::new(), daemon_dirs(&node));
    assert_eq!(("DEFAULT".to_string(), 0), smi_state(&node, &uuid));
    node.snapshot().assert_converged(&[], "after unprepare");
}

#[tokio::test]
async fn a_time_sliced_claim_sets_the_interval_and_unprepare_resets_it() {
    let node = Node::new();
    let config = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
    node.api.put_claim(with_config(
        claims::on_node("ts", "uid-ts", &["gpu-5"]),
        &[],
        config,
    ));
    let plugin = node.start().await;
    eventually("slices", || node.api.complete_pool()).await;
    let uuid = gpu_uuid(&node, "gpu-5");
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet.prepare(&[claim_ref("ts", "uid-ts")]).await.unwrap();
    assert!(got["uid-ts"].is_ok(), "{got:?}");
    assert_eq!(("DEFAULT".to_string(), 3), smi_state(&node, &uuid));
    let calls = tool_calls(&node);
    assert!(
        calls
            .iter()
            .any(|c| c == &format!("nvidia-smi compute-policy -i {uuid} --set-timeslice 3")),
        "{calls:#?}"
    );
    kubelet
        .unprepare(&[claim_ref("ts", "uid-ts")])
        .await
        .unwrap();
    assert_eq!(("DEFAULT".to_string(), 0), smi_state(&node, &uuid));
    assert_eq!(Vec::<String>::new(), daemon_dirs(&node));
}

#[tokio::test]
async fn mps_on_a_carved_mig_device_points_the_daemon_at_the_mig_uuid() {
    let node = Node::new();
    let (_plugin, mut kubelet) = prepared_with_env(
        &node,
        &[EVERY_PROFILE],
        "mig-mps",
        "uid-mig-mps",
        "gpu-0-mig-3g40gb-4",
        mps_config("MigDeviceConfig", 30, "8Gi"),
    )
    .await;
    let mig_uuid = node.snapshot().hardware_mig_uuids()[0].clone();
    let calls = tool_calls(&node);
    assert!(
        calls.iter().any(|c| c.contains(&format!(
            "CUDA_VISIBLE_DEVICES={mig_uuid} nvidia-cuda-mps-control -d"
        ))),
        "{calls:#?}"
    );
    assert!(
        !calls.iter().any(|c| c.contains("-c EXCLUSIVE_PROCESS")),
        "compute mode is a whole-GPU setting: {calls:#?}"
    );
    kubelet
        .unprepare(&[claim_ref("mig-mps", "uid-mig-mps")])
        .await
        .unwrap();
    let end = node.snapshot();
    end.assert_converged(&[], "after unprepare");
    assert!(end.instances.is_empty());
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
}

#[tokio::test]
async fn an_invalid_config_fails_prepare_with_the_field_and_starts_nothing() {
    let node = Node::new();
    let mut bad = mps_config("GpuConfig", 50, "10Gi");
    bad["sharing"]["mpsConfig"]["defaultActiveThreadPercentage"] = json!(150);
    node.api.put_claim(with_config(
        claims::on_node("bad", "uid-bad", &["gpu-0-mig-3g40gb-4"]),
        &[],
        bad,
    ));
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("bad", "uid-bad")])
        .await
        .unwrap();
    let error = got["uid-bad"].as_ref().expect_err("must fail");
    assert!(
        error.contains("defaultActiveThreadPercentage: 150 is outside 0–100"),
        "{error}"
    );
    assert!(error.contains("team-a/bad"), "names the claim: {error}");
    let after = node.snapshot();
    after.assert_converged(&[], "after the refused prepare");
    assert!(after.instances.is_empty(), "no MIG device carved");
    assert_eq!(Vec::<String>::new(), tool_calls(&node));
    assert_eq!(Vec::<String>::new(), daemon_dirs(&node));
}

#[tokio::test]
async fn a_daemon_that_dies_is_restarted_by_the_plugin_with_its_limits() {
    let node = Node::new();
    let (_plugin, mut kubelet) = prepared_with(
        &node,
        "mps",
        "uid-mps",
        "gpu-3",
        mps_config("GpuConfig", 25, "4Gi"),
    )
    .await;
    let id = daemon_dirs(&node)[0].clone();
    let first = daemon_pid(&node, &id).unwrap();
    kill9(first);
    // Restarted means: a new daemon, alive, with the limits sent again and read back.
    let limits_sent = || {
        tool_calls(&node)
            .iter()
            .filter(|c| c.contains("set_default_device_pinned_mem_limit 0 4096M"))
            .count()
    };
    let second = eventually("the daemon restarted with its limits", || {
        daemon_pid(&node, &id)
            .filter(|p| *p != first && live_daemons(node.root()) == vec![*p])
            .filter(|_| limits_sent() == 2)
    })
    .await;
    assert_ne!(first, second);
    let threads = tool_calls(&node)
        .iter()
        .filter(|c| c.contains("set_default_active_thread_percentage 25"))
        .count();
    assert_eq!(2, threads, "thread limit sent to both daemons");
    kubelet
        .unprepare(&[claim_ref("mps", "uid-mps")])
        .await
        .unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
}

#[tokio::test]
async fn after_a_plugin_crash_the_daemon_is_found_again_and_later_stopped() {
    let node = Node::new();
    let (mut plugin, _) = prepared_with(
        &node,
        "mps",
        "uid-mps",
        "gpu-3",
        mps_config("GpuConfig", 40, "2Gi"),
    )
    .await;
    let id = daemon_dirs(&node)[0].clone();
    let pid = daemon_pid(&node, &id).unwrap();
    plugin.signal(plugin_support::SIGKILL);
    plugin.wait_exit().await;
    assert_eq!(
        vec![pid],
        live_daemons(node.root()),
        "daemons outlive the plugin"
    );

    let plugin = node.start().await;
    assert_eq!(
        Some(pid),
        daemon_pid(&node, &id),
        "the same daemon, found again"
    );
    assert_eq!(vec![pid], live_daemons(node.root()));
    let mut kubelet = plugin.register(DraApi::V1).await;
    kubelet
        .unprepare(&[claim_ref("mps", "uid-mps")])
        .await
        .unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
    node.snapshot().assert_converged(&[], "after unprepare");
}

#[tokio::test]
async fn two_consumable_capacity_shares_use_one_daemon_with_their_own_client_limits() {
    let node = Node::new();
    let share = |name: &str, uid: &str, id: &str, memory: &str, sms: &str| {
        as_share(
            claims::on_node(name, uid, &["gpu-4"]),
            0,
            id,
            json!({"memory": memory, "multiprocessors": sms}),
        )
    };
    node.api
        .put_claim(share("a", "uid-a", "aaaa1111", "40Gi", "66"));
    node.api
        .put_claim(share("b", "uid-b", "bbbb2222", "20Gi", "33"));
    let plugin = node.start_with(&[("GPU_DRA_SHARED_GPUS", "4")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("a", "uid-a"), claim_ref("b", "uid-b")])
        .await
        .unwrap();
    assert!(got.values().all(Result::is_ok), "{got:?}\n{}", plugin.log());
    assert_eq!(vec!["share-gpu-4".to_string()], daemon_dirs(&node));
    let a = node.spec("uid-a").unwrap();
    let b = node.spec("uid-b").unwrap();
    assert!(a.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"), "{a}");
    assert!(
        a.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"),
        "{a}"
    );
    assert!(b.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"), "{b}");
    assert!(
        b.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"),
        "{b}"
    );
    assert!(
        a.contains("aaaa1111") && b.contains("bbbb2222"),
        "CDI names carry the share IDs"
    );

    kubelet.unprepare(&[claim_ref("a", "uid-a")]).await.unwrap();
    assert_eq!(
        1,
        live_daemons(node.root()).len(),
        "b still uses the daemon"
    );
    kubelet.unprepare(&[claim_ref("b", "uid-b")]).await.unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
    assert_eq!(Vec::<String>::new(), daemon_dirs(&node));
}

#[tokio::test]
async fn sharing_config_on_an_admin_access_device_is_refused() {
    let node = Node::new();
    let mut claim = with_config(
        claims::on_node("admin", "uid-admin", &["gpu-3"]),
        &[],
        mps_config("GpuConfig", 50, "1Gi"),
    );
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = json!(true);
    node.api.put_claim(claim);
    let plugin = node.start().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("admin", "uid-admin")])
        .await
        .unwrap();
    let error = got["uid-admin"].as_ref().expect_err("must fail");
    assert!(error.contains("admin access"), "{error}");
    assert_eq!(Vec::<String>::new(), tool_calls(&node));
}

#[tokio::test]
async fn mps_on_two_mig_devices_starts_one_daemon_per_mig_device() {
    let node = Node::new();
    node.api.put_claim(with_config(
        claims::on_node(
            "two-migs",
            "uid-two-migs",
            &["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"],
        ),
        &[],
        mps_config("MigDeviceConfig", 50, "4Gi"),
    ));
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let refs = [claim_ref("two-migs", "uid-two-migs")];
    let got = kubelet.prepare(&refs).await.unwrap();
    assert!(got["uid-two-migs"].is_ok(), "{got:?}");
    assert_eq!(2, daemon_dirs(&node).len(), "{:?}", daemon_dirs(&node));
    let starts: Vec<String> = tool_calls(&node)
        .into_iter()
        .filter(|c| c.ends_with("nvidia-cuda-mps-control -d"))
        .collect();
    assert_eq!(2, starts.len(), "{starts:#?}");
    assert!(
        starts.iter().all(|c| !c.contains(',')),
        "one MIG UUID each: {starts:#?}"
    );
    kubelet.unprepare(&refs).await.unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
    node.snapshot().assert_converged(&[], "after unprepare");
}

#[tokio::test]
async fn a_stale_pid_file_never_gets_another_process_killed() {
    let node = Node::new();
    let (_plugin, mut kubelet) = prepared_with(
        &node,
        "mps",
        "uid-mps",
        "gpu-3",
        mps_config("GpuConfig", 20, "1Gi"),
    )
    .await;
    let id = daemon_dirs(&node)[0].clone();
    let daemon = daemon_pid(&node, &id).unwrap();
    // The daemon dies and its pid is "reused" by an unrelated process.
    let mut bystander = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    kill9(daemon);
    let pid_file = node
        .plugin_dir()
        .join("mps")
        .join(&id)
        .join("pipe")
        .join("nvidia-cuda-mps-control.pid");
    std::fs::write(&pid_file, format!("{}\n", bystander.id())).unwrap();
    eventually("a new daemon", || {
        daemon_pid(&node, &id)
            .filter(|p| *p != bystander.id() && live_daemons(node.root()) == vec![*p])
    })
    .await;
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the process behind the stale pid was signalled"
    );
    let _ = bystander.kill();
    kubelet
        .unprepare(&[claim_ref("mps", "uid-mps")])
        .await
        .unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
}

/// An MPS config with `multiUser: true` and no limits.
fn multi_user_config() -> serde_json::Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": true}},
    })
}

/// The argv of a live process, one string per argument.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

#[tokio::test]
async fn a_multi_user_mps_claim_starts_its_daemon_with_dash_capital_m() {
    let node = Node::new();
    let (_plugin, mut kubelet) =
        prepared_with(&node, "mu", "uid-mu", "gpu-3", multi_user_config()).await;
    let uuid = gpu_uuid(&node, "gpu-3");
    let calls = tool_calls(&node);
    let start = format!("CUDA_VISIBLE_DEVICES={uuid} nvidia-cuda-mps-control -d -M");
    assert!(
        calls.iter().any(|c| c.ends_with(start.as_str())),
        "missing {start:?} in {calls:#?}"
    );
    // The live daemon (a real child process of the simulated tool) runs in multi-user mode.
    let daemons = daemon_dirs(&node);
    let pid = daemon_pid(&node, &daemons[0]).expect("pid file");
    assert_eq!(vec![pid], live_daemons(node.root()));
    assert_eq!(cmdline(pid)[1..], ["-f", "-M"]);
    let journal = std::fs::read_to_string(
        node.plugin_dir()
            .join("mps")
            .join(&daemons[0])
            .join("log/control.log"),
    )
    .unwrap();
    assert!(
        journal.contains("Starting control daemon in multi-user mode"),
        "{journal}"
    );
    // Clients connect as in single-user mode.
    let spec = node.spec("uid-mu").expect("CDI spec");
    assert!(
        spec.contains("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"),
        "{spec}"
    );

    kubelet
        .unprepare(&[claim_ref("mu", "uid-mu")])
        .await
        .unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
    assert_eq!(Vec::<String>::new(), daemon_dirs(&node));
}

#[tokio::test]
async fn multi_user_mps_is_refused_below_compute_capability_7_naming_the_gpu() {
    let files = tempfile::tempdir().unwrap();
    let node_file = files.path().join("pascal.yaml");
    let pascal = format!(
        "nodeName: {}\ngpus:\n  - model: P100-PCIE-16GB\n  - model: L4\n",
        claims::NODE
    );
    std::fs::write(&node_file, pascal).unwrap();
    let node = Node::new();
    for (name, uid, device) in [("old", "uid-old", "gpu-0"), ("new", "uid-new", "gpu-1")] {
        node.api.put_claim(with_config(
            claims::on_node(name, uid, &[device]),
            &[],
            multi_user_config(),
        ));
    }
    let mut plugin = node.spawn_command(node.command_on(node_file.to_str().unwrap()), &[]);
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;

    let got = kubelet
        .prepare(&[claim_ref("old", "uid-old")])
        .await
        .unwrap();
    let error = got["uid-old"].as_ref().expect_err("must be refused");
    assert!(
        error.contains(
            "sharing.mpsConfig.multiUser: GPU gpu-0 (Tesla P100-PCIE-16GB, compute capability 6.0) does not support multi-user MPS, which needs compute capability 7.0 (Volta) or newer"
        ),
        "{error}"
    );
    assert!(error.contains("team-a/old"), "names the claim: {error}");
    assert_eq!(Vec::<String>::new(), tool_calls(&node), "nothing was run");
    assert_eq!(Vec::<String>::new(), daemon_dirs(&node));

    // The L4 (compute capability 8.9) on the same node serves it.
    let got = kubelet
        .prepare(&[claim_ref("new", "uid-new")])
        .await
        .unwrap();
    assert!(got["uid-new"].is_ok(), "{got:?}\n{}", plugin.log());
    assert_eq!(1, live_daemons(node.root()).len());
    kubelet
        .unprepare(&[claim_ref("new", "uid-new")])
        .await
        .unwrap();
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
}
