//! Fabric membership at NVML's C ABI, as NCCL and NVIDIA's DRA driver query it:
//! `nvmlDeviceGetGpuFabricInfo` and `nvmlDeviceGetGpuFabricInfoV` (v2 and v3 structs, with
//! their `version` words) answered from the node file's `fabric:`; a GPU without one answers
//! NOT_SUPPORTED like a PCIe GPU; and gpu-dra's NVML backend over the library reports the
//! same fabric as the simulator does.
//!
//! One test: the library's node comes from the environment at `nvmlInit`.

use std::mem::{MaybeUninit, size_of};

use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::fabric::{FabricInfo, FabricState};
use gpu_dra::hardware::nvml::NvmlBackend;
use gpu_dra::hardware::sim::SimBackend;
use nvml_wrapper_sys::bindings::*;

#[path = "../../tests/nvml_sim_support/mod.rs"]
mod nvml_sim_support;
use nvml_sim_support::library;

/// `NVML_STRUCT_VERSION(T, v)` as nvml.h defines it.
fn version<T>(v: u32) -> u32 {
    size_of::<T>() as u32 | (v << 24)
}

const NODE: &str = "\
nodeName: tray-7
gpus:
  - model: GB200
    count: 2
    fabric: {clusterUuid: 6D9C2F5E-3B1A-4E7D-8C0F-2A4B6C8D0E1F, cliqueId: 32766, state: Completed}
  - model: GB200
    fabric: {clusterUuid: 6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f, cliqueId: 5, state: InProgress}
  - model: L4
";

const UUID_BYTES: [u8; 16] = [
    0x6d, 0x9c, 0x2f, 0x5e, 0x3b, 0x1a, 0x4e, 0x7d, 0x8c, 0x0f, 0x2a, 0x4b, 0x6c, 0x8d, 0x0e, 0x1f,
];

#[test]
fn fabric_info_answers_at_the_c_abi_and_through_the_nvml_backend() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("tray-7.yaml");
    std::fs::write(&node, NODE).unwrap();
    // SAFETY (test): set before anything in this single-test binary reads the environment.
    unsafe {
        std::env::set_var("GPU_DRA_SIM_NODE", &node);
        std::env::remove_var("GPU_DRA_SIM_STATE_DIR");
    }

    // The layouts nvml.h gives on 64-bit Linux.
    assert_eq!(size_of::<nvmlGpuFabricInfo_t>(), 28);
    assert_eq!(size_of::<nvmlGpuFabricInfo_v2_t>(), 36);
    assert_eq!(size_of::<nvmlGpuFabricInfo_v3_t>(), 40);
    assert_eq!(version::<nvmlGpuFabricInfo_v2_t>(2), 0x0200_0024);

    // SAFETY (test): the library is NVML's ABI; every out-pointer below is a live local.
    let lib = unsafe { NvmlLib::new(library()) }.unwrap();
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), 0);
        let mut gpu0: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut gpu0), 0);

        // The unversioned call.
        let mut plain = MaybeUninit::<nvmlGpuFabricInfo_t>::zeroed().assume_init();
        assert_eq!(lib.nvmlDeviceGetGpuFabricInfo(gpu0, &mut plain), 0);
        assert_eq!(
            (plain.clusterUuid, plain.cliqueId, plain.state, plain.status),
            (UUID_BYTES, 32766, NVML_GPU_FABRIC_STATE_COMPLETED as u8, 0)
        );

        // v2, as NVIDIA's DRA driver and NCCL pass it: the fields of v2 only.
        let mut v2 = MaybeUninit::<nvmlGpuFabricInfo_v2_t>::zeroed().assume_init();
        v2.version = version::<nvmlGpuFabricInfo_v2_t>(2);
        assert_eq!(
            lib.nvmlDeviceGetGpuFabricInfoV(gpu0, (&raw mut v2).cast()),
            0
        );
        assert_eq!(
            (v2.version, v2.clusterUuid, v2.cliqueId, v2.state),
            (0x0200_0024, UUID_BYTES, 32766, 3)
        );
        assert_ne!(
            v2.healthMask, 0,
            "a registered GPU reports its fabric health"
        );

        // v3 adds the health summary.
        let mut v3 = MaybeUninit::<nvmlGpuFabricInfo_v3_t>::zeroed().assume_init();
        v3.version = version::<nvmlGpuFabricInfo_v3_t>(3);
        assert_eq!(lib.nvmlDeviceGetGpuFabricInfoV(gpu0, &mut v3), 0);
        assert_eq!((v3.cliqueId, v3.healthMask), (32766, v2.healthMask));
        assert_eq!(
            v3.healthSummary as u32,
            NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
        );

        // A version word NVML does not know.
        let mut bad = MaybeUninit::<nvmlGpuFabricInfo_v3_t>::zeroed().assume_init();
        bad.version = version::<nvmlGpuFabricInfo_v3_t>(2);
        assert_eq!(
            lib.nvmlDeviceGetGpuFabricInfoV(gpu0, &mut bad),
            nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        assert_eq!(
            lib.nvmlDeviceGetGpuFabricInfoV(gpu0, std::ptr::null_mut()),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );

        // Registration still in progress: the state says so.
        let mut gpu2: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(2, &mut gpu2), 0);
        let mut v2 = MaybeUninit::<nvmlGpuFabricInfo_v2_t>::zeroed().assume_init();
        v2.version = version::<nvmlGpuFabricInfo_v2_t>(2);
        assert_eq!(
            lib.nvmlDeviceGetGpuFabricInfoV(gpu2, (&raw mut v2).cast()),
            0
        );
        assert_eq!(
            (v2.cliqueId, v2.state),
            (5, NVML_GPU_FABRIC_STATE_IN_PROGRESS as u8)
        );

        // The L4 is on no fabric: NOT_SUPPORTED for both calls, as on a PCIe GPU.
        let mut l4: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(3, &mut l4), 0);
        assert_eq!(
            lib.nvmlDeviceGetGpuFabricInfo(l4, &mut plain),
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            lib.nvmlDeviceGetGpuFabricInfoV(l4, &mut v3),
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        assert_eq!(lib.nvmlShutdown(), 0);
    }

    // The production backend over the library sees what the simulator reports.
    let sim = SimBackend::open(node.to_str().unwrap(), None).unwrap();
    let nvml = NvmlBackend::open_with(Some(&library())).unwrap();
    let got = nvml.inventory().unwrap();
    assert_eq!(got, sim.inventory().unwrap());
    let fabrics: Vec<Option<FabricInfo>> = got.gpus.iter().map(|g| g.fabric.clone()).collect();
    let completed = FabricInfo {
        cluster_uuid: "6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f".into(),
        clique_id: 32766,
        state: FabricState::Completed,
    };
    assert_eq!(
        fabrics,
        [
            Some(completed.clone()),
            Some(completed),
            Some(FabricInfo {
                cluster_uuid: "6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f".into(),
                clique_id: 5,
                state: FabricState::InProgress,
            }),
            None,
        ]
    );
    assert_eq!(
        got.gpus[0]
            .fabric
            .as_ref()
            .and_then(FabricInfo::clique)
            .as_deref(),
        Some("6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f.32766")
    );
    assert_eq!(
        got.gpus[2].fabric.as_ref().and_then(FabricInfo::clique),
        None
    );
}
