//! `kubectl delete -f job.yaml` as users do it: the ComputeDomain is deleted while its IMEX
//! daemons still run, and the kubelet stops them some time later. Real binaries (`gpu-dra
//! compute-domain-controller` and one `gpu-dra imex-daemon` per node, over the simulated
//! `nvidia-imex`) against the fake API server; the test plays the compute-domain plugin
//! (labels the nodes, writes the daemons' config), the DaemonSet's pods (starts a daemon per
//! labelled node), the kubelet (SIGTERM to the daemons `delay` after the delete, then the daemon
//! claim's unprepare) and the garbage collector (ends the DaemonSet's foreground deletion once
//! its pods are gone). Whatever the delay, nothing of the domain may remain, and no daemon may
//! rewrite its nodes config after the delete.

mod cd_support;
mod imex_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use cd_support::*;
use gpu_dra::compute_domain::api;
use gpu_dra::compute_domain::imex::signal::{Signal, send};
use serde_json::{Value, json};

const CLIQUE: &str = "6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f.1";
const WAIT: Duration = Duration::from_secs(20);

/// A process stopped when dropped, if it still runs: SIGTERM (a daemon then stops its
/// `nvidia-imex`, which would otherwise keep its address and fail the next run), SIGKILL
/// after 5 s.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() && self.terminate().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Proc {
    /// SIGTERM, then its exit code (within 5 s).
    fn terminate(&mut self) -> Option<i32> {
        let _ = send(self.0.id(), Signal::Terminate);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `gpu-dra compute-domain-controller` against the server of `<dir>/kubeconfig`, its log in
/// `log`.
fn controller(dir: &Path, extra: &[&str], log: &Path) -> Proc {
    let kubeconfig = dir.join("kubeconfig");
    Proc(
        Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
            .args(["compute-domain-controller", "--namespace", DRIVER_NS])
            .args(["--leader-election", "false"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(extra)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("GPU_DRA_IMEX_IMAGE")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// One node's daemon, as its DaemonSet pod runs it, with the config the plugin wrote, against
/// the server of `<dir>/kubeconfig`.
fn daemon(dir: &Path, domain: &Value, node: &str, ip: &str) -> (Proc, PathBuf) {
    let config_dir = dir.join(node);
    imex_support::write_config(&config_dir, ip, "RECOVERY", &[]);
    let kubeconfig = dir.join("kubeconfig");
    let child = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["imex-daemon", "--node-name", node, "--pod-ip", ip])
        .args(["--namespace", DRIVER_NS, "--simulated-imex"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--config-dir")
        .arg(&config_dir)
        .env(
            api::daemon_env::DOMAIN_UID,
            domain["metadata"]["uid"].as_str().unwrap(),
        )
        .env(
            api::daemon_env::DOMAIN_NAME,
            domain["metadata"]["name"].as_str().unwrap(),
        )
        .env(api::daemon_env::DOMAIN_NAMESPACE, WORKLOAD_NS)
        .env(api::daemon_env::CLIQUE_ID, CLIQUE)
        .env_remove("POD_IP")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Proc(child), config_dir)
}

/// The nodes config's content and modification time.
fn nodes_file(dir: &Path) -> (String, SystemTime) {
    let path = dir.join("nodes_config.cfg");
    (
        std::fs::read_to_string(&path).unwrap(),
        std::fs::metadata(&path).unwrap().modified().unwrap(),
    )
}

/// What is left of domain `uid`: node objects, labelled nodes, DaemonSet, daemon template,
/// workload template.
fn leftovers(server: &ObjServer, uid: &str, workload_template: &str) -> Vec<String> {
    let mut left: Vec<String> = server
        .list(
            &node_objects_path(),
            &format!("{}={uid}", api::DOMAIN_UID_LABEL),
        )
        .iter()
        .map(|o| format!("ComputeDomainNode {}", o["metadata"]["name"]))
        .collect();
    left.extend(
        server
            .list(NODES, &format!("{}={uid}", api::NODE_LABEL))
            .iter()
            .map(|n| format!("label on Node {}", n["metadata"]["name"])),
    );
    let objects = [
        ("DaemonSet", format!("{}/imex-{uid}", daemon_sets_path())),
        (
            "daemon template",
            format!("{}/imex-{uid}", templates_path(DRIVER_NS)),
        ),
        (
            "workload template",
            format!("{}/{workload_template}", templates_path(WORKLOAD_NS)),
        ),
    ];
    for (what, path) in objects {
        if server.get(&path).is_some() {
            left.push(what.to_string());
        }
    }
    left
}

/// Two nodes' daemons Ready; the domain deleted; the daemons stopped `delay` later.
fn delete_while_daemons_run(delay: Duration, ips: [&str; 2]) {
    let tmp = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    server.hold_foreground_deletions();
    // Watch events reach the clients after the writes' answers, as kube-apiserver sends them.
    server.set_watch_latency(Duration::from_millis(5));
    let nodes = ["tray-a", "tray-b"];
    for n in nodes {
        server.create(NODES, node(n, None));
    }
    let domain = server.create(&domains_path(WORKLOAD_NS), domain("imex-job", 0));
    let uid = domain["metadata"]["uid"].as_str().unwrap().to_string();
    // Written once: a process reading it while it is rewritten would find it empty.
    server.write_kubeconfig(&tmp.path().join("kubeconfig"));
    let log = tmp.path().join("controller.log");
    let mut controller = controller(tmp.path(), &["--image", "gpu-dra:test"], &log);
    let ds_path = format!("{}/imex-{uid}", daemon_sets_path());
    wait_for("the DaemonSet", || server.get(&ds_path));

    // The plugin labels each node as it prepares the node's first channel; the DaemonSet then
    // runs a daemon there.
    let mut daemons = Vec::new();
    for (n, ip) in nodes.iter().zip(ips) {
        let (code, _) = server.patch(
            &format!("{NODES}/{n}"),
            json!({"metadata": {"labels": {api::NODE_LABEL: uid}}}),
        );
        assert_eq!(code, 200);
        daemons.push(daemon(tmp.path(), &domain, n, ip));
    }
    wait_for("the domain Ready with both nodes", || {
        let d = server.get(&domain_path(WORKLOAD_NS, "imex-job"))?;
        let status = &d["status"];
        (status["status"] == "Ready" && status["nodes"].as_array()?.len() == 2).then_some(())
    });
    wait_for("both nodes configs list both nodes", || {
        daemons
            .iter()
            .all(|(_, dir)| nodes_file(dir).0.lines().count() == 2)
            .then_some(())
    });
    let before: Vec<_> = daemons.iter().map(|(_, dir)| nodes_file(dir)).collect();

    // kubectl delete -f job.yaml.
    assert_eq!(server.delete(&domain_path(WORKLOAD_NS, "imex-job")), 200);
    std::thread::sleep(delay);
    // The kubelet stops the daemons, then unprepares their claims; their pods are gone, so
    // the garbage collector ends the DaemonSet's foreground deletion.
    for (daemon, _) in daemons.iter_mut() {
        assert_eq!(daemon.terminate(), Some(0), "a daemon exits cleanly");
    }
    let after: Vec<_> = daemons.iter().map(|(_, dir)| nodes_file(dir)).collect();
    for (_, dir) in &daemons {
        std::fs::remove_dir_all(dir).unwrap();
    }
    if server.get(&ds_path).is_some() {
        assert!(server.finish_foreground_deletion(&ds_path));
    }

    wait_for("the domain to be gone", || {
        server
            .get(&domain_path(WORKLOAD_NS, "imex-job"))
            .is_none()
            .then_some(())
    });
    // Nothing comes back later either.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        leftovers(&server, &uid, "imex-job-channel"),
        Vec::<String>::new()
    );
    assert_eq!(
        after, before,
        "a nodes config was rewritten after the delete"
    );
    // The finalizer was added once and removed once: no clean-up ran again on a cached copy
    // of the domain after it was gone (its requests would all answer 404).
    let domain_writes: Vec<(String, u16)> = server
        .requests()
        .iter()
        .filter(|r| r.path == domain_path(WORKLOAD_NS, "imex-job") && r.is_write())
        .map(|r| (r.method.clone(), r.code))
        .collect();
    assert_eq!(
        domain_writes,
        [("PATCH".to_string(), 200), ("PATCH".to_string(), 200)]
    );
    // Reads may find nothing (is the DaemonSet gone yet?), and so may a daemon's last write
    // of its own object when the clean-up deleted it first (SIGTERM before the daemon saw the
    // deletion); a write of the controller that finds nothing was sent for a domain already
    // cleaned up.
    let not_found: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.code == 404 && r.is_write())
        .filter(|r| !(r.method == "PUT" && r.path.starts_with(&node_objects_path())))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(not_found, Vec::<String>::new());
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log.contains("WARN"),
        "the controller warned while deleting:\n{log}"
    );
    controller.terminate();
}

#[test]
fn a_domain_deleted_with_its_daemons_stopped_at_once_leaves_nothing() {
    delete_while_daemons_run(Duration::ZERO, ["127.0.3.10", "127.0.3.11"]);
}

#[test]
fn a_domain_deleted_with_its_daemons_stopped_100_ms_later_leaves_nothing() {
    delete_while_daemons_run(Duration::from_millis(100), ["127.0.3.20", "127.0.3.21"]);
}

#[test]
fn a_domain_deleted_with_its_daemons_stopped_2_s_later_leaves_nothing() {
    delete_while_daemons_run(Duration::from_secs(2), ["127.0.3.30", "127.0.3.31"]);
}
