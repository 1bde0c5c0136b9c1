//! vGPU on the host: the supported and creatable vGPU types of a GPU, each type's name,
//! framebuffer, instance count, homogeneity capabilities and GPU-instance profile, and the
//! GPU's heterogeneous mode, host vGPU mode and vGPU capabilities, all answered from the
//! simulated node's `GpuInfo::vgpu`.
//!
//! As nvml.h has it:
//! - A GPU without vGPU (`vgpu: None`: no vGPU manager) answers `NVML_ERROR_NOT_SUPPORTED`
//!   to every device call here; so does a MIG device handle.
//! - The type lists follow the vGPU count protocol: `*vgpuCount` is the caller's room; with
//!   too little (`0` to ask), `NVML_ERROR_INSUFFICIENT_SIZE` and the count needed, the buffer
//!   untouched (it may be null then); no types at all is `NVML_SUCCESS` with a count of 0.
//! - Type calls take no device: a type ID is looked up among the types every GPU of the node
//!   lists (IDs are unique per model, and the simulator's models share none). An ID no GPU
//!   lists is `NVML_ERROR_INVALID_ARGUMENT`, as is a null out-pointer or an unknown
//!   capability; `nvmlVgpuTypeGetMaxInstances` also refuses a type its device does not list.
//! - `nvmlDeviceGetVgpuHeterogeneousMode` checks the struct's `version`
//!   (`nvmlVgpuHeterogeneousMode_v1`, else `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`) and answers
//!   `NVML_ERROR_NOT_SUPPORTED` while MIG is enabled, as the header says.

use std::ffi::{c_char, c_uint, c_ulonglong};

use gpu_dra::hardware::vgpu::{GpuVgpu, VgpuFramework, VgpuType, catalog};
use gpu_dra::hardware::{GpuInfo, NodeInventory};
use nvml_wrapper_sys::bindings as sys;
use sys::{nvmlDevice_t, nvmlReturn_t, nvmlVgpuTypeId_t};

use crate::ffi::{self, Ret, guard, put};
use crate::node;

/// `nvmlVgpuHeterogeneousMode_v1`: `NVML_STRUCT_VERSION(VgpuHeterogeneousMode, 1)`.
pub const HETEROGENEOUS_MODE_V1: u32 =
    ffi::struct_version::<sys::nvmlVgpuHeterogeneousMode_v1_t>(1);

/// The vGPU side of physical GPU `gpu`: `NVML_ERROR_NOT_SUPPORTED` without one.
fn vgpu_of(gpu: &GpuInfo) -> Result<&GpuVgpu, Ret> {
    gpu.vgpu.as_ref().ok_or(ffi::NOT_SUPPORTED)
}

/// The type with ID `id` on the node and a GPU that lists it; `NVML_ERROR_INVALID_ARGUMENT`
/// for an ID no GPU lists.
pub fn type_on_node(inv: &NodeInventory, id: u32) -> Result<(&GpuInfo, &VgpuType), Ret> {
    inv.gpus
        .iter()
        .find_map(|g| Some((g, g.vgpu.as_ref()?.type_by_id(id)?)))
        .ok_or(ffi::INVALID_ARGUMENT)
}

/// `nvmlVgpuTypeGetGpuInstanceProfileId`: `INVALID_GPU_INSTANCE_PROFILE_ID` for a
/// time-sliced type; for a MIG-backed one the ID (`info.id`, what instance creation takes) of
/// its GPU-instance profile on `gpu`. A MIG-backed type whose profile the GPU lacks is an
/// inconsistent simulator table: `NVML_ERROR_UNKNOWN`.
pub fn gpu_instance_profile_id(gpu: &GpuInfo, t: &VgpuType) -> Result<u32, Ret> {
    let Some(profile) = &t.mig_profile else {
        return Ok(sys::INVALID_GPU_INSTANCE_PROFILE_ID);
    };
    gpu.mig_profiles
        .iter()
        .find(|p| &p.name == profile)
        .map(|p| p.id)
        .ok_or(ffi::UNKNOWN)
}

/// `nvmlVgpuTypeGetCapabilities`: the homogeneity caps from the type; the other known caps
/// (NVLink P2P, GPUDirect, multi-vGPU exclusive) are not simulated and read 0.
pub fn type_capability(t: &VgpuType, capability: sys::nvmlVgpuCapability_t) -> Result<u32, Ret> {
    match capability {
        sys::nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_TYPE => Ok(t.exclusive_type.into()),
        sys::nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_SIZE => Ok(t.exclusive_size.into()),
        c if c < sys::nvmlVgpuCapability_enum_NVML_VGPU_CAP_COUNT => Ok(0),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceGetVgpuCapabilities`: whether the GPU can run time-sliced types of different
/// types / sizes side by side: its model's capability in the simulator's catalog, and always
/// when the node runs it in heterogeneous mode (the mode needs the capability). Other known
/// caps read 0 (not simulated); an unknown one is `NVML_ERROR_INVALID_ARGUMENT`.
pub fn device_capability(
    gpu: &GpuInfo,
    v: &GpuVgpu,
    capability: sys::nvmlDeviceVgpuCapability_t,
) -> Result<u32, Ret> {
    match capability {
        sys::nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_PROFILES
        | sys::nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_SIZES => {
            let capable = catalog::for_product(&gpu.product_name)
                .is_some_and(|m| m.heterogeneous_capable);
            Ok((v.heterogeneous || capable).into())
        }
        c if c < sys::nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_COUNT => Ok(0),
        _ => Err(ffi::INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceGetVgpuHeterogeneousMode`'s `mode`: `NVML_FEATURE_ENABLED` or `_DISABLED`;
/// `NVML_ERROR_NOT_SUPPORTED` while MIG is enabled.
pub fn heterogeneous_mode(gpu: &GpuInfo, v: &GpuVgpu) -> Result<u32, Ret> {
    if gpu.mig.current {
        return Err(ffi::NOT_SUPPORTED);
    }
    Ok(if v.heterogeneous {
        sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED
    } else {
        sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED
    })
}

/// `nvmlDeviceGetHostVgpuMode`: SR-IOV for vdev, non-SR-IOV for mdev.
pub fn host_mode(v: &GpuVgpu) -> sys::nvmlHostVgpuMode_t {
    match v.framework {
        VgpuFramework::Vdev => sys::nvmlHostVgpuMode_enum_NVML_HOST_VGPU_MODE_SRIOV,
        VgpuFramework::Mdev => sys::nvmlHostVgpuMode_enum_NVML_HOST_VGPU_MODE_NON_SRIOV,
    }
}

/// Writes `ids` by the vGPU count protocol (module docs).
///
/// # Safety
/// `count` is null or valid for a read and a write; `buf` is null or valid for `*count`
/// writes.
unsafe fn put_type_ids(
    count: *mut c_uint,
    buf: *mut nvmlVgpuTypeId_t,
    ids: &[u32],
) -> Result<(), Ret> {
    if count.is_null() {
        return Err(ffi::INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid for a read (caller's contract).
    let room = unsafe { count.read_unaligned() } as usize;
    if room < ids.len() {
        // SAFETY: valid for a write (caller's contract).
        unsafe { count.write_unaligned(ids.len() as c_uint) };
        return Err(ffi::INSUFFICIENT_SIZE);
    }
    if !ids.is_empty() && buf.is_null() {
        return Err(ffi::INVALID_ARGUMENT);
    }
    for (i, id) in ids.iter().enumerate() {
        // SAFETY: `i < ids.len() <= room`, the caller's buffer length.
        unsafe { buf.add(i).write_unaligned(*id) };
    }
    // SAFETY: valid for a write (caller's contract).
    unsafe { count.write_unaligned(ids.len() as c_uint) };
    Ok(())
}

/// Runs `body` on the physical GPU of `device` and its vGPU side.
fn with_vgpu<T>(
    device: nvmlDevice_t,
    body: impl FnOnce(&GpuInfo, &GpuVgpu) -> Result<T, Ret>,
) -> Result<T, Ret> {
    let view = node::view()?;
    let gpu = view.full_gpu(device)?;
    body(gpu, vgpu_of(gpu)?)
}

/// Runs `body` on the type `id` and a GPU of the node that lists it.
fn with_type<T>(
    id: nvmlVgpuTypeId_t,
    body: impl FnOnce(&GpuInfo, &VgpuType) -> Result<T, Ret>,
) -> Result<T, Ret> {
    let view = node::view()?;
    let (gpu, t) = type_on_node(&view.inv, id)?;
    body(gpu, t)
}

/// `nvmlDeviceGetSupportedVgpus`: every type the GPU supports, in the simulator's order.
///
/// # Safety
/// `vgpuCount` is null or valid for a read and a write; `vgpuTypeIds` is null or valid for
/// `*vgpuCount` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedVgpus(
    device: nvmlDevice_t,
    vgpuCount: *mut c_uint,
    vgpuTypeIds: *mut nvmlVgpuTypeId_t,
) -> nvmlReturn_t {
    guard(|| {
        let ids = with_vgpu(device, |_, v| {
            Ok(v.supported.iter().map(|t| t.id).collect::<Vec<_>>())
        })?;
        // SAFETY: the caller's contract above.
        unsafe { put_type_ids(vgpuCount, vgpuTypeIds, &ids) }
    })
}

/// `nvmlDeviceGetCreatableVgpus`: the types one more vGPU could be created of now.
///
/// # Safety
/// As [`nvmlDeviceGetSupportedVgpus`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCreatableVgpus(
    device: nvmlDevice_t,
    vgpuCount: *mut c_uint,
    vgpuTypeIds: *mut nvmlVgpuTypeId_t,
) -> nvmlReturn_t {
    guard(|| {
        let ids = with_vgpu(device, |_, v| Ok(v.creatable.clone()))?;
        // SAFETY: the caller's contract above.
        unsafe { put_type_ids(vgpuCount, vgpuTypeIds, &ids) }
    })
}

/// `nvmlVgpuTypeGetName`: `NVIDIA H100-4C`. `*size` is the buffer's length; when the name and
/// its NUL do not fit, `NVML_ERROR_INSUFFICIENT_SIZE` with the length needed in `*size`.
///
/// # Safety
/// `size` is null or valid for a read and a write; `vgpuTypeName` is null or valid for
/// `*size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetName(
    vgpuTypeId: nvmlVgpuTypeId_t,
    vgpuTypeName: *mut c_char,
    size: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if vgpuTypeName.is_null() || size.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let name = with_type(vgpuTypeId, |_, t| Ok(t.name.clone()))?;
        // SAFETY: non-null and valid for a read (caller's contract).
        let room = unsafe { size.read_unaligned() };
        let need = name.len() as c_uint + 1;
        if room < need {
            // SAFETY: valid for a write (caller's contract).
            unsafe { size.write_unaligned(need) };
            return Err(ffi::INSUFFICIENT_SIZE);
        }
        // SAFETY: the buffer holds `room` >= `need` bytes (caller's contract).
        unsafe { ffi::put_str(vgpuTypeName, room, &name) }
    })
}

/// `nvmlVgpuTypeGetFramebufferSize`: one vGPU's framebuffer, in bytes.
///
/// # Safety
/// `fbSize` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetFramebufferSize(
    vgpuTypeId: nvmlVgpuTypeId_t,
    fbSize: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        if fbSize.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let bytes = with_type(vgpuTypeId, |_, t| Ok(t.framebuffer_mib * 1024 * 1024))?;
        // SAFETY: non-null and valid for one write (caller's contract).
        unsafe { put(fbSize, bytes) }
    })
}

/// `nvmlVgpuTypeGetMaxInstances`: how many vGPUs of the type `device` holds at most;
/// `NVML_ERROR_INVALID_ARGUMENT` for a type the device does not list.
///
/// # Safety
/// `vgpuInstanceCount` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetMaxInstances(
    device: nvmlDevice_t,
    vgpuTypeId: nvmlVgpuTypeId_t,
    vgpuInstanceCount: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if vgpuInstanceCount.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let max = with_vgpu(device, |_, v| {
            v.type_by_id(vgpuTypeId)
                .map(|t| t.max_instances)
                .ok_or(ffi::INVALID_ARGUMENT)
        })?;
        // SAFETY: non-null and valid for one write (caller's contract).
        unsafe { put(vgpuInstanceCount, max) }
    })
}

/// `nvmlVgpuTypeGetCapabilities`: `NVML_VGPU_CAP_EXCLUSIVE_TYPE` (3) and `_EXCLUSIVE_SIZE`
/// (4) as 0/1.
///
/// # Safety
/// `capResult` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetCapabilities(
    vgpuTypeId: nvmlVgpuTypeId_t,
    capability: sys::nvmlVgpuCapability_t,
    capResult: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if capResult.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let value = with_type(vgpuTypeId, |_, t| type_capability(t, capability))?;
        // SAFETY: non-null and valid for one write (caller's contract).
        unsafe { put(capResult, value) }
    })
}

/// `nvmlVgpuTypeGetGpuInstanceProfileId`: `INVALID_GPU_INSTANCE_PROFILE_ID` (0xFFFFFFFF) for
/// a time-sliced type, the GPU-instance profile's ID for a MIG-backed one.
///
/// # Safety
/// `gpuInstanceProfileId` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlVgpuTypeGetGpuInstanceProfileId(
    vgpuTypeId: nvmlVgpuTypeId_t,
    gpuInstanceProfileId: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if gpuInstanceProfileId.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let id = with_type(vgpuTypeId, gpu_instance_profile_id)?;
        // SAFETY: non-null and valid for one write (caller's contract).
        unsafe { put(gpuInstanceProfileId, id) }
    })
}

/// `nvmlDeviceGetVgpuHeterogeneousMode`: checks `version`, writes `mode`.
///
/// # Safety
/// `pHeterogeneousMode` is null or valid for a read and a write of
/// `nvmlVgpuHeterogeneousMode_v1_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuHeterogeneousMode(
    device: nvmlDevice_t,
    pHeterogeneousMode: *mut sys::nvmlVgpuHeterogeneousMode_t,
) -> nvmlReturn_t {
    guard(|| {
        if pHeterogeneousMode.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the struct starts with its `version` word (caller's contract).
        let version = unsafe { std::ptr::addr_of!((*pHeterogeneousMode).version).read_unaligned() };
        if version != HETEROGENEOUS_MODE_V1 {
            return Err(ffi::VERSION_MISMATCH);
        }
        let mode = with_vgpu(device, heterogeneous_mode)?;
        // SAFETY: non-null and valid for a write of the v1 struct (caller's contract).
        unsafe { std::ptr::addr_of_mut!((*pHeterogeneousMode).mode).write_unaligned(mode) };
        Ok(())
    })
}

/// `nvmlDeviceGetHostVgpuMode`: `NVML_HOST_VGPU_MODE_SRIOV` (1) for vdev,
/// `_NON_SRIOV` (0) for mdev.
///
/// # Safety
/// `pHostVgpuMode` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHostVgpuMode(
    device: nvmlDevice_t,
    pHostVgpuMode: *mut sys::nvmlHostVgpuMode_t,
) -> nvmlReturn_t {
    guard(|| {
        if pHostVgpuMode.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let mode = with_vgpu(device, |_, v| Ok(host_mode(v)))?;
        // SAFETY: non-null and valid for one write (caller's contract).
        unsafe { put(pHostVgpuMode, mode) }
    })
}

/// `nvmlDeviceGetVgpuCapabilities`: `NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_PROFILES`
/// (1) and `_SIZES` (2) as 0/1.
///
/// # Safety
/// `capResult` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVgpuCapabilities(
    device: nvmlDevice_t,
    capability: sys::nvmlDeviceVgpuCapability_t,
    capResult: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if capResult.is_null() {
            return Err(ffi::INVALID_ARGUMENT);
        }
        let value = with_vgpu(device, |g, v| device_capability(g, v, capability))?;
        // SAFETY: non-null and valid for one write (caller's contract).
        unsafe { put(capResult, value) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_dra::hardware::GpuBackend;
    use gpu_dra::hardware::sim::SimBackend;

    /// A DGX H100 whose GPU 0 offers the catalog's H100 types (GPU 1 has no vGPU manager).
    fn node() -> NodeInventory {
        let mut inv = SimBackend::open("dgx-h100", None)
            .unwrap()
            .inventory()
            .unwrap();
        let model = catalog::for_product(&inv.gpus[0].product_name).unwrap();
        inv.gpus[0].vgpu = Some(GpuVgpu {
            framework: model.framework,
            heterogeneous: false,
            creatable: vec![1056, 1058],
            supported: model.types,
        });
        inv.gpus[1].vgpu = None;
        inv
    }

    #[test]
    fn a_type_is_found_on_the_gpu_that_lists_it_and_an_unlisted_id_is_an_invalid_argument() {
        let inv = node();
        let (gpu, t) = type_on_node(&inv, 1058).unwrap();
        assert_eq!((gpu.index, t.name.as_str()), (0, "NVIDIA H100-10C"));
        assert_eq!(
            type_on_node(&inv, 1147).unwrap_err(),
            ffi::INVALID_ARGUMENT,
            "an L40S type on an H100 node"
        );
    }

    #[test]
    fn mig_backed_types_name_their_gpu_instance_profile_by_id_and_time_sliced_ones_the_invalid_id()
    {
        let inv = node();
        let gpu = &inv.gpus[0];
        let id = |type_id| {
            gpu_instance_profile_id(gpu, gpu.vgpu.as_ref().unwrap().type_by_id(type_id).unwrap())
        };
        assert_eq!(id(1056), Ok(0xFFFF_FFFF));
        for (type_id, profile) in [(1062, "1g.10gb"), (1065, "3g.40gb"), (1068, "1g.10gb+me")] {
            assert_eq!(
                id(type_id),
                Ok(gpu.profile_by_name(profile).unwrap().id),
                "{profile}"
            );
        }
        let mut without_mig = gpu.clone();
        without_mig.mig_profiles.clear();
        let t = gpu.vgpu.as_ref().unwrap().type_by_id(1062).unwrap();
        assert_eq!(gpu_instance_profile_id(&without_mig, t), Err(ffi::UNKNOWN));
    }

    #[test]
    fn capabilities_answer_the_homogeneity_caps_and_refuse_unknown_ones() {
        let inv = node();
        let gpu = &inv.gpus[0];
        let v = gpu.vgpu.as_ref().unwrap();
        let mut t = v.supported[0].clone();
        t.exclusive_size = true;
        assert_eq!(
            type_capability(
                &t,
                sys::nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_TYPE
            ),
            Ok(0)
        );
        assert_eq!(
            type_capability(
                &t,
                sys::nvmlVgpuCapability_enum_NVML_VGPU_CAP_EXCLUSIVE_SIZE
            ),
            Ok(1)
        );
        assert_eq!(
            type_capability(&t, sys::nvmlVgpuCapability_enum_NVML_VGPU_CAP_GPUDIRECT),
            Ok(0)
        );
        assert_eq!(type_capability(&t, 5), Err(ffi::INVALID_ARGUMENT));
        let profiles =
            sys::nvmlDeviceVgpuCapability_enum_NVML_DEVICE_VGPU_CAP_HETEROGENEOUS_TIMESLICE_PROFILES;
        assert_eq!(
            device_capability(gpu, v, profiles),
            Ok(0),
            "H100 is not heterogeneous-capable in the catalog"
        );
        let mut on = v.clone();
        on.heterogeneous = true;
        assert_eq!(device_capability(gpu, &on, profiles), Ok(1));
        assert_eq!(device_capability(gpu, v, 12), Err(ffi::INVALID_ARGUMENT));
    }

    #[test]
    fn heterogeneous_mode_is_not_supported_while_mig_is_enabled() {
        let inv = node();
        let mut gpu = inv.gpus[0].clone();
        let mut v = gpu.vgpu.clone().unwrap();
        v.heterogeneous = true;
        gpu.mig.current = false;
        assert_eq!(
            heterogeneous_mode(&gpu, &v),
            Ok(sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED)
        );
        gpu.mig.current = true;
        assert_eq!(heterogeneous_mode(&gpu, &v), Err(ffi::NOT_SUPPORTED));
        assert_eq!(
            host_mode(&v),
            sys::nvmlHostVgpuMode_enum_NVML_HOST_VGPU_MODE_SRIOV
        );
        assert!(vgpu_of(&inv.gpus[1]).is_err_and(|e| e == ffi::NOT_SUPPORTED));
    }

    #[test]
    fn type_lists_follow_the_vgpu_count_protocol() {
        let ids = [7, 8, 9];
        let mut count: c_uint = 0;
        // SAFETY (test): a null buffer with room 0 is the documented count query.
        assert_eq!(
            unsafe { put_type_ids(&mut count, std::ptr::null_mut(), &ids) },
            Err(ffi::INSUFFICIENT_SIZE)
        );
        assert_eq!(count, 3);
        let mut buf = [0u32; 4];
        count = 2;
        // SAFETY (test): `buf` holds 4 >= 2 elements.
        assert_eq!(
            unsafe { put_type_ids(&mut count, buf.as_mut_ptr(), &ids) },
            Err(ffi::INSUFFICIENT_SIZE)
        );
        assert_eq!(
            (count, buf),
            (3, [0; 4]),
            "a short buffer is left untouched"
        );
        count = 4;
        // SAFETY (test): `buf` holds 4 elements.
        assert_eq!(
            unsafe { put_type_ids(&mut count, buf.as_mut_ptr(), &ids) },
            Ok(())
        );
        assert_eq!((count, buf), (3, [7, 8, 9, 0]));
        // SAFETY (test): null pointers are refused before any access.
        unsafe {
            assert_eq!(
                put_type_ids(std::ptr::null_mut(), buf.as_mut_ptr(), &ids),
                Err(ffi::INVALID_ARGUMENT)
            );
            assert_eq!(
                put_type_ids(&mut count, std::ptr::null_mut(), &ids),
                Err(ffi::INVALID_ARGUMENT)
            );
        }
        count = 0;
        // SAFETY (test): nothing to write.
        assert_eq!(
            unsafe { put_type_ids(&mut count, std::ptr::null_mut(), &[]) },
            Ok(())
        );
        assert_eq!(count, 0);
    }
}
