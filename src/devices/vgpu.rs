//! vGPU devices (`--vgpu-types`; docs/device-model.md, "vGPU"), pure.
//!
//! A GPU that offers vGPU types publishes one device per type and instance slot,
//! `vgpu-<gpu index>-<slug>-<slot>` (slot 0 to the type's instance limit less one), with
//! NVIDIA's draft attributes, consuming its type's framebuffer from the GPU's counter set
//! (the dynamic-MIG set, or a `gpu-<minor>-counter-set` of its own), which gains a
//! `framebuffer` counter: what one type's instances take together at most. The full GPU and
//! the VFIO device consume that set whole, so none of them is allocated beside a vGPU of the
//! same GPU.
//!
//! Counters cannot keep two types apart that may not share a GPU, nor vGPUs apart from MIG
//! devices (docs/device-model.md says why). So without compatibility groups a GPU offers only
//! types that may all run together (checked at start, [`super::vgpu_config::check`]) and no
//! MIG devices. With them (Kubernetes 1.37, KEP-5963) every consumption of such a GPU's set
//! carries groups ([`groups`], `assign_groups`): co-allocation on one set needs a group
//! common to every device on it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{DeviceKind, ModelOptions, PublishedDevice, counters, mib_quantity, vgpu_config};
use crate::hardware::GpuInfo;
use crate::hardware::vgpu::{GpuVgpu, VgpuType};

/// The group of MIG devices on a GPU that offers vGPU types.
pub const GROUP_MIG: &str = "mig";
/// The group of the full GPU.
pub const GROUP_FULL_GPU: &str = "gpu-full";
/// The group of the VFIO device.
pub const GROUP_VFIO: &str = "vfio";
/// The group every vGPU type that may run beside other types shares (heterogeneous mode, not
/// exclusive).
pub const GROUP_MIXED: &str = "vgpu-mixed";

/// Domain of the standard, driver-independent attributes.
const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

/// `t`'s slug as a DNS label: `4c` for `NVIDIA H100-4C`.
fn label(t: &VgpuType) -> String {
    t.slug()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The device name of slot `slot` of type `t` on the GPU with NVML index `gpu_index`:
/// `vgpu-0-4c-12`.
pub fn device_name(gpu_index: u32, t: &VgpuType, slot: u32) -> String {
    format!("vgpu-{gpu_index}-{}-{slot}", label(t))
}

/// The compatibility groups of type `t` on a GPU in `heterogeneous` mode: its own
/// (`vgpu-<slug>`, shared by its instances only), and [`GROUP_MIXED`] when it may run beside
/// other types (heterogeneous mode, neither exclusive capability). Exclusive-size types
/// stay alone, although NVML would let them beside types of their own size: kept simple
/// until a model that has them shows the need.
pub fn groups(t: &VgpuType, heterogeneous: bool) -> Vec<String> {
    let mut out = vec![format!("vgpu-{}", label(t))];
    if heterogeneous && !t.exclusive_type && !t.exclusive_size && t.mig_profile.is_none() {
        out.push(GROUP_MIXED.to_string());
    }
    out
}

/// The framebuffer a GPU's time-sliced vGPUs share, MiB: the most any one type's instances
/// take together (80 GiB on an H100 80GB, whose NVML memory is 81559 MiB: 20 × `H100-4C`
/// must fit).
pub fn framebuffer_mib(vgpu: &GpuVgpu) -> u64 {
    vgpu.supported
        .iter()
        .filter(|t| t.mig_profile.is_none())
        .map(|t| t.framebuffer_mib * u64::from(t.max_instances))
        .max()
        .unwrap_or(0)
}

/// The types `gpu` offers under `options`; empty when vGPU is off for it. A list the flag's
/// rules refuse ([`vgpu_config::types_for`], and without compatibility groups two types that
/// may not share the GPU) offers nothing, with a warning: the plugin refuses such a value at
/// start, so this only happens to a GPU that changed since.
pub(super) fn offer<'g>(
    gpu: &'g GpuInfo,
    options: &ModelOptions,
    warnings: &mut Vec<String>,
) -> Vec<&'g VgpuType> {
    let types = match vgpu_config::types_for(&options.vgpu_types, gpu) {
        Ok(types) => types,
        Err(e) => {
            warnings.push(format!("GPU {}: no vGPU devices: {e}", gpu.index));
            return Vec::new();
        }
    };
    let heterogeneous = gpu.vgpu.as_ref().is_some_and(|v| v.heterogeneous);
    if !options.compatibility_groups
        && let Some((a, b)) = vgpu_config::conflict(&types, heterogeneous)
    {
        warnings.push(format!(
            "GPU {} ({}): no vGPU devices: {} and {} cannot share a GPU ({}) and --compatibility-groups is off",
            gpu.index,
            gpu.product_name,
            a.short_name(),
            b.short_name(),
            vgpu_config::why_apart(a, b, heterogeneous)
        ));
        return Vec::new();
    }
    types
}

fn string(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

/// The vGPU devices of `gpu` for `types` (every slot of each, type by type), each consuming
/// its type's framebuffer from the GPU's counter set, with the type's [`groups`] when
/// `groups_on`.
pub(super) fn devices(gpu: &GpuInfo, types: &[&VgpuType], groups_on: bool) -> Vec<PublishedDevice> {
    let Some(vgpu) = &gpu.vgpu else {
        return Vec::new();
    };
    let parent_address = crate::hardware::passthrough::normalize_address(&gpu.pci_bus_id);
    let mut out = Vec::new();
    for t in types {
        let mut consumption = counters::framebuffer_consumption(gpu.minor, t.framebuffer_mib);
        if groups_on {
            consumption.compatibility_groups = Some(groups(t, vgpu.heterogeneous));
        }
        for slot in 0..t.max_instances {
            let attributes = BTreeMap::from([
                ("type".to_string(), string("vgpu")),
                ("profile".to_string(), string(t.short_name())),
                ("typeID".to_string(), int(i64::from(t.id))),
                ("vgpuFramework".to_string(), string(vgpu.framework.as_str())),
                ("uuid".to_string(), string(&gpu.uuid)),
                ("productName".to_string(), string(&gpu.product_name)),
                (
                    format!("{STANDARD_DOMAIN}/pcieRoot"),
                    string(&gpu.pcie_root),
                ),
                ("index".to_string(), int(i64::from(gpu.index))),
                ("slot".to_string(), int(i64::from(slot))),
            ]);
            let capacity = BTreeMap::from([(
                "framebuffer".to_string(),
                DeviceCapacity {
                    value: Quantity(mib_quantity(t.framebuffer_mib)),
                    request_policy: None,
                },
            )]);
            out.push(PublishedDevice {
                gpu_index: gpu.index,
                gpu_minor: gpu.minor,
                gpu_uuid: gpu.uuid.clone(),
                kind: DeviceKind::Vgpu {
                    type_id: t.id,
                    type_name: t.short_name().to_string(),
                    framework: vgpu.framework,
                    parent_address: parent_address.clone(),
                    slot,
                },
                device: Device {
                    name: device_name(gpu.index, t, slot),
                    attributes: Some(attributes),
                    capacity: Some(capacity),
                    consumes_counters: Some(vec![consumption.clone()]),
                    ..Default::default()
                },
            });
        }
    }
    out
}

/// Gives every consumption of the counter sets in `sets` (those of GPUs offering vGPU types)
/// its device kind's group: [`GROUP_FULL_GPU`], [`GROUP_VFIO`], [`GROUP_MIG`]. vGPU devices
/// already carry theirs ([`devices`]).
pub(super) fn assign_groups(devices: &mut [PublishedDevice], sets: &BTreeSet<String>) {
    for published in devices {
        let group = match published.kind {
            DeviceKind::Gpu => GROUP_FULL_GPU,
            DeviceKind::Vfio { .. } => GROUP_VFIO,
            DeviceKind::MigStatic { .. } | DeviceKind::MigDynamic { .. } => GROUP_MIG,
            DeviceKind::Vgpu { .. } => continue,
        };
        for consumption in published.device.consumes_counters.iter_mut().flatten() {
            if sets.contains(&consumption.counter_set) {
                consumption.compatibility_groups = Some(vec![group.to_string()]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, exclusive_type: bool, exclusive_size: bool) -> VgpuType {
        VgpuType {
            id: 1,
            name: format!("NVIDIA {name}"),
            framebuffer_mib: 4096,
            max_instances: 4,
            exclusive_type,
            exclusive_size,
            mig_profile: None,
        }
    }

    #[test]
    fn a_type_joins_the_mixed_group_only_where_it_may_run_beside_other_types() {
        let cases = [
            (
                "L40S-12Q",
                false,
                false,
                true,
                vec!["vgpu-12q", "vgpu-mixed"],
            ),
            ("L40S-12Q", false, false, false, vec!["vgpu-12q"]),
            ("L40S-1B", true, false, true, vec!["vgpu-1b"]),
            ("L40S-8Q", false, true, true, vec!["vgpu-8q"]),
            ("H100-1-10C", false, false, false, vec!["vgpu-1-10c"]),
        ];
        for (name, exclusive_type, exclusive_size, heterogeneous, want) in cases {
            let got = groups(&t(name, exclusive_type, exclusive_size), heterogeneous);
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn device_names_carry_the_gpu_index_the_slug_and_the_slot() {
        assert_eq!(
            device_name(0, &t("H100-4C", false, false), 12),
            "vgpu-0-4c-12"
        );
        assert_eq!(
            device_name(3, &t("H100-1-10CME", false, false), 0),
            "vgpu-3-1-10cme-0"
        );
    }
}
