//! Fabric membership through `nvmlDeviceGetGpuFabricInfoV`, which nvml-wrapper does not wrap:
//! the raw call with an `nvmlGpuFabricInfo_v2` struct (the version every driver with the
//! call accepts, and what NVIDIA's own DRA driver passes).

use std::mem::MaybeUninit;

use nvml_wrapper_sys::bindings::{
    NVML_GPU_FABRIC_UUID_LEN, nvmlDevice_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfoV_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH as RAW_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND as RAW_FUNCTION_NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as RAW_NOT_SUPPORTED,
};

use super::{NvmlBackend, check};
use crate::hardware::HardwareError;
use crate::hardware::fabric::{FabricInfo, FabricState};

/// `nvmlGpuFabricInfo_v2`: `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`.
const FABRIC_INFO_V2: u32 = (size_of::<nvmlGpuFabricInfo_v2_t>() as u32) | (2 << 24);

/// Formats a cluster UUID's 16 bytes as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn cluster_uuid(bytes: &[u8; NVML_GPU_FABRIC_UUID_LEN as usize]) -> String {
    crate::hardware::passthrough::hyphenated(bytes)
}

impl NvmlBackend {
    /// The GPU's fabric membership; `None` when the GPU is on no fabric or the driver cannot
    /// say (NOT_SUPPORTED, no such function, an older struct version, or a library without
    /// the symbol). Other NVML failures are errors naming the call.
    pub(super) fn fabric(
        &self,
        handle: nvmlDevice_t,
        index: u32,
    ) -> Result<Option<FabricInfo>, HardwareError> {
        let Ok(&call) = self.nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref() else {
            return Ok(None);
        };
        let mut info = MaybeUninit::<nvmlGpuFabricInfo_v2_t>::zeroed();
        // SAFETY: `info` is zeroed (a valid bit pattern for this plain C struct) and writable.
        unsafe { (*info.as_mut_ptr()).version = FABRIC_INFO_V2 };
        // SAFETY: live device handle; the struct is the v2 layout its `version` word declares,
        // so NVML writes within it (the bindings' V type is the longer v3, hence the cast).
        let ret = unsafe { call(handle, info.as_mut_ptr().cast::<nvmlGpuFabricInfoV_t>()) };
        if matches!(
            ret,
            RAW_NOT_SUPPORTED | RAW_FUNCTION_NOT_FOUND | RAW_VERSION_MISMATCH
        ) {
            return Ok(None);
        }
        check(ret, "nvmlDeviceGetGpuFabricInfoV", index)?;
        // SAFETY: NVML filled the struct on success; it was zero-initialised before.
        let info = unsafe { info.assume_init() };
        Ok(Some(FabricInfo {
            cluster_uuid: cluster_uuid(&info.clusterUuid),
            clique_id: info.cliqueId,
            state: FabricState::from_raw(info.state).unwrap_or_default(),
        }))
    }
}

impl NvmlBackend {
    /// The GPU's module ID (`nvmlDeviceGetModuleId`: its slot on an NVSwitch baseboard,
    /// Fabric Manager's `physicalId`); 0 when the GPU or driver cannot say (NOT_SUPPORTED,
    /// no such function, a library without the symbol). Other failures name the call.
    pub(super) fn module_id(&self, handle: nvmlDevice_t, index: u32) -> Result<u32, HardwareError> {
        let Ok(&call) = self.nvml.lib().nvmlDeviceGetModuleId.as_ref() else {
            return Ok(0);
        };
        let mut id: std::ffi::c_uint = 0;
        // SAFETY: live device handle; `id` is valid for one write.
        let ret = unsafe { call(handle, &mut id) };
        if matches!(ret, RAW_NOT_SUPPORTED | RAW_FUNCTION_NOT_FOUND) {
            return Ok(0);
        }
        check(ret, "nvmlDeviceGetModuleId", index)?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_uuid_bytes_print_as_a_lowercase_uuid() {
        let bytes = [
            0x6d, 0x9c, 0x2f, 0x5e, 0x3b, 0x1a, 0x4e, 0x7d, 0x8c, 0x0f, 0x2a, 0x4b, 0x6c, 0x8d,
            0x0e, 0x1f,
        ];
        assert_eq!(cluster_uuid(&bytes), "6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f");
    }

    #[test]
    fn the_v2_version_word_is_the_struct_size_with_version_two_on_top() {
        assert_eq!(size_of::<nvmlGpuFabricInfo_v2_t>(), 36);
        assert_eq!(FABRIC_INFO_V2, 0x0200_0024);
    }
}
