//! A simulated node whose claims are prepared by the real plugin over its gRPC socket and
//! then run in podman containers, with the checks every CDI consumer's container must pass.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use gpu_dra::kubelet::PreparedDevice;
use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use serde_json::Value;

use super::{Inside, InstalledSpecs, Node as DevNode, podman_or_skip};
use crate::plugin_support::claims::claim_ref;
use crate::plugin_support::{Node, Plugin, eventually};

/// GPU 0 an A100 with static MIG devices, GPUs 1–7 H100s with dynamic MIG: every claim kind
/// has a device. Named like the claims' node.
const NODE_FILE: &str = "\
nodeName: dgx-h100
gpus:
  - model: A100-SXM4-40GB
    mig: static
    migDevices: [1g.5gb, 1g.5gb, 2g.10gb, 3g.20gb]
  - model: H100-SXM5-80GB
    count: 7
    mig: dynamic
passthrough:
  iommu: true
";

/// A file the test puts into each mount source, so a container that got some other
/// directory at the mount point cannot pass.
const MARKER: &str = "gpu-dra-podman-test-marker";

/// The plugin on a simulated node, registered by a kubelet-like client.
pub struct Rig {
    pub node: Node,
    plugin: Plugin,
    kubelet: KubeletClient,
    run: String,
}

impl Rig {
    /// Starts the plugin with extra `env`; `None` when podman tests are skipped here.
    pub async fn start(env: &[(&str, &str)]) -> Option<Rig> {
        Rig::start_with_args(env, &[]).await
    }

    /// [`Rig::start`] with `--passthrough` on the simulated node's host tree.
    pub async fn start_passthrough() -> Option<Rig> {
        Rig::start_with_args(&[], &["--passthrough"]).await
    }

    async fn start_with_args(env: &[(&str, &str)], args: &[&str]) -> Option<Rig> {
        podman_or_skip()?;
        let node = Node::new();
        let file = node.root().join("node.yaml");
        std::fs::write(&file, NODE_FILE).expect("node file");
        let node = node.with_sim_node(file.to_str().expect("UTF-8 path"));
        let mut command = node.command();
        command.args(args);
        if !args.is_empty() {
            command
                .arg("--host-root")
                .arg(node.state_dir().join("sim/host-root"));
        }
        let mut plugin = node.spawn_command(command, env);
        plugin.wait_registrable().await;
        let kubelet = plugin.register(DraApi::V1).await;
        eventually("the node's slices", || node.api.complete_pool()).await;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Some(Rig {
            node,
            plugin,
            kubelet,
            run: format!("p{}-{nanos}", std::process::id()),
        })
    }

    /// A claim UID unique to this run: CDI device names carry it, and the runtime reads every
    /// spec in its directory, so concurrent runs must not collide.
    pub fn uid(&self, name: &str) -> String {
        format!("{}-{name}", self.run)
    }

    /// Puts the allocated `claim` in the API server and prepares it as the kubelet would.
    ///
    /// # Panics
    /// When the prepare fails, with the plugin's log.
    pub async fn prepare(&mut self, claim: Value) -> Vec<PreparedDevice> {
        let name = claim["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let uid = claim["metadata"]["uid"].as_str().expect("uid").to_string();
        self.node.api.put_claim(claim);
        let mut got = self
            .kubelet
            .prepare(&[claim_ref(&name, &uid)])
            .await
            .expect("NodePrepareResources");
        match got.remove(&uid) {
            Some(Ok(devices)) => devices,
            other => panic!("prepare of {name}: {other:?}\n{}", self.plugin.log()),
        }
    }

    /// Unprepares the claim; its spec must be gone afterwards.
    pub async fn unprepare(&mut self, name: &str, uid: &str) {
        let got = self
            .kubelet
            .unprepare(&[claim_ref(name, uid)])
            .await
            .expect("NodeUnprepareResources");
        assert_eq!(got.get(uid), Some(&Ok(())), "{}", self.plugin.log());
        assert!(self.node.spec(uid).is_none(), "spec of {uid} left behind");
    }

    /// The `uuid` attribute the node publishes for `device`.
    pub fn published_uuid(&self, device: &str) -> String {
        self.node
            .api
            .slices()
            .values()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == device)
            .and_then(|d| d["attributes"]["uuid"]["string"].as_str().map(String::from))
            .unwrap_or_else(|| panic!("{device} is published without a UUID"))
    }

    /// Runs a container given `ids` and checks what every container must see:
    /// * `NVIDIA_VISIBLE_DEVICES=void`, exactly `want_uuids` in `DRA_GPU_UUID_*`, and every
    ///   env entry of the spec and of the given devices;
    /// * exactly the `/dev/nvidia*` nodes of the spec and the given devices, with their type,
    ///   numbers and mode;
    /// * each mount of the given devices mounted, showing the files of its host source.
    pub fn run_and_check(&self, uid: &str, ids: &[String], want_uuids: &[&String]) -> Inside {
        let text = self.node.spec(uid).expect("the claim's CDI spec");
        let spec: Value = serde_json::from_str(&text).expect("spec JSON");
        let kind = spec["kind"].as_str().expect("kind");
        let given: Vec<&Value> = spec["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .filter(|d| ids.contains(&format!("{kind}={}", d["name"].as_str().unwrap_or(""))))
            .collect();
        assert_eq!(given.len(), ids.len(), "IDs {ids:?} against spec {text}");
        let edits: Vec<&Value> = std::iter::once(&spec["containerEdits"])
            .chain(given.iter().map(|d| &d["containerEdits"]))
            .collect();
        let list = |e: &Value, key: &str| e[key].as_array().cloned().unwrap_or_default();
        let mounts: Vec<(String, String)> = edits
            .iter()
            .flat_map(|e| list(e, "mounts"))
            .map(|m| {
                let s = |k: &str| m[k].as_str().expect("mount path").to_string();
                (s("hostPath"), s("containerPath"))
            })
            .collect();
        // A file mount (a request's device metadata) is checked by its content; a directory
        // mount by what it lists, with a marker file added on the host side.
        let (file_mounts, mounts): (Vec<_>, Vec<_>) = mounts
            .into_iter()
            .partition(|(host, _)| std::path::Path::new(host).is_file());
        for (host, _) in &mounts {
            std::fs::write(std::path::Path::new(host).join(MARKER), "here\n").expect("marker");
        }
        let _installed = InstalledSpecs::install(&self.node.cdi_root());
        let file_dirs: Vec<String> = file_mounts
            .iter()
            .map(|(_, c)| {
                let parent = std::path::Path::new(c)
                    .parent()
                    .expect("a file in a directory");
                parent.to_string_lossy().into_owned()
            })
            .collect();
        let dirs: Vec<&str> = mounts
            .iter()
            .map(|(_, c)| c.as_str())
            .chain(file_dirs.iter().map(String::as_str))
            .collect();
        let inside = super::run(ids, &dirs);
        for (host, container) in &file_mounts {
            assert!(
                inside.mount_points.contains(container),
                "{container} is not a mount point: {:?}",
                inside.mount_points
            );
            let text = std::fs::read_to_string(host).expect("mounted file");
            assert_eq!(
                inside.contents.get(container),
                Some(&text),
                "{container} shows {host}"
            );
        }

        assert_eq!(
            inside.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
            Some("void")
        );
        let mut want: Vec<String> = want_uuids.iter().map(|u| u.to_string()).collect();
        want.sort();
        assert_eq!(inside.uuids(), want, "DRA_GPU_UUID_* of {ids:?}");
        for entry in edits.iter().flat_map(|e| list(e, "env")) {
            let (k, v) = entry
                .as_str()
                .and_then(|e| e.split_once('='))
                .expect("KEY=VALUE");
            assert_eq!(inside.env.get(k).map(String::as_str), Some(v), "env {k}");
        }

        let want_nodes: BTreeMap<String, DevNode> = edits
            .iter()
            .flat_map(|e| list(e, "deviceNodes"))
            .map(|n| {
                let num = |k: &str| n[k].as_u64().unwrap_or_else(|| panic!("{k} in {n}")) as u32;
                assert_eq!(n["type"], "c", "{n}");
                let node = DevNode {
                    kind: "character special file".into(),
                    major: num("major"),
                    minor: num("minor"),
                    mode: num("fileMode"),
                };
                (n["path"].as_str().expect("path").to_string(), node)
            })
            .collect();
        assert_eq!(inside.nvidia_nodes, want_nodes, "device nodes of {ids:?}");

        for (host, container) in &mounts {
            assert!(
                inside.mount_points.contains(container),
                "{container} is not a mount point: {:?}",
                inside.mount_points
            );
            let (files, contents) = host_files(host, container);
            let prefix = format!("{container}/");
            let seen: BTreeMap<String, String> = inside
                .files
                .iter()
                .filter(|(p, _)| p.starts_with(&prefix))
                .map(|(p, t)| (p.clone(), t.clone()))
                .collect();
            assert_eq!(seen, files, "{container} shows {host}");
            for (path, text) in contents {
                assert_eq!(inside.contents.get(&path), Some(&text), "content of {path}");
            }
        }
        inside
    }
}

/// What `stat -c %F` calls the files of a host directory (as seen at `container`), and the
/// contents of its small regular files.
fn host_files(host: &str, container: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    use std::os::unix::fs::FileTypeExt;
    let mut files = BTreeMap::new();
    let mut contents = BTreeMap::new();
    for entry in std::fs::read_dir(host).expect("mount source").flatten() {
        let meta = entry.metadata().expect("metadata");
        let t = meta.file_type();
        let kind = if t.is_socket() {
            "socket"
        } else if t.is_dir() {
            "directory"
        } else if t.is_fifo() {
            "fifo"
        } else if t.is_file() && meta.len() == 0 {
            "regular empty file"
        } else if t.is_file() {
            "regular file"
        } else {
            "other"
        };
        let path = format!("{container}/{}", entry.file_name().to_string_lossy());
        if t.is_file() && meta.len() > 0 && meta.len() < 4096 {
            let text = std::fs::read_to_string(entry.path()).expect("small file");
            contents.insert(path.clone(), text);
        }
        files.insert(path, kind.to_string());
    }
    (files, contents)
}

/// The CDI IDs the kubelet gives a container naming `request` (every device when `None`).
pub fn cdi_ids(devices: &[PreparedDevice], request: Option<&str>) -> Vec<String> {
    devices
        .iter()
        .filter(|d| {
            request.is_none_or(|r| {
                d.request_names.is_empty() || d.request_names.iter().any(|n| n == r)
            })
        })
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect()
}

/// The GPU nodes (`/dev/nvidia<N>`) a container has, sorted.
pub fn gpu_nodes(inside: &Inside) -> Vec<String> {
    inside
        .nvidia_nodes
        .keys()
        .filter(|p| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .cloned()
        .collect()
}
