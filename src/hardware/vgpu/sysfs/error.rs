//! [`VgpuHostError`]: why a vGPU could not be read, created or deleted, and what to do.

use std::path::PathBuf;

use super::SRIOV_MANAGE;

/// Errors of the host's vGPU files; each names the GPU, VF, mdev or file at fault and, where
/// there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum VgpuHostError {
    /// A sysfs file or directory could not be read or listed.
    #[error("{step} {}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        step: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused a write (`EINVAL` for a type the VF cannot create, `EDQUOT` for an
    /// mdev type with no instance left, …).
    #[error("writing {value:?} to {}", path.display())]
    Write {
        /// The sysfs attribute.
        path: PathBuf,
        /// What was written.
        value: String,
        /// What the kernel answered.
        #[source]
        source: std::io::Error,
    },
    /// No NVIDIA GPU function at that address.
    #[error("no NVIDIA GPU at PCI address {address} under {}", root.display())]
    NoSuchGpu {
        /// The address looked for.
        address: String,
        /// The host root.
        root: PathBuf,
    },
    /// No SR-IOV virtual function of an NVIDIA GPU at that address.
    #[error(
        "no SR-IOV virtual function of an NVIDIA GPU at PCI address {address} under {} (a VF has a physfn link and nvidia/current_vgpu_type); list a GPU's VFs with ls -l /sys/bus/pci/devices/<GPU address>/virtfn*",
        root.display()
    )]
    NoSuchVf {
        /// The address looked for.
        address: String,
        /// The host root.
        root: PathBuf,
    },
    /// The GPU offers no vGPUs of the framework asked for.
    #[error("GPU {address} offers no {framework} vGPUs: {detail}")]
    NotCapable {
        /// The GPU.
        address: String,
        /// `vdev` or `mdev`.
        framework: &'static str,
        /// What is missing and what to do.
        detail: String,
    },
    /// The GPU supports SR-IOV vGPUs but its virtual functions are not enabled.
    #[error(
        "GPU {address} has its SR-IOV virtual functions disabled (sriov_numvfs is 0 of {total}), so no vGPU can be created on it; enable them with `{SRIOV_MANAGE} -e {address}` (needed again after every reboot)"
    )]
    VfsNotEnabled {
        /// The GPU.
        address: String,
        /// `sriov_totalvfs`.
        total: u32,
    },
    /// The type cannot be created on the GPU beside the vGPUs it runs (another type in use,
    /// its instance count reached, or no framebuffer left).
    #[error(
        "vGPU type {type_name} cannot be created on GPU {gpu} now: it runs {in_use}, and it can create only {creatable} beside that; delete vGPUs of this GPU first, or create {type_name} on another GPU"
    )]
    TypeNotCreatable {
        /// The GPU (physical function).
        gpu: String,
        /// The VF asked for, when one was.
        vf: Option<String>,
        /// The type ID.
        type_id: u32,
        /// Its name, or `type <id>` when no list names it.
        type_name: String,
        /// The vGPUs it runs, by type (`2 × H100-4C (0000:18:00.4, 0000:18:00.5)`).
        in_use: String,
        /// What it can create now, or `nothing`.
        creatable: String,
    },
    /// Every enabled VF holds a vGPU.
    #[error(
        "every SR-IOV virtual function of GPU {gpu} holds a vGPU ({in_use}); delete one, or create {type_name} on another GPU"
    )]
    NoFreeVf {
        /// The GPU.
        gpu: String,
        /// The type ID asked for.
        type_id: u32,
        /// Its name.
        type_name: String,
        /// The vGPUs it runs.
        in_use: String,
    },
    /// The VF holds another vGPU.
    #[error(
        "virtual function {vf} already holds vGPU type {current_name}; delete it first (write 0 to its nvidia/current_vgpu_type) or use a free VF"
    )]
    VfBusy {
        /// The VF.
        vf: String,
        /// The type it holds.
        current: u32,
        /// Its name.
        current_name: String,
        /// The type asked for.
        wanted: u32,
    },
    /// The VF does not read back what was written.
    #[error(
        "virtual function {vf}: after writing {wanted} to nvidia/current_vgpu_type it reads {found}"
    )]
    VdevDidNotTake {
        /// The VF.
        vf: String,
        /// The value written.
        wanted: u32,
        /// The value read back.
        found: u32,
    },
    /// The parent has no such mdev type.
    #[error("{parent} has no mdev type nvidia-{type_id}; its types: {valid}")]
    NoMdevType {
        /// The parent device.
        parent: String,
        /// The type asked for.
        type_id: u32,
        /// Its types, `nvidia-<id> (<name>)`, or `none`.
        valid: String,
    },
    /// Not a UUID.
    #[error(
        "{uuid:?} is not an mdev UUID; write it as xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex digits)"
    )]
    BadUuid {
        /// What was given.
        uuid: String,
    },
    /// An mdev with that UUID exists, but not of that type on that parent.
    #[error(
        "mdev {uuid} already exists on {found_parent} as type nvidia-{found_type}, not nvidia-{type_id} on {parent}; use a fresh UUID"
    )]
    UuidTaken {
        /// The UUID.
        uuid: String,
        /// The parent asked for.
        parent: String,
        /// The type asked for.
        type_id: u32,
        /// The parent it has.
        found_parent: String,
        /// The type it has.
        found_type: u32,
    },
    /// The kernel took the `create` write but no such mdev appeared.
    #[error(
        "after writing {uuid} to {parent}'s mdev_supported_types/nvidia-{type_id}/create, /sys/bus/mdev/devices/{uuid} is not an mdev of that type"
    )]
    MdevDidNotAppear {
        /// The UUID.
        uuid: String,
        /// The parent.
        parent: String,
        /// The type.
        type_id: u32,
    },
    /// The kernel took the `remove` write but the mdev is still there.
    #[error("after writing 1 to /sys/bus/mdev/devices/{uuid}/remove, the mdev still exists")]
    MdevNotRemoved {
        /// The UUID.
        uuid: String,
    },
    /// The mdev a `vgpu_params` write was for does not exist, or has no `nvidia/vgpu_params`
    /// (a vGPU manager without it).
    #[error(
        "mdev {uuid} has no nvidia/vgpu_params under /sys/bus/mdev/devices (the mdev is gone, or this vGPU manager does not take vGPU parameters); remove params from the claim's VgpuDeviceConfig"
    )]
    NoParamsFile {
        /// The UUID.
        uuid: String,
    },
    /// The kernel took the `vgpu_params` write but reads back something else.
    #[error("after writing {wanted:?} to mdev {uuid}'s nvidia/vgpu_params, it reads {found:?}")]
    ParamsDidNotTake {
        /// The UUID.
        uuid: String,
        /// What was written.
        wanted: String,
        /// What reads back.
        found: String,
    },
}
