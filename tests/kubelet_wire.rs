//! The plugin's sockets against the bytes real clients put on the wire: every `:authority`
//! form they send, on all three services and the health stream, with CONTINUATION frames,
//! flow control, a reused HPACK table, and garbage that must end only its own connection.

mod wire_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra::kubelet::proto::pluginregistration as reg;
use gpu_dra::kubelet::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1};
use gpu_dra::kubelet::recording::{HandlerCall, RecordingHandler};
use gpu_dra::kubelet::{
    ClaimRef, DeviceHealth, HealthStatus, PluginSockets, RegistrationState, RunningPlugin, serve,
};
use prost::Message;
use tokio::sync::watch;
use wire_support::{Authority, Closed, RawH2, frame, grpc_headers};

const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";
const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
const UNPREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
const PREPARE_V1BETA1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
const WATCH_V1: &str = "/v1.DRAResourceHealth/NodeWatchResources";
const WATCH_V1ALPHA1: &str = "/v1alpha1.DRAResourceHealth/NodeWatchResources";

fn sockets(dir: &Path) -> PluginSockets {
    PluginSockets {
        driver_name: "gpu.nvidia.com".into(),
        registry_dir: dir.join("registry"),
        plugin_dir: dir.join("plugins").join("gpu.nvidia.com"),
        pod_uid: None,
    }
}

fn health() -> (
    watch::Sender<Vec<DeviceHealth>>,
    watch::Receiver<Vec<DeviceHealth>>,
) {
    watch::channel(vec![DeviceHealth {
        pool_name: "node-a".into(),
        device_name: "gpu-0".into(),
        status: HealthStatus::Healthy,
        message: String::new(),
        last_updated_unix_seconds: 1_700_000_000,
        health_check_timeout_seconds: 30,
    }])
}

async fn start(
    dir: &Path,
    handler: &Arc<RecordingHandler>,
) -> (RunningPlugin, watch::Sender<Vec<DeviceHealth>>) {
    let (tx, rx) = health();
    let plugin = serve(sockets(dir), Arc::clone(handler), Some(rx))
        .await
        .unwrap();
    (plugin, tx)
}

fn v1_claims(uids: &[String]) -> Vec<dra_v1::Claim> {
    uids.iter()
        .map(|uid| dra_v1::Claim {
            namespace: "team-a".into(),
            uid: uid.clone(),
            name: format!("claim-{uid}"),
        })
        .collect()
}

fn prepare_v1(uids: &[String]) -> Vec<u8> {
    dra_v1::NodePrepareResourcesRequest {
        claims: v1_claims(uids),
    }
    .encode_to_vec()
}

fn prepare_v1beta1(uid: &str) -> Vec<u8> {
    dra_v1beta1::NodePrepareResourcesRequest {
        claims: vec![dra_v1beta1::Claim {
            namespace: "team-a".into(),
            uid: uid.into(),
            name: format!("claim-{uid}"),
        }],
    }
    .encode_to_vec()
}

fn ok_message(response: &wire_support::Response, what: &str) -> Vec<u8> {
    assert_eq!(
        response.grpc_status(),
        Some(0),
        "{what}: headers {:?} trailers {:?} reset {:?}",
        response.headers,
        response.trailers,
        response.reset
    );
    let messages = response.messages();
    assert_eq!(messages.len(), 1, "{what}");
    messages.into_iter().next().unwrap()
}

#[tokio::test]
async fn every_authority_form_gets_answers_from_registration_dra_and_health() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let reg_socket = plugin.registration_socket().to_path_buf();
    let dra_socket = plugin.dra_socket().to_path_buf();

    for form in Authority::ALL {
        let mut kubelet = RawH2::connect(&reg_socket).await.unwrap();
        let authority = form.value(&reg_socket);
        let info = ok_message(
            &kubelet
                .unary(GET_INFO, authority.as_deref(), &[])
                .await
                .unwrap(),
            &format!("GetInfo with {form:?}"),
        );
        let info = reg::PluginInfo::decode(&info[..]).unwrap();
        assert_eq!(info.endpoint, dra_socket.to_string_lossy(), "{form:?}");

        let mut dra = RawH2::connect(&dra_socket).await.unwrap();
        let authority = form.value(&dra_socket);
        let uid = format!("uid-{form:?}").to_lowercase();
        let answer = ok_message(
            &dra.unary(
                PREPARE_V1,
                authority.as_deref(),
                &prepare_v1(std::slice::from_ref(&uid)),
            )
            .await
            .unwrap(),
            &format!("v1 prepare with {form:?}"),
        );
        let answer = dra_v1::NodePrepareResourcesResponse::decode(&answer[..]).unwrap();
        assert_eq!(answer.claims.keys().collect::<Vec<_>>(), [&uid]);
        let answer = ok_message(
            &dra.unary(
                PREPARE_V1BETA1,
                authority.as_deref(),
                &prepare_v1beta1(&uid),
            )
            .await
            .unwrap(),
            &format!("v1beta1 prepare with {form:?}"),
        );
        dra_v1beta1::NodePrepareResourcesResponse::decode(&answer[..]).unwrap();

        for (path, is_v1) in [(WATCH_V1, true), (WATCH_V1ALPHA1, false)] {
            let stream = dra
                .start(&grpc_headers(path, authority.as_deref()))
                .await
                .unwrap();
            dra.send_data(stream, &wire_support::grpc_message(&[]), true)
                .await
                .unwrap();
            let first = dra.messages(stream, 1).await.unwrap();
            assert_eq!(
                first.len(),
                1,
                "{path} with {form:?}: {:?}",
                dra.responses[&stream]
            );
            let devices = if is_v1 {
                health_v1::NodeWatchResourcesResponse::decode(&first[0][..])
                    .unwrap()
                    .devices
                    .len()
            } else {
                health_v1alpha1::NodeWatchResourcesResponse::decode(&first[0][..])
                    .unwrap()
                    .devices
                    .len()
            };
            assert_eq!(devices, 1, "{path} with {form:?}");
        }
    }
    assert_eq!(handler.calls().len(), 2 * Authority::ALL.len());
}

#[tokio::test]
async fn a_request_over_64_kib_crosses_continuation_flow_control_and_many_data_frames() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let socket = plugin.dra_socket().to_path_buf();

    let uids: Vec<String> = (0..1_500)
        .map(|i| format!("{i:08}-6d1c-4b8e-9a55-claim-uid"))
        .collect();
    let request = prepare_v1(&uids);
    assert!(
        request.len() > 65_535,
        "more than one default window: {}",
        request.len()
    );

    let mut dra = RawH2::connect(&socket).await.unwrap();
    dra.header_fragment = 40; // the header block goes out as HEADERS + several CONTINUATIONs
    let authority = Authority::SocketPath.value(&socket);
    let mut headers = grpc_headers(PREPARE_V1, authority.as_deref());
    headers.push(("x-trace".into(), "t".repeat(3_000)));
    let stream = dra.start(&headers).await.unwrap();
    assert!(dra.header_block_sizes[0] > 3 * 40);
    dra.send_data(stream, &wire_support::grpc_message(&request), true)
        .await
        .unwrap();
    let response = dra.finish(stream).await.unwrap();
    let answer =
        dra_v1::NodePrepareResourcesResponse::decode(&ok_message(&response, "big")[..]).unwrap();
    assert_eq!(answer.claims.len(), uids.len());
    match &handler.calls()[..] {
        [HandlerCall::Prepare(claims)] => assert_eq!(claims.len(), uids.len()),
        other => panic!(
            "one prepare call with every claim, got {} calls",
            other.len()
        ),
    }
}

#[tokio::test]
async fn several_calls_on_one_connection_reuse_the_clients_hpack_table() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let socket = plugin.dra_socket().to_path_buf();
    let authority = Authority::SocketPath.value(&socket);

    let mut dra = RawH2::connect(&socket).await.unwrap();
    for i in 0..6 {
        let uid = format!("uid-{i}");
        let response = dra
            .unary(
                PREPARE_V1,
                authority.as_deref(),
                &prepare_v1(std::slice::from_ref(&uid)),
            )
            .await
            .unwrap();
        let answer =
            dra_v1::NodePrepareResourcesResponse::decode(&ok_message(&response, &uid)[..]).unwrap();
        assert!(answer.claims.contains_key(&uid));
    }
    let sizes = &dra.header_block_sizes;
    assert!(
        sizes[1..].iter().all(|s| *s * 4 < sizes[0]),
        "later requests are indexed references into the table the first one filled: {sizes:?}"
    );
    assert_eq!(handler.calls().len(), 6);
    // The adapter lets clients use the protocol's default 4,096-byte table, and only that:
    // a server announcing another SETTINGS_HEADER_TABLE_SIZE would need the adapter to follow.
    assert!(
        dra.server_settings
            .iter()
            .all(|(id, value)| *id != 0x1 || *value == 4_096),
        "{:?}",
        dra.server_settings
    );
}

#[tokio::test]
async fn message_size_limits_still_hold() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let socket = plugin.dra_socket().to_path_buf();

    // tonic's default limit for a decoded request is 4 MiB; over it, tonic answers
    // OUT_OF_RANGE without calling the handler.
    let mut dra = RawH2::connect(&socket).await.unwrap();
    let too_big = vec![0u8; 5 << 20];
    let response = dra
        .unary(PREPARE_V1, Some("localhost"), &too_big)
        .await
        .unwrap();
    assert_eq!(response.grpc_status(), Some(11), "{response:?}");
    assert!(response.grpc_message().contains("4194304"), "{response:?}");
    assert!(handler.calls().is_empty());
}

#[tokio::test]
async fn garbage_and_truncated_frames_end_only_their_own_connection() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let socket = plugin.dra_socket().to_path_buf();
    let path = Authority::SocketPath.value(&socket);

    // A healthy connection opened before the bad ones must keep working after them.
    let mut healthy = RawH2::connect(&socket).await.unwrap();
    ok_message(
        &healthy
            .unary(PREPARE_V1, path.as_deref(), &prepare_v1(&["before".into()]))
            .await
            .unwrap(),
        "before",
    );

    // Each case is sent after the preface and SETTINGS; the server must end the connection
    // on its own, except for random bytes that may announce a frame longer than what follows:
    // like h2 itself, the server then waits for the rest until the client hangs up.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "continuation without headers",
            frame(
                wire_support::CONTINUATION,
                wire_support::END_HEADERS,
                1,
                b"\x82",
            ),
        ),
        (
            "an index beyond both HPACK tables",
            frame(
                wire_support::HEADERS,
                wire_support::END_HEADERS,
                1,
                &[0xff, 0x7f],
            ),
        ),
        (
            "DATA inside an open header block",
            [
                frame(wire_support::HEADERS, 0, 1, b"\x83\x86"),
                frame(wire_support::DATA, 0, 1, b"x"),
            ]
            .concat(),
        ),
        (
            "random bytes",
            (0..200u32).map(|i| (i * 37 % 251) as u8).collect(),
        ),
    ];
    for (name, bytes) in cases {
        let mut bad = RawH2::connect(&socket).await.unwrap();
        bad.send_raw(&bytes).await.unwrap();
        if name == "random bytes" {
            bad.hang_up().await.unwrap();
        }
        let closed = bad.until_closed().await.unwrap();
        assert!(
            matches!(closed, Closed::Eof | Closed::GoAway(_)),
            "{name}: {closed:?}"
        );
    }
    // Truncated: a frame header cut short, then the client hangs up.
    let mut cut = RawH2::connect(&socket).await.unwrap();
    cut.send_raw(
        &frame(
            wire_support::HEADERS,
            wire_support::END_HEADERS,
            1,
            b"\x82\x86",
        )[..5],
    )
    .await
    .unwrap();
    drop(cut);
    // Not HTTP/2 at all.
    let mut http1 = tokio::net::UnixStream::connect(&socket).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut http1, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    drop(http1);

    ok_message(
        &healthy
            .unary(PREPARE_V1, path.as_deref(), &prepare_v1(&["after".into()]))
            .await
            .unwrap(),
        "the healthy connection after the bad ones",
    );
    let mut fresh = RawH2::connect(&socket).await.unwrap();
    ok_message(
        &fresh
            .unary(PREPARE_V1, path.as_deref(), &prepare_v1(&["fresh".into()]))
            .await
            .unwrap(),
        "a new connection after the bad ones",
    );
    assert_eq!(handler.calls().len(), 3);
}

/// The plugin watcher's sequence (`operation_generator.go`): dial the registration socket
/// by path, GetInfo, then NotifyRegistrationStatus — with `plugin_registered=false` and the
/// reason when the DRA manager refused the plugin.
#[tokio::test]
async fn the_plugin_watcher_reports_success_and_refusal_over_the_path_authority() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let socket = plugin.registration_socket().to_path_buf();
    let path = Authority::SocketPath.value(&socket);
    let mut state = plugin.registration_status();

    for (registered, error, want) in [
        (
            false,
            "invalid supported gRPC versions of DRA driver plugin gpu.nvidia.com",
            RegistrationState::Rejected {
                error: "invalid supported gRPC versions of DRA driver plugin gpu.nvidia.com".into(),
            },
        ),
        (true, "", RegistrationState::Registered),
    ] {
        let mut watcher = RawH2::connect(&socket).await.unwrap();
        ok_message(
            &watcher.unary(GET_INFO, path.as_deref(), &[]).await.unwrap(),
            "GetInfo",
        );
        let status = reg::RegistrationStatus {
            plugin_registered: registered,
            error: error.into(),
        };
        ok_message(
            &watcher
                .unary(NOTIFY, path.as_deref(), &status.encode_to_vec())
                .await
                .unwrap(),
            "NotifyRegistrationStatus",
        );
        // The watcher closes its connection after each registration attempt.
        drop(watcher);
        tokio::time::timeout(Duration::from_secs(10), state.wait_for(|s| *s == want))
            .await
            .expect("state reported")
            .unwrap();
    }
}

/// The DRA client (`grpc.NewClient("unix:" + endpoint)`) keeps one connection for every
/// call; it may sit idle for minutes between pods, and after its idle timeout the client
/// closes it and dials again on the next call.
#[tokio::test]
async fn the_dra_client_keeps_one_connection_across_idle_periods_and_redials_after_idling() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let socket = plugin.dra_socket().to_path_buf();

    let mut dra = RawH2::connect(&socket).await.unwrap();
    for round in 0..3 {
        let uid = format!("idle-{round}");
        ok_message(
            &dra.unary(
                PREPARE_V1,
                Some("localhost"),
                &prepare_v1(std::slice::from_ref(&uid)),
            )
            .await
            .unwrap(),
            &uid,
        );
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    assert!(
        dra.closed.is_none(),
        "the server never drops an idle connection"
    );
    // Idle timeout: the client goes away without GOAWAY, then dials again.
    drop(dra);
    let mut again = RawH2::connect(&socket).await.unwrap();
    let unprepare = dra_v1::NodeUnprepareResourcesRequest {
        claims: v1_claims(&["idle-0".into()]),
    };
    ok_message(
        &again
            .unary(UNPREPARE_V1, Some("localhost"), &unprepare.encode_to_vec())
            .await
            .unwrap(),
        "unprepare after redial",
    );
    assert_eq!(handler.calls().len(), 4);
}

/// The kubelet reopens the health stream (`wait.UntilWithContext`, every 5 s) whenever it
/// ends; after a plugin restart the new stream starts with the full list again.
#[tokio::test]
async fn the_health_stream_is_reopened_after_the_plugin_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, health_tx) = start(dir.path(), &handler).await;
    let socket = plugin.dra_socket().to_path_buf();

    let mut kubelet = RawH2::connect(&socket).await.unwrap();
    let stream = kubelet
        .start(&grpc_headers(WATCH_V1, Some("localhost")))
        .await
        .unwrap();
    kubelet
        .send_data(stream, &wire_support::grpc_message(&[]), true)
        .await
        .unwrap();
    assert_eq!(kubelet.messages(stream, 1).await.unwrap().len(), 1);

    plugin
        .shutdown_within(Duration::from_secs(5))
        .await
        .unwrap();
    drop(health_tx);
    // The old stream ends: trailers, a reset or the connection going away.
    let _ = kubelet.finish(stream).await;

    let (plugin, _health) = start(dir.path(), &handler).await;
    let mut kubelet = RawH2::connect(plugin.dra_socket()).await.unwrap();
    let stream = kubelet
        .start(&grpc_headers(WATCH_V1, Some("localhost")))
        .await
        .unwrap();
    kubelet
        .send_data(stream, &wire_support::grpc_message(&[]), true)
        .await
        .unwrap();
    let first = kubelet.messages(stream, 1).await.unwrap();
    let list = health_v1::NodeWatchResourcesResponse::decode(&first[0][..]).unwrap();
    assert_eq!(list.devices.len(), 1);
}

/// A kubelet restart while the plugin runs: the registration socket is already there, the
/// new kubelet finds it and registers the plugin again on a fresh connection.
#[tokio::test]
async fn a_restarted_kubelet_registers_the_running_plugin_again() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let socket = plugin.registration_socket().to_path_buf();
    let path = Authority::SocketPath.value(&socket);
    let mut state = plugin.registration_status();

    for kubelet_run in 0..2 {
        assert!(
            socket.exists(),
            "run {kubelet_run}: the socket is still there"
        );
        let mut watcher = RawH2::connect(&socket).await.unwrap();
        ok_message(
            &watcher.unary(GET_INFO, path.as_deref(), &[]).await.unwrap(),
            "GetInfo",
        );
        let status = reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        };
        ok_message(
            &watcher
                .unary(NOTIFY, path.as_deref(), &status.encode_to_vec())
                .await
                .unwrap(),
            "Notify",
        );
        state.mark_unchanged();
        tokio::time::timeout(
            Duration::from_secs(10),
            state.wait_for(|s| *s == RegistrationState::Registered),
        )
        .await
        .unwrap()
        .unwrap();
        // The kubelet dies: its connection just goes away.
        drop(watcher);
    }
}

/// A plugin restart while pods hold prepared claims: the kubelet re-registers the new
/// instance and its later unprepare calls reach it.
#[tokio::test]
async fn after_a_plugin_restart_the_kubelet_re_registers_and_unprepares_reach_it() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, _health) = start(dir.path(), &handler).await;
    let reg_socket = plugin.registration_socket().to_path_buf();
    let mut dra = RawH2::connect(plugin.dra_socket()).await.unwrap();
    ok_message(
        &dra.unary(PREPARE_V1, Some("localhost"), &prepare_v1(&["held".into()]))
            .await
            .unwrap(),
        "prepare",
    );
    drop(plugin);
    assert!(
        !reg_socket.exists(),
        "the old instance took its registration away"
    );

    let (plugin, _health) = start(dir.path(), &handler).await;
    let path = Authority::SocketPath.value(plugin.registration_socket());
    let mut watcher = RawH2::connect(plugin.registration_socket()).await.unwrap();
    let info = reg::PluginInfo::decode(
        &ok_message(
            &watcher.unary(GET_INFO, path.as_deref(), &[]).await.unwrap(),
            "GetInfo",
        )[..],
    )
    .unwrap();
    let mut dra = RawH2::connect(Path::new(&info.endpoint)).await.unwrap();
    let unprepare = dra_v1::NodeUnprepareResourcesRequest {
        claims: v1_claims(&["held".into()]),
    };
    let answer = dra_v1::NodeUnprepareResourcesResponse::decode(
        &ok_message(
            &dra.unary(UNPREPARE_V1, Some("localhost"), &unprepare.encode_to_vec())
                .await
                .unwrap(),
            "unprepare",
        )[..],
    )
    .unwrap();
    assert_eq!(answer.claims["held"].error, "");
    let want = ClaimRef {
        namespace: "team-a".into(),
        name: "claim-held".into(),
        uid: "held".into(),
    };
    assert_eq!(
        handler.calls(),
        [
            HandlerCall::Prepare(vec![want.clone()]),
            HandlerCall::Unprepare(vec![want])
        ]
    );
}

/// One device's health as both versions carry it: (pool, device, health, message, last
/// updated, timeout).
type HealthRow = (String, String, i32, String, i64, i64);

/// The rows of the latest list on a v1 or v1alpha1 health stream.
fn latest_rows(messages: &[Vec<u8>], is_v1: bool) -> Vec<HealthRow> {
    let last = &messages.last().expect("a list")[..];
    if is_v1 {
        health_v1::NodeWatchResourcesResponse::decode(last)
            .unwrap()
            .devices
            .into_iter()
            .map(|d| {
                let id = d.device.unwrap_or_default();
                (
                    id.pool_name,
                    id.device_name,
                    d.health,
                    d.message,
                    d.last_updated_time,
                    d.health_check_timeout_seconds,
                )
            })
            .collect()
    } else {
        health_v1alpha1::NodeWatchResourcesResponse::decode(last)
            .unwrap()
            .devices
            .into_iter()
            .map(|d| {
                let id = d.device.unwrap_or_default();
                (
                    id.pool_name,
                    id.device_name,
                    d.health,
                    d.message,
                    d.last_updated_time,
                    d.health_check_timeout_seconds,
                )
            })
            .collect()
    }
}

#[tokio::test]
async fn both_health_versions_stream_the_same_taint_change_on_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let handler = Arc::new(RecordingHandler::new());
    let (plugin, health_tx) = start(dir.path(), &handler).await;
    let mut kubelet = RawH2::connect(plugin.dra_socket()).await.unwrap();
    let mut streams = Vec::new();
    for path in [WATCH_V1, WATCH_V1ALPHA1] {
        let stream = kubelet
            .start(&grpc_headers(path, Some("localhost")))
            .await
            .unwrap();
        kubelet
            .send_data(stream, &wire_support::grpc_message(&[]), true)
            .await
            .unwrap();
        assert_eq!(
            kubelet.messages(stream, 1).await.unwrap().len(),
            1,
            "{path}"
        );
        streams.push(stream);
    }

    // The change that taints gpu-0 (an XID the health policy treats as fatal).
    health_tx.send_replace(vec![DeviceHealth {
        pool_name: "node-a".into(),
        device_name: "gpu-0".into(),
        status: HealthStatus::Unhealthy,
        message: "XID 79: GPU has fallen off the bus".into(),
        last_updated_unix_seconds: 1_700_000_060,
        health_check_timeout_seconds: 30,
    }]);
    let v1 = kubelet.messages(streams[0], 2).await.unwrap();
    let v1alpha1 = kubelet.messages(streams[1], 2).await.unwrap();
    let want: Vec<HealthRow> = vec![(
        "node-a".into(),
        "gpu-0".into(),
        health_v1::HealthStatus::Unhealthy as i32,
        "XID 79: GPU has fallen off the bus".into(),
        1_700_000_060,
        30,
    )];
    assert_eq!(
        (
            v1.len(),
            latest_rows(&v1, true),
            v1alpha1.len(),
            latest_rows(&v1alpha1, false)
        ),
        (2, want.clone(), 2, want)
    );
}
