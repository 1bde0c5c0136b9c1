//! The pure decisions before a vGPU write: which VF a vdev vGPU goes to, whether an mdev
//! type can be created, and the refusal (with what the GPU runs) when neither can.

use std::collections::BTreeMap;

use super::VgpuHostError;
use crate::hardware::vgpu::{GpuVgpuHost, MdevType, VgpuType, VirtualFunction};

/// Names of vGPU types by ID, for messages: NVML's names where the caller has them, else
/// what sysfs prints (`creatable_vgpu_types`, mdev `name`). A type nothing names is
/// `type <id>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeNames(BTreeMap<u32, String>);

impl TypeNames {
    /// The short names (`H100-4C`) of `types`.
    pub fn from_types(types: &[VgpuType]) -> TypeNames {
        TypeNames(
            types
                .iter()
                .map(|t| (t.id, t.short_name().to_string()))
                .collect(),
        )
    }

    /// Adds `name` for `id` unless the type has one already.
    pub fn add(&mut self, id: u32, name: &str) {
        self.0
            .entry(id)
            .or_insert_with(|| crate::hardware::vgpu::short_name(name).to_string());
    }

    /// Takes every name of `other`, over the names this has.
    pub fn extend(&mut self, other: &TypeNames) {
        for (id, name) in &other.0 {
            self.0.insert(*id, name.clone());
        }
    }

    /// `H100-4C`, or `type 1056` when nothing names it.
    pub fn label(&self, id: u32) -> String {
        self.0
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("type {id}"))
    }
}

/// The VF a vGPU of `type_id` goes to: the lowest-numbered free VF (no vGPU) whose
/// creatable list holds the type. `None` when no VF qualifies.
pub fn pick_vf(gpu: &GpuVgpuHost, type_id: u32) -> Option<&VirtualFunction> {
    gpu.vfs
        .iter()
        .filter(|vf| vf.current_type == 0 && vf.creatable.contains(&type_id))
        .min_by_key(|vf| vf.number)
}

/// The vGPUs `gpu` runs, by type in ID order: `2 × H100-4C (0000:18:00.4, 0000:18:00.5)`,
/// joined by `, `; `no vGPU` when none.
pub fn describe_in_use(gpu: &GpuVgpuHost, names: &TypeNames) -> String {
    let mut by_type: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for instance in &gpu.instances {
        let at = instance
            .vf_address
            .as_deref()
            .or(instance.mdev_uuid.as_deref())
            .unwrap_or("?");
        by_type.entry(instance.type_id).or_default().push(at);
    }
    if by_type.is_empty() {
        return "no vGPU".into();
    }
    by_type
        .iter()
        .map(|(id, at)| format!("{} × {} ({})", at.len(), names.label(*id), at.join(", ")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The labels of `ids`, sorted and deduplicated, joined by `, `; `nothing` when empty.
pub(super) fn list_labels(ids: impl IntoIterator<Item = u32>, names: &TypeNames) -> String {
    let mut ids: Vec<u32> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return "nothing".into();
    }
    ids.iter()
        .map(|id| names.label(*id))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Decides where a vdev vGPU of `type_id` goes on `gpu`, or why it cannot, without touching
/// anything: the GPU has SR-IOV, its VFs are enabled, and a free VF can create the type
/// ([`pick_vf`]).
///
/// # Errors
/// The first of [`VgpuHostError::NotCapable`], [`VgpuHostError::VfsNotEnabled`],
/// [`VgpuHostError::NoFreeVf`], [`VgpuHostError::TypeNotCreatable`] that applies.
pub fn check_vdev<'a>(
    gpu: &'a GpuVgpuHost,
    type_id: u32,
    names: &TypeNames,
) -> Result<&'a VirtualFunction, VgpuHostError> {
    if gpu.total_vfs == 0 {
        return Err(VgpuHostError::NotCapable {
            address: gpu.address.clone(),
            framework: "vdev",
            detail: if gpu.mdev_types.is_empty() {
                "it has no SR-IOV virtual functions (no sriov_totalvfs); vdev vGPUs need an Ada, Hopper or Blackwell GPU with the NVIDIA vGPU manager installed".into()
            } else {
                "it has no SR-IOV virtual functions; its vGPUs are mdev devices (mdev_supported_types)".into()
            },
        });
    }
    if gpu.vfs.is_empty() {
        return Err(VgpuHostError::VfsNotEnabled {
            address: gpu.address.clone(),
            total: gpu.total_vfs,
        });
    }
    if let Some(vf) = pick_vf(gpu, type_id) {
        return Ok(vf);
    }
    let free: Vec<&VirtualFunction> = gpu.vfs.iter().filter(|v| v.current_type == 0).collect();
    if free.is_empty() {
        return Err(VgpuHostError::NoFreeVf {
            gpu: gpu.address.clone(),
            type_id,
            type_name: names.label(type_id),
            in_use: describe_in_use(gpu, names),
        });
    }
    Err(VgpuHostError::TypeNotCreatable {
        gpu: gpu.address.clone(),
        vf: None,
        type_id,
        type_name: names.label(type_id),
        in_use: describe_in_use(gpu, names),
        creatable: list_labels(free.iter().flat_map(|v| v.creatable.iter().copied()), names),
    })
}

/// Decides whether an mdev vGPU of `type_id` can be created on `gpu` now, without touching
/// anything: the GPU has the mdev type and an instance of it is available.
///
/// # Errors
/// [`VgpuHostError::NotCapable`] without mdev types, [`VgpuHostError::NoMdevType`],
/// [`VgpuHostError::TypeNotCreatable`] with no instance available.
pub fn check_mdev<'a>(
    gpu: &'a GpuVgpuHost,
    type_id: u32,
    names: &TypeNames,
) -> Result<&'a MdevType, VgpuHostError> {
    if gpu.mdev_types.is_empty() {
        return Err(VgpuHostError::NotCapable {
            address: gpu.address.clone(),
            framework: "mdev",
            detail: "it lists no mdev_supported_types; install the NVIDIA vGPU manager (its vdev GPUs create vGPUs on SR-IOV virtual functions instead)".into(),
        });
    }
    let Some(t) = gpu.mdev_types.iter().find(|t| t.id == type_id) else {
        return Err(VgpuHostError::NoMdevType {
            parent: gpu.address.clone(),
            type_id,
            valid: gpu
                .mdev_types
                .iter()
                .map(|t| {
                    format!(
                        "nvidia-{} ({})",
                        t.id,
                        crate::hardware::vgpu::short_name(&t.name)
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    if t.available == 0 {
        return Err(VgpuHostError::TypeNotCreatable {
            gpu: gpu.address.clone(),
            vf: None,
            type_id,
            type_name: names.label(type_id),
            in_use: describe_in_use(gpu, names),
            creatable: list_labels(
                gpu.mdev_types
                    .iter()
                    .filter(|t| t.available > 0)
                    .map(|t| t.id),
                names,
            ),
        });
    }
    Ok(t)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::hardware::vgpu::VgpuInstance;

    /// A VF of GPU `0000:18:00.0` as the simulator numbers them (also used by the sysfs tests).
    pub(in crate::hardware::vgpu::sysfs) fn vf(
        number: u32,
        current: u32,
        creatable: &[u32],
    ) -> VirtualFunction {
        VirtualFunction {
            address: format!("0000:18:00.{}", number + 4),
            number,
            iommu_group: Some(format!("{}", 9 + number)),
            current_type: current,
            creatable: creatable.to_vec(),
        }
    }

    fn gpu(total: u32, vfs: Vec<VirtualFunction>) -> GpuVgpuHost {
        let instances = vfs
            .iter()
            .filter(|v| v.current_type != 0)
            .map(|v| VgpuInstance {
                type_id: v.current_type,
                vf_address: Some(v.address.clone()),
                mdev_uuid: None,
                iommu_group: v.iommu_group.clone(),
            })
            .collect();
        GpuVgpuHost {
            address: "0000:18:00.0".into(),
            total_vfs: total,
            vfs,
            mdev_types: Vec::new(),
            instances,
        }
    }

    fn names() -> TypeNames {
        let mut names = TypeNames::default();
        names.add(1056, "NVIDIA H100-4C");
        names.add(1058, "NVIDIA H100-10C");
        names
    }

    #[test]
    fn the_lowest_numbered_free_vf_that_can_create_the_type_is_picked() {
        // (VFs as (current type, creatable list), type asked for, VF picked)
        type Row = (&'static [(u32, &'static [u32])], u32, Option<u32>);
        let table: &[Row] = &[
            (&[(0, &[1056, 1058]), (0, &[1056, 1058])], 1058, Some(0)),
            (&[(1056, &[]), (0, &[1056]), (0, &[1056])], 1056, Some(1)),
            (&[(1056, &[]), (0, &[1056])], 1058, None),
            (&[(1056, &[]), (1056, &[])], 1056, None),
            (&[], 1056, None),
        ];
        for (vfs, type_id, want) in table {
            let vfs = vfs
                .iter()
                .enumerate()
                .map(|(n, (cur, cr))| vf(n as u32, *cur, cr))
                .collect();
            let g = gpu(32, vfs);
            assert_eq!(
                pick_vf(&g, *type_id).map(|v| v.number),
                *want,
                "{type_id} on {:?}",
                g.vfs
            );
        }
    }

    #[test]
    fn vdev_refusals_name_the_cause_and_the_fix() {
        let no_sriov = check_vdev(&gpu(0, vec![]), 1056, &names()).unwrap_err();
        assert!(
            matches!(no_sriov, VgpuHostError::NotCapable { .. }),
            "{no_sriov}"
        );
        let disabled = check_vdev(&gpu(32, vec![]), 1056, &names()).unwrap_err();
        assert_eq!(
            disabled.to_string(),
            "GPU 0000:18:00.0 has its SR-IOV virtual functions disabled (sriov_numvfs is 0 of 32), so no vGPU can be created on it; enable them with `/usr/lib/nvidia/sriov-manage -e 0000:18:00.0` (needed again after every reboot)"
        );
        let mixed = gpu(32, vec![vf(0, 1056, &[]), vf(1, 0, &[1056])]);
        let other = check_vdev(&mixed, 1058, &names()).unwrap_err();
        assert_eq!(
            other.to_string(),
            "vGPU type H100-10C cannot be created on GPU 0000:18:00.0 now: it runs 1 × H100-4C (0000:18:00.4), and it can create only H100-4C beside that; delete vGPUs of this GPU first, or create H100-10C on another GPU"
        );
        let full = gpu(2, vec![vf(0, 1056, &[]), vf(1, 1056, &[])]);
        let none = check_vdev(&full, 1056, &names()).unwrap_err();
        assert!(
            none.to_string().starts_with(
                "every SR-IOV virtual function of GPU 0000:18:00.0 holds a vGPU (2 × H100-4C (0000:18:00.4, 0000:18:00.5))"
            ),
            "{none}"
        );
        assert_eq!(check_vdev(&mixed, 1056, &names()).unwrap().number, 1);
    }

    #[test]
    fn mdev_checks_refuse_an_unknown_or_unavailable_type() {
        let mut g = gpu(0, vec![]);
        g.mdev_types = vec![
            MdevType {
                id: 232,
                name: "NVIDIA T4-4Q".into(),
                available: 3,
            },
            MdevType {
                id: 233,
                name: "NVIDIA T4-8Q".into(),
                available: 0,
            },
        ];
        g.instances.push(VgpuInstance {
            type_id: 232,
            vf_address: None,
            mdev_uuid: Some("3b1a5e2c-0000-4000-8000-000000000001".into()),
            iommu_group: Some("9".into()),
        });
        let mut names = TypeNames::default();
        names.add(232, "NVIDIA T4-4Q");
        names.add(233, "NVIDIA T4-8Q");
        assert_eq!(check_mdev(&g, 232, &names).unwrap().available, 3);
        assert_eq!(
            check_mdev(&g, 233, &names).unwrap_err().to_string(),
            "vGPU type T4-8Q cannot be created on GPU 0000:18:00.0 now: it runs 1 × T4-4Q (3b1a5e2c-0000-4000-8000-000000000001), and it can create only T4-4Q beside that; delete vGPUs of this GPU first, or create T4-8Q on another GPU"
        );
        assert_eq!(
            check_mdev(&g, 1, &names).unwrap_err().to_string(),
            "0000:18:00.0 has no mdev type nvidia-1; its types: nvidia-232 (T4-4Q), nvidia-233 (T4-8Q)"
        );
        assert!(matches!(
            check_mdev(&gpu(32, vec![]), 232, &names),
            Err(VgpuHostError::NotCapable { .. })
        ));
    }
}
