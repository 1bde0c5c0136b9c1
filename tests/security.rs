//! The points of docs/security.md, one test (or more) each: names from the kubelet and the
//! checkpoint cannot escape a directory; sockets, directories and state files get their
//! modes; writes in the CDI and state directories do not follow planted symlinks; MPS
//! daemons do not inherit the plugin's environment; the API token is never logged.

mod plugin_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use gpu_dra::cdi::{CdiWriter, ClaimNaming};
use gpu_dra::checkpoint::CheckpointStore;
use gpu_dra::kubelet::client::DraApi;
use gpu_dra::kubelet::{ClaimRef, validate_claims};
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{live_daemons, mps_config, with_config};
use plugin_support::{Node, eventually};

const HOSTILE: [&str; 6] = [
    "../../etc/cron.d/x",
    "/etc/passwd",
    "..",
    ".checkpoint.json.tmp-1-0",
    "a/b",
    "a\0b",
];

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

// 1. Claim UIDs and names are validated before they become file or directory names.

#[test]
fn hostile_claim_uids_and_names_are_refused_at_the_kubelet_boundary_naming_the_field() {
    for hostile in HOSTILE {
        let refs = vec![
            ClaimRef {
                namespace: "team-a".into(),
                name: "ok".into(),
                uid: hostile.into(),
            },
            ClaimRef {
                namespace: hostile.into(),
                name: "ok".into(),
                uid: "uid-ns".into(),
            },
            ClaimRef {
                namespace: "team-a".into(),
                name: hostile.into(),
                uid: "uid-name".into(),
            },
        ];
        let (valid, invalid) = validate_claims(refs);
        assert!(valid.is_empty(), "{hostile:?} passed: {valid:?}");
        assert!(
            invalid[hostile].starts_with("claim field uid "),
            "{invalid:?}"
        );
        assert!(invalid["uid-ns"].starts_with("claim field namespace "));
        assert!(invalid["uid-name"].starts_with("claim field name "));
    }
}

#[test]
fn hostile_claim_uids_never_name_a_cdi_spec_or_an_mps_daemon_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cdi = dir.path().join("cdi");
    let writer = CdiWriter::new(&cdi);
    let naming = ClaimNaming::default();
    for hostile in HOSTILE {
        assert!(naming.spec_file_name(hostile).is_err(), "{hostile:?}");
        assert!(writer.spec_path(hostile).is_err(), "{hostile:?}");
        assert!(writer.remove_claim_spec(hostile).is_err(), "{hostile:?}");
        assert!(
            gpu_dra::sharing::validate_daemon_id(hostile).is_err(),
            "{hostile:?}"
        );
    }
    assert!(!dir.path().join("etc").exists());
}

// 2. Socket and state file modes.

#[tokio::test]
async fn sockets_directories_and_state_files_get_their_modes() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("mig", "uid-mig", &["gpu-0-mig-1g10gb-0"]));
    // Every profile on every GPU: the default `split` gives GPU 0 no 1g.10gb.
    let plugin = node.start_with(&[("GPU_DRA_MIG_PROFILES", "all")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("mig", "uid-mig")])
        .await
        .unwrap();
    assert!(got["uid-mig"].is_ok(), "{got:?}");
    let want = [
        (node.dra_socket(), 0o600),
        (node.registration_socket(), 0o600),
        (node.plugin_dir(), 0o750),
        (node.plugin_dir().join("plugin.lock"), 0o600),
        (node.state_dir().join("checkpoint.json"), 0o600),
        // The container runtime, possibly another user, reads the specs.
        (
            node.cdi_root()
                .join(plugin_support::state::spec_file("uid-mig")),
            0o644,
        ),
    ];
    for (path, mode_wanted) in want {
        assert_eq!(
            format!("{mode_wanted:o}"),
            format!("{:o}", mode(&path)),
            "{}",
            path.display()
        );
    }
}

// 3. Writes in the CDI and state directories do not follow planted symlinks.

#[test]
fn a_symlink_planted_at_a_spec_or_checkpoint_path_is_replaced_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::write(&outside, "precious").unwrap();
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    let writer = CdiWriter::new(&cdi);
    let spec_path = writer.spec_path("uid-a").unwrap();
    std::os::unix::fs::symlink(&outside, &spec_path).unwrap();
    let spec: gpu_dra::cdi::Spec = serde_json::from_value(serde_json::json!({
        "cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{"name": "uid-a-gpu-0", "containerEdits": {"env": ["A=1"]}}]
    }))
    .unwrap();
    writer.write_claim_spec("uid-a", &spec).unwrap();
    assert_eq!("precious", std::fs::read_to_string(&outside).unwrap());
    assert!(std::fs::symlink_metadata(&spec_path).unwrap().is_file());

    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::symlink(&outside, state.join("checkpoint.json")).unwrap();
    let (mut store, _) = CheckpointStore::open(&state, "boot-1").unwrap_or_else(|e| {
        // A symlink to a non-checkpoint reads as corrupt and is moved aside: fine too.
        panic!("{e}")
    });
    store.update(|_| ()).unwrap();
    assert_eq!("precious", std::fs::read_to_string(&outside).unwrap());
    assert!(
        std::fs::symlink_metadata(state.join("checkpoint.json"))
            .unwrap()
            .is_file()
    );
}

#[test]
fn a_symlink_planted_at_the_temp_path_fails_the_write_and_redirects_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::write(&outside, "precious").unwrap();
    let target = dir.path().join("spec.json");
    // The temp names this process will use next: `.<name>.tmp-<pid>-<counter>`.
    let pid = std::process::id();
    for n in 0..256 {
        let temp = dir.path().join(format!(".spec.json.tmp-{pid}-{n}"));
        std::os::unix::fs::symlink(&outside, temp).unwrap();
    }
    let result = gpu_dra::fsutil::write_atomic(&target, b"new", 0o644);
    assert!(
        matches!(result, Err(gpu_dra::fsutil::FsError::CreateTemp { .. })),
        "{result:?}"
    );
    assert_eq!("precious", std::fs::read_to_string(&outside).unwrap());
    assert!(!target.exists());
}

// 4. MPS daemons do not inherit the plugin's environment beyond what MPS needs.

#[tokio::test]
async fn an_mps_daemon_does_not_inherit_the_plugins_secrets() {
    let node = Node::new();
    node.api.put_claim(with_config(
        claims::on_node("mps", "uid-mps", &["gpu-3"]),
        &[],
        mps_config("GpuConfig", 50, "10Gi"),
    ));
    let plugin = node
        .start_with(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("AWS_SECRET_ACCESS_KEY", "hunter2-secret"),
            ("CUDA_MPS_LOG_DIRECTORY_HINT", "kept"),
        ])
        .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("mps", "uid-mps")])
        .await
        .unwrap();
    assert!(got["uid-mps"].is_ok(), "{got:?}\n{}", plugin.log());
    let daemons = live_daemons(node.root());
    assert_eq!(1, daemons.len());
    let environ = std::fs::read(format!("/proc/{}/environ", daemons[0])).unwrap();
    let vars: Vec<String> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    let names: Vec<&str> = vars
        .iter()
        .map(|v| v.split_once('=').map_or(v.as_str(), |(k, _)| k))
        .collect();
    for secret in ["KUBERNETES_SERVICE_HOST", "AWS_SECRET_ACCESS_KEY", "HOME"] {
        assert!(!names.contains(&secret), "{secret} leaked: {vars:#?}");
    }
    for needed in [
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MPS_LOG_DIRECTORY_HINT",
    ] {
        assert!(names.contains(&needed), "{needed} missing: {vars:#?}");
    }
    kubelet
        .unprepare(&[claim_ref("mps", "uid-mps")])
        .await
        .unwrap();
}

// 5. No secrets or tokens are logged.

#[tokio::test]
async fn the_kubeconfig_bearer_token_never_appears_in_a_debug_log() {
    const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.s1gnature";
    let node = Node::new();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
         current-context: fake\nusers:\n- name: fake\n  user:\n    token: {TOKEN}\n",
        node.api.url()
    );
    std::fs::write(node.root().join("kubeconfig"), text).unwrap();
    node.api
        .put_claim(claims::on_node("full", "uid-full", &["gpu-6"]));
    node.api
        .put_claim(claims::on_node("gone", "uid-gone", &["gpu-7"]));
    let plugin = node.start_with(&[("GPU_DRA_LOG", "debug")]).await;
    eventually("slices", || node.api.complete_pool()).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet
        .prepare(&[claim_ref("full", "uid-full"), claim_ref("missing", "uid-x")])
        .await
        .unwrap();
    assert!(got["uid-full"].is_ok(), "{got:?}");
    assert!(got["uid-x"].is_err(), "a failed fetch is logged too");
    let sent = node
        .api
        .requests()
        .iter()
        .filter(|r| r.authorization.as_deref() == Some(&format!("Bearer {TOKEN}")))
        .count();
    assert!(
        sent > 0,
        "the token was used (else this test proves nothing)"
    );
    let log = plugin.log();
    assert!(log.contains("DEBUG"), "the log is at debug level");
    for secret in [TOKEN, "c2VjcmV0LXRva2Vu", "s1gnature"] {
        assert!(!log.contains(secret), "{secret} logged:\n{log}");
    }
}
