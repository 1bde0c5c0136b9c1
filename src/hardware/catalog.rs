//! The GPU models the simulator knows, built from the embedded reference table
//! (`data/mig-profiles.json`), GB200 derived from its B200 row, and a few models without
//! MIG.
//!
//! The table is parsed once, on first use. A model is looked up by its key (e.g.
//! `H100-SXM5-80GB`), case-insensitively, or by a short alias (`h100`, `a100-40gb`).

use std::sync::OnceLock;

use serde::Deserialize;

use super::{Architecture, MigProfile};

const MIG_TABLE: &str = include_str!("data/mig-profiles.json");

/// A GPU model: its identity, size and MIG geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuModel {
    /// The key node files use, e.g. `H100-SXM5-80GB`.
    pub key: String,
    /// NVML product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// PCI device id as NVML prints it, e.g. `0x233010DE`.
    pub pci_device_id: String,
    /// NVML brand as NVIDIA's driver prints it.
    pub brand: String,
    /// Architecture family.
    pub architecture: Architecture,
    /// CUDA compute capability.
    pub compute_capability: (u32, u32),
    /// Total memory, MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU.
    pub multiprocessors: u32,
    /// Memory slices (8, or 4 on A30); 0 without MIG.
    pub memory_slices: u32,
    /// Compute slices (7, or 4 on A30); 0 without MIG.
    pub compute_slices: u32,
    /// GPU-instance profiles, empty without MIG.
    pub profiles: Vec<MigProfile>,
}

impl GpuModel {
    /// Whether the model supports MIG.
    pub fn mig_capable(&self) -> bool {
        !self.profiles.is_empty()
    }
}

/// Errors of the model catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The embedded table does not parse (a build defect, caught by tests).
    #[error("embedded MIG profile table is invalid: {detail}")]
    InvalidTable {
        /// What is wrong.
        detail: String,
    },
    /// No model with that name.
    #[error("unknown GPU model {name:?}; valid models: {valid}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// Comma-separated model keys and aliases.
        valid: String,
    },
}

/// Short names accepted besides the full keys.
const ALIASES: &[(&str, &str)] = &[
    ("a100", "A100-SXM4-40GB"),
    ("a100-40gb", "A100-SXM4-40GB"),
    ("a100-80gb", "A100-SXM4-80GB"),
    ("a30", "A30-24GB"),
    ("h100", "H100-SXM5-80GB"),
    ("h100-80gb", "H100-SXM5-80GB"),
    ("h100-nvl", "H100-NVL-94GB"),
    ("h200", "H200-SXM-141GB"),
    ("b200", "B200"),
    ("gb200", "GB200"),
    ("l4", "L4"),
    ("rtx4090", "RTX-4090"),
];

/// Every known model, in table order (MIG models first, then the others).
///
/// Fails only if the embedded table is malformed, which the test suite rules out.
pub fn models() -> Result<&'static [GpuModel], CatalogError> {
    static MODELS: OnceLock<Result<Vec<GpuModel>, String>> = OnceLock::new();
    match MODELS.get_or_init(|| build_models().map_err(|e| e.to_string())) {
        Ok(models) => Ok(models),
        Err(detail) => Err(CatalogError::InvalidTable {
            detail: detail.clone(),
        }),
    }
}

/// Looks a model up by key (case-insensitive) or alias.
///
/// Fails with [`CatalogError::UnknownModel`] listing every valid name.
pub fn model(name: &str) -> Result<&'static GpuModel, CatalogError> {
    let all = models()?;
    let wanted = ALIASES
        .iter()
        .find(|(alias, _)| alias.eq_ignore_ascii_case(name))
        .map(|(_, key)| *key)
        .unwrap_or(name);
    all.iter()
        .find(|m| m.key.eq_ignore_ascii_case(wanted))
        .ok_or_else(|| CatalogError::UnknownModel {
            name: name.to_string(),
            valid: valid_names(all),
        })
}

fn valid_names(all: &[GpuModel]) -> String {
    let mut names: Vec<String> = all.iter().map(|m| m.key.clone()).collect();
    names.extend(ALIASES.iter().map(|(alias, _)| alias.to_string()));
    names.join(", ")
}

#[derive(Deserialize)]
struct Table {
    gpus: Vec<TableGpu>,
}

#[derive(Deserialize)]
struct TableGpu {
    model: String,
    nvml_name: String,
    pci_device_id: String,
    architecture: String,
    total_memory_mib: u64,
    sm_count: u32,
    memory_slices: u32,
    compute_slices: u32,
    profiles: Vec<TableProfile>,
}

#[derive(Deserialize)]
struct TableProfile {
    name: String,
    nvml_profile_index: u32,
    profile_info_id_as_shown_by_nvidia_smi: u32,
    memory_mib: u64,
    sm_count: u32,
    copy_engines: u32,
    decoders: u32,
    encoders: u32,
    jpeg: u32,
    ofa: u32,
    max_instances: u32,
    memory_slices: u32,
    compute_slices: u32,
    placements: Vec<TablePlacement>,
}

#[derive(Deserialize)]
struct TablePlacement {
    start: u32,
    size: u32,
}

fn build_models() -> Result<Vec<GpuModel>, CatalogError> {
    let table: Table = serde_json::from_str(MIG_TABLE).map_err(|e| CatalogError::InvalidTable {
        detail: e.to_string(),
    })?;
    let mut models = Vec::with_capacity(table.gpus.len() + 2);
    for gpu in table.gpus {
        let (architecture, compute_capability) = parse_architecture(&gpu.architecture)?;
        let mut profiles = Vec::with_capacity(gpu.profiles.len());
        for p in gpu.profiles {
            if let Some(bad) = p.placements.iter().find(|pl| pl.size != p.memory_slices) {
                return Err(CatalogError::InvalidTable {
                    detail: format!(
                        "{} {}: placement {}:{} does not span {} memory slices",
                        gpu.model, p.name, bad.start, bad.size, p.memory_slices
                    ),
                });
            }
            profiles.push(MigProfile {
                name: p.name,
                index: p.nvml_profile_index,
                id: p.profile_info_id_as_shown_by_nvidia_smi,
                memory_mib: p.memory_mib,
                multiprocessors: p.sm_count,
                copy_engines: p.copy_engines,
                decoders: p.decoders,
                encoders: p.encoders,
                jpeg_engines: p.jpeg,
                ofa_engines: p.ofa,
                max_instances: p.max_instances,
                compute_slices: p.compute_slices,
                memory_slices: p.memory_slices,
                placement_starts: p.placements.iter().map(|pl| pl.start).collect(),
            });
        }
        models.push(GpuModel {
            key: gpu.model,
            product_name: gpu.nvml_name,
            pci_device_id: gpu.pci_device_id,
            brand: "Nvidia".to_string(),
            architecture,
            compute_capability,
            memory_mib: gpu.total_memory_mib,
            multiprocessors: gpu.sm_count,
            memory_slices: gpu.memory_slices,
            compute_slices: gpu.compute_slices,
            profiles,
        });
    }
    if let Some(b200) = models.iter().find(|m| m.key == "B200") {
        let gb200 = gb200_from(b200);
        models.push(gb200);
    }
    // Models without MIG, from their public specifications.
    models.push(GpuModel {
        key: "L4".to_string(),
        product_name: "NVIDIA L4".to_string(),
        pci_device_id: "0x27B810DE".to_string(),
        brand: "Nvidia".to_string(),
        architecture: Architecture::AdaLovelace,
        compute_capability: (8, 9),
        memory_mib: 23034,
        multiprocessors: 58,
        memory_slices: 0,
        compute_slices: 0,
        profiles: Vec::new(),
    });
    // vGPU hosts without MIG: an SR-IOV (vdev) Ada GPU and an mdev Turing GPU.
    models.push(GpuModel {
        key: "L40S".to_string(),
        product_name: "NVIDIA L40S".to_string(),
        pci_device_id: "0x26B910DE".to_string(),
        brand: "Nvidia".to_string(),
        architecture: Architecture::AdaLovelace,
        compute_capability: (8, 9),
        memory_mib: 46068,
        multiprocessors: 142,
        memory_slices: 0,
        compute_slices: 0,
        profiles: Vec::new(),
    });
    models.push(GpuModel {
        key: "T4".to_string(),
        product_name: "Tesla T4".to_string(),
        pci_device_id: "0x1EB810DE".to_string(),
        brand: "Tesla".to_string(),
        architecture: Architecture::Turing,
        compute_capability: (7, 5),
        memory_mib: 15360,
        multiprocessors: 40,
        memory_slices: 0,
        compute_slices: 0,
        profiles: Vec::new(),
    });
    // A pre-Volta GPU (compute capability 6.0), for what needs Volta or newer (multi-user MPS).
    models.push(GpuModel {
        key: "P100-PCIE-16GB".to_string(),
        product_name: "Tesla P100-PCIE-16GB".to_string(),
        pci_device_id: "0x15F810DE".to_string(),
        brand: "Tesla".to_string(),
        architecture: Architecture::Pascal,
        compute_capability: (6, 0),
        memory_mib: 16280,
        multiprocessors: 56,
        memory_slices: 0,
        compute_slices: 0,
        profiles: Vec::new(),
    });
    models.push(GpuModel {
        key: "RTX-4090".to_string(),
        product_name: "NVIDIA GeForce RTX 4090".to_string(),
        pci_device_id: "0x268410DE".to_string(),
        brand: "GeForce".to_string(),
        architecture: Architecture::AdaLovelace,
        compute_capability: (8, 9),
        memory_mib: 24564,
        multiprocessors: 128,
        memory_slices: 0,
        compute_slices: 0,
        profiles: Vec::new(),
    });
    Ok(models)
}

/// GB200's total memory as `nvidia-smi` reports it on GB200 NVL72 compute trays.
const GB200_MEMORY_MIB: u64 = 189_471;

/// GB200 (the Blackwell GPU of GB200 NVL72), which the reference table lists by profile names
/// only (mig-parted's config: `1g.23gb`, `1g.47gb`, `2g.47gb`, `3g.93gb`, `4g.93gb`,
/// `7g.186gb`). It is the B200 die, so it takes B200's placements, profile ids, SMs and
/// engines; profile memory is B200's scaled to GB200's total and rounded down to 128 MiB,
/// which makes go-nvlib's name derivation give exactly mig-parted's names (tested). An
/// estimate, like the B200 row it is built from.
fn gb200_from(b200: &GpuModel) -> GpuModel {
    let scale = |mib: u64| (mib * GB200_MEMORY_MIB / b200.memory_mib) / 128 * 128;
    let rename = |name: &str| {
        [
            ("1g.23gb", "1g.23gb"),
            ("1g.45gb", "1g.47gb"),
            ("2g.45gb", "2g.47gb"),
            ("3g.90gb", "3g.93gb"),
            ("4g.90gb", "4g.93gb"),
            ("7g.180gb", "7g.186gb"),
        ]
        .iter()
        .find_map(|(b, gb)| name.strip_prefix(b).map(|rest| format!("{gb}{rest}")))
        .unwrap_or_else(|| name.to_string())
    };
    GpuModel {
        key: "GB200".to_string(),
        product_name: "NVIDIA GB200".to_string(),
        pci_device_id: "0x294110DE".to_string(),
        memory_mib: GB200_MEMORY_MIB,
        profiles: b200
            .profiles
            .iter()
            .map(|p| MigProfile {
                name: rename(&p.name),
                memory_mib: scale(p.memory_mib),
                ..p.clone()
            })
            .collect(),
        ..b200.clone()
    }
}

/// Parses the table's `"Hopper (GH100), CC 9.0"` form.
fn parse_architecture(text: &str) -> Result<(Architecture, (u32, u32)), CatalogError> {
    let invalid = || CatalogError::InvalidTable {
        detail: format!(
            "architecture {text:?} is not of the form \"<Name> (<chip>), CC <major>.<minor>\""
        ),
    };
    let family = text.split_whitespace().next().ok_or_else(invalid)?;
    let architecture = match family {
        "Turing" => Architecture::Turing,
        "Ampere" => Architecture::Ampere,
        "Ada" => Architecture::AdaLovelace,
        "Hopper" => Architecture::Hopper,
        "Blackwell" => Architecture::Blackwell,
        _ => return Err(invalid()),
    };
    let cc = text.rsplit("CC ").next().ok_or_else(invalid)?;
    let (major, minor) = cc.trim().split_once('.').ok_or_else(invalid)?;
    let major = major.parse().map_err(|_| invalid())?;
    let minor = minor.parse().map_err(|_| invalid())?;
    Ok((architecture, (major, minor)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_model_parses_with_its_profiles() {
        let all = models().expect("embedded table parses");
        let keys: Vec<&str> = all.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "A100-SXM4-40GB",
                "A100-SXM4-80GB",
                "A30-24GB",
                "H100-SXM5-80GB",
                "H100-NVL-94GB",
                "H200-SXM-141GB",
                "B200",
                "GB200",
                "L4",
                "L40S",
                "T4",
                "P100-PCIE-16GB",
                "RTX-4090"
            ]
        );
        let h100 = model("h100").unwrap();
        assert_eq!(h100.product_name, "NVIDIA H100 80GB HBM3");
        assert_eq!(h100.architecture, Architecture::Hopper);
        assert_eq!(h100.compute_capability, (9, 0));
        let placements: usize = h100.profiles.iter().map(|p| p.placement_starts.len()).sum();
        assert_eq!(placements, 25);
    }

    #[test]
    fn profile_ids_follow_the_driver_not_the_constant() {
        let a100 = model("A100-SXM4-40GB").unwrap();
        let pairs: Vec<(u32, u32)> = a100.profiles.iter().map(|p| (p.index, p.id)).collect();
        assert_eq!(
            pairs,
            [(0, 19), (7, 20), (9, 15), (1, 14), (2, 9), (3, 5), (4, 0)]
        );
    }

    /// go-nvlib's `getMigMemorySizeGB`: the profile's share of memory rounded up to eighths,
    /// times the GPU's memory in whole GiB (rounded up), rounded.
    fn go_nvlib_gb(profile_mib: u64, total_mib: u64) -> u64 {
        let eighths = (profile_mib as f64 / total_mib as f64 * 8.0).ceil() / 8.0;
        (eighths * (total_mib as f64 / 1024.0).ceil()).round() as u64
    }

    #[test]
    fn gb200_profile_names_follow_from_its_memory_as_go_nvlib_derives_them() {
        let gb200 = model("gb200").unwrap();
        assert_eq!(gb200.product_name, "NVIDIA GB200");
        let names: Vec<&str> = gb200.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "1g.23gb",
                "1g.23gb+me",
                "1g.47gb",
                "2g.47gb",
                "3g.93gb",
                "4g.93gb",
                "7g.186gb"
            ]
        );
        for p in &gb200.profiles {
            let gb = go_nvlib_gb(p.memory_mib, gb200.memory_mib);
            let base = p.name.split('+').next().unwrap();
            assert_eq!(
                base.split('.').nth(1),
                Some(format!("{gb}gb").as_str()),
                "{}",
                p.name
            );
            assert!(p.memory_mib <= gb200.memory_mib);
        }
    }

    #[test]
    fn unknown_model_lists_valid_choices() {
        let err = model("V100").unwrap_err().to_string();
        assert!(
            err.starts_with("unknown GPU model \"V100\"; valid models: A100-SXM4-40GB"),
            "{err}"
        );
        assert!(err.contains("rtx4090"), "{err}");
    }
}
