//! MIG through NVML's raw calls: profiles and placements, existing MIG devices and empty GPU
//! instances, and creating and destroying a MIG device at an exact placement. nvml-wrapper
//! has no safe wrappers for these, so they go through `Nvml::lib()`; each `unsafe` block
//! states why it is sound.

use std::ffi::CStr;
use std::mem::MaybeUninit;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t,
};

use super::{NvmlBackend, check, convert, symbol, wrap};
use crate::hardware::{GpuInstanceRef, HardwareError, MigDevice, MigProfile, NvmlCode, Placement};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in nvml.h.
const GI_PROFILE_COUNT: u32 = 0x12;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_PROFILE_SHARED: u32 = 0;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const UUID_BUFFER: usize = 96;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
const CI_PROFILE_COUNT: u32 = 0x9;
/// `NVML_ERROR_NOT_SUPPORTED` as returned by raw calls.
const RAW_NOT_SUPPORTED: u32 = 3;

/// `nvmlGpuInstanceGetInfo` of `gi`, a GPU instance handle NVML just returned.
fn gpu_instance_ref(
    gi_info: unsafe extern "C" fn(
        nvmlGpuInstance_t,
        *mut nvmlGpuInstanceInfo_t,
    ) -> nvml_wrapper_sys::bindings::nvmlReturn_t,
    gi: nvmlGpuInstance_t,
    index: u32,
) -> Result<GpuInstanceRef, HardwareError> {
    let mut info = MaybeUninit::<nvmlGpuInstanceInfo_t>::zeroed();
    // SAFETY: `gi` was just returned by NVML and is live; `info` is writable and sized for
    // the struct.
    check(
        unsafe { gi_info(gi, info.as_mut_ptr()) },
        "nvmlGpuInstanceGetInfo",
        index,
    )?;
    // SAFETY: success above means NVML initialised the struct (it was zeroed before).
    let info = unsafe { info.assume_init() };
    Ok(GpuInstanceRef {
        gi_id: info.id,
        profile_id: info.profileId,
        placement: Placement {
            start: info.placement.start,
            size: info.placement.size,
        },
    })
}

impl NvmlBackend {
    /// Every GPU instance of the GPU, with its handle: one `nvmlDeviceGetGpuInstances` per
    /// profile and one `nvmlGpuInstanceGetInfo` per instance.
    pub(super) fn gpu_instances(
        &self,
        handle: nvmlDevice_t,
        index: u32,
        profiles: &[MigProfile],
    ) -> Result<Vec<(nvmlGpuInstance_t, GpuInstanceRef)>, HardwareError> {
        let lib = self.nvml.lib();
        let get_gis = symbol(&lib.nvmlDeviceGetGpuInstances, "nvmlDeviceGetGpuInstances")?;
        let gi_info = symbol(&lib.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
        let mut out = Vec::new();
        for profile in profiles {
            let mut gis: Vec<nvmlGpuInstance_t> =
                vec![std::ptr::null_mut(); profile.max_instances.max(1) as usize];
            let mut count = gis.len() as u32;
            // SAFETY: live device handle; `gis` holds `count` entries NVML may fill.
            let ret = unsafe { get_gis(handle, profile.id, gis.as_mut_ptr(), &mut count) };
            check(ret, "nvmlDeviceGetGpuInstances", index)?;
            for &gi in gis.iter().take(count as usize) {
                out.push((gi, gpu_instance_ref(gi_info, gi, index)?));
            }
        }
        Ok(out)
    }

    /// The GPU instances of `gis` without any compute instance (left by an interrupted
    /// creation or cleanup), which recovery destroys. One that holds one of `devices` (the
    /// GPU's MIG devices, each a compute instance) is not asked for its compute instances.
    pub(super) fn empty_gpu_instances(
        &self,
        index: u32,
        gis: &[(nvmlGpuInstance_t, GpuInstanceRef)],
        devices: &[MigDevice],
    ) -> Result<Vec<GpuInstanceRef>, HardwareError> {
        let lib = self.nvml.lib();
        let ci_profile = symbol(
            &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        )?;
        let get_cis = symbol(
            &lib.nvmlGpuInstanceGetComputeInstances,
            "nvmlGpuInstanceGetComputeInstances",
        )?;
        let mut out = Vec::new();
        for (gi, found) in gis {
            if devices.iter().any(|d| d.gi_id == found.gi_id) {
                continue; // it holds a MIG device, so a compute instance
            }
            let mut cis_total = 0u32;
            for ci_index in 0..CI_PROFILE_COUNT {
                let mut cip = MaybeUninit::<nvmlComputeInstanceProfileInfo_t>::zeroed();
                // SAFETY: live GI handle; `cip` is writable and sized for the struct.
                let ret = unsafe {
                    ci_profile(*gi, ci_index, CI_ENGINE_PROFILE_SHARED, cip.as_mut_ptr())
                };
                if ret != 0 {
                    continue; // the GI has no CI profile of that size
                }
                // SAFETY: success above means NVML initialised the struct.
                let cip = unsafe { cip.assume_init() };
                let mut cis: Vec<nvmlComputeInstance_t> =
                    vec![std::ptr::null_mut(); cip.instanceCount.max(1) as usize];
                let mut n = cis.len() as u32;
                // SAFETY: live GI handle; `cis` holds `n` entries NVML may fill.
                let ret = unsafe { get_cis(*gi, cip.id, cis.as_mut_ptr(), &mut n) };
                check(ret, "nvmlGpuInstanceGetComputeInstances", index)?;
                cis_total += n;
            }
            if cis_total == 0 {
                out.push(*found);
            }
        }
        out.sort_by_key(|g| g.gi_id);
        Ok(out)
    }

    /// Every GPU-instance profile with its placements (raw `_v2` placement query).
    pub(super) fn profiles(
        &self,
        handle: nvmlDevice_t,
        index: u32,
        total_mib: u64,
    ) -> Result<Vec<MigProfile>, HardwareError> {
        let lib = self.nvml.lib();
        let get_info = symbol(
            &lib.nvmlDeviceGetGpuInstanceProfileInfo,
            "nvmlDeviceGetGpuInstanceProfileInfo",
        )?;
        let get_placements = symbol(
            &lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2,
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        )?;
        let mut profiles = Vec::new();
        for profile_index in 0..GI_PROFILE_COUNT {
            let mut info = MaybeUninit::<nvmlGpuInstanceProfileInfo_t>::zeroed();
            // SAFETY: `handle` is a live device handle; `info` points to writable memory of the
            // struct's size, which NVML fills on success.
            let ret = unsafe { get_info(handle, profile_index, info.as_mut_ptr()) };
            if ret == RAW_NOT_SUPPORTED || ret == 2 {
                continue; // the GPU lacks this profile
            }
            check(ret, "nvmlDeviceGetGpuInstanceProfileInfo", index)?;
            // SAFETY: NVML returned success, so the struct is initialised (and it was zeroed).
            let info = unsafe { info.assume_init() };
            let mut count: u32 = 0;
            // SAFETY: a null buffer with a count pointer asks NVML for the number of placements.
            let ret = unsafe { get_placements(handle, info.id, std::ptr::null_mut(), &mut count) };
            if ret != 0 && ret != 7 {
                check(
                    ret,
                    "nvmlDeviceGetGpuInstancePossiblePlacements_v2 (count)",
                    index,
                )?;
            }
            let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
            // SAFETY: `buf` holds `count` elements and NVML writes at most `count` of them,
            // updating `count` to the number written.
            let ret = unsafe { get_placements(handle, info.id, buf.as_mut_ptr(), &mut count) };
            check(ret, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", index)?;
            buf.truncate(count as usize);
            let memory_slices = buf.first().map(|p| p.size).unwrap_or(0);
            profiles.push(MigProfile {
                name: convert::profile_name(
                    profile_index,
                    info.sliceCount,
                    info.memorySizeMB,
                    total_mib,
                ),
                index: profile_index,
                id: info.id,
                memory_mib: info.memorySizeMB,
                multiprocessors: info.multiprocessorCount,
                copy_engines: info.copyEngineCount,
                decoders: info.decoderCount,
                encoders: info.encoderCount,
                jpeg_engines: info.jpegCount,
                ofa_engines: info.ofaCount,
                max_instances: info.instanceCount,
                compute_slices: info.sliceCount,
                memory_slices,
                placement_starts: buf.iter().map(|p| p.start).collect(),
            });
        }
        // The order `nvidia-smi mig -lgip` lists them in (and the simulator's tables keep):
        // by memory, then compute slices, then profile index.
        profiles.sort_by_key(|p| (p.memory_mib, p.compute_slices, p.index));
        Ok(profiles)
    }

    /// MIG devices that exist, with their GI/CI ids and placements. A device's GPU instance
    /// is taken from `gis` (the GPU's instances, [`NvmlBackend::gpu_instances`], read just
    /// before) or, when not there, asked for by id.
    pub(super) fn mig_devices(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        handle: nvmlDevice_t,
        index: u32,
        profiles: &[MigProfile],
        gis: &[(nvmlGpuInstance_t, GpuInstanceRef)],
    ) -> Result<Vec<MigDevice>, HardwareError> {
        let lib = self.nvml.lib();
        let gi_id_of = symbol(
            &lib.nvmlDeviceGetGpuInstanceId,
            "nvmlDeviceGetGpuInstanceId",
        )?;
        let ci_id_of = symbol(
            &lib.nvmlDeviceGetComputeInstanceId,
            "nvmlDeviceGetComputeInstanceId",
        )?;
        let gi_by_id = symbol(
            &lib.nvmlDeviceGetGpuInstanceById,
            "nvmlDeviceGetGpuInstanceById",
        )?;
        let gi_info = symbol(&lib.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
        let max = dev
            .mig_device_count()
            .map_err(wrap("nvmlDeviceGetMaxMigDeviceCount", index))?;
        let mut out = Vec::new();
        for i in 0..max {
            let mig = match dev.mig_device_by_index(i) {
                Ok(m) => m,
                Err(NvmlError::NotFound) | Err(NvmlError::InvalidArg) => continue,
                Err(e) => return Err(wrap("nvmlDeviceGetMigDeviceHandleByIndex", index)(e)),
            };
            // SAFETY: the MIG handle is live while `mig` is; passed only to NVML below.
            let mig_handle = unsafe { mig.handle() };
            let (mut gi_id, mut ci_id) = (0u32, 0u32);
            // SAFETY: live MIG handle and valid out-pointers to u32.
            check(
                unsafe { gi_id_of(mig_handle, &mut gi_id) },
                "nvmlDeviceGetGpuInstanceId",
                index,
            )?;
            // SAFETY: as above.
            check(
                unsafe { ci_id_of(mig_handle, &mut ci_id) },
                "nvmlDeviceGetComputeInstanceId",
                index,
            )?;
            let found = match gis.iter().find(|(_, g)| g.gi_id == gi_id) {
                Some((_, found)) => *found,
                None => {
                    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
                    // SAFETY: parent handle is live; `gi` receives an NVML-owned handle.
                    check(
                        unsafe { gi_by_id(handle, gi_id, &mut gi) },
                        "nvmlDeviceGetGpuInstanceById",
                        index,
                    )?;
                    gpu_instance_ref(gi_info, gi, index)?
                }
            };
            let profile = profiles.iter().find(|p| p.id == found.profile_id);
            out.push(MigDevice {
                uuid: mig
                    .uuid()
                    .map_err(wrap("nvmlDeviceGetUUID (MIG device)", index))?,
                profile_id: found.profile_id,
                profile_name: profile.map(|p| p.name.clone()).unwrap_or_default(),
                gi_id,
                ci_id,
                placement: found.placement,
            });
        }
        out.sort_by_key(|d| (d.placement.start, d.gi_id));
        Ok(out)
    }

    /// Creates the GPU instance at the placement and its default compute instance; nothing
    /// is left behind on failure.
    pub(super) fn create_mig(
        &self,
        index: u32,
        profile_id: u32,
        placement_start: u32,
    ) -> Result<MigDevice, HardwareError> {
        // Only the profile table is read: it cannot change while the GPU stays in MIG mode.
        let info = self.gpu_facts(index)?;
        let profile = info.profile_by_id(profile_id).cloned().ok_or_else(|| {
            HardwareError::NoSuchProfile {
                index,
                profile_id,
                valid: info
                    .mig_profiles
                    .iter()
                    .map(|p| format!("{} ({})", p.id, p.name))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })?;
        let op = format!(
            "nvmlDeviceCreateGpuInstanceWithPlacement ({} at {}:{})",
            profile.name, placement_start, profile.memory_slices
        );
        let dev = self.device(index)?;
        let lib = self.nvml.lib();
        let create_gi = symbol(
            &lib.nvmlDeviceCreateGpuInstanceWithPlacement,
            "nvmlDeviceCreateGpuInstanceWithPlacement",
        )?;
        let gi_info = symbol(&lib.nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
        let ci_profile = symbol(
            &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        )?;
        let create_ci = symbol(
            &lib.nvmlGpuInstanceCreateComputeInstance,
            "nvmlGpuInstanceCreateComputeInstance",
        )?;
        let ci_info = symbol(
            &lib.nvmlComputeInstanceGetInfo_v2,
            "nvmlComputeInstanceGetInfo_v2",
        )?;
        let destroy_gi = symbol(&lib.nvmlGpuInstanceDestroy, "nvmlGpuInstanceDestroy")?;
        let get_uuid = symbol(&lib.nvmlDeviceGetUUID, "nvmlDeviceGetUUID")?;

        let placement = nvmlGpuInstancePlacement_t {
            start: placement_start,
            size: profile.memory_slices,
        };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: the device handle is live for this call (`dev` outlives it); `placement` is a
        // valid struct read by NVML; `gi` receives an NVML-owned handle.
        check(
            unsafe { create_gi(dev.handle(), profile_id, &placement, &mut gi) },
            &op,
            index,
        )?;
        crate::crashpoint::hit("prepare-gpu-instance-created");
        let destroy_on_err = |e: HardwareError| {
            // SAFETY: `gi` is the instance created above and not yet destroyed.
            let _ = unsafe { destroy_gi(gi) };
            e
        };
        let created = gpu_instance_ref(gi_info, gi, index).map_err(destroy_on_err)?;
        let ci_index =
            convert::default_ci_profile_index(profile.compute_slices).ok_or_else(|| {
                destroy_on_err(HardwareError::Nvml {
                    operation: format!(
                        "pick compute instance profile for {} compute slices",
                        profile.compute_slices
                    ),
                    index,
                    code: NvmlCode::NotSupported,
                })
            })?;
        let mut cip = MaybeUninit::<nvmlComputeInstanceProfileInfo_t>::zeroed();
        // SAFETY: `gi` is live; `cip` is writable memory of the struct's size.
        check(
            unsafe { ci_profile(gi, ci_index, CI_ENGINE_PROFILE_SHARED, cip.as_mut_ptr()) },
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            index,
        )
        .map_err(destroy_on_err)?;
        // SAFETY: success above means NVML initialised the struct.
        let cip = unsafe { cip.assume_init() };
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is live; `ci` receives an NVML-owned handle.
        check(
            unsafe { create_ci(gi, cip.id, &mut ci) },
            "nvmlGpuInstanceCreateComputeInstance",
            index,
        )
        .map_err(destroy_on_err)?;
        let mut ci_out = MaybeUninit::<nvmlComputeInstanceInfo_t>::zeroed();
        // SAFETY: `ci` is live; `ci_out` is writable memory of the struct's size.
        check(
            unsafe { ci_info(ci, ci_out.as_mut_ptr()) },
            "nvmlComputeInstanceGetInfo_v2",
            index,
        )?;
        // SAFETY: success above means NVML initialised the struct.
        let ci_out = unsafe { ci_out.assume_init() };
        let mut buf = [0 as std::ffi::c_char; UUID_BUFFER];
        // SAFETY: `ci_out.device` is the MIG device handle NVML returned for the new compute
        // instance (as NVIDIA's driver relies on); `buf` holds UUID_BUFFER bytes.
        check(
            unsafe { get_uuid(ci_out.device, buf.as_mut_ptr(), UUID_BUFFER as u32) },
            "nvmlDeviceGetUUID (MIG device)",
            index,
        )?;
        // SAFETY: NVML wrote a NUL-terminated string into `buf` on success.
        let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(MigDevice {
            uuid,
            profile_id,
            profile_name: profile.name.clone(),
            gi_id: created.gi_id,
            ci_id: ci_out.id,
            placement: created.placement,
        })
    }

    /// Destroys the compute instance (if still there) and then the GPU instance.
    pub(super) fn destroy_mig(
        &self,
        index: u32,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), HardwareError> {
        let dev = self.device(index)?;
        let lib = self.nvml.lib();
        let gi_by_id = symbol(
            &lib.nvmlDeviceGetGpuInstanceById,
            "nvmlDeviceGetGpuInstanceById",
        )?;
        let ci_by_id = symbol(
            &lib.nvmlGpuInstanceGetComputeInstanceById,
            "nvmlGpuInstanceGetComputeInstanceById",
        )?;
        let destroy_ci = symbol(
            &lib.nvmlComputeInstanceDestroy,
            "nvmlComputeInstanceDestroy",
        )?;
        let destroy_gi = symbol(&lib.nvmlGpuInstanceDestroy, "nvmlGpuInstanceDestroy")?;
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: live device handle; `gi` receives an NVML-owned handle.
        check(
            unsafe { gi_by_id(dev.handle(), gi_id, &mut gi) },
            &format!("nvmlDeviceGetGpuInstanceById (GI {gi_id})"),
            index,
        )?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is live; `ci` receives an NVML-owned handle.
        let found = unsafe { ci_by_id(gi, ci_id, &mut ci) };
        if found == 0 {
            // SAFETY: `ci` was returned by NVML just above and is destroyed once.
            check(
                unsafe { destroy_ci(ci) },
                &format!("nvmlComputeInstanceDestroy (CI {ci_id} of GI {gi_id})"),
                index,
            )?;
        }
        // A CI already gone (a partial earlier cleanup) is fine; the GI still goes.
        // SAFETY: `gi` is live and destroyed once.
        check(
            unsafe { destroy_gi(gi) },
            &format!("nvmlGpuInstanceDestroy (GI {gi_id})"),
            index,
        )
    }
}
