//! Fabric Manager's partition list as `fmpm -l` prints it, validated, and the pure decisions
//! built on it: the attributes a GPU publishes (`gpuModuleID`, `partition1/2/4/8`) and the one
//! partition a claim's GPUs must fill exactly.
//!
//! A GPU is named by its *module ID*: NVML's `nvmlDeviceGetModuleId`, which Fabric Manager
//! reports as `physicalId` (1–8 on an HGX baseboard; 0 means "unknown").

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::DeviceAttribute;
use serde::{Deserialize, Serialize};

use super::FabricError;

/// One GPU of a partition, as `fmpm -l` prints it (`fmFabricPartitionGpuInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionGpu {
    /// The GPU's module ID (NVML `nvmlDeviceGetModuleId`).
    pub physical_id: u32,
    /// `GPU-…` UUID (may be empty while the GPU is bound to `vfio-pci`).
    #[serde(default)]
    pub uuid: String,
    /// PCI bus ID as FM prints it.
    #[serde(default)]
    pub pci_bus_id: String,
    /// NVLinks usable in this partition.
    #[serde(default)]
    pub num_nv_links_available: u32,
    /// NVLinks the GPU has.
    #[serde(default)]
    pub max_num_nv_links: u32,
    /// Line rate of one NVLink in MB/s.
    #[serde(default)]
    pub nvlink_line_rate_m_bps: u64,
}

/// One partition (`fmFabricPartitionInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    /// FM's partition ID.
    pub partition_id: u32,
    /// Whether FM has it activated now.
    pub is_active: bool,
    /// How many GPUs it has (`gpuInfo.len()`).
    pub num_gpus: u32,
    /// Its GPUs.
    pub gpu_info: Vec<PartitionGpu>,
}

impl Partition {
    /// The module IDs of its GPUs, sorted.
    pub fn modules(&self) -> BTreeSet<u32> {
        self.gpu_info.iter().map(|g| g.physical_id).collect()
    }
}

/// `fmpm -l`'s whole answer (`fmFabricPartitionList_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionList {
    /// Struct version word FM filled in.
    #[serde(default)]
    pub version: u32,
    /// Partitions listed.
    pub num_partitions: u32,
    /// Most partitions FM supports (64).
    #[serde(default)]
    pub max_num_partitions: u32,
    /// The partitions.
    #[serde(default)]
    pub partition_info: Vec<Partition>,
}

/// A validated partition list: non-empty, unique partition IDs, no GPU twice in a partition,
/// no module ID 0, `numGpus` equal to the GPUs listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTable {
    partitions: Vec<Partition>,
}

impl PartitionTable {
    /// Parses `fmpm -l`'s JSON and validates it.
    ///
    /// # Errors
    /// [`FabricError::BadList`] naming what is wrong (not JSON of that shape, empty, a
    /// duplicate partition ID, a GPU listed twice in one partition, a count that disagrees).
    pub fn parse(json: &str) -> Result<PartitionTable, FabricError> {
        let list: PartitionList = serde_json::from_str(json).map_err(|e| FabricError::BadList {
            detail: format!("not the JSON fmpm -l prints: {e}"),
        })?;
        PartitionTable::new(list.partition_info)
    }

    /// Validates `partitions` as [`PartitionTable::parse`] does.
    ///
    /// # Errors
    /// As [`PartitionTable::parse`].
    pub fn new(partitions: Vec<Partition>) -> Result<PartitionTable, FabricError> {
        let bad = |detail: String| Err(FabricError::BadList { detail });
        if partitions.is_empty() {
            return bad(
                "Fabric Manager lists no partitions (is FABRIC_MODE=1 set in fabricmanager.cfg?)"
                    .into(),
            );
        }
        let mut ids = BTreeSet::new();
        for p in &partitions {
            if !ids.insert(p.partition_id) {
                return bad(format!("partition ID {} is listed twice", p.partition_id));
            }
            if p.gpu_info.is_empty() || p.num_gpus as usize != p.gpu_info.len() {
                return bad(format!(
                    "partition {} says numGpus {} but lists {} GPU(s)",
                    p.partition_id,
                    p.num_gpus,
                    p.gpu_info.len()
                ));
            }
            let mut seen = BTreeSet::new();
            for g in &p.gpu_info {
                if g.physical_id == 0 {
                    return bad(format!(
                        "partition {} lists a GPU with physicalId 0 (unknown module)",
                        p.partition_id
                    ));
                }
                if !seen.insert(g.physical_id) {
                    return bad(format!(
                        "partition {} lists GPU physicalId {} twice",
                        p.partition_id, g.physical_id
                    ));
                }
            }
        }
        Ok(PartitionTable { partitions })
    }

    /// The partitions, in FM's order.
    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    /// The partition with ID `id`.
    pub fn get(&self, id: u32) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.partition_id == id)
    }

    /// For each partition size FM reports, the ID of the partition of that size containing
    /// `module` (the lowest ID if FM lists several): what `partition<N>` says.
    pub fn partitions_of(&self, module: u32) -> BTreeMap<u32, u32> {
        let mut out = BTreeMap::new();
        for p in &self.partitions {
            if p.gpu_info.iter().any(|g| g.physical_id == module) {
                let size = p.gpu_info.len() as u32;
                let id = out.entry(size).or_insert(p.partition_id);
                *id = (*id).min(p.partition_id);
            }
        }
        out
    }

    /// The module ID FM lists for the GPU at `pci_bus_id` (any domain width and case:
    /// `0000:18:00.0`, `00000000:18:00.0`): for a GPU NVML cannot see (bound to `vfio-pci`),
    /// whose VFIO device still needs `gpuModuleID`.
    pub fn module_by_pci_bus_id(&self, pci_bus_id: &str) -> Option<u32> {
        let key = |bdf: &str| -> Option<(u64, String)> {
            let (domain, rest) = bdf.trim().split_once(':')?;
            Some((
                u64::from_str_radix(domain, 16).ok()?,
                rest.to_ascii_lowercase(),
            ))
        };
        let wanted = key(pci_bus_id)?;
        self.partitions
            .iter()
            .flat_map(|p| &p.gpu_info)
            .find(|g| key(&g.pci_bus_id).as_ref() == Some(&wanted))
            .map(|g| g.physical_id)
    }

    /// The partition whose GPUs are exactly `modules`, if any.
    pub fn exact(&self, modules: &BTreeSet<u32>) -> Option<&Partition> {
        self.partitions.iter().find(|p| &p.modules() == modules)
    }

    /// The partitions of `size` GPUs that contain every module of `modules`: what a claim of
    /// those GPUs could have asked for instead, smallest ID first.
    pub fn fitting(&self, modules: &BTreeSet<u32>) -> Vec<&Partition> {
        let mut fits: Vec<&Partition> = self
            .partitions
            .iter()
            .filter(|p| modules.is_subset(&p.modules()))
            .collect();
        fits.sort_by_key(|p| (p.gpu_info.len(), p.partition_id));
        fits
    }
}

/// The attributes a device of the GPU with module ID `module` publishes on a Fabric Manager
/// node, with NVIDIA's names and types: `gpuModuleID` (int) and `partition<N>` (int, the ID
/// of the size-N partition containing the GPU) for each size FM reports. Full GPUs carry
/// them; so should VFIO devices (from their parent GPU's module ID).
///
/// Empty when `module` is 0 (NVML could not say) or FM lists no partition with it: such a
/// GPU cannot be claimed on an FM node anyway, and publishing a wrong ID would be worse.
pub fn attributes(module: u32, table: &PartitionTable) -> BTreeMap<String, DeviceAttribute> {
    let mut out = BTreeMap::new();
    let sizes = table.partitions_of(module);
    if module == 0 || sizes.is_empty() {
        return out;
    }
    let int = |v: u32| DeviceAttribute {
        int: Some(i64::from(v)),
        ..Default::default()
    };
    out.insert(MODULE_ATTRIBUTE.to_string(), int(module));
    for (size, id) in sizes {
        out.insert(format!("partition{size}"), int(id));
    }
    out
}

/// The attribute holding a GPU's module ID.
pub const MODULE_ATTRIBUTE: &str = "gpuModuleID";

/// Whether `name` (bare, or qualified as `<domain>/<name>`) is one of the attributes
/// [`attributes`] publishes, which a node has only when its plugin runs with
/// `--fabric-manager`: `gpuModuleID` or `partition<N>`.
pub fn is_fabric_attribute(name: &str) -> bool {
    let id = name.rsplit_once('/').map_or(name, |(_, id)| id);
    id == MODULE_ATTRIBUTE
        || id
            .strip_prefix("partition")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The partition a claim of the GPUs `modules` must use: the one whose GPUs are exactly
/// those (a single GPU: its size-1 partition).
///
/// # Errors
/// [`FabricError::Mismatch`] naming the claim's module IDs, the partitions that contain
/// them all (size and ID), and the `matchAttribute` that makes the scheduler pick a set
/// that fits.
pub fn partition_for(modules: &BTreeSet<u32>, table: &PartitionTable) -> Result<u32, FabricError> {
    if let Some(p) = table.exact(modules) {
        return Ok(p.partition_id);
    }
    let fitting = table.fitting(modules);
    let fits = if fitting.is_empty() {
        "no partition contains all of them".to_string()
    } else {
        let list: Vec<String> = fitting
            .iter()
            .map(|p| {
                let ids: Vec<String> = p.modules().iter().map(u32::to_string).collect();
                format!(
                    "partition {} ({} GPUs: modules {})",
                    p.partition_id,
                    p.gpu_info.len(),
                    ids.join(",")
                )
            })
            .collect();
        format!("partitions that contain them: {}", list.join("; "))
    };
    let sizes: BTreeSet<usize> = table.partitions.iter().map(|p| p.gpu_info.len()).collect();
    let sizes: Vec<String> = sizes.iter().map(usize::to_string).collect();
    let ids: Vec<String> = modules.iter().map(u32::to_string).collect();
    Err(FabricError::Mismatch {
        modules: ids.join(","),
        detail: format!(
            "{fits}; a claim must get exactly one partition's GPUs (sizes {}): request `count: N` with `constraints: [{{matchAttribute: gpu.nvidia.com/partitionN}}]`",
            sizes.join(", ")
        ),
    })
}

/// The 15-partition table of an HGX H100/H200 8-GPU baseboard (18 NVLinks per GPU, as
/// docs/fabric-manager.md sources it): ID 0 all eight; 1–2 the halves; 3–6 the pairs
/// {1,3} {2,4} {5,7} {6,8}; 7–14 one GPU each (ID = 6 + module). `gpus` gives each module's
/// UUID and PCI bus ID (module 1 first); `active` the IDs FM has activated. The simulated
/// Fabric Manager lists this.
pub fn hgx_8gpu_table(gpus: &[(String, String)], active: &BTreeSet<u32>) -> Vec<Partition> {
    let sets: [&[u32]; 15] = [
        &[1, 2, 3, 4, 5, 6, 7, 8],
        &[1, 2, 3, 4],
        &[5, 6, 7, 8],
        &[1, 3],
        &[2, 4],
        &[5, 7],
        &[6, 8],
        &[1],
        &[2],
        &[3],
        &[4],
        &[5],
        &[6],
        &[7],
        &[8],
    ];
    sets.iter()
        .enumerate()
        .map(|(id, modules)| {
            let id = id as u32;
            let active = active.contains(&id);
            Partition {
                partition_id: id,
                is_active: active,
                num_gpus: modules.len() as u32,
                gpu_info: modules
                    .iter()
                    .map(|&m| {
                        let (uuid, bus) = gpus.get(m as usize - 1).cloned().unwrap_or_default();
                        // Links to the NVSwitches are trained only while the partition runs.
                        let links = if active { 18 } else { 0 };
                        PartitionGpu {
                            physical_id: m,
                            uuid,
                            pci_bus_id: bus,
                            num_nv_links_available: links,
                            max_num_nv_links: 18,
                            nvlink_line_rate_m_bps: 25_781,
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PartitionTable {
        PartitionTable::new(hgx_8gpu_table(&[], &BTreeSet::new())).unwrap()
    }

    fn set(ids: &[u32]) -> BTreeSet<u32> {
        ids.iter().copied().collect()
    }

    #[test]
    fn module_3_of_an_hgx_board_publishes_the_partitions_nvidia_shows_for_it() {
        // NVIDIA's H200 slice (PR #1190): module 3 → partition1 9, partition2 3, partition4 1,
        // partition8 0.
        let got: BTreeMap<String, i64> = attributes(3, &table())
            .into_iter()
            .map(|(k, v)| (k, v.int.unwrap()))
            .collect();
        let want: BTreeMap<String, i64> = [
            ("gpuModuleID", 3),
            ("partition1", 9),
            ("partition2", 3),
            ("partition4", 1),
            ("partition8", 0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn every_published_name_is_known_as_a_fabric_attribute_and_others_are_not() {
        for name in attributes(3, &table()).keys() {
            assert!(is_fabric_attribute(name), "{name}");
            assert!(
                is_fabric_attribute(&format!("gpu.nvidia.com/{name}")),
                "{name}"
            );
        }
        for name in [
            "partition",
            "partitionX",
            "gpu.nvidia.com/uuid",
            "parentUUID",
        ] {
            assert!(!is_fabric_attribute(name), "{name}");
        }
    }

    #[test]
    fn an_unknown_module_publishes_no_attributes() {
        assert!(attributes(0, &table()).is_empty());
        assert!(attributes(9, &table()).is_empty());
    }

    #[test]
    fn each_partition_size_is_found_from_its_exact_gpu_set() {
        let t = table();
        let got: Vec<u32> = [&[7][..], &[2, 4], &[5, 6, 7, 8], &[1, 2, 3, 4, 5, 6, 7, 8]]
            .iter()
            .map(|m| partition_for(&set(m), &t).unwrap())
            .collect();
        assert_eq!(got, vec![13, 4, 2, 0]);
    }

    #[test]
    fn a_mismatched_set_names_the_partitions_that_would_fit_and_the_fix() {
        let err = partition_for(&set(&[1, 2, 3]), &table())
            .unwrap_err()
            .to_string();
        assert!(err.contains("modules 1,2,3"), "{err}");
        assert!(
            err.contains("partition 1 (4 GPUs: modules 1,2,3,4)"),
            "{err}"
        );
        assert!(err.contains("partition 0 (8 GPUs"), "{err}");
        assert!(
            err.contains("matchAttribute: gpu.nvidia.com/partitionN"),
            "{err}"
        );
        let err = partition_for(&set(&[1, 5]), &table())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("partitions that contain them: partition 0 (8 GPUs"),
            "{err}"
        );
        assert!(!err.contains("partition 1 ("), "{err}");
    }

    #[test]
    fn lists_that_break_an_invariant_are_refused_naming_it() {
        let mut dup = hgx_8gpu_table(&[], &BTreeSet::new());
        dup[1].partition_id = 0;
        let twice = {
            let mut t = hgx_8gpu_table(&[], &BTreeSet::new());
            t[3].gpu_info[1].physical_id = 1;
            t
        };
        let errors: Vec<String> = [Vec::new(), dup, twice]
            .into_iter()
            .map(|p| PartitionTable::new(p).unwrap_err().to_string())
            .collect();
        assert!(errors[0].contains("no partitions"), "{}", errors[0]);
        assert!(
            errors[1].contains("partition ID 0 is listed twice"),
            "{}",
            errors[1]
        );
        assert!(errors[2].contains("physicalId 1 twice"), "{}", errors[2]);
    }

    #[test]
    fn a_gpu_is_found_by_its_pci_bus_id_whatever_the_domain_width() {
        let gpus: Vec<(String, String)> = (1..=8)
            .map(|m| (format!("GPU-{m}"), format!("00000000:{:02X}:00.0", m * 16)))
            .collect();
        let t = PartitionTable::new(hgx_8gpu_table(&gpus, &BTreeSet::new())).unwrap();
        assert_eq!(t.module_by_pci_bus_id("0000:30:00.0"), Some(3));
        assert_eq!(t.module_by_pci_bus_id("0000:31:00.0"), None);
    }

    #[test]
    fn fmpm_json_round_trips_through_the_parser() {
        let list = PartitionList {
            version: 0x0100_0000,
            num_partitions: 15,
            max_num_partitions: 64,
            partition_info: hgx_8gpu_table(&[], &set(&[2])),
        };
        let json = serde_json::to_string_pretty(&list).unwrap();
        assert!(json.contains("\"nvlinkLineRateMBps\""), "{json}");
        assert!(json.contains("\"numNvLinksAvailable\""), "{json}");
        let t = PartitionTable::parse(&json).unwrap();
        assert_eq!(t.partitions().len(), 15);
        assert!(t.get(2).unwrap().is_active);
    }
}
