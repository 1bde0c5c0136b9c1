//! MPS daemons against fake tools: real child processes, FIFOs, temp dirs.

mod sharing_support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use gpu_dra::sharing::{Ensured, MpsManager, MpsOptions, SharingError};
use sharing_support::*;

fn manager(dir: &Path) -> MpsManager {
    MpsManager::new(fake_tools(dir), dir.join("mps"), MpsOptions::default())
}

fn strings(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|s| s.to_string()).collect()
}

#[test]
fn start_sets_exclusive_mode_spawns_the_daemon_and_verifies_limits_by_ordinal() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    let m = manager(tmp.path());
    let status = m.start(&spec("c1")).unwrap();
    let base = tmp.path().join("mps/c1");
    let want = vec![
        "nvidia-smi -i GPU-aa11 -c EXCLUSIVE_PROCESS".to_string(),
        format!(
            "nvidia-cuda-mps-control -d CUDA_VISIBLE_DEVICES=GPU-aa11,MIG-bb22 \
             CUDA_MPS_PIPE_DIRECTORY={0}/pipe CUDA_MPS_LOG_DIRECTORY={0}/log",
            base.display()
        ),
        "mps-client get_default_active_thread_percentage".into(),
        "mps-client set_default_active_thread_percentage 50".into(),
        "mps-client get_default_active_thread_percentage".into(),
        "mps-client set_default_device_pinned_mem_limit 0 4096M".into(),
        "mps-client get_default_device_pinned_mem_limit 0".into(),
    ];
    assert_eq!(calls(tmp.path()), want);
    assert_eq!(Some(status.pid), pid_of(&m.root, "c1"));
    assert!(!status.already_running);
    let modes: Vec<u32> = ["", "pipe", "log", "shm"]
        .iter()
        .map(|d| fs::metadata(base.join(d)).unwrap().permissions().mode() & 0o777)
        .collect();
    assert_eq!(modes, vec![0o755; 4]);
    assert!(base.join("spec.json").is_file());
    let log = fs::read_to_string(base.join("log/control.log")).unwrap();
    assert!(
        log.contains("Cmd:set_default_device_pinned_mem_limit 0 4096M"),
        "{log}"
    );
    m.stop("c1", &spec("c1").devices).unwrap();
}

#[test]
fn limit_read_back_that_differs_fails_start_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    lie_about_percentage(tmp.path(), "42.0");
    let m = manager(tmp.path());
    let err = m.start(&spec("c1")).unwrap_err();
    match &err {
        SharingError::LimitMismatch { want, got, .. } => {
            assert_eq!((want.as_str(), got.as_str()), ("50", "42.0"));
        }
        other => panic!("want LimitMismatch, got {other:?}"),
    }
    let got = calls(tmp.path());
    let tail = &got[got.len() - 2..];
    assert_eq!(
        tail,
        strings(&["mps-client quit", "nvidia-smi -i GPU-aa11 -c DEFAULT"])
    );
    assert!(!tmp.path().join("mps/c1").exists());
    assert_eq!(m.list().unwrap(), Vec::<String>::new());
}

#[test]
fn killed_daemon_is_restarted_by_ensure_running_with_its_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    let m = manager(tmp.path());
    let first = m.start(&spec("c1")).unwrap();
    assert!(matches!(
        m.ensure_running(&spec("c1")).unwrap(),
        Ensured::Running(_)
    ));
    kill9(first.pid);
    clear_calls(tmp.path());
    let got = m.ensure_running(&spec("c1")).unwrap();
    let Ensured::Restarted(status) = got else {
        panic!("want Restarted, got {got:?}");
    };
    assert_ne!(status.pid, first.pid);
    assert!(alive(status.pid));
    let calls = calls(tmp.path());
    for want in [
        "mps-client set_default_active_thread_percentage 50",
        "mps-client set_default_device_pinned_mem_limit 0 4096M",
    ] {
        assert!(
            calls.iter().any(|c| c == want),
            "{want} missing from {calls:?}"
        );
    }
    m.stop("c1", &[]).unwrap();
}

#[test]
fn a_second_manager_finds_the_running_daemon_and_stops_it() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    let started = manager(tmp.path()).start(&spec("c1")).unwrap();
    let restarted_plugin = manager(tmp.path());
    assert_eq!(restarted_plugin.list().unwrap(), strings(&["c1"]));
    let found = restarted_plugin.start(&spec("c1")).unwrap();
    assert_eq!((found.pid, found.already_running), (started.pid, true));
    clear_calls(tmp.path());
    restarted_plugin.stop("c1", &[]).unwrap();
    assert_eq!(
        calls(tmp.path()),
        strings(&["mps-client quit", "nvidia-smi -i GPU-aa11 -c DEFAULT"])
    );
    assert!(!alive(started.pid));
}

#[test]
fn stop_is_idempotent_and_an_unknown_id_is_fine() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    let m = manager(tmp.path());
    let status = m.start(&spec("c1")).unwrap();
    m.stop("c1", &spec("c1").devices).unwrap();
    assert!(!alive(status.pid));
    assert!(!tmp.path().join("mps/c1").exists());
    clear_calls(tmp.path());
    m.stop("c1", &spec("c1").devices).unwrap();
    m.stop("never-started", &[]).unwrap();
    assert_eq!(calls(tmp.path()), Vec::<String>::new());
}

#[test]
fn stop_of_a_daemon_that_ignores_quit_kills_it() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    let m = manager(tmp.path());
    let status = m.start(&spec("c1")).unwrap();
    // Without its FIFO the client cannot deliver `quit`; the daemon stays blocked reading.
    fs::remove_file(tmp.path().join("mps/c1/pipe/cmd")).unwrap();
    let mut quick = m.clone();
    quick.options.stop_timeout = std::time::Duration::from_millis(200);
    quick.tools.timeout = std::time::Duration::from_millis(500);
    quick.stop("c1", &[]).unwrap();
    assert!(!alive(status.pid));
    assert!(!tmp.path().join("mps/c1").exists());
}

#[test]
fn starting_twice_is_idempotent_but_another_spec_under_the_same_id_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    let m = manager(tmp.path());
    let first = m.start(&spec("c1")).unwrap();
    let again = m.start(&spec("c1")).unwrap();
    assert_eq!(again.pid, first.pid);
    let mut other = spec("c1");
    other.active_thread_percentage = Some(10);
    let err = m.start(&other).unwrap_err();
    assert!(matches!(err, SharingError::SpecConflict { .. }), "{err:?}");
    m.stop("c1", &[]).unwrap();
}

#[test]
fn nvidia_smi_failure_names_the_command_status_and_output_and_start_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let _reaper = Reaper(tmp.path().join("mps"));
    fail_smi(
        tmp.path(),
        "Unable to set the compute mode: Insufficient Permissions",
    );
    let m = manager(tmp.path());
    let err = m.start(&spec("c1")).unwrap_err().to_string();
    let smi = tmp.path().join("bin/nvidia-smi");
    let want = format!(
        "`{} -i GPU-aa11 -c EXCLUSIVE_PROCESS` exited with exit status: 3: \
         Unable to set the compute mode: Insufficient Permissions",
        smi.display()
    );
    assert_eq!(err, want);
    assert!(!tmp.path().join("mps/c1").exists());
    let spawned = calls(tmp.path()).iter().any(|c| c.contains("-d"));
    assert!(
        !spawned,
        "the daemon must not start after a failed compute mode"
    );
}

#[test]
fn an_invalid_spec_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(tmp.path());
    let mut bad = spec("c1");
    bad.active_thread_percentage = Some(150);
    let err = m.start(&bad).unwrap_err().to_string();
    assert_eq!(
        err,
        "MPS daemon \"c1\": active_thread_percentage: 150 is outside 0–100"
    );
    assert_eq!(calls(tmp.path()), Vec::<String>::new());
    assert!(!tmp.path().join("mps").exists());
}

#[test]
fn client_edits_mount_the_pipe_and_shm_dirs_and_point_clients_at_the_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let m = MpsManager::new(fake_tools(tmp.path()), "/plug/mps", MpsOptions::default());
    let got = m.client_edits("c1");
    let mounts: Vec<(String, String, String)> = got
        .mounts
        .iter()
        .map(|mo| {
            let host = mo.host_path.display().to_string();
            (host, mo.container_path.clone(), mo.options.join(","))
        })
        .collect();
    let opts = "rw,nosuid,nodev,bind".to_string();
    let want = vec![
        (
            "/plug/mps/c1/pipe".into(),
            "/tmp/nvidia-mps".into(),
            opts.clone(),
        ),
        ("/plug/mps/c1/shm".into(), "/dev/shm".into(), opts),
    ];
    assert_eq!(mounts, want);
    let env = vec![(
        "CUDA_MPS_PIPE_DIRECTORY".to_string(),
        "/tmp/nvidia-mps".to_string(),
    )];
    assert_eq!(got.env, env);
}
