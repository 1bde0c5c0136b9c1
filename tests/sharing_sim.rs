//! The same flows against the simulated tools: the gpu-dra binary run as nvidia-smi and
//! nvidia-cuda-mps-control.

mod sharing_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use gpu_dra::sharing::simtools::{self, SmiGpuState};
use gpu_dra::sharing::{Ensured, MpsManager, MpsOptions, Tools};
use sharing_support::*;

fn sim_tools(dir: &Path) -> Tools {
    Tools::simulated(Path::new(env!("CARGO_BIN_EXE_gpu-dra")), dir).unwrap()
}

fn state(mode: &str, timeslice: u8) -> SmiGpuState {
    SmiGpuState {
        compute_mode: mode.into(),
        timeslice,
    }
}

#[test]
fn simulated_nvidia_smi_keeps_the_timeslice_and_logs_the_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = sim_tools(tmp.path());
    tools.set_timeslice("GPU-aa11", 2).unwrap();
    let got = simtools::read_state(tmp.path());
    assert_eq!(
        got,
        BTreeMap::from([("GPU-aa11".to_string(), state("DEFAULT", 2))])
    );
    let lines: Vec<String> = simtools::read_log(tmp.path())
        .iter()
        .map(|i| i.command_line())
        .collect();
    let want = vec![
        "nvidia-smi -i GPU-aa11 -c DEFAULT".to_string(),
        "nvidia-smi compute-policy -i GPU-aa11 --set-timeslice 2".to_string(),
    ];
    assert_eq!(lines, want);
}

#[test]
fn simulated_nvidia_smi_rejects_bad_arguments_like_the_real_one() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = sim_tools(tmp.path());
    let out = Command::new(&tools.nvidia_smi)
        .args(["-i", "GPU-aa11", "-c", "SHARED"])
        .output()
        .unwrap();
    let got = (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    );
    assert_eq!(
        got,
        (Some(2), "Invalid compute mode value: SHARED\n".to_string())
    );
}

#[test]
fn simulated_mps_daemon_starts_with_verified_limits_restarts_and_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("mps");
    let _reaper = Reaper(root.clone());
    let m = MpsManager::new(sim_tools(tmp.path()), &root, MpsOptions::default());
    let first = m.start(&spec("c1")).unwrap();
    assert_eq!(
        simtools::read_state(tmp.path())["GPU-aa11"],
        state("EXCLUSIVE_PROCESS", 0)
    );
    let log = simtools::read_log(tmp.path());
    let daemon = log.iter().find(|i| i.args == ["-d"]).unwrap();
    assert_eq!(daemon.env["CUDA_VISIBLE_DEVICES"], "GPU-aa11,MIG-bb22");
    let sent: Vec<String> = log.iter().flat_map(|i| i.stdin.clone()).collect();
    assert!(sent.contains(&"set_default_device_pinned_mem_limit 0 4096M".to_string()));
    let control = std::fs::read_to_string(root.join("c1/log/control.log")).unwrap();
    assert!(
        control.contains("Cmd:set_default_active_thread_percentage 50"),
        "{control}"
    );

    kill9(first.pid);
    let Ensured::Restarted(second) = m.ensure_running(&spec("c1")).unwrap() else {
        panic!("want Restarted");
    };
    assert!(alive(second.pid));
    assert!(matches!(
        m.ensure_running(&spec("c1")).unwrap(),
        Ensured::Running(_)
    ));

    m.stop("c1", &[]).unwrap();
    assert!(!alive(second.pid));
    assert!(!root.join("c1").exists());
    assert_eq!(
        simtools::read_state(tmp.path())["GPU-aa11"],
        state("DEFAULT", 0)
    );
}

#[test]
fn simulated_client_without_a_daemon_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = sim_tools(tmp.path());
    let out = Command::new(&tools.mps_control)
        .env("CUDA_MPS_PIPE_DIRECTORY", tmp.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "no command, nothing to send");
    let mut child = Command::new(&tools.mps_control)
        .env("CUDA_MPS_PIPE_DIRECTORY", tmp.path())
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"get_server_list\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let got = (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        got,
        (
            Some(1),
            "Cannot find MPS control daemon process\n".to_string()
        )
    );
}

#[test]
fn simulated_mps_control_accepts_only_dash_capital_m_for_multi_user_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = sim_tools(tmp.path());
    let got: Vec<(String, Option<i32>, String)> = ["-m", "--multiuser", "-multiuser-server", "-M"]
        .into_iter()
        .map(|flag| {
            let pipe = tmp.path().join("pipe");
            let out = Command::new(&tools.mps_control)
                .args(["-d", flag])
                .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
                .env("CUDA_MPS_LOG_DIRECTORY", tmp.path().join("log"))
                .output()
                .unwrap();
            (
                flag.to_string(),
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        })
        .collect();
    let refused = |flag: &str| {
        (
            flag.to_string(),
            Some(1),
            "Invalid arguments; usage: nvidia-cuda-mps-control [-d [-M] | -f [-M]]\n".to_string(),
        )
    };
    let want = vec![
        refused("-m"),
        refused("--multiuser"),
        refused("-multiuser-server"),
        ("-M".to_string(), Some(0), String::new()),
    ];
    assert_eq!(got, want);
    // The one daemon that started is quit (and leaves with its pipe directory).
    let quit = Command::new(&tools.mps_control)
        .env("CUDA_MPS_PIPE_DIRECTORY", tmp.path().join("pipe"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"quit\n")?;
            child.wait()
        })
        .unwrap();
    assert!(quit.success());
}
