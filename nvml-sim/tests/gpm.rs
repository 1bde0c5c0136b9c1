//! GPU Performance Monitoring as nvml-wrapper uses it (`Device::gpm_support`,
//! `Device::gpm_mig_sample`, `gpm::gpm_metrics_get`): Hopper instances report the load
//! model's SM utilisation between two samples, other metrics fail in their own slot, samples
//! of two different instances are refused, and GPUs before Hopper have no GPM.
//!
//! One test per process state: the library's node comes from the environment at `nvmlInit`.

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper_sys::bindings::nvmlDevice_t;

// The library as gpu-dra's own tests find it: built next to the test binary.
#[path = "../../tests/nvml_sim_support/mod.rs"]
mod nvml_sim_support;
use nvml_sim_support::library;

/// GPU instance id of MIG device `index` of `gpu`, as the NVML backend reads it.
fn gi_of(nvml: &Nvml, gpu: &nvml_wrapper::Device<'_>, index: u32) -> u32 {
    let mig = gpu.mig_device_by_index(index).unwrap();
    let get = nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref().unwrap();
    let mut gi = 0u32;
    // SAFETY (test): the MIG handle is live while `mig` is; `gi` is a valid out-pointer.
    let ret = unsafe {
        let handle: nvmlDevice_t = mig.handle();
        get(handle, &mut gi)
    };
    assert_eq!(ret, 0);
    gi
}

#[test]
fn hopper_instances_report_sm_utilisation_between_two_samples() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("gpm-node.yaml");
    std::fs::write(
        &node,
        "nodeName: gpm-node
gpus:
  - model: H100-SXM5-80GB
    mig: static
    migDevices: [1g.10gb, 3g.40gb]
  - model: A100-SXM4-40GB
    mig: static
    migDevices: [1g.5gb]
",
    )
    .unwrap();
    // SAFETY (test): set before any thread of this test binary reads the environment; this
    // file has a single test.
    unsafe {
        std::env::set_var("GPU_DRA_SIM_NODE", &node);
        std::env::remove_var("GPU_DRA_SIM_STATE_DIR");
    }
    let nvml = Nvml::builder()
        .lib_path(library().as_os_str())
        .init()
        .unwrap();
    let h100 = nvml.device_by_index(0).unwrap();
    let a100 = nvml.device_by_index(1).unwrap();
    assert_eq!(
        (h100.gpm_support().unwrap(), a100.gpm_support().unwrap()),
        (true, false)
    );

    let (first, second) = (gi_of(&nvml, &h100, 0), gi_of(&nvml, &h100, 1));
    let s1 = h100.gpm_mig_sample(first).unwrap();
    let s2 = h100.gpm_mig_sample(first).unwrap();
    let got = gpm_metrics_get(
        &nvml,
        &s1,
        &s2,
        &[
            GpmMetricId::SmUtil,
            GpmMetricId::SmOccupancy,
            GpmMetricId::DramBwUtil,
        ],
    )
    .unwrap();
    let values: Vec<Result<f64, String>> = got
        .into_iter()
        .map(|r| r.map(|m| m.value).map_err(|e| format!("{e:?}")))
        .collect();
    assert_eq!(
        values,
        vec![
            Ok(60.0),
            Ok(60.0),
            Err(format!("{:?}", NvmlError::NotSupported))
        ]
    );

    let other = h100.gpm_mig_sample(second).unwrap();
    assert!(matches!(
        gpm_metrics_get(&nvml, &s2, &other, &[GpmMetricId::SmUtil]),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        a100.gpm_mig_sample(gi_of(&nvml, &a100, 0)),
        Err(NvmlError::NotSupported)
    ));
}
