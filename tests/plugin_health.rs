//! Faults injected with `gpu-dra sim-fault` reach the kubelet's health stream: through the
//! simulator's state with the sim backend, through the simulated NVML library's event set
//! with the NVML backend (`GPU_DRA_TEST_GPU_BACKEND=nvml`), and a reset clears them.

mod plugin_support;

use std::process::Command;
use std::time::{Duration, Instant};

use gpu_dra::kubelet::HealthStatus;
use gpu_dra::kubelet::client::{DraApi, HealthApi, HealthWatch, KubeletClient, KubeletVersions};
use plugin_support::Node;

/// Reads the stream until `device` has `status`; returns the statuses of every device then.
async fn until_status(
    watch: &mut HealthWatch,
    device: &str,
    status: HealthStatus,
) -> Vec<(String, HealthStatus, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let list = tokio::time::timeout(remaining, watch.next())
            .await
            .unwrap_or_else(|_| panic!("{device} never became {status:?}"))
            .expect("health stream")
            .expect("the stream stays open");
        if list
            .iter()
            .any(|d| d.device_name == device && d.status == status)
        {
            return list
                .into_iter()
                .map(|d| (d.device_name, d.status, d.message))
                .collect();
        }
    }
}

#[tokio::test]
async fn a_lost_gpu_turns_its_devices_unhealthy_and_a_reset_brings_them_back() {
    let node = Node::new();
    let plugin = node.start().await;
    let versions = KubeletVersions {
        dra: vec![DraApi::V1],
        health: vec![HealthApi::V1],
    };
    let mut kubelet = match KubeletClient::register(&node.registration_socket(), &versions).await {
        Ok(k) => k,
        Err(e) => panic!("registration failed: {e:?}\n{}", plugin.log()),
    };
    let mut watch = kubelet.watch_health().await.expect("NodeWatchResources");
    until_status(&mut watch, "gpu-0", HealthStatus::Healthy).await;

    let printed = node.sim_fault(&["lost", "--gpu", "0"]);
    assert!(printed.contains("GPU 0 is unhealthy (lost)"), "{printed}");
    let list = until_status(&mut watch, "gpu-0", HealthStatus::Unhealthy).await;
    let gpu1 = list
        .iter()
        .find(|(name, ..)| name == "gpu-1")
        .expect("gpu-1");
    assert_eq!(
        gpu1.1,
        HealthStatus::Healthy,
        "only the lost GPU is unhealthy"
    );
    let gpu0 = list
        .iter()
        .find(|(name, ..)| name == "gpu-0")
        .expect("gpu-0");
    assert!(gpu0.2.ends_with(": failed: xid-79"), "{gpu0:?}");

    let printed = node.sim_fault(&["recover", "--gpu", "0"]);
    assert!(printed.contains("GPU 0 is healthy"), "{printed}");
    until_status(&mut watch, "gpu-0", HealthStatus::Healthy).await;
}

#[tokio::test]
async fn a_double_bit_ecc_error_is_fatal_and_an_unknown_gpu_is_refused_with_the_valid_range() {
    let node = Node::new();
    let plugin = node.start().await;
    let versions = KubeletVersions {
        dra: vec![DraApi::V1],
        health: vec![HealthApi::V1],
    };
    let mut kubelet = match KubeletClient::register(&node.registration_socket(), &versions).await {
        Ok(k) => k,
        Err(e) => panic!("registration failed: {e:?}\n{}", plugin.log()),
    };
    let mut watch = kubelet.watch_health().await.expect("NodeWatchResources");
    until_status(&mut watch, "gpu-3", HealthStatus::Healthy).await;

    let printed = node.sim_fault(&["ecc", "--gpu", "3", "--double-bit"]);
    assert!(printed.contains("double-bit ECC error"), "{printed}");
    until_status(&mut watch, "gpu-3", HealthStatus::Unhealthy).await;

    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["sim-fault", "--state-dir"])
        .arg(node.state_dir())
        .args(["xid", "--gpu", "42", "--code", "79"])
        .output()
        .expect("run gpu-dra sim-fault");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no GPU with index 42 on this node (it has 8)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_gpu_lost_before_the_plugin_starts_is_unhealthy_from_the_first_report() {
    let node = Node::new();
    // The first run creates the simulator's state; the fault goes in while it is down.
    let mut first = node.start().await;
    first.kill().await;
    node.sim_fault(&["lost", "--gpu", "5"]);
    let plugin = node.start().await;
    let versions = KubeletVersions {
        dra: vec![DraApi::V1],
        health: vec![HealthApi::V1],
    };
    let mut kubelet = match KubeletClient::register(&node.registration_socket(), &versions).await {
        Ok(k) => k,
        Err(e) => panic!("registration failed: {e:?}\n{}", plugin.log()),
    };
    let mut watch = kubelet.watch_health().await.expect("NodeWatchResources");
    let first_report = watch.next().await.expect("health stream").expect("a list");
    let status = |name: &str| {
        first_report
            .iter()
            .find(|d| d.device_name == name)
            .map(|d| d.status)
    };
    assert_eq!(
        (status("gpu-5"), status("gpu-4")),
        (Some(HealthStatus::Unhealthy), Some(HealthStatus::Healthy))
    );
}
