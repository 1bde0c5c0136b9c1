//! The simulated library's vGPU calls as C callers make them: the count protocol of the type
//! lists (NVML's documented `*vgpuCount = 0` query, nvml-wrapper's empty-then-exact calls,
//! go-nvml's start-at-one-and-double loop), type names, framebuffers in bytes, instance
//! counts, homogeneity caps, GPU-instance profiles, host and heterogeneous modes, and the
//! codes NVML gives a GPU without vGPU, an unknown type or a null pointer. Then gpu-dra's NVML
//! backend over the library reads the same `GpuInfo::vgpu` as the sim backend, and a vGPU
//! created on the simulated host by the production host code changes what the library reports
//! as creatable at once.
//!
//! The node (a file and a state directory in Cargo's test temp dir) is one process-wide
//! state: every test sets the same environment and opens the library on it.

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::nvml::NvmlBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::sim::sysfs::SimKernel;
use gpu_dra::hardware::vgpu::VgpuHost;
use gpu_dra::hardware::vgpu::catalog;
use gpu_dra::hardware::vgpu::sysfs::TypeNames;
use nvml_wrapper_sys::bindings::*;

// The library as gpu-dra's own tests find it: built next to the test binary.
#[path = "../../tests/nvml_sim_support/mod.rs"]
mod nvml_sim_support;
use nvml_sim_support::library;

/// GPU 0: H100 with MIG off; 1: H100 with MIG on; 2: L40S in heterogeneous mode; 3: T4 on
/// mdev; 4: L4 without the vGPU manager.
const NODE: &str = "\
gpus:
  - model: H100-SXM5-80GB
    count: 1
    mig: disabled
    vgpu: {}
  - model: H100-SXM5-80GB
    count: 1
    mig: static
    migDevices: [1g.10gb]
    vgpu: {}
  - model: L40S
    count: 1
    vgpu:
      heterogeneous: true
  - model: T4
    count: 1
    vgpu: {}
  - model: L4
    count: 1
";

const OK: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const INVALID_ARGUMENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const VERSION_MISMATCH: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

const H100_4C: u32 = 1056;
const H100_10C: u32 = 1058;
const H100_1_10C: u32 = 1062;
const L40S_1B: u32 = 1147;
const L40S_12Q: u32 = 1153;

/// The node file, written once with a fresh state directory (so the host tree, and the
/// vGPUs on it, are shared by the sim backend, the host code and the library), both named in
/// the environment before any library is opened.
fn node_file() -> &'static PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvml-sim-vgpu");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node.yaml");
        std::fs::write(&path, NODE).unwrap();
        let state = dir.join("state");
        SimBackend::open(&path.to_string_lossy(), Some(&state)).unwrap();
        // SAFETY (test): every test passes through this once-only initialiser before it
        // loads the library, the only reader of these variables.
        unsafe {
            std::env::set_var("GPU_DRA_SIM_NODE", &path);
            std::env::set_var("GPU_DRA_SIM_STATE_DIR", &state);
        }
        path
    })
}

/// The state directory of [`node_file`].
fn state_dir() -> PathBuf {
    node_file().with_file_name("state")
}

/// Held by the tests that change the host's vGPUs or compare whole inventories, so that
/// neither sees the other half-way.
static HOST: Mutex<()> = Mutex::new(());

/// The library loaded and initialised as a C caller does; shut down on drop.
struct Lib(NvmlLib);

impl Lib {
    fn open() -> Lib {
        node_file();
        // SAFETY (test): loading our own library; its initialisers are Rust statics only.
        let lib = unsafe { NvmlLib::new(library()) }.unwrap();
        // SAFETY (test): init/shutdown pairs are refcounted by the library.
        assert_eq!(unsafe { lib.nvmlInit_v2() }, OK);
        Lib(lib)
    }

    fn device(&self, index: u32) -> nvmlDevice_t {
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY (test): `dev` is valid for one write.
        assert_eq!(
            unsafe { self.0.nvmlDeviceGetHandleByIndex_v2(index, &mut dev) },
            OK
        );
        dev
    }

    /// A type list read as NVML documents: ask with `*count = 0` and no buffer, then fetch.
    fn list(
        &self,
        call: unsafe extern "C" fn(nvmlDevice_t, *mut u32, *mut nvmlVgpuTypeId_t) -> nvmlReturn_t,
        dev: nvmlDevice_t,
    ) -> Result<Vec<u32>, nvmlReturn_t> {
        let mut count = 0;
        // SAFETY (test): room 0 with a null buffer is the documented count query.
        match unsafe { call(dev, &mut count, std::ptr::null_mut()) } {
            OK => return Ok(Vec::new()),
            INSUFFICIENT_SIZE => {}
            code => return Err(code),
        }
        let mut ids = vec![0; count as usize];
        // SAFETY (test): `ids` holds `count` elements.
        match unsafe { call(dev, &mut count, ids.as_mut_ptr()) } {
            OK => Ok(ids[..count as usize].to_vec()),
            code => Err(code),
        }
    }

    fn name(&self, id: u32) -> Result<String, nvmlReturn_t> {
        let mut buf = [0 as std::ffi::c_char; NVML_VGPU_NAME_BUFFER_SIZE as usize];
        let mut size = NVML_VGPU_NAME_BUFFER_SIZE;
        // SAFETY (test): `buf` holds `size` bytes.
        match unsafe { self.0.nvmlVgpuTypeGetName(id, buf.as_mut_ptr(), &mut size) } {
            // SAFETY (test): NVML wrote a NUL-terminated string.
            OK => Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_str()
                .unwrap()
                .to_string()),
            code => Err(code),
        }
    }

    fn type_cap(&self, id: u32, cap: nvmlVgpuCapability_t) -> Result<u32, nvmlReturn_t> {
        let mut value = 0;
        // SAFETY (test): `value` is valid for one write.
        match unsafe { self.0.nvmlVgpuTypeGetCapabilities(id, cap, &mut value) } {
            OK => Ok(value),
            code => Err(code),
        }
    }

    fn device_cap(
        &self,
        dev: nvmlDevice_t,
        cap: nvmlDeviceVgpuCapability_t,
    ) -> Result<u32, nvmlReturn_t> {
        let mut value = 0;
        // SAFETY (test): `value` is valid for one write.
        match unsafe { self.0.nvmlDeviceGetVgpuCapabilities(dev, cap, &mut value) } {
            OK => Ok(value),
            code => Err(code),
        }
    }

    fn host_mode(&self, dev: nvmlDevice_t) -> Result<nvmlHostVgpuMode_t, nvmlReturn_t> {
        let mut mode = 7;
        // SAFETY (test): `mode` is valid for one write.
        match unsafe { self.0.nvmlDeviceGetHostVgpuMode(dev, &mut mode) } {
            OK => Ok(mode),
            code => Err(code),
        }
    }

    /// The heterogeneous mode with the struct's `version` word set to `version`.
    fn heterogeneous(&self, dev: nvmlDevice_t, version: u32) -> Result<u32, nvmlReturn_t> {
        let mut mode = nvmlVgpuHeterogeneousMode_v1_t { version, mode: 7 };
        // SAFETY (test): `mode` is the v1 struct.
        match unsafe { self.0.nvmlDeviceGetVgpuHeterogeneousMode(dev, &mut mode) } {
            OK => Ok(mode.mode),
            code => Err(code),
        }
    }
}

impl Drop for Lib {
    fn drop(&mut self) {
        // SAFETY (test): pairs the init of `open`.
        unsafe { self.0.nvmlShutdown() };
    }
}

/// `nvmlVgpuHeterogeneousMode_v1` as nvml.h's `NVML_STRUCT_VERSION` builds it.
const HETEROGENEOUS_V1: u32 = size_of::<nvmlVgpuHeterogeneousMode_v1_t>() as u32 | (1 << 24);

fn sim() -> SimBackend {
    SimBackend::open(&node_file().to_string_lossy(), Some(&state_dir())).unwrap()
}

#[test]
fn type_lists_follow_nvmls_count_protocol_as_each_caller_uses_it() {
    let lib = Lib::open();
    let h100 = lib.device(0);
    let want: Vec<u32> = catalog::for_product("NVIDIA H100 80GB HBM3")
        .unwrap()
        .types
        .iter()
        .map(|t| t.id)
        .collect();
    let supported = lib.0.nvmlDeviceGetSupportedVgpus.as_ref().copied().unwrap();
    assert_eq!(lib.list(supported, h100), Ok(want.clone()));

    // SAFETY (test): every buffer below holds the room its count says.
    unsafe {
        // A short buffer: the count needed, the buffer untouched.
        let mut ids = [0u32; 4];
        let mut count = 4;
        assert_eq!(
            supported(h100, &mut count, ids.as_mut_ptr()),
            INSUFFICIENT_SIZE
        );
        assert_eq!((count, ids), (want.len() as u32, [0; 4]));
        // More room than needed: the count written.
        let mut ids = [0u32; 32];
        let mut count = 32;
        assert_eq!(supported(h100, &mut count, ids.as_mut_ptr()), OK);
        assert_eq!(&ids[..count as usize], want.as_slice());
        // nvml-wrapper: room 0 with an empty Vec's dangling (non-null) pointer first.
        let mut empty: Vec<u32> = Vec::new();
        let mut count = 0;
        assert_eq!(
            supported(h100, &mut count, empty.as_mut_ptr()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, want.len() as u32);
        // go-nvml: room 1, doubled after every INSUFFICIENT_SIZE whatever count came back.
        let mut room = 1u32;
        let got = loop {
            let mut ids = vec![0u32; room as usize];
            let mut count = room;
            match supported(h100, &mut count, ids.as_mut_ptr()) {
                OK => break ids[..count as usize].to_vec(),
                INSUFFICIENT_SIZE => room *= 2,
                code => panic!("go-nvml's loop got {code}"),
            }
        };
        assert_eq!(got, want);
        // A null count is refused; so is a null buffer with room for the answer.
        assert_eq!(
            supported(h100, std::ptr::null_mut(), ids.as_mut_ptr()),
            INVALID_ARGUMENT
        );
        let mut count = 32;
        assert_eq!(
            supported(h100, &mut count, std::ptr::null_mut()),
            INVALID_ARGUMENT
        );
    }

    // Creatable: what the sim backend computes for an idle GPU, every time-sliced type.
    let creatable = lib.0.nvmlDeviceGetCreatableVgpus.as_ref().copied().unwrap();
    let inv = sim().inventory().unwrap();
    let from_sim = inv.gpus[0].vgpu.as_ref().unwrap().creatable.clone();
    assert_eq!(lib.list(creatable, h100), Ok(from_sim.clone()));
    assert_eq!(
        from_sim,
        [1056, 1057, 1058, 1059, 1060, 1061],
        "an idle H100 can create each time-sliced type"
    );
}

#[test]
fn type_queries_give_name_framebuffer_in_bytes_instances_caps_and_gpu_instance_profile() {
    let lib = Lib::open();
    let (h100, l40s) = (lib.device(0), lib.device(2));
    assert_eq!(lib.name(H100_10C).as_deref(), Ok("NVIDIA H100-10C"));
    assert_eq!(lib.name(L40S_12Q).as_deref(), Ok("NVIDIA L40S-12Q"));
    // SAFETY (test): every buffer holds the room its size says; out-pointers are locals.
    unsafe {
        // A name that does not fit: INSUFFICIENT_SIZE and the length it needs.
        let mut buf = [0 as std::ffi::c_char; 8];
        let mut size = 8;
        assert_eq!(
            lib.0
                .nvmlVgpuTypeGetName(H100_10C, buf.as_mut_ptr(), &mut size),
            INSUFFICIENT_SIZE
        );
        assert_eq!(size, "NVIDIA H100-10C".len() as u32 + 1);

        let mut fb = 0u64;
        assert_eq!(lib.0.nvmlVgpuTypeGetFramebufferSize(H100_10C, &mut fb), OK);
        assert_eq!(fb, 10 * 1024 * 1024 * 1024, "bytes, not MiB");

        let mut max = 0;
        assert_eq!(
            lib.0.nvmlVgpuTypeGetMaxInstances(h100, H100_4C, &mut max),
            OK
        );
        assert_eq!(max, 20);
        assert_eq!(
            lib.0.nvmlVgpuTypeGetMaxInstances(l40s, H100_4C, &mut max),
            INVALID_ARGUMENT,
            "a type the device does not list"
        );

        // Time-sliced: INVALID_GPU_INSTANCE_PROFILE_ID; MIG-backed: the id instance creation
        // takes, as nvmlDeviceGetGpuInstanceProfileInfo gives it for 1g.10gb.
        let mut gi_profile = 0;
        assert_eq!(
            lib.0
                .nvmlVgpuTypeGetGpuInstanceProfileId(H100_4C, &mut gi_profile),
            OK
        );
        assert_eq!(gi_profile, INVALID_GPU_INSTANCE_PROFILE_ID);
        assert_eq!(
            lib.0
                .nvmlVgpuTypeGetGpuInstanceProfileId(H100_1_10C, &mut gi_profile),
            OK
        );
        let mut info = MaybeUninit::<nvmlGpuInstanceProfileInfo_t>::zeroed().assume_init();
        assert_eq!(
            lib.0.nvmlDeviceGetGpuInstanceProfileInfo(
                h100,
                NVML_GPU_INSTANCE_PROFILE_1_SLICE,
                &mut info
            ),
            OK
        );
        assert_eq!(gi_profile, info.id);
    }

    let exclusive_type = nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_TYPE;
    let exclusive_size = nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_SIZE;
    assert_eq!((exclusive_type, exclusive_size), (3, 4), "nvml.h's values");
    assert_eq!(lib.type_cap(L40S_1B, exclusive_type), Ok(1));
    assert_eq!(lib.type_cap(L40S_1B, exclusive_size), Ok(0));
    assert_eq!(lib.type_cap(L40S_12Q, exclusive_type), Ok(0));
    assert_eq!(
        lib.type_cap(L40S_12Q, nvmlVgpuCapability_enum_NVML_VGPU_CAP_COUNT),
        Err(INVALID_ARGUMENT)
    );
}

#[test]
fn host_and_heterogeneous_modes_follow_the_framework_the_node_setting_and_mig() {
    let lib = Lib::open();
    let [h100, h100_mig, l40s, t4] = [0, 1, 2, 3].map(|i| lib.device(i));
    let sriov = nvmlHostVgpuMode_enum_NVML_HOST_VGPU_MODE_SRIOV;
    let non_sriov = nvmlHostVgpuMode_enum_NVML_HOST_VGPU_MODE_NON_SRIOV;
    assert_eq!((non_sriov, sriov), (0, 1), "nvml.h's values");
    assert_eq!(lib.host_mode(h100), Ok(sriov));
    assert_eq!(lib.host_mode(l40s), Ok(sriov));
    assert_eq!(lib.host_mode(t4), Ok(non_sriov));

    let (enabled, disabled) = (
        nvmlEnableState_enum_NVML_FEATURE_ENABLED,
        nvmlEnableState_enum_NVML_FEATURE_DISABLED,
    );
    assert_eq!(HETEROGENEOUS_V1, 0x0100_0008);
    assert_eq!(lib.heterogeneous(l40s, HETEROGENEOUS_V1), Ok(enabled));
    assert_eq!(lib.heterogeneous(h100, HETEROGENEOUS_V1), Ok(disabled));
    assert_eq!(lib.heterogeneous(t4, HETEROGENEOUS_V1), Ok(disabled));
    assert_eq!(
        lib.heterogeneous(h100_mig, HETEROGENEOUS_V1),
        Err(NOT_SUPPORTED),
        "nvml.h: not supported while MIG is enabled"
    );
    assert_eq!(
        lib.heterogeneous(l40s, 8 | (2 << 24)),
        Err(VERSION_MISMATCH)
    );
    assert_eq!(lib.heterogeneous(l40s, 0), Err(VERSION_MISMATCH));

    let profiles =
        nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_PROFILES;
    let sizes = nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_SIZES;
    assert_eq!((profiles, sizes), (1, 2), "nvml.h's values");
    for cap in [profiles, sizes] {
        assert_eq!(lib.device_cap(l40s, cap), Ok(1));
        assert_eq!(lib.device_cap(h100, cap), Ok(0));
        assert_eq!(lib.device_cap(t4, cap), Ok(0));
    }
    assert_eq!(
        lib.device_cap(
            l40s,
            nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_COUNT
        ),
        Err(INVALID_ARGUMENT)
    );
}

#[test]
fn a_gpu_without_vgpu_unknown_types_and_null_pointers_get_nvmls_codes() {
    let lib = Lib::open();
    let (h100, l4) = (lib.device(0), lib.device(4));
    let supported = lib.0.nvmlDeviceGetSupportedVgpus.as_ref().copied().unwrap();
    let creatable = lib.0.nvmlDeviceGetCreatableVgpus.as_ref().copied().unwrap();
    // No vGPU manager for the L4: every device call is NOT_SUPPORTED.
    assert_eq!(lib.list(supported, l4), Err(NOT_SUPPORTED));
    assert_eq!(lib.list(creatable, l4), Err(NOT_SUPPORTED));
    assert_eq!(lib.host_mode(l4), Err(NOT_SUPPORTED));
    assert_eq!(lib.heterogeneous(l4, HETEROGENEOUS_V1), Err(NOT_SUPPORTED));
    let profiles =
        nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_PROFILES;
    assert_eq!(lib.device_cap(l4, profiles), Err(NOT_SUPPORTED));
    let mut max = 0;
    // SAFETY (test): `max` is valid for one write.
    assert_eq!(
        unsafe { lib.0.nvmlVgpuTypeGetMaxInstances(l4, H100_4C, &mut max) },
        NOT_SUPPORTED
    );

    // A type ID no GPU of the node lists (an A100's), and a handle never handed out.
    let a100_4c = 460;
    assert_eq!(lib.name(a100_4c), Err(INVALID_ARGUMENT));
    assert_eq!(
        lib.type_cap(
            a100_4c,
            nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_TYPE
        ),
        Err(INVALID_ARGUMENT)
    );
    let bogus: nvmlDevice_t = std::ptr::without_provenance_mut(0x1234);
    assert_eq!(lib.host_mode(bogus), Err(INVALID_ARGUMENT));
    // SAFETY (test): out-pointers are locals or null; null ones are refused unread.
    unsafe {
        let mut fb = 0u64;
        assert_eq!(
            lib.0.nvmlVgpuTypeGetFramebufferSize(a100_4c, &mut fb),
            INVALID_ARGUMENT
        );
        let mut gi = 0;
        assert_eq!(
            lib.0.nvmlVgpuTypeGetGpuInstanceProfileId(a100_4c, &mut gi),
            INVALID_ARGUMENT
        );

        use std::ptr::null_mut as null;
        assert_eq!(
            lib.0.nvmlVgpuTypeGetFramebufferSize(H100_4C, null()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.0.nvmlVgpuTypeGetMaxInstances(h100, H100_4C, null()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.0.nvmlVgpuTypeGetCapabilities(H100_4C, 3, null()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.0.nvmlVgpuTypeGetGpuInstanceProfileId(H100_4C, null()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.0.nvmlDeviceGetHostVgpuMode(h100, null()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.0.nvmlDeviceGetVgpuHeterogeneousMode(h100, null()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            lib.0.nvmlDeviceGetVgpuCapabilities(h100, 1, null()),
            INVALID_ARGUMENT
        );
        let mut size = 64;
        assert_eq!(
            lib.0.nvmlVgpuTypeGetName(H100_4C, null(), &mut size),
            INVALID_ARGUMENT
        );
        let mut buf = [0 as std::ffi::c_char; 64];
        assert_eq!(
            lib.0.nvmlVgpuTypeGetName(H100_4C, buf.as_mut_ptr(), null()),
            INVALID_ARGUMENT
        );
    }
}

#[test]
fn the_nvml_backend_reads_the_same_vgpu_as_the_sim_backend() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let sim = sim().inventory().unwrap();
    let nvml = NvmlBackend::open_with(Some(&library()))
        .unwrap()
        .inventory()
        .unwrap();
    let vgpus = |inv: &gpu_dra::hardware::NodeInventory| {
        inv.gpus.iter().map(|g| g.vgpu.clone()).collect::<Vec<_>>()
    };
    assert_eq!(vgpus(&nvml), vgpus(&sim));
    assert_eq!(
        sim.gpus
            .iter()
            .map(|g| g.vgpu.is_some())
            .collect::<Vec<_>>(),
        [true, true, true, true, false]
    );
    // MIG-backed types keep their GPU-instance profile through NVML's profile id.
    let h100 = nvml.gpus[0].vgpu.as_ref().unwrap();
    assert_eq!(
        h100.type_by_id(H100_1_10C).unwrap().mig_profile.as_deref(),
        Some("1g.10gb")
    );
    assert!(nvml.gpus[2].vgpu.as_ref().unwrap().heterogeneous);
    assert_eq!(nvml, sim);
}

#[test]
fn a_vgpu_created_on_the_host_changes_what_nvml_reports_creatable() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let lib = Lib::open();
    let l40s = lib.device(2);
    let creatable = lib.0.nvmlDeviceGetCreatableVgpus.as_ref().copied().unwrap();
    let all_l40s: Vec<u32> = (1147..=1155).collect();
    assert_eq!(lib.list(creatable, l40s), Ok(all_l40s.clone()));

    // The production host code through the simulated kernel, as the plugin will prepare.
    let sim = sim();
    let root = sim.host_root().unwrap().to_path_buf();
    let host = VgpuHost::new(&root, Arc::new(SimKernel::new(&root)));
    let parent = sim.inventory().unwrap().gpus[2].pci_bus_id.clone();
    // A backend that read the node in full before the vGPU existed: a kubelet call's
    // inventory after it (supported types kept, creatable ones asked again) sees it.
    let backend = NvmlBackend::open_with(Some(&library())).unwrap();
    backend.inventory().unwrap();
    let vf = host
        .vf_for(&parent, L40S_12Q, &TypeNames::default())
        .unwrap();
    host.create_vdev(&vf.address, L40S_12Q).unwrap();
    // Heterogeneous: the other Q types that fit beside 12 GiB (48 GiB in all), not the B
    // types (exclusive type), not 48Q (no room).
    let with_12q = lib.list(creatable, l40s).unwrap();
    assert_eq!(with_12q, [1149, 1150, 1151, 1152, 1153, 1154]);
    let nvml = backend.request_inventory().unwrap();
    assert_eq!(nvml, sim.inventory().unwrap());
    assert_eq!(nvml.gpus[2].vgpu.as_ref().unwrap().creatable, with_12q);
    assert_eq!(backend.inventory().unwrap(), nvml);

    host.delete_vdev(&vf.address).unwrap();
    assert_eq!(lib.list(creatable, l40s), Ok(all_l40s));
}
