//! A second, independent client: grpc-python (grpcio from PyPI, installed by `.ci/run`)
//! calls all three services with its own default `:authority` (the percent-encoded socket
//! path), the socket path and `localhost`. Skips with a reason where grpcio is missing,
//! except in CI.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use gpu_dra::kubelet::proto::pluginregistration as reg;
use gpu_dra::kubelet::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1};
use gpu_dra::kubelet::recording::RecordingHandler;
use gpu_dra::kubelet::{DeviceHealth, HealthStatus, PluginSockets, serve};
use prost::Message;
use tokio::sync::watch;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc_python/call.py");

fn grpcio_available() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import grpc"])
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must have grpcio: .ci/run installs it with pip"
        );
        eprintln!("skipped: python3 cannot import grpc (pip install grpcio)");
    }
    found
}

async fn call(
    socket: &Path,
    method: &str,
    authority: &str,
    request: &[u8],
    stream: bool,
) -> Vec<u8> {
    let hex: String = request.iter().map(|b| format!("{b:02x}")).collect();
    let mut command = tokio::process::Command::new("python3");
    command.args([SCRIPT, &socket.to_string_lossy(), method, authority, &hex]);
    if stream {
        command.arg("stream");
    }
    let out = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "grpc-python {method} with {authority} authority: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (0..stdout.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&stdout[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_python_gets_answers_from_all_three_services_with_every_authority() {
    if !grpcio_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sockets = PluginSockets {
        driver_name: "gpu.nvidia.com".into(),
        registry_dir: dir.path().join("registry"),
        plugin_dir: dir.path().join("plugins/gpu.nvidia.com"),
        pod_uid: None,
    };
    let (_tx, health) = watch::channel(vec![DeviceHealth {
        pool_name: "node-a".into(),
        device_name: "gpu-0".into(),
        status: HealthStatus::Healthy,
        ..DeviceHealth::default()
    }]);
    let plugin = serve(sockets, Arc::new(RecordingHandler::new()), Some(health))
        .await
        .unwrap();
    let reg_socket = plugin.registration_socket().to_path_buf();
    let dra_socket = plugin.dra_socket().to_path_buf();

    for authority in ["default", "path", "localhost"] {
        let info = call(
            &reg_socket,
            "/pluginregistration.Registration/GetInfo",
            authority,
            &[],
            false,
        )
        .await;
        let info = reg::PluginInfo::decode(&info[..]).unwrap();
        assert_eq!(info.name, "gpu.nvidia.com", "{authority}");

        let uid = format!("uid-{authority}");
        let request = dra_v1::NodePrepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: "team-a".into(),
                uid: uid.clone(),
                name: "claim".into(),
            }],
        };
        let answer = call(
            &dra_socket,
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            authority,
            &request.encode_to_vec(),
            false,
        )
        .await;
        let answer = dra_v1::NodePrepareResourcesResponse::decode(&answer[..]).unwrap();
        assert!(answer.claims.contains_key(&uid), "{authority}");

        let request = dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: "team-a".into(),
                uid: uid.clone(),
                name: "claim".into(),
            }],
        };
        let answer = call(
            &dra_socket,
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            authority,
            &request.encode_to_vec(),
            false,
        )
        .await;
        let answer = dra_v1beta1::NodePrepareResourcesResponse::decode(&answer[..]).unwrap();
        assert!(answer.claims.contains_key(&uid), "{authority}");

        let first = call(
            &dra_socket,
            "/v1.DRAResourceHealth/NodeWatchResources",
            authority,
            &[],
            true,
        )
        .await;
        let list = health_v1::NodeWatchResourcesResponse::decode(&first[..]).unwrap();
        assert_eq!(list.devices.len(), 1, "{authority}");
        let first = call(
            &dra_socket,
            "/v1alpha1.DRAResourceHealth/NodeWatchResources",
            authority,
            &[],
            true,
        )
        .await;
        let list = health_v1alpha1::NodeWatchResourcesResponse::decode(&first[..]).unwrap();
        assert_eq!(list.devices.len(), 1, "{authority}");
    }
}
