//! `gpu-dra sim-fault load`: sets the readings a simulated GPU reports, refuses a ratio out of
//! range naming the flag, the value and the valid range, and `--clear` returns to the model.

use std::process::{Command, Output};

fn gpu_dra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .env_remove("GPU_DRA_SIM_STATE_DIR")
        .output()
        .expect("run gpu-dra")
}

#[test]
fn a_load_is_set_read_back_through_the_state_and_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    // A simulated node must have run with the state directory once.
    let out = gpu_dra(&["inventory", "--sim-node", "mixed", "--state-dir", state]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = gpu_dra(&[
        "sim-fault",
        "--state-dir",
        state,
        "load",
        "--gpu",
        "2",
        "--sm",
        "1.5",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--sm 1.5 is out of range; give a ratio from 0 to 1"),
        "{err}"
    );

    let set = gpu_dra(&[
        "sim-fault",
        "--state-dir",
        state,
        "load",
        "--gpu",
        "2",
        "--sm",
        "0.5",
        "--power",
        "60",
    ]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let sim = gpu_dra::hardware::sim::SimBackend::open_state_dir(dir.path()).unwrap();
    let load = sim.load(2).unwrap().expect("a load set");
    assert_eq!(
        (
            load.sm_active_percent,
            load.power_watts,
            load.memory_used_mib
        ),
        (Some(50), Some(60), None)
    );

    let clear = gpu_dra(&[
        "sim-fault",
        "--state-dir",
        state,
        "load",
        "--gpu",
        "2",
        "--clear",
    ]);
    assert!(clear.status.success());
    assert_eq!(sim.load(2).unwrap(), None);
}
