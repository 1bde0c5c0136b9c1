//! NVIDIA vGPU on the host: the vGPU types a GPU supports (NVML), the rules that say which
//! types can run side by side on one GPU, and the vGPUs that exist now (sysfs).
//!
//! Two host frameworks exist ([`VgpuFramework`]):
//! - **vdev** (SR-IOV, Ada/Hopper/Blackwell, vGPU 17+): the GPU's SR-IOV virtual functions
//!   (enabled with `sriov-manage -e`) each hold at most one vGPU; a vGPU is created by writing
//!   its type ID to `<VF>/nvidia/current_vgpu_type` and deleted by writing `0`. The VF stays on
//!   the `nvidia` driver, which provides its VFIO device (`/dev/vfio/<group>`).
//! - **mdev** (Turing/Volta, older Ampere drivers): mediated devices under
//!   `<parent>/mdev_supported_types/nvidia-<id>/`, created by writing a UUID to `create` and
//!   removed by writing `1` to `/sys/bus/mdev/devices/<uuid>/remove`.
//!
//! What a GPU supports comes from NVML (`nvmlDeviceGetSupportedVgpus`, the type queries, the
//! homogeneity capabilities, `nvmlDeviceGetVgpuHeterogeneousMode`, `nvmlDeviceGetHostVgpuMode`)
//! into [`GpuVgpu`] on [`crate::hardware::GpuInfo::vgpu`]; what exists now comes from sysfs
//! into [`VgpuHostFacts`] on [`crate::hardware::NodeInventory::vgpu_host`]. The pure rules
//! ([`creatable`], [`may_share_gpu`]) are shared by the simulator (which must refuse what the
//! hardware refuses) and the device model (which must never offer what the hardware refuses).
//!
//! Facts and their sources: `shared/reference/vgpu-and-dra-next.md`.

pub mod backend;
pub mod catalog;
pub mod sysfs;

pub use backend::VgpuBackend;
pub use sysfs::{VgpuHost, VgpuHostError};

use serde::{Deserialize, Serialize};

/// How vGPUs are created on a GPU's host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VgpuFramework {
    /// Mediated devices (`mdev_supported_types`), pre-Ada GPUs.
    Mdev,
    /// SR-IOV "vendor-specific VFIO": one vGPU per virtual function (`current_vgpu_type`).
    Vdev,
}

impl VgpuFramework {
    /// The value of the `vgpuFramework` attribute: `mdev` or `vdev`.
    pub fn as_str(self) -> &'static str {
        match self {
            VgpuFramework::Mdev => "mdev",
            VgpuFramework::Vdev => "vdev",
        }
    }
}

/// One vGPU type as NVML describes it (`nvmlVgpuTypeGet*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VgpuType {
    /// The type ID (`nvmlVgpuTypeId_t`, the `nvidia-<id>` of mdev, what `current_vgpu_type`
    /// takes). Unique per GPU model only.
    pub id: u32,
    /// The name NVML and sysfs print, `NVIDIA H100-4C`.
    pub name: String,
    /// Framebuffer of one vGPU of this type, MiB (`nvmlVgpuTypeGetFramebufferSize`).
    pub framebuffer_mib: u64,
    /// How many vGPUs of this type one GPU holds at most (`nvmlVgpuTypeGetMaxInstances`).
    pub max_instances: u32,
    /// `NVML_VGPU_CAP_EXCLUSIVE_TYPE`: no other type may run on the GPU beside this one.
    #[serde(default)]
    pub exclusive_type: bool,
    /// `NVML_VGPU_CAP_EXCLUSIVE_SIZE`: no other framebuffer size may run beside this one.
    #[serde(default)]
    pub exclusive_size: bool,
    /// For a MIG-backed type (`H100-1-10C`), the GPU-instance profile it runs on
    /// (`1g.10gb`); `None` for a time-sliced type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
}

impl VgpuType {
    /// The name without the `NVIDIA ` prefix: `H100-4C` (what `--vgpu-types` and the
    /// `profile` attribute use).
    pub fn short_name(&self) -> &str {
        short_name(&self.name)
    }

    /// The last `-` token, lower-cased: `4c` for `NVIDIA H100-4C` (NVIDIA's device names use it).
    pub fn slug(&self) -> String {
        slug(&self.name)
    }
}

/// `NVIDIA H100-4C` → `H100-4C`; a name without the prefix is returned as it is.
pub fn short_name(name: &str) -> &str {
    name.strip_prefix("NVIDIA ").unwrap_or(name).trim()
}

/// `NVIDIA H100-4C` → `4c`; `NVIDIA H100-1-10C` → `1-10c` (MIG-backed names keep the GI
/// slices, so two types never share a slug on one GPU).
pub fn slug(name: &str) -> String {
    let short = short_name(name);
    let rest = short.split_once('-').map_or(short, |(_, rest)| rest);
    rest.to_ascii_lowercase()
}

/// What NVML reports about one GPU's vGPU support.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuVgpu {
    /// How vGPUs are created on this GPU (`nvmlDeviceGetHostVgpuMode`: `SRIOV` → vdev).
    pub framework: VgpuFramework,
    /// `nvmlDeviceGetVgpuHeterogeneousMode`: types of different sizes may share the GPU.
    pub heterogeneous: bool,
    /// Every type the GPU supports (`nvmlDeviceGetSupportedVgpus`), in NVML's order.
    pub supported: Vec<VgpuType>,
    /// Type IDs that could be created now (`nvmlDeviceGetCreatableVgpus`).
    pub creatable: Vec<u32>,
}

impl GpuVgpu {
    /// The supported type with ID `id`.
    pub fn type_by_id(&self, id: u32) -> Option<&VgpuType> {
        self.supported.iter().find(|t| t.id == id)
    }

    /// The supported type named `name`, with or without the `NVIDIA ` prefix, case-insensitively.
    pub fn type_by_name(&self, name: &str) -> Option<&VgpuType> {
        let want = short_name(name);
        self.supported
            .iter()
            .find(|t| t.short_name().eq_ignore_ascii_case(want))
    }
}

/// One vGPU that exists now on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VgpuInstance {
    /// Its type ID.
    pub type_id: u32,
    /// vdev: the virtual function holding it (`0000:18:00.4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf_address: Option<String>,
    /// mdev: the mediated device's UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mdev_uuid: Option<String>,
    /// The IOMMU group a VM gets it through (`/dev/vfio/<group>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<String>,
}

/// One SR-IOV virtual function of a GPU, as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualFunction {
    /// PCI address, `0000:18:00.4`.
    pub address: String,
    /// `virtfn<N>` of the parent: its number.
    pub number: u32,
    /// Its IOMMU group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<String>,
    /// `nvidia/current_vgpu_type`; 0 when it holds no vGPU.
    pub current_type: u32,
    /// `nvidia/creatable_vgpu_types`: what it could hold now.
    pub creatable: Vec<u32>,
}

/// One mdev type of a parent, as `mdev_supported_types/nvidia-<id>/` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MdevType {
    /// The type ID (`nvidia-<id>`).
    pub id: u32,
    /// `name`, `NVIDIA T4-4Q`.
    pub name: String,
    /// `available_instances` now.
    pub available: u32,
}

/// The vGPU side of one GPU physical function, read from sysfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuVgpuHost {
    /// The physical function's PCI address (normalised, `0000:18:00.0`).
    pub address: String,
    /// `sriov_totalvfs`; 0 on a GPU without SR-IOV.
    pub total_vfs: u32,
    /// Its virtual functions (`virtfnN`), by number; empty until `sriov-manage -e`.
    pub vfs: Vec<VirtualFunction>,
    /// mdev types (`mdev_supported_types`); empty on a vdev host.
    pub mdev_types: Vec<MdevType>,
    /// vGPUs that exist now.
    pub instances: Vec<VgpuInstance>,
}

/// What the host's sysfs says about vGPUs, per GPU physical function, in address order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VgpuHostFacts {
    /// One entry per NVIDIA GPU physical function.
    pub gpus: Vec<GpuVgpuHost>,
}

impl VgpuHostFacts {
    /// The GPU at `address` (normalised).
    pub fn gpu(&self, address: &str) -> Option<&GpuVgpuHost> {
        self.gpus.iter().find(|g| g.address == address)
    }
}

/// Whether `text` is a UUID as mdev takes it: `8-4-4-4-12` hex digits, either case.
pub fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether a vGPU of type `a` and one of type `b` may run on one GPU at the same time, by the
/// homogeneity rules NVML reports: the same type always may (up to its instance count); two
/// types only in heterogeneous mode, when neither is `exclusive_type`, and, when either is
/// `exclusive_size`, only with the same framebuffer. MIG-backed and time-sliced types never
/// mix (a GPU is in MIG mode or not).
pub fn may_share_gpu(a: &VgpuType, b: &VgpuType, heterogeneous: bool) -> bool {
    if a.id == b.id {
        return true;
    }
    if a.mig_profile.is_some() != b.mig_profile.is_some() {
        return false;
    }
    if a.mig_profile.is_some() {
        // MIG-backed vGPUs sit on their own GPU instances; the MIG placement rules decide.
        return true;
    }
    if !heterogeneous || a.exclusive_type || b.exclusive_type {
        return false;
    }
    if (a.exclusive_size || b.exclusive_size) && a.framebuffer_mib != b.framebuffer_mib {
        return false;
    }
    true
}

/// The type IDs of `supported` that one more vGPU could be created of, with `active` (type
/// IDs, one entry per vGPU that exists) on the GPU: those that may share the GPU with every
/// active type ([`may_share_gpu`]), have fewer than `max_instances` vGPUs already, and fit in
/// the framebuffer left (`total_framebuffer_mib` less what the active vGPUs hold). What
/// `nvmlDeviceGetCreatableVgpus` answers, and what a free VF's `creatable_vgpu_types` lists.
pub fn creatable(
    supported: &[VgpuType],
    heterogeneous: bool,
    active: &[u32],
    total_framebuffer_mib: u64,
) -> Vec<u32> {
    let active_types: Vec<&VgpuType> = active
        .iter()
        .filter_map(|id| supported.iter().find(|t| t.id == *id))
        .collect();
    let used: u64 = active_types.iter().map(|t| t.framebuffer_mib).sum();
    supported
        .iter()
        .filter(|t| t.mig_profile.is_none())
        .filter(|t| {
            active_types
                .iter()
                .all(|a| may_share_gpu(a, t, heterogeneous))
        })
        .filter(|t| {
            let count = active.iter().filter(|id| **id == t.id).count();
            (count as u64) < u64::from(t.max_instances)
        })
        .filter(|t| used + t.framebuffer_mib <= total_framebuffer_mib)
        .map(|t| t.id)
        .collect()
}

/// Parses `creatable_vgpu_types` of a VF. Real drivers print a header (`ID    : vGPU Name`)
/// and one `<id>  : <name>` line per type; NVIDIA's draft driver assumes `<name> <id>`, so
/// both orders are read. Blank lines and the header are skipped; a line with no number is
/// ignored (a driver that adds a column must not make the VF look empty).
pub fn parse_creatable(text: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some((left, right)) = line.split_once(':') {
            let (left, right) = (left.trim(), right.trim());
            if let Ok(id) = left.parse::<u32>() {
                out.push((id, right.to_string()));
            } else if let Ok(id) = right.parse::<u32>() {
                out.push((id, left.to_string()));
            }
            continue;
        }
        // `<name> <id>`: the number is the last whitespace-separated token.
        if let Some((name, id)) = line.rsplit_once(char::is_whitespace)
            && let Ok(id) = id.trim().parse::<u32>()
        {
            out.push((id, name.trim().to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u32, name: &str, fb: u64, max: u32) -> VgpuType {
        VgpuType {
            id,
            name: name.into(),
            framebuffer_mib: fb,
            max_instances: max,
            exclusive_type: false,
            exclusive_size: false,
            mig_profile: None,
        }
    }

    #[test]
    fn names_and_slugs_follow_nvidias_device_names() {
        assert_eq!(short_name("NVIDIA H100-4C"), "H100-4C");
        assert_eq!(slug("NVIDIA H100-4C"), "4c");
        assert_eq!(slug("NVIDIA L40S-12Q"), "12q");
        assert_eq!(slug("NVIDIA H100-1-10C"), "1-10c");
    }

    #[test]
    fn creatable_vgpu_types_is_read_in_both_orders() {
        let real = "ID    : vGPU Name\n1153  : NVIDIA L40S-12Q\n1154  : NVIDIA L40S-24Q\n";
        assert_eq!(
            parse_creatable(real),
            vec![
                (1153, "NVIDIA L40S-12Q".to_string()),
                (1154, "NVIDIA L40S-24Q".to_string())
            ]
        );
        let draft = "NVIDIA L40S-12Q 1153\n";
        assert_eq!(
            parse_creatable(draft),
            vec![(1153, "NVIDIA L40S-12Q".to_string())]
        );
        assert!(parse_creatable("ID    : vGPU Name\n").is_empty());
    }

    #[test]
    fn a_homogeneous_gpu_creates_only_the_type_it_runs() {
        let types = [
            t(1, "NVIDIA H100-4C", 4096, 20),
            t(2, "NVIDIA H100-10C", 10240, 8),
        ];
        assert_eq!(creatable(&types, false, &[], 81920), vec![1, 2]);
        assert_eq!(creatable(&types, false, &[1, 1], 81920), vec![1]);
        assert_eq!(creatable(&types, false, &[2; 8], 81920), Vec::<u32>::new());
    }

    #[test]
    fn a_heterogeneous_gpu_mixes_sizes_within_its_framebuffer() {
        let mut types = [
            t(1, "NVIDIA L40S-12Q", 12288, 4),
            t(2, "NVIDIA L40S-24Q", 24576, 2),
        ];
        assert_eq!(creatable(&types, true, &[2], 49152), vec![1, 2]);
        assert_eq!(creatable(&types, true, &[2, 1], 49152), vec![1]);
        assert_eq!(creatable(&types, true, &[2, 2], 49152), Vec::<u32>::new());
        types[1].exclusive_type = true;
        assert_eq!(creatable(&types, true, &[2], 49152), vec![2]);
    }
}
