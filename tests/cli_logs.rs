//! Logs a machine can read: every verb of the binary, and the simulated tools it runs as,
//! write plain UTF-8 lines (no ANSI escape) when stderr is a pipe, even at the most verbose
//! level; colour appears only at a terminal without `NO_COLOR`.

mod plugin_support;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims::{self, claim_ref};
use plugin_support::{Node, SIGTERM};

const ESC: u8 = 0x1b;
const BIN: &str = env!("CARGO_BIN_EXE_gpu-dra");

/// `gpu-dra` with stdout and stderr to pipes, every log level on, no `NO_COLOR`.
fn gpu_dra(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("GPU_DRA_LOG", "trace")
        .env_remove("NO_COLOR")
        .env_remove("GPU_DRA_SIM_NODE")
        .stdin(Stdio::null());
    command
}

/// Panics unless `bytes` are UTF-8 without an ESC byte.
fn assert_plain(what: &str, bytes: &[u8]) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    assert!(
        !bytes.contains(&ESC),
        "{what}: ESC byte in output to a pipe:\n{}",
        text.replace('\x1b', "<ESC>")
    );
}

/// Runs `command`, asserts its stderr (a pipe) is plain and holds `want` (a log line's text,
/// so the check is not vacuous); returns the output.
fn run_plain(what: &str, mut command: Command, want: &str) -> Output {
    let out = command.output().expect("run gpu-dra");
    assert_plain(&format!("{what} stderr"), &out.stderr);
    assert_plain(&format!("{what} stdout"), &out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(want),
        "{what}: no {want:?} in stderr:\n{stderr}"
    );
    out
}

const DEVICE: &str = "name: gpu-0\nattributes:\n  type: {string: gpu}\n";

#[test]
fn every_verb_logs_plain_lines_to_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let device = dir.path().join("device.yaml");
    std::fs::write(&device, DEVICE).unwrap();
    let device = device.to_str().unwrap();
    let cases: [(&str, &[&str]); 6] = [
        ("demo", &["demo"]),
        ("inventory", &["inventory", "--sim-node", "mixed"]),
        (
            "explain",
            &[
                "explain",
                "--claim",
                "examples/dedicated-gpu.yaml",
                "--sim-node",
                "mixed",
            ],
        ),
        (
            "cel",
            &[
                "cel",
                "-e",
                "device.attributes['gpu.nvidia.com'].type == 'gpu'",
                "-d",
                device,
            ],
        ),
        (
            "cel (bad input)",
            &["cel", "-e", "device.nope(", "-d", device],
        ),
        (
            "inventory (error)",
            &["inventory", "--sim-node", "no-such-preset"],
        ),
    ];
    for (what, args) in cases {
        let verb = args[0];
        run_plain(what, gpu_dra(args), &format!("verb=\"{verb}\""));
    }
}

#[test]
fn a_bad_flag_is_reported_in_plain_text() {
    let out = gpu_dra(&["kubelet-plugin", "--log-format", "yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_plain("clap error", &out.stderr);
    assert!(String::from_utf8_lossy(&out.stderr).contains("'yaml'"));
}

#[tokio::test]
async fn the_kubelet_plugin_logs_claim_spans_as_plain_text_to_a_pipe() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("logs", "uid-logs", &["gpu-1"]));
    let mut command = node.command();
    command
        .args(["--log-level", "debug", "--log-format", "text"])
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("start the plugin");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    // The socket file exists from the plugin's bind(), a moment before its listen(): wait
    // until it answers (a connect in between is refused).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !(node.registration_socket().exists()
        && gpu_dra::kubelet::client::KubeletClient::connect(&node.registration_socket())
            .await
            .is_ok())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for the registration socket"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut kubelet = gpu_dra::kubelet::client::KubeletClient::register(
        &node.registration_socket(),
        &gpu_dra::kubelet::client::KubeletVersions {
            dra: vec![DraApi::V1],
            ..Default::default()
        },
    )
    .await
    .expect("register");
    let got = kubelet
        .prepare(&[claim_ref("logs", "uid-logs")])
        .await
        .unwrap();
    assert!(got["uid-logs"].is_ok(), "{got:?}");
    kubelet
        .unprepare(&[claim_ref("logs", "uid-logs")])
        .await
        .unwrap();
    let status = Command::new("kill")
        .args([format!("-{SIGTERM}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // Waits without blocking the runtime: the client's connection answers the plugin's
    // graceful shutdown.
    plugin_support::eventually("the plugin's exit", || child.try_wait().unwrap()).await;
    drop(kubelet);
    let bytes = reader.join().unwrap();
    assert_plain("kubelet-plugin stderr", &bytes);
    let text = String::from_utf8_lossy(&bytes);
    for want in [
        "verb=\"kubelet-plugin\"",
        "claim.namespace=team-a",
        "claim.uid=uid-logs",
    ] {
        assert!(text.contains(want), "no {want:?} in the log:\n{text}");
    }
}

#[test]
fn the_simulated_tools_write_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let tool = |name: &str| {
        let mut command = Command::new(BIN);
        command
            .arg0(name)
            .env("GPU_DRA_LOG", "trace")
            .env_remove("NO_COLOR")
            .env("GPU_DRA_SIM_TOOLS_LOG", dir.path().join("tools.log"))
            .env("CUDA_MPS_PIPE_DIRECTORY", dir.path().join("pipe"))
            .env("CUDA_MPS_LOG_DIRECTORY", dir.path().join("log"));
        command
    };
    let smi = tool("nvidia-smi")
        .args(["-i", "0", "-c", "EXCLUSIVE_PROCESS"])
        .output()
        .unwrap();
    assert!(smi.status.success(), "{smi:?}");
    assert_plain("nvidia-smi", &[smi.stdout, smi.stderr].concat());
    let bad = tool("nvidia-smi").arg("--no-such-flag").output().unwrap();
    assert_plain("nvidia-smi (bad flag)", &[bad.stdout, bad.stderr].concat());

    let client = |input: &str| {
        let mut child = tool("nvidia-cuda-mps-control")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let no_daemon = client("get_default_active_thread_percentage\n");
    assert_eq!(
        String::from_utf8_lossy(&no_daemon.stderr),
        "Cannot find MPS control daemon process\n"
    );
    let start = tool("nvidia-cuda-mps-control").arg("-d").output().unwrap();
    assert!(start.status.success(), "{start:?}");
    assert_plain("mps daemon start", &[start.stdout, start.stderr].concat());
    let answer = client("get_default_active_thread_percentage\nquit\n");
    assert!(answer.status.success(), "{answer:?}");
    assert_plain("mps client", &[answer.stdout, answer.stderr].concat());
    for file in read_all(&dir.path().join("log")) {
        assert_plain("the MPS daemon's log directory", &file);
    }
}

fn read_all(dir: &Path) -> Vec<Vec<u8>> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `shell` under a pseudo-terminal (util-linux `script`), returning what it printed.
fn at_a_terminal(shell: &str) -> Vec<u8> {
    let out = Command::new("script")
        .args(["-qec", shell, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("run script (util-linux)");
    out.stdout
}

#[test]
fn a_terminal_gets_colour_unless_no_color_is_set() {
    let run = format!("GPU_DRA_LOG=debug {BIN} inventory --sim-node mixed >/dev/null");
    let coloured = at_a_terminal(&format!("unset NO_COLOR; {run}"));
    assert!(
        coloured.contains(&ESC),
        "no colour at a terminal: {}",
        String::from_utf8_lossy(&coloured)
    );
    let plain = at_a_terminal(&format!("NO_COLOR=1 {run}"));
    assert_plain("a terminal with NO_COLOR=1", &plain);
    assert!(String::from_utf8_lossy(&plain).contains("colour=false"));
}

#[test]
fn json_logs_carry_no_escapes_even_at_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // A plugin that cannot read its kubeconfig logs its start and stops with an error.
    let out = at_a_terminal(&format!(
        "unset NO_COLOR; {BIN} kubelet-plugin --gpu-backend sim --log-format json \
         --log-level debug --kubeconfig {d}/missing --plugin-dir {d}/plugin \
         --registry-dir {d}/registry --cdi-root {d}/cdi --metrics-addr off"
    ));
    assert_plain("JSON logs at a terminal", &out);
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains(r#""verb":"kubelet-plugin""#),
        "no JSON start line: {text}"
    );
}
