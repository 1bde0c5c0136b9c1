//! The sockets themselves: names, modes, stale files, the path limit, garbage on the wire and
//! the lock two instances share.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpu_dra::kubelet::client::{KubeletClient, KubeletVersions};
use gpu_dra::kubelet::recording::RecordingHandler;
use gpu_dra::kubelet::{
    ClaimRef, DraHandler, KubeletError, PluginSockets, PrepareResults, UnprepareResults, serve,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};

fn sockets(dir: &Path, pod_uid: Option<&str>) -> PluginSockets {
    PluginSockets {
        driver_name: "gpu.nvidia.com".into(),
        registry_dir: dir.join("registry"),
        plugin_dir: dir.join("plugins").join("gpu.nvidia.com"),
        pod_uid: pod_uid.map(String::from),
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "team".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

#[tokio::test]
async fn a_pod_uid_names_both_sockets_and_the_announced_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = sockets(dir.path(), Some("9a7f-2b6d"));
    let handler = Arc::new(RecordingHandler::new());
    let plugin = serve(config, handler, None).await.unwrap();

    let want_reg = dir
        .path()
        .join("registry/gpu.nvidia.com-9a7f-2b6d-reg.sock");
    let want_dra = dir.path().join("plugins/gpu.nvidia.com/dra-9a7f-2b6d.sock");
    let mut kubelet = KubeletClient::connect(&want_reg).await.unwrap();
    let info = kubelet.get_info().await.unwrap();
    let got = (
        plugin.registration_socket().to_path_buf(),
        PathBuf::from(info.endpoint),
    );
    assert_eq!(got, (want_reg, want_dra));
}

#[tokio::test]
async fn stale_sockets_from_an_earlier_run_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let config = sockets(dir.path(), None);
    for stale in [config.registration_socket(), config.dra_socket()] {
        fs::create_dir_all(stale.parent().unwrap()).unwrap();
        drop(UnixListener::bind(&stale).unwrap());
    }
    let plugin = serve(config, Arc::new(RecordingHandler::new()), None)
        .await
        .unwrap();

    let kubelet = KubeletClient::register(plugin.registration_socket(), &Default::default()).await;
    assert_eq!(kubelet.unwrap().endpoint(), Some(plugin.dra_socket()));
}

#[tokio::test]
async fn a_regular_file_at_a_socket_path_is_an_error_naming_it_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = sockets(dir.path(), None);
    let in_the_way = config.dra_socket();
    fs::create_dir_all(in_the_way.parent().unwrap()).unwrap();
    fs::write(&in_the_way, "precious").unwrap();

    let got = serve(config.clone(), Arc::new(RecordingHandler::new()), None).await;
    assert!(matches!(got, Err(KubeletError::NotASocket { ref path }) if *path == in_the_way));
    let message = got.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains(&in_the_way.display().to_string()));
    assert_eq!(fs::read_to_string(&in_the_way).unwrap(), "precious");
    assert!(!config.registration_socket().exists());
}

#[tokio::test]
async fn sockets_are_private_and_created_directories_are_0750() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("kubelet");
    let plugin = serve(
        sockets(&base, None),
        Arc::new(RecordingHandler::new()),
        None,
    )
    .await
    .unwrap();

    let paths = [
        base.clone(),
        base.join("registry"),
        base.join("plugins"),
        base.join("plugins/gpu.nvidia.com"),
        plugin.registration_socket().to_path_buf(),
        plugin.dra_socket().to_path_buf(),
    ];
    let got: Vec<u32> = paths.iter().map(|path| mode(path)).collect();
    assert_eq!(got, vec![0o750, 0o750, 0o750, 0o750, 0o600, 0o600]);
}

#[tokio::test]
async fn a_socket_path_over_the_unix_limit_is_rejected_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = sockets(dir.path(), None);
    config.plugin_dir = dir.path().join("p".repeat(120));
    let want_path = config.dra_socket();

    let got = serve(config.clone(), Arc::new(RecordingHandler::new()), None).await;
    let Err(KubeletError::SocketPathTooLong { path, len, max }) = got else {
        panic!("expected SocketPathTooLong, got {got:?}");
    };
    assert_eq!(
        (path, len, max),
        (want_path.clone(), want_path.as_os_str().len(), 107)
    );
    assert!(!config.plugin_dir.exists());
    assert!(!config.registry_dir.exists());
}

#[tokio::test]
async fn garbage_bytes_on_either_socket_do_not_stop_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = serve(
        sockets(dir.path(), None),
        Arc::new(RecordingHandler::new()),
        None,
    )
    .await
    .unwrap();
    let mut kubelet = KubeletClient::register(plugin.registration_socket(), &Default::default())
        .await
        .unwrap();

    let garbage: Vec<u8> = (0..=255u8).rev().cycle().take(1024).collect();
    for socket in [plugin.registration_socket(), plugin.dra_socket()] {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        stream.write_all(&garbage).await.unwrap();
        // The server hangs up on a connection that does not speak HTTP/2, possibly before
        // reading everything, which the kernel reports as a reset.
        let mut answer = Vec::new();
        let hung_up = match stream.read_to_end(&mut answer).await {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(hung_up, "reading from {socket:?} failed otherwise");
    }

    let still_serving = (
        kubelet.get_info().await.is_ok(),
        kubelet.prepare(&[claim("uid-a")]).await.unwrap(),
    );
    let fresh = KubeletClient::register(plugin.registration_socket(), &Default::default()).await;
    assert_eq!(
        still_serving,
        (true, BTreeMap::from([("uid-a".to_string(), Ok(vec![]))]))
    );
    assert!(fresh.is_ok());
}

/// Records when each instance enters and leaves a call, and holds each call until released.
struct GatedHandler {
    instance: &'static str,
    events: Arc<Mutex<Vec<String>>>,
    entered: mpsc::UnboundedSender<&'static str>,
    release: Arc<Semaphore>,
}

impl DraHandler for GatedHandler {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.events
            .lock()
            .unwrap()
            .push(format!("enter {}", self.instance));
        self.entered.send(self.instance).unwrap();
        self.release.acquire().await.unwrap().forget();
        self.events
            .lock()
            .unwrap()
            .push(format!("exit {}", self.instance));
        claims.into_iter().map(|c| (c.uid, Ok(vec![]))).collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_a_plugin_dir_never_run_calls_at_the_same_time() {
    let dir = tempfile::tempdir().unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let instance = |name| {
        Arc::new(GatedHandler {
            instance: name,
            events: Arc::clone(&events),
            entered: entered_tx.clone(),
            release: Arc::clone(&release),
        })
    };
    let old = serve(sockets(dir.path(), Some("old")), instance("old"), None)
        .await
        .unwrap();
    let new = serve(sockets(dir.path(), Some("new")), instance("new"), None)
        .await
        .unwrap();
    let versions = KubeletVersions::default();
    let mut kubelet_old = KubeletClient::register(old.registration_socket(), &versions)
        .await
        .unwrap();
    let mut kubelet_new = KubeletClient::register(new.registration_socket(), &versions)
        .await
        .unwrap();

    let first = tokio::spawn(async move { kubelet_old.prepare(&[claim("uid-1")]).await });
    assert_eq!(entered.recv().await, Some("old"));
    let lock = fs::File::open(dir.path().join("plugins/gpu.nvidia.com/plugin.lock")).unwrap();
    let held = matches!(lock.try_lock(), Err(fs::TryLockError::WouldBlock));
    assert!(held, "plugin.lock is free while a call runs");

    let second = tokio::spawn(async move { kubelet_new.prepare(&[claim("uid-2")]).await });
    // Give the second call every chance to slip past the lock; a slow machine only makes this
    // check weaker, never wrong.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    release.add_permits(1);
    assert!(first.await.unwrap().unwrap()["uid-1"].is_ok());
    assert_eq!(entered.recv().await, Some("new"));
    release.add_permits(1);
    assert!(second.await.unwrap().unwrap()["uid-2"].is_ok());

    let got = events.lock().unwrap().clone();
    assert_eq!(got, vec!["enter old", "exit old", "enter new", "exit new"]);
}
