//! The NVML backend over the simulated NVML library publishes exactly what the sim backend
//! publishes for the same node: every preset, every device and attribute (`inventory -o
//! json`, the ResourceSlices).

mod nvml_sim_support;

use std::process::Command;

use gpu_dra::hardware::sim::presets::PRESETS;

fn inventory(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
    command
        .arg("inventory")
        .args(args)
        .args(["-o", "json"])
        .env_remove("GPU_DRA_SIM_NODE")
        .env_remove("GPU_DRA_SIM_STATE_DIR")
        .env_remove("GPU_DRA_GPU_BACKEND");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run gpu-dra inventory");
    assert!(
        out.status.success(),
        "gpu-dra inventory {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

#[test]
fn every_preset_publishes_the_same_slices_through_nvml_as_through_the_simulator() {
    let lib = nvml_sim_support::library();
    let lib = lib.to_str().expect("UTF-8 path");
    for preset in PRESETS {
        let sim = inventory(&["--sim-node", preset.name], &[]);
        let policies = nvml_sim_support::policies_flag(preset.name);
        let nvml = inventory(
            &[
                "--gpu-backend",
                "nvml",
                "--nvml-lib",
                lib,
                "--node-name",
                preset.name,
                "--gpu-mig-policies",
                &policies,
            ],
            &[("GPU_DRA_SIM_NODE", preset.name)],
        );
        let sim: serde_json::Value = serde_json::from_str(&sim).unwrap();
        let nvml: serde_json::Value = serde_json::from_str(&nvml).unwrap();
        assert!(
            sim["items"]
                .as_array()
                .is_some_and(|slices| !slices.is_empty()),
            "preset {} published no slices",
            preset.name
        );
        assert_eq!(nvml, sim, "preset {}", preset.name);
    }
}

#[test]
fn the_simulated_library_without_a_node_is_refused_naming_what_to_set() {
    let lib = nvml_sim_support::library();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["inventory", "--gpu-backend", "nvml", "--nvml-lib"])
        .arg(&lib)
        .env("GPU_DRA_SIM_NODE", "dgx-z9")
        .env_remove("GPU_DRA_SIM_STATE_DIR")
        .output()
        .expect("run gpu-dra inventory");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "GPU_DRA_SIM_NODE: --sim-node \"dgx-z9\" is neither a preset nor a file; presets: mixed"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "the NVML library {} could not be used",
            lib.display()
        )),
        "{err}"
    );
}
