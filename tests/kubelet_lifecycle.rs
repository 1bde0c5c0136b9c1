//! The health stream and the end of a plugin's life: graceful shutdown and drop.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra::kubelet::client::{HealthApi, KubeletClient, KubeletVersions};
use gpu_dra::kubelet::recording::RecordingHandler;
use gpu_dra::kubelet::{
    ClaimRef, DeviceHealth, DraHandler, HealthStatus, PluginSockets, PrepareResults,
    UnprepareResults, serve,
};
use tokio::sync::{Semaphore, mpsc, watch};

fn sockets(dir: &Path) -> PluginSockets {
    PluginSockets {
        driver_name: "gpu.nvidia.com".into(),
        registry_dir: dir.join("registry"),
        plugin_dir: dir.join("plugins").join("gpu.nvidia.com"),
        pod_uid: None,
    }
}

fn health(device: &str, status: HealthStatus, message: &str, at: i64) -> DeviceHealth {
    DeviceHealth {
        pool_name: "node-a".into(),
        device_name: device.into(),
        status,
        message: message.into(),
        last_updated_unix_seconds: at,
        health_check_timeout_seconds: 30,
    }
}

fn kubelet_with_health(api: HealthApi) -> KubeletVersions {
    KubeletVersions {
        health: vec![api],
        ..KubeletVersions::default()
    }
}

async fn health_list_is_streamed_on_connect_and_on_every_change(api: HealthApi) {
    let dir = tempfile::tempdir().unwrap();
    let initial = vec![
        health("gpu-0", HealthStatus::Healthy, "", 1_700_000_000),
        health("gpu-1", HealthStatus::Unknown, "", 1_700_000_000),
    ];
    let (source, receiver) = watch::channel(initial.clone());
    let plugin = serve(
        sockets(dir.path()),
        Arc::new(RecordingHandler::new()),
        Some(receiver),
    )
    .await
    .unwrap();
    let mut kubelet =
        KubeletClient::register(plugin.registration_socket(), &kubelet_with_health(api))
            .await
            .unwrap();
    assert_eq!(kubelet.health_api(), Some(api));

    let mut watch = kubelet.watch_health().await.unwrap();
    assert_eq!(watch.next().await.unwrap(), Some(initial));

    let changed = vec![
        health("gpu-0", HealthStatus::Unhealthy, "XID 79", 1_700_000_060),
        health("gpu-1", HealthStatus::Healthy, "", 1_700_000_060),
    ];
    source.send_replace(changed.clone());
    assert_eq!(watch.next().await.unwrap(), Some(changed));

    drop(source);
    assert_eq!(watch.next().await.unwrap(), None);
}

#[tokio::test]
async fn health_over_v1_is_streamed_on_connect_and_on_every_change() {
    health_list_is_streamed_on_connect_and_on_every_change(HealthApi::V1).await;
}

#[tokio::test]
async fn health_over_v1alpha1_is_streamed_on_connect_and_on_every_change() {
    health_list_is_streamed_on_connect_and_on_every_change(HealthApi::V1alpha1).await;
}

#[tokio::test]
async fn health_is_announced_newest_first_only_when_a_source_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let (_source, receiver) = watch::channel(Vec::new());
    let with = serve(
        sockets(&dir.path().join("with")),
        Arc::new(RecordingHandler::new()),
        Some(receiver),
    )
    .await
    .unwrap();
    let without = serve(
        sockets(&dir.path().join("without")),
        Arc::new(RecordingHandler::new()),
        None,
    )
    .await
    .unwrap();

    let mut got = Vec::new();
    for plugin in [&with, &without] {
        let mut kubelet = KubeletClient::connect(plugin.registration_socket())
            .await
            .unwrap();
        got.push(kubelet.get_info().await.unwrap().supported_versions);
    }
    let want = vec![
        vec![
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ],
        vec!["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    ];
    assert_eq!(got, want);
}

/// Holds every prepare call until released, says when one has started, and whether it ran to
/// completion or was dropped half way.
struct GatedHandler {
    entered: mpsc::UnboundedSender<()>,
    release: Arc<Semaphore>,
    finished: mpsc::UnboundedSender<&'static str>,
}

struct Finish {
    report: mpsc::UnboundedSender<&'static str>,
    completed: bool,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let _ = self.report.send(if self.completed {
            "completed"
        } else {
            "dropped"
        });
    }
}

fn gated() -> (
    Arc<GatedHandler>,
    mpsc::UnboundedReceiver<()>,
    Arc<Semaphore>,
    mpsc::UnboundedReceiver<&'static str>,
) {
    let (entered, entered_rx) = mpsc::unbounded_channel();
    let (finished, finished_rx) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let handler = GatedHandler {
        entered,
        release: Arc::clone(&release),
        finished,
    };
    (Arc::new(handler), entered_rx, release, finished_rx)
}

impl DraHandler for GatedHandler {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let mut finish = Finish {
            report: self.finished.clone(),
            completed: false,
        };
        self.entered.send(()).unwrap();
        self.release.acquire().await.unwrap().forget();
        finish.completed = true;
        claims.into_iter().map(|c| (c.uid, Ok(vec![]))).collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

fn slow_claim() -> ClaimRef {
    ClaimRef {
        namespace: "team".into(),
        name: "slow".into(),
        uid: "uid-slow".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_the_kubelet_gave_up_on_still_runs_to_completion() {
    let dir = tempfile::tempdir().unwrap();
    let (handler, mut entered, release, mut finished) = gated();
    let plugin = serve(sockets(dir.path()), handler, None).await.unwrap();
    let mut kubelet = KubeletClient::register(plugin.registration_socket(), &Default::default())
        .await
        .unwrap();

    let call = tokio::spawn(async move { kubelet.prepare(&[slow_claim()]).await });
    entered.recv().await.unwrap();
    call.abort();
    // Give the server time to see the hang-up; a slow machine only makes this check weaker.
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.add_permits(1);
    assert_eq!(finished.recv().await, Some("completed"));
}

struct PanickingHandler;

impl DraHandler for PanickingHandler {
    async fn prepare(&self, _claims: Vec<ClaimRef>) -> PrepareResults {
        panic!("simulated driver bug");
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

#[tokio::test]
async fn a_panicking_handler_fails_its_claims_and_the_connection_survives() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = serve(sockets(dir.path()), Arc::new(PanickingHandler), None)
        .await
        .unwrap();
    let mut kubelet = KubeletClient::register(plugin.registration_socket(), &Default::default())
        .await
        .unwrap();

    let prepared = kubelet.prepare(&[slow_claim()]).await.unwrap();
    let got: Vec<(&str, bool)> = prepared
        .iter()
        .map(|(uid, outcome)| {
            let failed_internally = outcome
                .as_ref()
                .is_err_and(|e| e.starts_with("the driver failed internally"));
            (uid.as_str(), failed_internally)
        })
        .collect();
    assert_eq!(got, vec![("uid-slow", true)]);
    let unprepared = kubelet.unprepare(&[slow_claim()]).await.unwrap();
    assert_eq!(
        unprepared,
        BTreeMap::from([("uid-slow".to_string(), Ok(()))])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_call_in_flight_answer_ends_health_streams_and_removes_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let (handler, mut entered, release, _finished) = gated();
    let (_source, receiver) = watch::channel(Vec::new());
    let plugin = serve(sockets(dir.path()), handler, Some(receiver))
        .await
        .unwrap();
    let (reg_socket, dra_socket) = (
        plugin.registration_socket().to_path_buf(),
        plugin.dra_socket().to_path_buf(),
    );
    let mut kubelet = KubeletClient::register(&reg_socket, &KubeletVersions::default())
        .await
        .unwrap();
    let mut watch = kubelet.watch_health().await.unwrap();
    assert_eq!(watch.next().await.unwrap(), Some(vec![]));

    let in_flight = tokio::spawn(async move { kubelet.prepare(&[slow_claim()]).await });
    entered.recv().await.unwrap();
    let shutdown = tokio::spawn(plugin.shutdown());

    // The health stream ends as soon as shutdown begins; the prepare call holds it open.
    assert_eq!(watch.next().await.unwrap(), None);
    assert!(
        !reg_socket.exists(),
        "registration socket outlived shutdown"
    );
    assert!(
        !shutdown.is_finished(),
        "shutdown did not wait for the call"
    );

    release.add_permits(1);
    let answered = in_flight.await.unwrap().unwrap();
    assert_eq!(
        answered,
        BTreeMap::from([("uid-slow".to_string(), Ok(vec![]))])
    );
    shutdown.await.unwrap().unwrap();
    assert_eq!((reg_socket.exists(), dra_socket.exists()), (false, false));
}

#[tokio::test]
async fn dropping_the_running_plugin_removes_its_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = serve(sockets(dir.path()), Arc::new(RecordingHandler::new()), None)
        .await
        .unwrap();
    let paths = [
        plugin.registration_socket().to_path_buf(),
        plugin.dra_socket().to_path_buf(),
    ];
    drop(plugin);
    let got: Vec<bool> = paths.iter().map(|path| path.exists()).collect();
    assert_eq!(got, vec![false, false]);
}

#[tokio::test]
async fn shutdown_leaves_a_successors_socket_at_the_same_path_alone() {
    let dir = tempfile::tempdir().unwrap();
    let first = serve(sockets(dir.path()), Arc::new(RecordingHandler::new()), None)
        .await
        .unwrap();
    // A successor without pod UID names replaces the sockets while the first still runs.
    let second = serve(sockets(dir.path()), Arc::new(RecordingHandler::new()), None)
        .await
        .unwrap();
    first.shutdown().await.unwrap();

    let kubelet = KubeletClient::register(second.registration_socket(), &Default::default()).await;
    assert_eq!(kubelet.unwrap().endpoint(), Some(second.dra_socket()));
}

#[tokio::test]
async fn shutdown_abandons_a_peer_that_never_speaks_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = serve(sockets(dir.path()), Arc::new(RecordingHandler::new()), None)
        .await
        .unwrap();
    let dra_socket = plugin.dra_socket().to_path_buf();
    let _silent = tokio::net::UnixStream::connect(&dra_socket).await.unwrap();

    let got = plugin.shutdown_within(Duration::from_millis(100)).await;
    assert_eq!((got.is_ok(), dra_socket.exists()), (true, false));
}
