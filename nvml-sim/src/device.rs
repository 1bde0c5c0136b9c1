//! Device identity: name, brand, UUID, serial, minor number, index, PCI info, NUMA node,
//! memory, architecture, compute capability, attributes and core count.

use std::ffi::{c_char, c_int, c_uint};

use gpu_dra::hardware::nvml::convert;
use gpu_dra::hardware::{Architecture, GpuInfo, catalog};
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put, put_str};
use crate::node::{self, Dev};

const MIB: u64 = 1024 * 1024;

/// The serial number the simulated board reports: 13 digits derived from the GPU UUID.
pub fn serial_of(uuid: &str) -> String {
    let hex: String = uuid.chars().filter(char::is_ascii_hexdigit).collect();
    let tail = &hex[hex.len().saturating_sub(12)..];
    let n = u64::from_str_radix(tail, 16).unwrap_or(0) % 1_000_000_000_000;
    format!("1{n:012}")
}

/// The NVML brand enum of a brand name as the catalog spells it.
fn brand_code(brand: &str) -> sys::nvmlBrandType_t {
    match brand {
        "Nvidia" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        "GeForce" => sys::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        "Tesla" => sys::nvmlBrandType_enum_NVML_BRAND_TESLA,
        "Quadro" => sys::nvmlBrandType_enum_NVML_BRAND_QUADRO,
        "Titan" => sys::nvmlBrandType_enum_NVML_BRAND_TITAN,
        "NvidiaRTX" => sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        _ => sys::nvmlBrandType_enum_NVML_BRAND_UNKNOWN,
    }
}

/// `NVML_DEVICE_ARCH_*` of an architecture.
pub fn arch_code(arch: Architecture) -> u32 {
    match arch {
        Architecture::Pascal => sys::NVML_DEVICE_ARCH_PASCAL,
        Architecture::Volta => sys::NVML_DEVICE_ARCH_VOLTA,
        Architecture::Turing => sys::NVML_DEVICE_ARCH_TURING,
        Architecture::Ampere => sys::NVML_DEVICE_ARCH_AMPERE,
        Architecture::AdaLovelace => sys::NVML_DEVICE_ARCH_ADA,
        Architecture::Hopper => sys::NVML_DEVICE_ARCH_HOPPER,
        Architecture::Blackwell => sys::NVML_DEVICE_ARCH_BLACKWELL,
    }
}

/// PCI device id (`0x20B010DE`) of the GPU's model, from the catalog.
fn pci_device_id(gpu: &GpuInfo) -> u32 {
    catalog::models()
        .ok()
        .and_then(|all| all.iter().find(|m| m.product_name == gpu.product_name))
        .and_then(|m| u32::from_str_radix(m.pci_device_id.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0)
}

/// Runs `body` on the resolved device of `device`.
fn with_device(
    device: nvmlDevice_t,
    body: impl FnOnce(&node::View, Dev<'_>) -> Result<(), Ret>,
) -> nvmlReturn_t {
    guard(|| {
        let view = node::view()?;
        let dev = view.device(device)?;
        body(&view, dev)
    })
}

/// `nvmlDeviceGetName`: the product name; MIG devices add ` MIG <profile>`.
///
/// # Safety
/// `name` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let text = match dev {
            Dev::Gpu(g) => g.product_name.clone(),
            Dev::Mig(g, m) => format!("{} MIG {}", g.product_name, m.profile_name),
        };
        // SAFETY: the caller's buffer holds `length` bytes (NVML's contract).
        unsafe { put_str(name, length, &text) }
    })
}

/// `nvmlDeviceGetBrand`.
///
/// # Safety
/// `type_` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    type_: *mut sys::nvmlBrandType_t,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(type_, brand_code(&dev.gpu().brand)) }
    })
}

/// `nvmlDeviceGetUUID`: `GPU-…` or, for a MIG device, `MIG-…`.
///
/// # Safety
/// `uuid` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let text = match dev {
            Dev::Gpu(g) => &g.uuid,
            Dev::Mig(_, m) => &m.uuid,
        };
        // SAFETY: the caller's buffer holds `length` bytes (NVML's contract).
        unsafe { put_str(uuid, length, text) }
    })
}

/// `nvmlDeviceGetSerial`.
///
/// # Safety
/// `serial` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let gpu = dev.full()?;
        // SAFETY: the caller's buffer holds `length` bytes (NVML's contract).
        unsafe { put_str(serial, length, &serial_of(&gpu.uuid)) }
    })
}

/// `nvmlDeviceGetMinorNumber`.
///
/// # Safety
/// `minorNumber` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let gpu = dev.full()?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(minorNumber, gpu.minor) }
    })
}

/// `nvmlDeviceGetModuleId`: the GPU's slot on an NVSwitch baseboard (the node file's
/// `nvswitch: true` gives 1–8); `NVML_ERROR_NOT_SUPPORTED` on other GPUs, as PCIe boards
/// answer.
///
/// # Safety
/// `moduleId` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetModuleId(
    device: nvmlDevice_t,
    moduleId: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let gpu = dev.full()?;
        if gpu.module_id == 0 {
            return Err(ffi::NOT_SUPPORTED);
        }
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(moduleId, gpu.module_id) }
    })
}

/// `nvmlDeviceGetIndex`: the enumeration index now.
///
/// # Safety
/// `index` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |view, dev| {
        let slot = dev.full()?.minor;
        let position = view
            .inv
            .gpus
            .iter()
            .position(|g| g.minor == slot)
            .ok_or(ffi::INVALID_ARGUMENT)?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(index, position as c_uint) }
    })
}

/// `nvmlDeviceGetPciInfo_v3`.
///
/// # Safety
/// `pci` is null or valid for one write of `nvmlPciInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let gpu = dev.full()?;
        let mut parts = gpu.pci_bus_id.split([':', '.']);
        let mut next = || {
            parts
                .next()
                .and_then(|p| u32::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        };
        let (domain, bus, dev_no) = (next(), next(), next());
        let mut info = sys::nvmlPciInfo_t {
            busIdLegacy: [0; 16],
            domain,
            bus,
            device: dev_no,
            pciDeviceId: pci_device_id(gpu),
            pciSubSystemId: 0,
            busId: [0; 32],
        };
        ffi::fill_array(&mut info.busIdLegacy, &gpu.pci_bus_id.to_ascii_uppercase());
        ffi::fill_array(
            &mut info.busId,
            &format!("0000{}", gpu.pci_bus_id.to_ascii_uppercase()),
        );
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(pci, info) }
    })
}

/// `nvmlDeviceGetNumaNodeId`.
///
/// # Safety
/// `node` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let numa = dev.full()?.numa_node.ok_or(ffi::NOT_SUPPORTED)?;
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(node, numa as c_uint) }
    })
}

fn memory_mib(dev: &Dev<'_>) -> u64 {
    match dev {
        Dev::Gpu(g) => g.memory_mib,
        Dev::Mig(g, m) => g.profile_by_id(m.profile_id).map_or(0, |p| p.memory_mib),
    }
}

/// Memory in use (bytes) by the simulator's load model: of the GPU, or of one MIG device.
fn memory_used(view: &crate::node::View, dev: &Dev<'_>) -> Result<u64, ffi::Ret> {
    let r = crate::telemetry::model_readings(view, dev.gpu())?;
    Ok(match dev {
        Dev::Gpu(_) => r.memory_used_mib,
        Dev::Mig(_, m) => r.mig.get(&m.gi_id).map_or(0, |(_, used)| *used),
    } * MIB)
}

/// `nvmlDeviceGetMemoryInfo`: in use as the simulator's load model says.
///
/// # Safety
/// `memory` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut sys::nvmlMemory_t,
) -> nvmlReturn_t {
    with_device(device, |view, dev| {
        let total = memory_mib(&dev) * MIB;
        let used = memory_used(view, &dev)?.min(total);
        let info = sys::nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(memory, info) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: checks `version` (`nvmlMemory_v2`).
///
/// # Safety
/// `memory` is null or valid for reading and writing one `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut sys::nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_device(device, |view, dev| {
        if memory.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for reads by the caller's contract.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read_unaligned() };
        if version != ffi::struct_version::<sys::nvmlMemory_v2_t>(2) {
            return Err(ffi::VERSION_MISMATCH);
        }
        let total = memory_mib(&dev) * MIB;
        let used = memory_used(view, &dev)?.min(total);
        let info = sys::nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: valid for one write (caller's contract).
        unsafe { put(memory, info) }
    })
}

/// `nvmlDeviceGetArchitecture`.
///
/// # Safety
/// `arch` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut sys::nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(arch, arch_code(dev.gpu().architecture)) }
    })
}

/// `nvmlDeviceGetCudaComputeCapability`.
///
/// # Safety
/// `major` and `minor` are null or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let (ma, mi) = dev.gpu().compute_capability;
        // SAFETY: null or valid for one write each (caller's contract).
        unsafe {
            put(major, ma as c_int)?;
            put(minor, mi as c_int)
        }
    })
}

/// `nvmlDeviceGetNumGpuCores`: SMs × cores per SM.
///
/// # Safety
/// `numCores` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    device: nvmlDevice_t,
    numCores: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let gpu = dev.full()?;
        let (major, minor) = gpu.compute_capability;
        let cores = gpu.multiprocessors * convert::cores_per_sm(major, minor);
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(numCores, cores) }
    })
}

/// `nvmlDeviceGetAttributes_v2`: like NVML, answered for MIG device handles only.
///
/// # Safety
/// `attributes` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut sys::nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    with_device(device, |_, dev| {
        let Dev::Mig(g, m) = dev else {
            return Err(ffi::NOT_SUPPORTED);
        };
        let p = g.profile_by_id(m.profile_id).ok_or(ffi::UNKNOWN)?;
        let info = sys::nvmlDeviceAttributes_t {
            multiprocessorCount: p.multiprocessors,
            sharedCopyEngineCount: p.copy_engines,
            sharedDecoderCount: p.decoders,
            sharedEncoderCount: p.encoders,
            sharedJpegCount: p.jpeg_engines,
            sharedOfaCount: p.ofa_engines,
            gpuInstanceSliceCount: p.compute_slices,
            computeInstanceSliceCount: p.compute_slices,
            memorySizeMB: p.memory_mib,
        };
        // SAFETY: null or valid for one write (caller's contract).
        unsafe { put(attributes, info) }
    })
}
