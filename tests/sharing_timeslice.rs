//! Time-slicing against the fake nvidia-smi.

mod sharing_support;

use gpu_dra::sharing::{ComputeMode, ResetOutcome, SharingError};
use sharing_support::*;

fn strings(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|s| s.to_string()).collect()
}

#[test]
fn set_timeslice_sets_compute_mode_default_then_the_compute_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_tools(tmp.path());
    tools.set_timeslice("GPU-aa11", 3).unwrap();
    let want = strings(&[
        "nvidia-smi -i GPU-aa11 -c DEFAULT",
        "nvidia-smi compute-policy -i GPU-aa11 --set-timeslice 3",
    ]);
    assert_eq!(calls(tmp.path()), want);
}

#[test]
fn set_compute_mode_runs_exactly_one_nvidia_smi_call() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_tools(tmp.path());
    tools
        .set_compute_mode("GPU-aa11", ComputeMode::ExclusiveProcess)
        .unwrap();
    let want = strings(&["nvidia-smi -i GPU-aa11 -c EXCLUSIVE_PROCESS"]);
    assert_eq!(calls(tmp.path()), want);
}

#[test]
fn reset_answered_not_supported_is_a_distinct_outcome_not_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_tools(tmp.path());
    fail_smi(
        tmp.path(),
        "Setting time slice is Not Supported for GPU 00000000:07:00.0.",
    );
    let got = tools.reset_timeslice("GPU-aa11").unwrap();
    let ResetOutcome::NotSupported { command, output } = got else {
        panic!("want NotSupported, got {got:?}");
    };
    assert!(
        command.ends_with("nvidia-smi -i GPU-aa11 -c DEFAULT"),
        "{command}"
    );
    assert!(output.contains("Not Supported"), "{output}");
    // Both steps still ran.
    assert_eq!(calls(tmp.path()).len(), 2);
}

#[test]
fn reset_on_a_supported_gpu_resets_both_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_tools(tmp.path());
    assert_eq!(
        tools.reset_timeslice("GPU-aa11").unwrap(),
        ResetOutcome::Reset
    );
    let want = strings(&[
        "nvidia-smi -i GPU-aa11 -c DEFAULT",
        "nvidia-smi compute-policy -i GPU-aa11 --set-timeslice 0",
    ]);
    assert_eq!(calls(tmp.path()), want);
}

#[test]
fn other_nvidia_smi_failures_are_errors_naming_command_status_and_output() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_tools(tmp.path());
    fail_smi(tmp.path(), "Insufficient Permissions");
    let err = tools.set_timeslice("GPU-aa11", 1).unwrap_err();
    let SharingError::ToolFailed {
        command,
        status,
        output,
    } = err
    else {
        panic!("want ToolFailed, got {err:?}");
    };
    let want_cmd = format!("{} -i GPU-aa11 -c DEFAULT", tools.nvidia_smi.display());
    assert_eq!(
        (command, status, output),
        (
            want_cmd,
            "exit status: 3".to_string(),
            "Insufficient Permissions".to_string()
        )
    );
    let reset = tools.reset_timeslice("GPU-aa11");
    assert!(reset.is_err(), "{reset:?}");
}

#[test]
fn timeslice_on_a_mig_device_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = fake_tools(tmp.path());
    let err = tools.set_timeslice("MIG-bb22", 1).unwrap_err();
    assert!(matches!(err, SharingError::NotAFullGpu { .. }), "{err:?}");
    assert_eq!(calls(tmp.path()), Vec::<String>::new());
}
