//! `gpu-dra imex-daemon` as the DaemonSet runs it: real processes (the wrapper and the
//! simulated `nvidia-imex` it supervises) on loopback addresses 127.0.1.x, against the
//! watch-capable fake API server's `computedomainnodes` (`cd_support`). Three nodes reach
//! Ready with indices 0, 1, 2 that stay put when a daemon restarts and a node joins; a killed
//! `nvidia-imex` is restarted and its object shows the crash meanwhile; nodes of another clique
//! or domain are not peers; a peer that joins later arrives through the watch; at steady state
//! a daemon sends nothing.

mod cd_support;
mod imex_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use cd_support::{ObjServer, WORKLOAD_NS as DOMAIN_NS, domains_path, node_objects_path};
use gpu_dra::compute_domain::api;
use gpu_dra::compute_domain::imex::signal::{Signal, send};
use imex_support::{tools, wait_for, write_config};
use serde_json::{Value, json};

const NAMESPACE: &str = "gpu-dra";
const CLIQUE: &str = "6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f.1";

struct Cluster {
    tmp: tempfile::TempDir,
    server: ObjServer,
    kubeconfig: PathBuf,
    imex: PathBuf,
    ctl: PathBuf,
    /// Domain UID to name, of the domains [`Cluster::domain`] created.
    names: std::sync::Mutex<BTreeMap<String, String>>,
}

impl Cluster {
    fn new() -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let server = ObjServer::start();
        let kubeconfig = tmp.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig);
        let (imex, ctl) = tools(tmp.path());
        Cluster {
            tmp,
            server,
            kubeconfig,
            imex,
            ctl,
            names: Default::default(),
        }
    }

    /// Creates ComputeDomain `name` in `team-a` (a daemon serves only a domain that exists)
    /// and returns its UID.
    fn domain(&self, name: &str) -> String {
        let created = self
            .server
            .create(&domains_path(DOMAIN_NS), cd_support::domain(name, 0));
        let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
        self.names
            .lock()
            .unwrap()
            .insert(uid.clone(), name.to_string());
        uid
    }

    fn domain_name(&self, uid: &str) -> String {
        self.names.lock().unwrap()[uid].clone()
    }

    /// The config dir of `node` in `domain`, with the config the plugin would write (FULL
    /// quorum, so Ready means every peer is connected).
    fn config_dir(&self, domain: &str, node: &str, ip: &str) -> PathBuf {
        let dir = self.tmp.path().join(domain).join(node);
        if !dir.join("config.cfg").exists() {
            write_config(&dir, ip, "FULL", &[]);
        }
        dir
    }

    /// Starts the wrapper for `node` at `ip` in `domain`, clique `clique`, with the tools
    /// linked by the test.
    fn start(&self, domain: &str, node: &str, ip: &str, clique: &str) -> Wrapper {
        let tools = [
            "--imex-bin".into(),
            self.imex.display().to_string(),
            "--imex-ctl-bin".into(),
            self.ctl.display().to_string(),
        ];
        self.start_with(domain, node, ip, clique, &tools)
    }

    fn start_with(
        &self,
        domain: &str,
        node: &str,
        ip: &str,
        clique: &str,
        extra: &[String],
    ) -> Wrapper {
        let dir = self.config_dir(domain, node, ip);
        let child = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
            .args(["imex-daemon", "--node-name", node, "--pod-ip", ip])
            .args(["--namespace", NAMESPACE])
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--config-dir")
            .arg(&dir)
            .args(extra)
            .env(api::daemon_env::DOMAIN_UID, domain)
            .env(api::daemon_env::DOMAIN_NAME, self.domain_name(domain))
            .env(api::daemon_env::DOMAIN_NAMESPACE, DOMAIN_NS)
            .env(api::daemon_env::CLIQUE_ID, clique)
            .env_remove("POD_IP")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Wrapper { child, dir }
    }

    /// (index, status, reason, message, ip) of every ComputeDomainNode of `domain`, by node.
    fn nodes(&self, domain: &str) -> BTreeMap<String, (u64, String, String, String, String)> {
        self.server
            .list(&node_objects_path(), "")
            .into_iter()
            .filter(|o| o["spec"]["domainUID"] == domain)
            .map(|o| {
                let s = &o["status"];
                let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    text(&o["spec"]["nodeName"]),
                    (
                        s["index"].as_u64().unwrap_or(u64::MAX),
                        text(&s["status"]),
                        text(&s["reason"]),
                        text(&s["message"]),
                        text(&s["ipAddress"]),
                    ),
                )
            })
            .collect()
    }

    fn ready(&self, domain: &str, node: &str) -> bool {
        self.nodes(domain).get(node).is_some_and(|n| n.1 == "Ready")
    }

    fn index(&self, domain: &str, node: &str) -> u64 {
        self.nodes(domain)[node].0
    }

    /// Writes the object a peer's daemon writes when it starts: index 1, NotReady,
    /// `DaemonStarting`, at `ip` (the test plays that daemon).
    fn starting_peer(&self, domain: &str, node: &str, ip: &str) {
        self.server.create(
            &node_objects_path(),
            json!({
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomainNode",
                "metadata": {"name": api::compute_domain_node_name(domain, node),
                             "labels": {api::DOMAIN_UID_LABEL: domain}},
                "spec": {"domainUID": domain, "domainNamespace": DOMAIN_NS,
                         "domainName": self.domain_name(domain), "nodeName": node,
                         "cliqueID": CLIQUE},
                "status": {"ipAddress": ip, "index": 1, "status": "NotReady",
                           "reason": "DaemonStarting"},
            }),
        );
    }
}

/// A running wrapper; stopped with SIGTERM (which stops its `nvidia-imex`) when dropped.
struct Wrapper {
    child: Child,
    dir: PathBuf,
}

impl Wrapper {
    fn stop(&mut self) -> Option<i32> {
        let _ = send(self.child.id(), Signal::Terminate);
        self.child.wait().ok().and_then(|s| s.code())
    }

    fn nodes_config(&self) -> String {
        std::fs::read_to_string(self.dir.join("nodes_config.cfg")).unwrap_or_default()
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}

/// The pid of the `nvidia-imex -c <dir>/config.cfg` running now, from /proc.
fn imex_pid(dir: &Path) -> Option<u32> {
    let config = dir.join("config.cfg");
    let want = format!("-c\0{}\0", config.display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let text = String::from_utf8_lossy(&cmdline);
        (text.contains("nvidia-imex\0") && text.ends_with(&want)).then_some(pid)
    })
}

#[test]
fn three_nodes_reach_ready_with_indices_that_survive_a_restart_and_a_join() {
    let c = Cluster::new();
    let d = &c.domain("imex-1");
    let mut w0 = c.start(d, "tray-0", "127.0.1.2", CLIQUE);
    wait_for("tray-0's object", || c.nodes(d).contains_key("tray-0"));
    let mut w1 = c.start(d, "tray-1", "127.0.1.3", CLIQUE);
    wait_for("both ready", || {
        c.ready(d, "tray-0") && c.ready(d, "tray-1")
    });
    assert_eq!((c.index(d, "tray-0"), c.index(d, "tray-1")), (0, 1));
    assert_eq!(w0.nodes_config(), "127.0.1.2\n127.0.1.3\n");

    // A node of another clique in the same domain, and a node of another domain in this
    // clique: neither is a peer.
    let other_clique = "6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f.2";
    let _x = c.start(d, "tray-x", "127.0.1.9", other_clique);
    let d2 = &c.domain("imex-2");
    let _y = c.start(d2, "tray-y", "127.0.1.10", CLIQUE);
    wait_for("the outsiders ready", || {
        c.ready(d, "tray-x") && c.ready(d2, "tray-y")
    });
    assert_eq!(c.index(d, "tray-x"), 0, "indices count per clique");
    assert_eq!(c.index(d2, "tray-y"), 0, "and per domain");

    // A third node joins: index 2, and every node's nodes config lists all three in order.
    let w2 = c.start(d, "tray-2", "127.0.1.4", CLIQUE);
    wait_for("three ready", || {
        ["tray-0", "tray-1", "tray-2"].iter().all(|n| c.ready(d, n))
    });
    let three = "127.0.1.2\n127.0.1.3\n127.0.1.4\n";
    for w in [&w0, &w1, &w2] {
        assert_eq!(w.nodes_config(), three);
    }
    let (_, domain) = imex_support::ctl(
        &c.ctl,
        &["-c", w0.dir.join("config.cfg").to_str().unwrap(), "-N"],
    );
    assert!(domain.contains("Domain State: UP"), "{domain}");

    // tray-1's daemon restarts: stopped (NotReady, DaemonStopped), back with index 1.
    assert_eq!(w1.stop(), Some(0));
    let stopped = c.nodes(d)["tray-1"].clone();
    assert_eq!(
        (stopped.1.as_str(), stopped.2.as_str()),
        ("NotReady", "DaemonStopped")
    );
    let w1 = c.start(d, "tray-1", "127.0.1.3", CLIQUE);
    wait_for("tray-1 ready again", || c.ready(d, "tray-1"));
    let indices: Vec<u64> = ["tray-0", "tray-1", "tray-2"]
        .iter()
        .map(|n| c.index(d, n))
        .collect();
    assert_eq!(indices, [0, 1, 2]);
    assert_eq!(w1.nodes_config(), three);
    drop(w1);
    w0.stop();
}

#[test]
fn a_killed_nvidia_imex_is_restarted_and_its_object_shows_the_crash_meanwhile() {
    let c = Cluster::new();
    let d = &c.domain("imex-3");
    let w = c.start(d, "tray-k", "127.0.1.20", CLIQUE);
    wait_for("ready", || c.ready(d, "tray-k"));
    let first = imex_pid(&w.dir).expect("nvidia-imex runs");
    send(first, Signal::Kill).unwrap();
    wait_for("the crash in the object", || {
        let n = &c.nodes(d)["tray-k"];
        n.1 == "NotReady" && n.2 == "DaemonCrashed"
    });
    let crashed = c.nodes(d)["tray-k"].clone();
    assert!(crashed.3.contains("signal: 9"), "{}", crashed.3);
    wait_for("ready after the restart", || c.ready(d, "tray-k"));
    let second = imex_pid(&w.dir).expect("nvidia-imex runs again");
    assert_ne!(first, second, "a new nvidia-imex process");
    let back = c.nodes(d)["tray-k"].clone();
    assert_eq!(
        (back.2.as_str(), back.3.as_str()),
        ("", ""),
        "reason cleared"
    );
}

#[test]
fn concurrent_starters_end_with_distinct_indices() {
    let c = Cluster::new();
    let d = &c.domain("imex-4");
    let nodes = [
        ("tray-a", "127.0.1.30"),
        ("tray-b", "127.0.1.31"),
        ("tray-c", "127.0.1.32"),
    ];
    let _ws: Vec<Wrapper> = nodes
        .iter()
        .map(|(n, ip)| c.start(d, n, ip, CLIQUE))
        .collect();
    wait_for("all ready", || nodes.iter().all(|(n, _)| c.ready(d, n)));
    let mut indices: Vec<u64> = nodes.iter().map(|(n, _)| c.index(d, n)).collect();
    indices.sort();
    assert_eq!(indices, [0, 1, 2]);
}

#[test]
fn a_missing_domain_identity_is_refused_naming_the_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["imex-daemon", "--node-name", "n", "--pod-ip", "127.0.1.40"])
        .args(["--namespace", NAMESPACE])
        .env_remove(api::daemon_env::DOMAIN_UID)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("COMPUTE_DOMAIN_UUID is required"), "{err}");
}

/// Requests recorded from the `from`-th on, as (method, path, labelSelector, watch).
fn calls_since(c: &Cluster, from: usize) -> Vec<(String, String, Option<String>, bool)> {
    c.server
        .requests()
        .into_iter()
        .skip(from)
        .map(|r| {
            let watch = r
                .query
                .get("watch")
                .is_some_and(|w| w == "true" || w == "1");
            (
                r.method,
                r.path,
                r.query.get("labelSelector").cloned(),
                watch,
            )
        })
        .collect()
}

#[test]
fn at_steady_state_a_ready_node_sends_nothing_but_its_open_watch() {
    let c = Cluster::new();
    let d = &c.domain("imex-5");
    // As a simulated node's DaemonSet runs it: the binary links its own simulated tools.
    let _w = c.start_with(
        d,
        "tray-s",
        "127.0.1.50",
        CLIQUE,
        &["--simulated-imex".into()],
    );
    wait_for("ready", || c.ready(d, "tray-s"));
    let selector = Some(format!("{}={d}", api::DOMAIN_UID_LABEL));
    let watching = calls_since(&c, 0)
        .into_iter()
        .any(|(m, p, s, w)| m == "GET" && p == node_objects_path() && s == selector && w);
    assert!(watching, "the daemon watches its domain's objects");
    // Let the Ready write come back through the watch, then count over four ticks.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let before = c.server.requests().len();
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let calls = calls_since(&c, before);
    let requests: Vec<_> = calls.iter().filter(|(.., watch)| !watch).collect();
    assert!(
        requests.is_empty(),
        "a Ready node costs the API server no request at steady state (it polled one LIST per \
         500 ms tick before, 2 LIST/s per node, ~2,000 LIST/s on 1,000 nodes); it sent {requests:?}"
    );
    assert!(
        calls.len() <= 1,
        "at most the watch re-opened, not re-opened per tick: {calls:?}"
    );
}

#[test]
fn a_peer_that_joins_after_ready_is_rendered_from_the_watch_without_a_list() {
    let c = Cluster::new();
    let d = &c.domain("imex-7");
    let w = c.start(d, "tray-w", "127.0.1.70", CLIQUE);
    wait_for("ready", || c.ready(d, "tray-w"));
    assert_eq!(w.nodes_config(), "127.0.1.70\n");
    let before = c.server.requests().len();
    // A peer's daemon writes its object (the test writes it as that daemon would).
    c.starting_peer(d, "tray-v", "127.0.1.71");
    wait_for("the peer in tray-w's nodes config", || {
        w.nodes_config() == "127.0.1.70\n127.0.1.71\n"
    });
    let lists: Vec<_> = calls_since(&c, before)
        .into_iter()
        .filter(|(m, p, _, watch)| m == "GET" && *p == node_objects_path() && !watch)
        .collect();
    assert!(
        lists.is_empty(),
        "the peer arrived through the watch, with no LIST after Ready: {lists:?}"
    );
}

#[test]
fn the_plugins_config_runs_as_written_outside_a_container() {
    // The plugin's config.cfg: no bind address, logs to stderr, the nodes file at the
    // container's mount. Outside a container each node binds its POD_IP and keeps its nodes
    // file in its own directory; the daemon's stderr is drained into the wrapper's log.
    let c = Cluster::new();
    let d = &c.domain("imex-6");
    let nodes = [("tray-p0", "127.0.1.60"), ("tray-p1", "127.0.1.61")];
    let plugin_config = "LOG_LEVEL=4\nLOG_FILE_NAME=\nSERVER_PORT=50000\nSECURITY_MODE=0\nIMEX_CMD_PORT=50005\nIMEX_CMD_ENABLED=1\nIMEX_WAIT_FOR_QUORUM=RECOVERY\nIMEX_CONN_WAIT_TIMEOUT=70\nIMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n";
    for (node, _) in nodes {
        let dir = c.tmp.path().join(d).join(node);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.cfg"), plugin_config).unwrap();
    }
    let ws: Vec<Wrapper> = nodes
        .iter()
        .map(|(n, ip)| c.start(d, n, ip, CLIQUE))
        .collect();
    wait_for("both ready", || nodes.iter().all(|(n, _)| c.ready(d, n)));
    // Whichever daemon starts first takes index 0: both files list both, in index order.
    let in_index_order = || {
        let mut by_index: Vec<(u64, &str)> =
            nodes.iter().map(|(n, ip)| (c.index(d, n), *ip)).collect();
        by_index.sort();
        by_index
            .iter()
            .map(|(_, ip)| format!("{ip}\n"))
            .collect::<String>()
    };
    wait_for("both nodes files list both, in index order", || {
        let want = in_index_order();
        ws.iter().all(|w| w.nodes_config() == want)
    });
    let domain = || {
        let out = Command::new(&c.ctl)
            .env("POD_IP", "127.0.1.60")
            .args(["-c", ws[0].dir.join("config.cfg").to_str().unwrap(), "-N"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_for("the two daemons connected", || {
        domain().contains("Domain State: UP")
    });
}

#[test]
fn an_expired_watch_is_listed_again_and_a_peer_that_joined_meanwhile_is_rendered() {
    let c = Cluster::new();
    let d = &c.domain("imex-9");
    let w = c.start(d, "tray-x", "127.0.1.90", CLIQUE);
    wait_for("ready", || c.ready(d, "tray-x"));
    assert_eq!(w.nodes_config(), "127.0.1.90\n");
    // Let the Ready write come back through the watch before the history goes.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let before = c.server.requests().len();

    // The API server compacts: the open watch ends with 410 Expired, and a watch resumed from
    // its last resourceVersion would be refused the same way. A peer joins right after.
    c.server.expire_watches();
    c.starting_peer(d, "tray-y", "127.0.1.91");
    wait_for(
        "the peer in tray-x's nodes config after the re-list",
        || w.nodes_config() == "127.0.1.90\n127.0.1.91\n",
    );

    let calls = calls_since(&c, before);
    let selector = Some(format!("{}={d}", api::DOMAIN_UID_LABEL));
    let relisted = calls.iter().any(|(m, p, s, watch)| {
        m == "GET" && *p == node_objects_path() && *s == selector && !watch
    });
    assert!(
        relisted,
        "the daemon listed its domain's objects again after the 410: {calls:?}"
    );
    assert!(
        c.server.expired_watches() >= 1,
        "the open watch was expired"
    );
    // It watches again, from the new list.
    let rewatched = calls
        .iter()
        .filter(|(m, p, s, watch)| {
            m == "GET" && *p == node_objects_path() && *s == selector && *watch
        })
        .count();
    assert!(rewatched >= 1, "a new watch after the re-list: {calls:?}");
    // Writes resumed after the re-list: the object now says what nvidia-imex says with a
    // peer in its config that has not come up (quorum), not a watch failure.
    wait_for("tray-x's object reporting the quorum wait", || {
        c.nodes(d)["tray-x"].2 == "WaitingForQuorum"
    });
    assert_eq!(c.index(d, "tray-x"), 0, "its index survived the re-list");
}

/// The nodes config's content and modification time.
fn nodes_file(w: &Wrapper) -> (String, std::time::SystemTime) {
    let path = w.dir.join("nodes_config.cfg");
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    (std::fs::read_to_string(&path).unwrap(), modified)
}

#[test]
fn a_daemon_whose_domain_is_being_deleted_never_recreates_its_object_nor_rewrites_its_config() {
    let c = Cluster::new();
    let d = &c.domain("imex-10");
    let mut w0 = c.start(d, "tray-d0", "127.0.1.100", CLIQUE);
    let mut w1 = c.start(d, "tray-d1", "127.0.1.101", CLIQUE);
    wait_for("both ready", || {
        c.ready(d, "tray-d0") && c.ready(d, "tray-d1")
    });
    // Whichever started first took index 0: both files list both, in the same order.
    wait_for("both nodes files list both", || {
        let (a, b) = (w0.nodes_config(), w1.nodes_config());
        a == b && a.lines().count() == 2
    });
    let before = [nodes_file(&w0), nodes_file(&w1)];

    // `kubectl delete`: the controller's finalizer keeps the domain while it deletes the
    // domain's objects, as it does with daemons still running.
    let domain = domains_path(DOMAIN_NS) + "/imex-10";
    let (code, _) = c.server.patch(
        &domain,
        json!({"metadata": {"finalizers": [api::FINALIZER]}}),
    );
    assert_eq!(code, 200);
    assert_eq!(c.server.delete(&domain), 200);
    let selector = format!("{}={d}", api::DOMAIN_UID_LABEL);
    for o in c.server.list(&node_objects_path(), &selector) {
        let name = o["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            c.server.delete(&format!("{}/{name}", node_objects_path())),
            200
        );
    }
    let deleted_at = c.server.requests().len();

    // Several rounds later: nothing was re-created, no config rewritten, nothing written.
    std::thread::sleep(std::time::Duration::from_millis(1600));
    assert_eq!(
        c.server.list(&node_objects_path(), &selector),
        Vec::<Value>::new()
    );
    assert_eq!([nodes_file(&w0), nodes_file(&w1)], before);
    let writes: Vec<String> = c.server.requests()[deleted_at..]
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(writes, Vec::<String>::new());

    // The kubelet unprepares tray-d0's daemon claim (the plugin removes its config): that
    // daemon exits by itself, with status 0; SIGTERM ends the other one, also writing nothing.
    std::fs::remove_dir_all(&w0.dir).unwrap();
    let exited = wait_exit(&mut w0.child, std::time::Duration::from_secs(5));
    assert_eq!(exited, Some(0));
    assert_eq!(w1.stop(), Some(0));
    assert_eq!(
        c.server.list(&node_objects_path(), &selector),
        Vec::<Value>::new()
    );
    assert!(
        c.server.requests()[deleted_at..]
            .iter()
            .all(|r| !r.is_write()),
        "a daemon of a deleted domain wrote"
    );
}

#[test]
fn a_daemon_started_for_a_domain_that_is_gone_creates_nothing_and_exits_once_unprepared() {
    let c = Cluster::new();
    let d = &c.domain("imex-11");
    let domain = domains_path(DOMAIN_NS) + "/imex-11";
    assert_eq!(c.server.delete(&domain), 200);
    let mut w = c.start(d, "tray-g", "127.0.1.110", CLIQUE);
    wait_for("the daemon to read its domain", || {
        c.server
            .requests()
            .iter()
            .any(|r| r.method == "GET" && r.path == domain)
    });
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert_eq!(
        c.nodes(d),
        BTreeMap::new(),
        "no object for a domain that is gone"
    );
    assert!(
        imex_pid(&w.dir).is_none(),
        "no nvidia-imex for a domain that is gone"
    );
    std::fs::remove_dir_all(&w.dir).unwrap();
    assert_eq!(
        wait_exit(&mut w.child, std::time::Duration::from_secs(5)),
        Some(0)
    );
    assert!(c.server.requests().iter().all(|r| !r.is_write()));
}

/// Waits up to `within` for `child` to exit by itself; its exit code.
fn wait_exit(child: &mut Child, within: std::time::Duration) -> Option<i32> {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}
