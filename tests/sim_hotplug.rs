//! `gpu-dra sim-fault add-gpu` / `remove-gpu` change a running simulated node: the sim
//! backend and the NVML backend over the simulated library both see the new GPU set, slots
//! keep their identities, and bad input names the valid choices.

mod nvml_sim_support;

use std::path::Path;
use std::process::{Command, Output};

fn gpu_dra(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
    command
        .args(args)
        .env_remove("GPU_DRA_SIM_NODE")
        .env_remove("GPU_DRA_SIM_STATE_DIR")
        .env_remove("GPU_DRA_STATE_DIR")
        .env_remove("GPU_DRA_GPU_BACKEND");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("run gpu-dra")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn device_names(json: &str) -> Vec<String> {
    let list: serde_json::Value = serde_json::from_str(json).unwrap();
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|slice| {
            slice["spec"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn added_and_removed_gpus_appear_on_both_backends_and_bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let sim_args = [
        "inventory",
        "--sim-node",
        "l4-x4",
        "--state-dir",
        state,
        "-o",
        "json",
    ];
    let before = ok(gpu_dra(&sim_args, &[]));
    assert_eq!(device_names(&before), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);

    let added = ok(gpu_dra(
        &[
            "sim-fault",
            "--state-dir",
            state,
            "add-gpu",
            "--model",
            "H100-SXM5-80GB",
        ],
        &[],
    ));
    assert_eq!(added, "added GPU 4 (H100-SXM5-80GB)\n");
    ok(gpu_dra(
        &[
            "sim-fault",
            "--state-dir",
            state,
            "remove-gpu",
            "--gpu",
            "1",
        ],
        &[],
    ));

    let sim = ok(gpu_dra(&sim_args, &[]));
    assert_eq!(device_names(&sim), ["gpu-0", "gpu-2", "gpu-3", "gpu-4"]);
    let lib = nvml_sim_support::library();
    let nvml = ok(gpu_dra(
        &[
            "inventory",
            "--gpu-backend",
            "nvml",
            "--node-name",
            "l4-x4",
            "-o",
            "json",
        ],
        &[
            ("GPU_DRA_NVML_LIB", &lib),
            ("GPU_DRA_SIM_NODE", Path::new("l4-x4")),
            ("GPU_DRA_SIM_STATE_DIR", dir.path()),
        ],
    ));
    let as_json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
    assert_eq!(as_json(&nvml), as_json(&sim));

    let unknown_model = gpu_dra(
        &[
            "sim-fault",
            "--state-dir",
            state,
            "add-gpu",
            "--model",
            "Z9000",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&unknown_model.stderr);
    assert!(!unknown_model.status.success());
    assert!(
        err.contains("--model") && err.contains("Z9000") && err.contains("H100-SXM5-80GB"),
        "{err}"
    );
    // Indices are enumeration positions, as NVML's: four GPUs are left, 0 to 3.
    let past_the_end = gpu_dra(
        &[
            "sim-fault",
            "--state-dir",
            state,
            "remove-gpu",
            "--gpu",
            "4",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&past_the_end.stderr);
    assert!(!past_the_end.status.success());
    assert!(
        err.contains("no GPU with index 4 on this node (it has 4)"),
        "{err}"
    );
}
