//! Multi-node NVLink fabric: `nvmlDeviceGetGpuFabricInfo` and `nvmlDeviceGetGpuFabricInfoV`,
//! answered from the node file's per-GPU `fabric:` (cluster UUID, clique, state).
//!
//! A GPU without `fabric:` answers `NVML_ERROR_NOT_SUPPORTED`, as a PCIe GPU does; so does a
//! MIG device handle. The versioned call accepts `nvmlGpuFabricInfo_v2` (what NCCL and
//! NVIDIA's DRA driver pass) and `_v3` (the header's current `nvmlGpuFabricInfoV_t`) and fills
//! only the fields of the version asked for; any other version word is
//! `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`.

use gpu_dra::hardware::fabric::{FabricInfo, FabricState};
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t};

use crate::ffi::{self, Ret, guard, put};
use crate::node;

/// `healthMask` of a healthy fabric: no degraded bandwidth, no route recovery, no unhealthy
/// route, no access-timeout recovery (each `*_FALSE`), and a correct configuration.
const HEALTHY_MASK: u32 = (sys::NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
    << sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)
    | (sys::NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE
        << sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY)
    | (sys::NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
        << sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY)
    | (sys::NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE
        << sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY)
    | (sys::NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE
        << sys::NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION);

/// The 16 bytes of a `xxxxxxxx-xxxx-…` UUID (the node file validated its form).
fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: Vec<u8> = uuid
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .map(|b| (b as char).to_digit(16).unwrap_or(0) as u8)
        .collect();
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte =
            hex.get(2 * i).copied().unwrap_or(0) << 4 | hex.get(2 * i + 1).copied().unwrap_or(0);
    }
    out
}

/// The fabric of `device`'s GPU, or NOT_SUPPORTED (no fabric, or a MIG handle).
fn fabric_of(device: nvmlDevice_t) -> Result<FabricInfo, Ret> {
    let view = node::view()?;
    let gpu = view.device(device)?.full()?;
    gpu.fabric.clone().ok_or(ffi::NOT_SUPPORTED)
}

/// The raw `state` byte and `status` of a fabric.
fn state_and_status(f: &FabricInfo) -> (sys::nvmlGpuFabricState_t, Ret) {
    (f.state.raw(), ffi::SUCCESS)
}

/// `healthSummary` (v3) of a fabric: healthy once registered, not supported before.
fn health_summary(f: &FabricInfo) -> u8 {
    if f.state == FabricState::Completed {
        sys::NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY as u8
    } else {
        sys::NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED as u8
    }
}

/// `nvmlDeviceGetGpuFabricInfo`: the unversioned struct.
///
/// # Safety
/// `gpuFabricInfo` is null or valid for one write of `nvmlGpuFabricInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    gpuFabricInfo: *mut sys::nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        if gpuFabricInfo.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let f = fabric_of(device)?;
        let (state, status) = state_and_status(&f);
        let info = sys::nvmlGpuFabricInfo_t {
            clusterUuid: uuid_bytes(&f.cluster_uuid),
            status,
            cliqueId: f.clique_id,
            state,
        };
        // SAFETY: non-null and valid for one write (caller's contract).
        unsafe { put(gpuFabricInfo, info) }
    })
}

/// `nvmlDeviceGetGpuFabricInfoV`: checks `version` (`nvmlGpuFabricInfo_v2` or `_v3`) and
/// writes that version's fields only.
///
/// # Safety
/// `gpuFabricInfo` is null or valid for reading and writing the struct of the version its
/// `version` field names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    gpuFabricInfo: *mut sys::nvmlGpuFabricInfoV_t,
) -> nvmlReturn_t {
    guard(|| {
        if gpuFabricInfo.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; every version of the struct starts with the `version` word.
        let version = unsafe { std::ptr::addr_of!((*gpuFabricInfo).version).read_unaligned() };
        let v2 = ffi::struct_version::<sys::nvmlGpuFabricInfo_v2_t>(2);
        let v3 = ffi::struct_version::<sys::nvmlGpuFabricInfo_v3_t>(3);
        if version != v2 && version != v3 {
            return Err(ffi::VERSION_MISMATCH);
        }
        let f = fabric_of(device)?;
        let (state, status) = state_and_status(&f);
        let info = sys::nvmlGpuFabricInfo_v2_t {
            version,
            clusterUuid: uuid_bytes(&f.cluster_uuid),
            status,
            cliqueId: f.clique_id,
            state,
            healthMask: HEALTHY_MASK,
        };
        if version == v2 {
            // SAFETY: the caller declared a v2 struct, valid for one write of it.
            return unsafe { put(gpuFabricInfo.cast::<sys::nvmlGpuFabricInfo_v2_t>(), info) };
        }
        let info = sys::nvmlGpuFabricInfo_v3_t {
            version,
            clusterUuid: info.clusterUuid,
            status,
            cliqueId: info.cliqueId,
            state,
            healthMask: info.healthMask,
            healthSummary: health_summary(&f),
        };
        // SAFETY: the caller declared a v3 struct, valid for one write of it.
        unsafe { put(gpuFabricInfo, info) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_uuid_becomes_its_sixteen_bytes_in_order() {
        let bytes = uuid_bytes("6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f");
        assert_eq!(
            bytes,
            [
                0x6d, 0x9c, 0x2f, 0x5e, 0x3b, 0x1a, 0x4e, 0x7d, 0x8c, 0x0f, 0x2a, 0x4b, 0x6c, 0x8d,
                0x0e, 0x1f
            ]
        );
    }
}
