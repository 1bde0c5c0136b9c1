//! The logic of `hack/e2e.sh`, checked without a cluster: the suite runs against a fake
//! kubectl (`tests/deploy_support/fake-kubectl`) that answers like a cluster running gpu-dra,
//! and must pass; with one fault injected it must fail the right case with a message saying
//! what is wrong. Skipped with a notice when python3 (the fake's interpreter) is absent.

mod deploy_support;

use std::process::Command;

use deploy_support::{repo, tool};

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    calls: String,
}

/// Runs `hack/e2e.sh` with the fake kubectl first on PATH and the given fault.
fn run_suite(fault: &str, cases: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        repo().join("tests/deploy_support/fake-kubectl"),
        dir.path().join("kubectl"),
    )
    .unwrap();
    // `gpu-dra capacity` against the fake cluster: the real binary, given its objects as files.
    std::os::unix::fs::symlink(
        repo().join("tests/deploy_support/fake-gpu-dra"),
        dir.path().join("gpu-dra"),
    )
    .unwrap();
    // The real interpreter beside the fake: version-manager shims (pyenv) cost ~100 ms a call.
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let python = String::from_utf8(python.stdout).unwrap();
    std::os::unix::fs::symlink(python.trim(), dir.path().join("python3")).unwrap();
    let log = dir.path().join("calls.log");
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("bash")
        .arg(repo().join("hack/e2e.sh"))
        .args(cases)
        .env("PATH", path)
        .env("FAKE_KUBECTL_LOG", &log)
        .env("FAKE_KUBECTL_FAULT", fault)
        .env("FAKE_GPU_DRA_REAL", env!("CARGO_BIN_EXE_gpu-dra"))
        // Only the CDI-leak case waits, and it is meant to fail: keep that wait short.
        .env("E2E_TIMEOUT", "1")
        .output()
        .unwrap();
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        calls: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

fn have_python() -> bool {
    tool(
        "python3",
        "the e2e-suite logic checks (the fake kubectl is Python)",
    )
    .is_some()
}

#[test]
fn suite_passes_against_a_cluster_that_behaves_and_removes_its_namespace() {
    if !have_python() {
        return;
    }
    let run = run_suite("", &[]);
    let got = (
        run.code,
        run.stdout.lines().last().unwrap_or_default().to_string(),
        run.calls.contains("delete namespace gpu-dra-e2e"),
    );
    assert!(
        run.calls
            .contains("gpu-dra capacity --driver-name gpu.nvidia.com --node n1"),
        "the capacity-report case asks gpu-dra about the pod's node:\n{}",
        run.calls
    );
    assert_eq!(
        got,
        (Some(0), "PASSED: 9 cases".to_string(), true),
        "{}",
        run.stderr
    );
}

#[test]
fn suite_fails_the_case_whose_check_breaks_and_says_why() {
    if !have_python() {
        return;
    }
    let cases = [
        (
            "uuid",
            "FAIL: dedicated/ctr does not see gpu-0 (GPU-1) of claim dedicated-gpu; it sees GPU-7",
            "FAILED: dedicated (of 1)",
        ),
        (
            "visible",
            "FAIL: dedicated/ctr: NVIDIA_VISIBLE_DEVICES=GPU-1, want void: the container's devices are in DRA_GPU_UUID_*",
            "FAILED: dedicated (of 1)",
        ),
        (
            "isolation",
            "FAIL: mig-parent/small sees MIG-a MIG-b: UUIDs that are not devices of claim mig-parent-mig request small",
            "FAILED: mig-parent (of 1)",
        ),
        (
            "parent",
            "FAIL: distinct parentUUIDs of the allocated MIG devices: want '1', got '2'",
            "FAILED: mig-parent (of 1)",
        ),
        (
            "mps",
            "FAIL: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in ctr1: want '50', got ''",
            "FAILED: mps (of 1)",
        ),
        (
            "quota",
            "FAIL: the third 3g.40gb claim was admitted; ResourceQuota gpu-devices should refuse it",
            "FAILED: quota (of 1)",
        ),
        (
            "taint",
            "FAIL: gpu-0 on n1: health taint '' 10s after the fault, want 'xid-79'",
            "FAILED: health (of 1)",
        ),
        (
            "holder",
            "FAIL: namespace, pod and claim that gpu-dra capacity shows holding gpu-0-mig-3g40gb-0: want 'gpu-dra-e2e capacity-report capacity-report-gpu', got 'gpu-dra-e2e capacity-report-other capacity-report-gpu'",
            "FAILED: capacity-report (of 1)",
        ),
        (
            "toleration",
            "FAIL: PodScheduled of health-intolerant (its claim does not tolerate the taint): want 'False', got 'True'",
            "FAILED: health (of 1)",
        ),
    ];
    for (fault, message, summary) in cases {
        let case = summary.split_whitespace().nth(1).unwrap();
        let run = run_suite(fault, &[case]);
        let lines: Vec<&str> = run.stderr.lines().map(str::trim).collect();
        let got = (run.code, lines);
        assert_eq!(got, (Some(1), vec![message, summary]), "fault {fault}");
    }
}

#[test]
fn quota_case_creates_the_class_and_quota_and_deletes_the_class() {
    if !have_python() {
        return;
    }
    let run = run_suite("", &["quota"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let calls: Vec<&str> = run
        .calls
        .lines()
        .filter(|l| {
            l.contains("deviceclass") || l.contains("resourcequota") || l.starts_with("apply")
        })
        .collect();
    assert_eq!(
        calls,
        [
            "apply -f -", // the namespace
            "apply -f -", // the DeviceClass
            "apply -f -", // the ResourceQuota
            "get resourcequota gpu-devices -o jsonpath={.status.hard}",
            "apply -f -", // quota-0
            "apply -f -", // quota-1
            "apply -f -", // quota-2, refused
            "delete deviceclass gpu-dra-e2e-mig-3g40gb --ignore-not-found",
            "delete deviceclass gpu-dra-e2e-mig-3g40gb --ignore-not-found",
        ]
    );
}

#[test]
fn suite_fails_when_a_cdi_spec_outlives_its_claim() {
    if !have_python() {
        return;
    }
    let run = run_suite("cdi", &["dedicated"]);
    let lines: Vec<&str> = run.stderr.lines().map(str::trim).collect();
    let want = vec![
        "FAIL: CDI spec of claim uid-dedicated-gpu still in /var/run/cdi on n1 after 1s",
        "FAILED: dedicated (of 1)",
    ];
    assert_eq!((run.code, lines), (Some(1), want));
}

#[test]
fn health_case_injects_an_xid_in_the_plugin_pod_and_always_resets_the_gpu() {
    if !have_python() {
        return;
    }
    for fault in ["", "toleration"] {
        let run = run_suite(fault, &["health"]);
        let faults: Vec<&str> = run
            .calls
            .lines()
            .filter(|l| l.contains("sim-fault"))
            .collect();
        assert_eq!(
            faults,
            [
                "exec gpu-dra-kubelet-plugin-x7k2p -- gpu-dra sim-fault xid --gpu 0 --code 79",
                "exec gpu-dra-kubelet-plugin-x7k2p -- gpu-dra sim-fault recover --gpu 0",
            ],
            "fault {fault:?}: the GPU is reset whether the case passes or fails"
        );
        assert!(
            run.calls.contains("get pods -l app.kubernetes.io/component=kubelet-plugin --field-selector spec.nodeName=n1"),
            "{}",
            run.calls
        );
    }
}
