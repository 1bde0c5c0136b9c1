//! gpu-dra's production NVML backend against the simulated library, next to the simulator on
//! the same state directory: errors name the NVML call and carry NVML's code, the A100 keeps
//! a MIG mode change pending until a reset, and a GPU instance left without a compute
//! instance is discovered through NVML. A kubelet call's inventory, which keeps what cannot
//! change from the last full read, agrees with a full read after every change.

use gpu_dra::hardware::nvml::NvmlBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::{GpuBackend, HardwareError, MigModeChange, NvmlCode};

// The library as gpu-dra's own tests find it: built next to the test binary.
#[path = "../../tests/nvml_sim_support/mod.rs"]
mod nvml_sim_support;
use nvml_sim_support::library;

/// The NVML call and code of a hardware error.
fn nvml_failure(e: HardwareError) -> (String, NvmlCode) {
    match e {
        HardwareError::Nvml {
            operation, code, ..
        } => (operation, code),
        other => panic!("not an NVML error: {other}"),
    }
}

/// The kubelet call's inventory (asked first, so it starts from what the last full read
/// kept) and a full read both say what the simulator says.
fn agree(nvml: &NvmlBackend, sim: &SimBackend, step: &str) {
    let truth = sim.inventory().unwrap();
    assert_eq!(
        nvml.request_inventory().unwrap(),
        truth,
        "{step}: request inventory"
    );
    assert_eq!(nvml.inventory().unwrap(), truth, "{step}: full read");
}

#[test]
fn the_nvml_backend_runs_the_mig_lifecycle_and_reports_nvml_failures_by_call() {
    let state = tempfile::tempdir().unwrap();
    // SAFETY (test): set before anything in this single-test binary reads the environment.
    unsafe {
        std::env::set_var("GPU_DRA_SIM_NODE", "dgx-a100");
        std::env::set_var("GPU_DRA_SIM_STATE_DIR", state.path());
        std::env::set_var(
            gpu_dra_nvml_sim::calls::CALLS_ENV,
            state.path().join("nvml-calls"),
        );
    }
    let calls = || gpu_dra_nvml_sim::calls::read(&state.path().join("nvml-calls")).unwrap();
    let sim = SimBackend::open("dgx-a100", Some(state.path())).unwrap();
    let nvml = NvmlBackend::open_with(Some(&library())).unwrap();
    // The backend's event thread registers the GPUs as it starts: counts are taken once it
    // has (the count stands still for 200 ms).
    let mut last = calls();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = calls();
        if now == last {
            break;
        }
        last = now;
    }
    // The first inventory reads every GPU in full; the next ones, within a minute of it, ask
    // only what can change, as a kubelet call's does.
    let counted = |read: &dyn Fn() -> gpu_dra::hardware::NodeInventory| {
        let before = calls();
        let inventory = read();
        (calls() - before, inventory)
    };
    let (full, first) = counted(&|| nvml.inventory().unwrap());
    let (kept, second) = counted(&|| nvml.inventory().unwrap());
    let (call, third) = counted(&|| nvml.request_inventory().unwrap());
    assert_eq!((&first, &second), (&third, &third));
    assert_eq!(kept, call, "a round within a minute asks what a call asks");
    assert!(
        kept * 2 < full,
        "kept facts: {kept} NVML calls, a full read {full}"
    );
    agree(&nvml, &sim, "at start");

    // GPU 0 is pre-partitioned 1g.5gb ×2 + 2g.10gb + 3g.20gb: 3g.20gb at 4 is taken.
    let three_g = sim.inventory().unwrap().gpus[0]
        .profile_by_name("3g.20gb")
        .unwrap()
        .id;
    let (call, code) = nvml_failure(nvml.create_mig_device(0, three_g, 4).unwrap_err());
    assert_eq!(code, NvmlCode::InsufficientResources);
    assert!(
        call.starts_with("nvmlDeviceCreateGpuInstanceWithPlacement (3g.20gb at 4:4)"),
        "{call}"
    );
    let (_, code) = nvml_failure(nvml.create_mig_device(0, three_g, 2).unwrap_err());
    assert_eq!(code, NvmlCode::InvalidArgument);
    let (call, code) = nvml_failure(nvml.destroy_mig_device(0, 99, 0).unwrap_err());
    assert_eq!(code, NvmlCode::NotFound);
    assert!(call.starts_with("nvmlDeviceGetGpuInstanceById"), "{call}");

    // Destroy the 3g.20gb through NVML and carve it again at its placement.
    let before = nvml.inventory().unwrap().gpus[0].mig_devices.clone();
    let victim = before
        .iter()
        .find(|d| d.profile_name == "3g.20gb")
        .unwrap()
        .clone();
    nvml.destroy_mig_device(0, victim.gi_id, victim.ci_id)
        .unwrap();
    assert_eq!(sim.inventory().unwrap().gpus[0].mig_devices.len(), 3);
    let before = calls();
    let again = nvml.create_mig_device(0, three_g, 4).unwrap();
    // The GPU's handle, UUID and MIG mode (its profile table is kept from the last full
    // read), its handle again for the creation; create the GPU instance, its info, the
    // compute-instance profile, create the compute instance, its info and its UUID. It was
    // a full read of the GPU before.
    assert_eq!(calls() - before, 3 + 1 + 6, "NVML calls of a MIG creation");
    assert_eq!(
        (again.placement, again.gi_id, again.profile_name.as_str()),
        (victim.placement, victim.gi_id, "3g.20gb")
    );
    assert_ne!(
        again.uuid, victim.uuid,
        "a re-created MIG device gets a new UUID"
    );
    agree(&nvml, &sim, "a MIG device destroyed and created again");

    // The A100's MIG mode: IN_USE with MIG devices, pending until a reset on an idle GPU.
    let (call, code) = nvml_failure(nvml.set_mig_mode(0, false).unwrap_err());
    assert_eq!(
        (call.as_str(), code),
        ("nvmlDeviceSetMigMode", NvmlCode::InUse)
    );
    assert_eq!(
        nvml.set_mig_mode(4, true).unwrap(),
        MigModeChange::PendingReset
    );
    let mode = nvml.inventory().unwrap().gpus[4].mig;
    assert_eq!((mode.current, mode.pending), (false, true));
    agree(&nvml, &sim, "MIG mode pending");
    sim.reset_gpu(4).unwrap();
    agree(&nvml, &sim, "MIG mode on after the reset");
    let mode = nvml.inventory().unwrap().gpus[4].mig;
    assert_eq!((mode.current, mode.pending), (true, true));

    // A GPU instance without a compute instance (an interrupted creation) is seen as such.
    let one_g = sim.inventory().unwrap().gpus[4]
        .profile_by_name("1g.5gb")
        .unwrap()
        .id;
    let gi = sim.create_gpu_instance(4, one_g, 6).unwrap();
    agree(&nvml, &sim, "a GPU instance without a compute instance");
    let gpu4 = &nvml.inventory().unwrap().gpus[4];
    assert_eq!(
        gpu4.empty_gpu_instances
            .iter()
            .map(|g| (g.gi_id, g.placement.start))
            .collect::<Vec<_>>(),
        [(gi, 6)]
    );
    // A MIG device carved by another process beside it.
    let carved = sim.create_mig_device(4, one_g, 0).unwrap();
    agree(&nvml, &sim, "a MIG device carved elsewhere");
    sim.destroy_mig_device(4, carved.gi_id, carved.ci_id)
        .unwrap();
    agree(&nvml, &sim, "that MIG device destroyed");
}
