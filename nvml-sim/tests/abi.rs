//! The built library as nvml-wrapper sees it: opened with `NvmlLib::new` (libloading's
//! `dlopen` and one `dlsym` per function, exactly what `Nvml::init` does), struct layouts and
//! `version` words of the versioned calls checked against nvml-wrapper-sys's bindings (NVML's
//! header), unimplemented functions answering `NVML_ERROR_NOT_SUPPORTED`, and the MIG
//! lifecycle through raw calls with the codes NVML gives.
//!
//! One test per process state: the library's node comes from the environment at `nvmlInit`.

use std::mem::{MaybeUninit, size_of};

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;

// The library as gpu-dra's own tests find it: built next to the test binary.
#[path = "../../tests/nvml_sim_support/mod.rs"]
mod nvml_sim_support;
use nvml_sim_support::library;

/// `NVML_STRUCT_VERSION(T, v)` as nvml.h defines it.
fn version<T>(v: u32) -> u32 {
    size_of::<T>() as u32 | (v << 24)
}

#[test]
fn the_library_speaks_nvml_abi_as_nvml_wrapper_loads_it() {
    // SAFETY (test): set before any thread of this test binary reads the environment; this
    // file has a single test.
    unsafe {
        std::env::set_var("GPU_DRA_SIM_NODE", "mixed");
        std::env::remove_var("GPU_DRA_SIM_STATE_DIR");
    }
    let path = library();

    // Layouts of the structs the library fills, as nvml.h defines them on 64-bit Linux.
    assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
    assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
    assert_eq!(size_of::<nvmlEventData_t>(), 32);
    assert_eq!(size_of::<nvmlGpuInstanceInfo_t>(), 24);
    assert_eq!(size_of::<nvmlComputeInstanceInfo_t>(), 32);
    assert_eq!(size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 152);
    assert_eq!(size_of::<nvmlDeviceAttributes_t>(), 40);
    assert_eq!(size_of::<nvmlVgpuHeterogeneousMode_v1_t>(), 8);

    // nvml-wrapper's own path: dlopen, nvmlInit_v2, safe queries.
    let nvml = Nvml::builder().lib_path(path.as_os_str()).init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 3);
    assert_eq!(nvml.sys_driver_version().unwrap(), "580.95.05");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13000);
    let a100 = nvml.device_by_index(0).unwrap();
    assert_eq!(a100.name().unwrap(), "NVIDIA A100-SXM4-40GB");
    // memory_info is nvmlDeviceGetMemoryInfo_v2 with nvml-wrapper's own version word.
    assert_eq!(a100.memory_info().unwrap().total, 40960 * 1024 * 1024);
    let uuid = a100.uuid().unwrap();
    assert_eq!(
        nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(),
        0
    );
    let bus_id = a100.pci_info().unwrap().bus_id;
    assert_eq!(bus_id, "00000000:18:00.0");
    assert_eq!(
        nvml.device_by_pci_bus_id(bus_id.as_str())
            .unwrap()
            .index()
            .unwrap(),
        0
    );
    let mode = a100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(a100.mig_device_count().unwrap(), 7);
    let mig = a100.mig_device_by_index(0).unwrap();
    assert!(mig.mig_is_mig_device_handle().unwrap());
    assert!(mig.uuid().unwrap().starts_with("MIG-"));
    assert_eq!(mig.memory_info().unwrap().total, 4864 * 1024 * 1024);
    assert_eq!(mig.mig_parent_device().unwrap().uuid().unwrap(), uuid);
    let l4 = nvml.device_by_index(2).unwrap();
    assert!(matches!(
        l4.mig_mode(),
        Err(nvml_wrapper::error::NvmlError::NotSupported)
    ));
    assert_eq!(l4.power_management_limit().unwrap(), 72_000);

    // The raw symbol table nvml-wrapper-sys resolves, and the calls our backend makes raw.
    // SAFETY (test): loading our own library; its initialisers are Rust statics only.
    let lib = unsafe { NvmlLib::new(&path) }.unwrap();
    let get = |name: &str, ok: bool| assert!(ok, "{name} is not exported");
    get("nvmlShutdown", lib.nvmlShutdown.is_ok());
    get(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        lib.nvmlDeviceCreateGpuInstanceWithPlacement.is_ok(),
    );
    get(
        "nvmlGetVgpuVersion (a stub)",
        lib.nvmlGetVgpuVersion.is_ok(),
    );
    // The vGPU calls the NVML backend reads (nvml-sim/tests/vgpu.rs checks their answers).
    for (name, ok) in [
        (
            "nvmlDeviceGetSupportedVgpus",
            lib.nvmlDeviceGetSupportedVgpus.is_ok(),
        ),
        (
            "nvmlDeviceGetCreatableVgpus",
            lib.nvmlDeviceGetCreatableVgpus.is_ok(),
        ),
        ("nvmlVgpuTypeGetName", lib.nvmlVgpuTypeGetName.is_ok()),
        (
            "nvmlVgpuTypeGetFramebufferSize",
            lib.nvmlVgpuTypeGetFramebufferSize.is_ok(),
        ),
        (
            "nvmlVgpuTypeGetMaxInstances",
            lib.nvmlVgpuTypeGetMaxInstances.is_ok(),
        ),
        (
            "nvmlVgpuTypeGetCapabilities",
            lib.nvmlVgpuTypeGetCapabilities.is_ok(),
        ),
        (
            "nvmlVgpuTypeGetGpuInstanceProfileId",
            lib.nvmlVgpuTypeGetGpuInstanceProfileId.is_ok(),
        ),
        (
            "nvmlDeviceGetVgpuHeterogeneousMode",
            lib.nvmlDeviceGetVgpuHeterogeneousMode.is_ok(),
        ),
        (
            "nvmlDeviceGetHostVgpuMode",
            lib.nvmlDeviceGetHostVgpuMode.is_ok(),
        ),
        (
            "nvmlDeviceGetVgpuCapabilities",
            lib.nvmlDeviceGetVgpuCapabilities.is_ok(),
        ),
    ] {
        get(name, ok);
    }
    // SAFETY (test): init/shutdown pairs are refcounted by the library.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), 0);
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(1, &mut dev), 0);
        // An unimplemented function answers NOT_SUPPORTED, never crashes.
        let mut speed = 0u32;
        assert_eq!(
            lib.nvmlDeviceGetFanSpeed(dev, &mut speed),
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        );
        // A handle the library never gave out is refused.
        let bogus: nvmlDevice_t = std::ptr::without_provenance_mut(0x1234);
        let mut minor = 0u32;
        assert_eq!(
            lib.nvmlDeviceGetMinorNumber(bogus, &mut minor),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );

        // Versioned structs: the right version word succeeds, a wrong one is refused.
        let mut mem = MaybeUninit::<nvmlMemory_v2_t>::zeroed().assume_init();
        mem.version = version::<nvmlMemory_v2_t>(2);
        assert_eq!(lib.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem), 0);
        assert_eq!(mem.total, 81559 * 1024 * 1024);
        mem.version = version::<nvmlMemory_v2_t>(1);
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem),
            nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        let mut v2 = MaybeUninit::<nvmlGpuInstanceProfileInfo_v2_t>::zeroed().assume_init();
        v2.version = version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
        assert_eq!(lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, &mut v2), 0);
        let name = std::ffi::CStr::from_ptr(v2.name.as_ptr()).to_str().unwrap();
        assert_eq!(name, "MIG 1g.10gb");
        let mut v3 = MaybeUninit::<nvmlGpuInstanceProfileInfo_v3_t>::zeroed().assume_init();
        v3.version = version::<nvmlGpuInstanceProfileInfo_v3_t>(3);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, (&raw mut v3).cast()),
            0
        );
        assert_eq!((v3.id, v3.sliceCount, v3.memorySizeMB), (v2.id, 1, 9984));
        let name = std::ffi::CStr::from_ptr(v3.name.as_ptr()).to_str().unwrap();
        assert_eq!(name, "1g.10gb");
        v2.version = version::<nvmlGpuInstanceProfileInfo_v2_t>(1);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, &mut v2),
            nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );

        // MIG lifecycle at a placement: 3g.40gb at 4, an occupied overlap, a bad start.
        let profile = {
            let mut info = MaybeUninit::<nvmlGpuInstanceProfileInfo_t>::zeroed().assume_init();
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, 2, &mut info),
                0
            );
            info
        };
        let at = |start| nvmlGpuInstancePlacement_t { start, size: 4 };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile.id, &at(4), &mut gi),
            0
        );
        let mut other: nvmlGpuInstance_t = std::ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile.id, &at(4), &mut other),
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES
        );
        assert_eq!(
            lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile.id, &at(2), &mut other),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );
        let mut gi_info = MaybeUninit::<nvmlGpuInstanceInfo_t>::zeroed().assume_init();
        assert_eq!(lib.nvmlGpuInstanceGetInfo(gi, &mut gi_info), 0);
        assert_eq!((gi_info.placement.start, gi_info.placement.size), (4, 4));
        let mut cip = MaybeUninit::<nvmlComputeInstanceProfileInfo_t>::zeroed().assume_init();
        assert_eq!(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0, &mut cip),
            0
        );
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        assert_eq!(
            lib.nvmlGpuInstanceCreateComputeInstance(gi, cip.id, &mut ci),
            0
        );
        let mut ci_info = MaybeUninit::<nvmlComputeInstanceInfo_t>::zeroed().assume_init();
        assert_eq!(lib.nvmlComputeInstanceGetInfo_v2(ci, &mut ci_info), 0);
        let mut gi_id = 0;
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceId(ci_info.device, &mut gi_id),
            0
        );
        assert_eq!(gi_id, gi_info.id);
        assert_eq!(
            lib.nvmlGpuInstanceDestroy(gi),
            nvmlReturn_enum_NVML_ERROR_IN_USE
        );
        assert_eq!(lib.nvmlComputeInstanceDestroy(ci), 0);
        assert_eq!(lib.nvmlGpuInstanceDestroy(gi), 0);
        // The destroyed instance's handle is now refused, not dangling.
        assert_eq!(
            lib.nvmlGpuInstanceGetInfo(gi, &mut gi_info),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );

        // Hopper toggles MIG mode at once when idle; Ampere keeps it pending.
        let mut status = 0;
        assert_eq!(lib.nvmlDeviceSetMigMode(dev, 0, &mut status), 0);
        assert_eq!(status, 0);
        let mut a100: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut a100), 0);
        assert_eq!(
            lib.nvmlDeviceSetMigMode(a100, 0, &mut status),
            nvmlReturn_enum_NVML_ERROR_IN_USE,
            "MIG devices exist on the A100"
        );
        assert_eq!(lib.nvmlShutdown(), 0);
    }
    drop(nvml);
}
