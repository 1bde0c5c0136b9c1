//! `gpu-dra compute-domain-controller` as a process, against the fake API server: started in a
//! pod without `--image` it gives the IMEX daemons its own pod's image; with neither it fails
//! naming both ways; a refused finalizer write is logged with its cause.

mod cd_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cd_support::*;
use gpu_dra::compute_domain::api;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

/// The controller process, killed when dropped.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The command for the controller against `server`, with no image, pod or identity from the
/// test's own environment.
fn command(server: &ObjServer, dir: &Path) -> Command {
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig);
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
    c.args(["compute-domain-controller", "--namespace", DRIVER_NS])
        .args(["--leader-election", "false"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env_remove("GPU_DRA_IMEX_IMAGE")
        .stdout(Stdio::null());
    c
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

#[test]
fn started_in_a_pod_without_image_the_controller_runs_the_daemons_on_its_own_image() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    // The chart's pod: a sidecar first, the controller's container by its name.
    server.create(
        &format!("/api/v1/namespaces/{DRIVER_NS}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "gpu-dra-compute-domain-controller-7d9f-x2x"},
               "spec": {"containers": [
                   {"name": "log-shipper", "image": "registry.example/shipper:3"},
                   {"name": "controller", "image": "registry.example/gpu-dra:1.2.3"}]}}),
    );
    let created = server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let uid = created["metadata"]["uid"].as_str().unwrap();
    let _c = Controller(
        command(&server, dir.path())
            .env("POD_NAME", "gpu-dra-compute-domain-controller-7d9f-x2x")
            .env("POD_NAMESPACE", DRIVER_NS)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ds = wait_for("the DaemonSet", || {
        server.get(&format!("{}/imex-{uid}", daemon_sets_path()))
    });
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        json!("registry.example/gpu-dra:1.2.3")
    );
    let own_pod_reads = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/pods/"))
        .count();
    assert_eq!(own_pod_reads, 1, "the own pod is read once, at start");
}

#[test]
fn without_image_or_pod_the_controller_fails_naming_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let out = command(&server, dir.path())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for named in ["--image", "GPU_DRA_IMEX_IMAGE", "POD_NAME", "POD_NAMESPACE"] {
        assert!(err.contains(named), "{named} not named in: {err}");
    }
}

#[test]
fn an_unreadable_own_pod_fails_the_start_with_the_api_servers_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let out = command(&server, dir.path())
        .env("POD_NAME", "gone")
        .env("POD_NAMESPACE", DRIVER_NS)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reading the controller's own pod gpu-dra/gone")
            && err.contains("pass --image")
            && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn a_refused_finalizer_write_is_logged_with_its_cause_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjServer::start();
    let path = domain_path(WORKLOAD_NS, "imex");
    server.fail_next("PATCH", &path, 403, 1);
    server.create(&domains_path(WORKLOAD_NS), domain("imex", 0));
    let log = dir.path().join("controller.log");
    let _c = Controller(
        command(&server, dir.path())
            .args(["--image", "gpu-dra:test"])
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for("the finalizer, on the retry", || {
        server
            .get(&path)
            .filter(|d| d["metadata"]["finalizers"] == json!([api::FINALIZER]))
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let warning = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains("reconcile failed"))
        .unwrap_or_else(|| panic!("no warning in:\n{text}"));
    // The step and the domain, then the API server's answer: the cause, not only the step.
    assert!(
        warning.contains("adding the finalizer for ComputeDomain team-a/imex: ")
            && warning.contains("injected 403 for PATCH"),
        "{warning}"
    );
}
