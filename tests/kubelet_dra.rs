//! The DRA calls as a kubelet makes them, over real Unix sockets, against a recording handler
//! (and, for group commit, a handler that holds its first call).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra::kubelet::client::{DraApi, KubeletClient, KubeletVersions, connect_unix};
use gpu_dra::kubelet::proto::dra_v1;
use gpu_dra::kubelet::recording::{HandlerCall, RecordingHandler};
use gpu_dra::kubelet::{
    ClaimRef, DraHandler, PluginSockets, PrepareResults, PreparedDevice, RegistrationState,
    RunningPlugin, UnprepareResults, serve,
};
use tokio::sync::Semaphore;

fn claim(namespace: &str, name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn gpu(device: &str, share_id: Option<&str>) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpu".into()],
        pool_name: "node-a".into(),
        device_name: device.into(),
        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/device={device}")],
        share_id: share_id.map(String::from),
    }
}

fn sockets(dir: &Path) -> PluginSockets {
    PluginSockets {
        driver_name: "gpu.nvidia.com".into(),
        registry_dir: dir.join("registry"),
        plugin_dir: dir.join("plugins").join("gpu.nvidia.com"),
        pod_uid: None,
    }
}

async fn start(dir: &Path, handler: &Arc<RecordingHandler>) -> RunningPlugin {
    serve(sockets(dir), Arc::clone(handler), None)
        .await
        .unwrap()
}

fn only(dra: DraApi) -> KubeletVersions {
    KubeletVersions {
        dra: vec![dra],
        health: vec![],
    }
}

#[tokio::test]
async fn get_info_announces_the_driver_and_notify_is_observable() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = start(dir.path(), &Arc::new(RecordingHandler::new())).await;
    let mut status = plugin.registration_status();
    let mut kubelet = KubeletClient::connect(plugin.registration_socket())
        .await
        .unwrap();

    let info = kubelet.get_info().await.unwrap();
    let got = (
        info.r#type.as_str(),
        info.name.as_str(),
        Path::new(&info.endpoint),
        info.supported_versions.clone(),
    );
    let want = (
        "DRAPlugin",
        "gpu.nvidia.com",
        plugin.dra_socket(),
        vec!["v1.DRAPlugin".to_string(), "v1beta1.DRAPlugin".to_string()],
    );
    assert_eq!(got, want);
    assert!(Path::new(&info.endpoint).is_absolute());
    assert_eq!(*status.borrow_and_update(), RegistrationState::Pending);

    kubelet.notify(false, "driver name taken").await.unwrap();
    let rejected = status.wait_for(|s| *s != RegistrationState::Pending).await;
    let want = RegistrationState::Rejected {
        error: "driver name taken".into(),
    };
    assert_eq!(*rejected.unwrap(), want);

    kubelet.notify(true, "").await.unwrap();
    let registered = status
        .wait_for(|s| *s == RegistrationState::Registered)
        .await;
    assert!(registered.is_ok());
}

#[tokio::test]
async fn a_current_kubelet_picks_v1_and_an_older_one_v1beta1() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = start(dir.path(), &Arc::new(RecordingHandler::new())).await;
    let reg = plugin.registration_socket();
    let current = KubeletClient::register(reg, &KubeletVersions::default()).await;
    let older = KubeletClient::register(reg, &only(DraApi::V1beta1)).await;
    let got = (current.unwrap().dra_api(), older.unwrap().dra_api());
    assert_eq!(got, (Some(DraApi::V1), Some(DraApi::V1beta1)));
}

async fn prepare_and_unprepare_batch_reaches_the_handler(api: DraApi) {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(
        RecordingHandler::new()
            .on_prepare("uid-a", Ok(vec![gpu("gpu-0", None)]))
            .on_prepare("uid-b", Err("MIG placement 0 is occupied".into()))
            .on_unprepare("uid-b", Err("MPS daemon did not stop".into())),
    );
    let plugin = start(dir.path(), &handler).await;
    let mut kubelet = KubeletClient::register(plugin.registration_socket(), &only(api))
        .await
        .unwrap();
    let claims = vec![claim("team", "a", "uid-a"), claim("team", "b", "uid-b")];

    let got = kubelet.prepare(&claims).await.unwrap();
    let want = BTreeMap::from([
        ("uid-a".to_string(), Ok(vec![gpu("gpu-0", None)])),
        (
            "uid-b".to_string(),
            Err("MIG placement 0 is occupied".to_string()),
        ),
    ]);
    assert_eq!(got, want);

    let got = kubelet.unprepare(&claims).await.unwrap();
    let want = BTreeMap::from([
        ("uid-a".to_string(), Ok(())),
        (
            "uid-b".to_string(),
            Err("MPS daemon did not stop".to_string()),
        ),
    ]);
    assert_eq!(got, want);

    let want = vec![
        HandlerCall::Prepare(claims.clone()),
        HandlerCall::Unprepare(claims),
    ];
    assert_eq!(handler.calls(), want);
}

#[tokio::test]
async fn prepare_and_unprepare_batches_over_v1_reach_the_handler() {
    prepare_and_unprepare_batch_reaches_the_handler(DraApi::V1).await;
}

#[tokio::test]
async fn prepare_and_unprepare_batches_over_v1beta1_reach_the_handler() {
    prepare_and_unprepare_batch_reaches_the_handler(DraApi::V1beta1).await;
}

#[tokio::test]
async fn claims_with_empty_fields_get_their_own_errors_and_the_rest_is_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let plugin = start(dir.path(), &handler).await;
    let mut kubelet = KubeletClient::register(plugin.registration_socket(), &Default::default())
        .await
        .unwrap();

    let good = claim("team", "good", "uid-good");
    let claims = [
        good.clone(),
        claim("", "no-namespace", "uid-1"),
        claim("team", "", "uid-2"),
        claim("team", "no-uid", ""),
    ];
    let got = kubelet.prepare(&claims).await.unwrap();
    let got: BTreeMap<String, Result<usize, String>> = got
        .into_iter()
        .map(|(uid, outcome)| (uid, outcome.map(|devices| devices.len())))
        .collect();
    let error = |field: &str, namespace: &str, name: &str, uid: &str| {
        Err(format!(
            "claim field {field} is empty (namespace {namespace:?}, name {name:?}, uid {uid:?}); \
             the kubelet must send namespace, name and uid"
        ))
    };
    let want = BTreeMap::from([
        ("".to_string(), error("uid", "team", "no-uid", "")),
        (
            "uid-1".to_string(),
            error("namespace", "", "no-namespace", "uid-1"),
        ),
        ("uid-2".to_string(), error("name", "team", "", "uid-2")),
        ("uid-good".to_string(), Ok(0)),
    ]);
    assert_eq!(got, want);

    let unprepared = kubelet.unprepare(&claims).await.unwrap();
    let got: Vec<(&str, bool)> = unprepared
        .iter()
        .map(|(uid, outcome)| (uid.as_str(), outcome.is_ok()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("", false),
            ("uid-1", false),
            ("uid-2", false),
            ("uid-good", true)
        ]
    );
    let want = vec![
        HandlerCall::Prepare(vec![good.clone()]),
        HandlerCall::Unprepare(vec![good]),
    ];
    assert_eq!(handler.calls(), want);
}

#[tokio::test]
async fn claims_the_handler_leaves_out_are_reported_as_errors_naming_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new().omit("uid-lost"));
    let plugin = start(dir.path(), &handler).await;
    let mut kubelet = KubeletClient::register(plugin.registration_socket(), &Default::default())
        .await
        .unwrap();
    let claims = [
        claim("team", "kept", "uid-kept"),
        claim("team", "lost", "uid-lost"),
    ];

    let prepared = kubelet.prepare(&claims).await.unwrap();
    let unprepared = kubelet.unprepare(&claims).await.unwrap();
    let missing = "the driver returned no result for claim team/lost (uid uid-lost); \
                   the kubelet will retry"
        .to_string();
    let want_prepared = BTreeMap::from([
        ("uid-kept".to_string(), Ok(vec![])),
        ("uid-lost".to_string(), Err(missing.clone())),
    ]);
    let want_unprepared = BTreeMap::from([
        ("uid-kept".to_string(), Ok(())),
        ("uid-lost".to_string(), Err(missing)),
    ]);
    assert_eq!((prepared, unprepared), (want_prepared, want_unprepared));
}

#[tokio::test]
async fn share_id_reaches_v1_kubelets_only() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(
        RecordingHandler::new().on_prepare("uid-s", Ok(vec![gpu("gpu-1", Some("share-7"))])),
    );
    let plugin = start(dir.path(), &handler).await;
    let claims = [claim("team", "shared", "uid-s")];

    let mut v1 = KubeletClient::register(plugin.registration_socket(), &only(DraApi::V1))
        .await
        .unwrap();
    let mut v1beta1 = KubeletClient::register(plugin.registration_socket(), &only(DraApi::V1beta1))
        .await
        .unwrap();
    let got = (
        v1.prepare(&claims).await.unwrap(),
        v1beta1.prepare(&claims).await.unwrap(),
    );
    let want = (
        BTreeMap::from([("uid-s".to_string(), Ok(vec![gpu("gpu-1", Some("share-7"))]))]),
        BTreeMap::from([("uid-s".to_string(), Ok(vec![gpu("gpu-1", None)]))]),
    );
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_v1beta1_answer_carries_no_share_id_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(
        RecordingHandler::new().on_prepare("uid-s", Ok(vec![gpu("gpu-1", Some("share-7"))])),
    );
    let plugin = start(dir.path(), &handler).await;

    // Decode the v1beta1 answer with the v1 message types, which do know field 5.
    let channel = connect_unix(plugin.dra_socket()).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    );
    let codec = tonic_prost::ProstCodec::<
        dra_v1::NodePrepareResourcesRequest,
        dra_v1::NodePrepareResourcesResponse,
    >::default();
    let request = dra_v1::NodePrepareResourcesRequest {
        claims: vec![dra_v1::Claim {
            namespace: "team".into(),
            uid: "uid-s".into(),
            name: "shared".into(),
        }],
    };
    let response = grpc
        .unary(tonic::Request::new(request), path, codec)
        .await
        .unwrap()
        .into_inner();
    let got: Vec<Option<String>> = response.claims["uid-s"]
        .devices
        .iter()
        .map(|device| device.share_id.clone())
        .collect();
    assert_eq!(got, vec![None]);
}

// Group commit: kubelet calls that arrive while another holds the plugin lock are served
// together as one handler call, each kubelet call gets exactly its own claims' answers, and a
// prepare's claims are read ahead (`prefetch`) before the call waits for the lock.

fn one(uid: &str) -> ClaimRef {
    claim("team", &format!("claim-{uid}"), uid)
}

fn device(uid: &str) -> PreparedDevice {
    PreparedDevice {
        device_name: format!("dev-{uid}"),
        ..PreparedDevice::default()
    }
}

/// Records what it is asked; its prepares wait for a permit the test hands out.
struct Gate {
    prefetched: Mutex<Vec<Vec<String>>>,
    prepared: Mutex<Vec<Vec<String>>>,
    permits: Semaphore,
}

fn uids(claims: &[ClaimRef]) -> Vec<String> {
    claims.iter().map(|c| c.uid.clone()).collect()
}

impl DraHandler for Gate {
    async fn prefetch(&self, claims: &[ClaimRef]) {
        self.prefetched.lock().unwrap().push(uids(claims));
    }

    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.prepared.lock().unwrap().push(uids(&claims));
        self.permits.acquire().await.unwrap().forget();
        claims
            .iter()
            .map(|c| (c.uid.clone(), Ok(vec![device(&c.uid)])))
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.iter().map(|c| (c.uid.clone(), Ok(()))).collect()
    }
}

async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_arrive_while_one_holds_the_lock_are_served_as_one_batch_with_their_own_answers()
{
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate {
        prefetched: Mutex::default(),
        prepared: Mutex::default(),
        permits: Semaphore::new(0),
    });
    let plugin = serve(sockets(dir.path()), Arc::clone(&gate), None)
        .await
        .unwrap();
    let versions = KubeletVersions {
        dra: vec![DraApi::V1],
        health: vec![],
    };
    let mut kubelets = Vec::new();
    for _ in 0..4 {
        let kubelet = KubeletClient::register(plugin.registration_socket(), &versions)
            .await
            .unwrap();
        kubelets.push(kubelet);
    }
    let calls: Vec<Vec<ClaimRef>> = vec![
        vec![one("first")],
        vec![one("a"), one("shared")],
        vec![one("b")],
        vec![one("shared"), one("c")],
    ];

    let mut tasks = Vec::new();
    for (i, (mut kubelet, claims)) in kubelets.into_iter().zip(calls.clone()).enumerate() {
        tasks.push(tokio::spawn(async move {
            kubelet.prepare(&claims).await.unwrap()
        }));
        if i == 0 {
            // The first call holds the lock, waiting in the handler.
            until("the first call in the handler", || {
                gate.prepared.lock().unwrap().len() == 1
            })
            .await;
        }
    }
    // Every call read its claims ahead, then queued behind the first.
    until("every call read ahead", || {
        gate.prefetched.lock().unwrap().len() == 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.permits.add_permits(2);

    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    for (claims, answer) in calls.iter().zip(&answers) {
        let want: PrepareResults = claims
            .iter()
            .map(|c| (c.uid.clone(), Ok(vec![device(&c.uid)])))
            .collect();
        assert_eq!(*answer, want, "each call gets its own claims' answers");
    }
    let batches = gate.prepared.lock().unwrap().clone();
    assert_eq!(batches.len(), 2, "{batches:?}");
    assert_eq!(batches[0], ["first"]);
    let mut second = batches[1].clone();
    second.sort();
    assert_eq!(
        second,
        ["a", "b", "c", "shared"],
        "each UID once in the batch"
    );
}
