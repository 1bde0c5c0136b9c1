//! The vGPU types the simulator knows, per GPU model: what a simulated GPU's NVML reports
//! (`nvmlDeviceGetSupportedVgpus` and the type queries). The NVML backend reads a real GPU's
//! types from NVML and never uses this table.
//!
//! Names, framebuffer sizes and instance counts: H100 80GB and A100 40GB from the
//! reference's table (vgpu-device-manager's example config); L40S-12Q's ID 1153 from a real
//! `creatable_vgpu_types` listing. The other type IDs are the simulator's own (real IDs are
//! unique per card only and must never be assumed: the plugin always reads them), and so
//! are the L40S and T4 rows beyond 12Q and the exclusive-type capability of the `B` series,
//! which the simulator sets so that both homogeneity rules can be exercised.

use super::{VgpuFramework, VgpuType};

/// A model's vGPU support in the simulator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelVgpu {
    /// NVML product name of the GPU model.
    pub product_name: &'static str,
    /// How its host creates vGPUs.
    pub framework: VgpuFramework,
    /// SR-IOV virtual functions the GPU offers (`sriov_totalvfs`); 0 for mdev on the PF.
    pub total_vfs: u32,
    /// Whether the GPU supports heterogeneous time-sliced types at all
    /// (`HETEROGENEOUS_TIMESLICE_SIZES`); the mode itself is the node's setting.
    pub heterogeneous_capable: bool,
    /// The framebuffer vGPUs share, MiB: the most any one type's instances take together.
    pub framebuffer_mib: u64,
    /// Every type, in NVML's order.
    pub types: Vec<VgpuType>,
}

/// `(id, short name, framebuffer GiB, max instances, exclusive type, MIG profile)`.
type Row = (u32, &'static str, u64, u32, bool, Option<&'static str>);

const H100_80GB: &[Row] = &[
    (1056, "H100-4C", 4, 20, false, None),
    (1057, "H100-5C", 5, 16, false, None),
    (1058, "H100-10C", 10, 8, false, None),
    (1059, "H100-20C", 20, 4, false, None),
    (1060, "H100-40C", 40, 2, false, None),
    (1061, "H100-80C", 80, 1, false, None),
    (1062, "H100-1-10C", 10, 7, false, Some("1g.10gb")),
    (1063, "H100-1-20C", 20, 4, false, Some("1g.20gb")),
    (1064, "H100-2-20C", 20, 3, false, Some("2g.20gb")),
    (1065, "H100-3-40C", 40, 2, false, Some("3g.40gb")),
    (1066, "H100-4-40C", 40, 1, false, Some("4g.40gb")),
    (1067, "H100-7-80C", 80, 1, false, Some("7g.80gb")),
    (1068, "H100-1-10CME", 10, 1, false, Some("1g.10gb+me")),
];

const A100_40GB: &[Row] = &[
    (460, "A100-4C", 4, 10, false, None),
    (461, "A100-1-5C", 5, 7, false, Some("1g.5gb")),
    (462, "A100-3-20C", 20, 2, false, Some("3g.20gb")),
    (463, "A100-7-40C", 40, 1, false, Some("7g.40gb")),
];

const L40S: &[Row] = &[
    (1147, "L40S-1B", 1, 32, true, None),
    (1148, "L40S-2B", 2, 24, true, None),
    (1149, "L40S-4Q", 4, 12, false, None),
    (1150, "L40S-6Q", 6, 8, false, None),
    (1151, "L40S-8Q", 8, 6, false, None),
    (1152, "L40S-16Q", 16, 3, false, None),
    (1153, "L40S-12Q", 12, 4, false, None),
    (1154, "L40S-24Q", 24, 2, false, None),
    (1155, "L40S-48Q", 48, 1, false, None),
];

const T4: &[Row] = &[
    (222, "T4-1B", 1, 16, false, None),
    (223, "T4-2B", 2, 8, false, None),
    (230, "T4-1Q", 1, 16, false, None),
    (231, "T4-2Q", 2, 8, false, None),
    (232, "T4-4Q", 4, 4, false, None),
    (233, "T4-8Q", 8, 2, false, None),
    (234, "T4-16Q", 16, 1, false, None),
    (319, "T4-4C", 4, 4, false, None),
    (320, "T4-8C", 8, 2, false, None),
    (321, "T4-16C", 16, 1, false, None),
];

fn types(rows: &[Row]) -> Vec<VgpuType> {
    rows.iter()
        .map(|&(id, name, gib, max, exclusive, mig)| VgpuType {
            id,
            name: format!("NVIDIA {name}"),
            framebuffer_mib: gib * 1024,
            max_instances: max,
            exclusive_type: exclusive,
            exclusive_size: false,
            mig_profile: mig.map(str::to_string),
        })
        .collect()
}

/// The simulator's vGPU support for the model with NVML product name `product_name`;
/// `None` for a model without vGPU in the simulator.
pub fn for_product(product_name: &str) -> Option<ModelVgpu> {
    let (framework, total_vfs, heterogeneous_capable, framebuffer_gib, rows) = match product_name {
        "NVIDIA H100 80GB HBM3" => (VgpuFramework::Vdev, 32, false, 80, H100_80GB),
        "NVIDIA A100-SXM4-40GB" => (VgpuFramework::Vdev, 20, false, 40, A100_40GB),
        "NVIDIA L40S" => (VgpuFramework::Vdev, 32, true, 48, L40S),
        "Tesla T4" => (VgpuFramework::Mdev, 0, false, 16, T4),
        _ => return None,
    };
    Some(ModelVgpu {
        product_name: match product_name {
            "NVIDIA H100 80GB HBM3" => "NVIDIA H100 80GB HBM3",
            "NVIDIA A100-SXM4-40GB" => "NVIDIA A100-SXM4-40GB",
            "NVIDIA L40S" => "NVIDIA L40S",
            _ => "Tesla T4",
        },
        framework,
        total_vfs,
        heterogeneous_capable,
        framebuffer_mib: framebuffer_gib * 1024,
        types: types(rows),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_types_instances_fit_the_framebuffer_and_ids_are_unique_per_model() {
        for product in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA L40S",
            "Tesla T4",
        ] {
            let model = for_product(product).expect(product);
            let mut ids: Vec<u32> = model.types.iter().map(|t| t.id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), model.types.len(), "{product}");
            for t in &model.types {
                assert!(
                    t.framebuffer_mib * u64::from(t.max_instances) <= model.framebuffer_mib,
                    "{}",
                    t.name
                );
            }
        }
        assert_eq!(
            for_product("NVIDIA L40S").unwrap().types[6].name,
            "NVIDIA L40S-12Q"
        );
        assert!(for_product("NVIDIA L4").is_none());
    }
}
