//! The simulated NVML library (the `nvml-sim` workspace member) as the tests load it: built by
//! Cargo before the tests run (it is a dev-dependency), found next to the test binary.
#![allow(dead_code)] // each test file uses a different part

use std::path::PathBuf;

/// Path of the built `libgpu_dra_nvml_sim.so`.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary directory");
    let candidates = [
        deps.join(gpu_dra_nvml_sim::LIBRARY_FILE),
        deps.parent()
            .map(|p| p.join(gpu_dra_nvml_sim::LIBRARY_FILE))
            .unwrap_or_default(),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!("the simulated NVML library is not built; looked at {candidates:?}")
        })
}

/// `--gpu-mig-policies` giving the NVML backend the per-GPU MIG policies of `preset`'s node
/// file (the sim backend reads them from the file).
pub fn policies_flag(preset: &str) -> String {
    let sim = gpu_dra::hardware::sim::SimBackend::open(preset, None).expect("preset");
    gpu_dra::hardware::policy_flag::format_gpu_policies(&sim.mig_policies())
}
