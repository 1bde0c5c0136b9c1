//! `--vgpu-types`: which NVIDIA vGPU types each GPU offers (docs/device-model.md, "vGPU").
//!
//! Off by default. A comma list (`H100-4C,H100-10C`) applies to every GPU: each offers the
//! listed types its model supports, and a GPU supporting none of them offers none. Per GPU
//! index, `INDEXES=TYPES` pairs separated by `;` (`0-3=H100-4C;4-7=L40S-12Q,L40S-24Q`), as the
//! GPU Operator's vGPU configuration does per device. Names are NVML's without the `NVIDIA `
//! prefix, case-insensitive.
//!
//! What is refused ([`check`], at start): a name no GPU of the node supports (listing each
//! model's types), an index the node lacks, a GPU without vGPU, a MIG-backed type (the
//! hardware rules for creating one are not confirmed), and, without `--compatibility-groups`,
//! two types on one GPU that the hardware never runs side by side ([`may_share_gpu`]):
//! counters cannot keep them apart, so the message says how to give them different GPUs.
//! [`types_for`] and [`conflict`] are the same rules, used by the device model on every
//! rebuild.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::hardware::vgpu::{VgpuType, may_share_gpu};
use crate::hardware::{GpuInfo, NodeInventory};

/// The flag name, for messages.
const FLAG: &str = "--vgpu-types";

/// Which vGPU types GPUs offer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum VgpuTypes {
    /// No vGPU devices (the default).
    #[default]
    Off,
    /// These types on every GPU that supports them, in the order given, without duplicates.
    Every(Vec<String>),
    /// These types on these GPUs (by NVML index); GPUs not listed offer none.
    PerGpu(BTreeMap<u32, Vec<String>>),
}

impl VgpuTypes {
    /// Whether any GPU may offer vGPU types.
    pub fn is_on(&self) -> bool {
        *self != VgpuTypes::Off
    }

    /// The names listed for the GPU with NVML index `index`.
    pub fn listed_for(&self, index: u32) -> &[String] {
        match self {
            VgpuTypes::Off => &[],
            VgpuTypes::Every(names) => names,
            VgpuTypes::PerGpu(map) => map.get(&index).map_or(&[], Vec::as_slice),
        }
    }
}

/// GPU indices as ranges: `[0, 1, 2, 3, 6]` → `0-3,6`.
pub fn index_ranges(indices: &[u32]) -> String {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(match start == end {
            true => start.to_string(),
            false => format!("{start}-{end}"),
        });
        i += 1;
    }
    parts.join(",")
}

impl fmt::Display for VgpuTypes {
    /// The flag value that parses back to `self`; runs of GPUs with the same list are written
    /// as one range (`0-3=H100-4C;4-7=H100-10C`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VgpuTypes::Off => Ok(()),
            VgpuTypes::Every(names) => f.write_str(&names.join(",")),
            VgpuTypes::PerGpu(map) => {
                let mut runs: Vec<(Vec<u32>, &Vec<String>)> = Vec::new();
                for (index, names) in map {
                    match runs.last_mut() {
                        Some((indices, last))
                            if *last == names && indices.last().map(|l| l + 1) == Some(*index) =>
                        {
                            indices.push(*index)
                        }
                        _ => runs.push((vec![*index], names)),
                    }
                }
                let text: Vec<String> = runs
                    .iter()
                    .map(|(indices, names)| {
                        format!("{}={}", index_ranges(indices), names.join(","))
                    })
                    .collect();
                f.write_str(&text.join(";"))
            }
        }
    }
}

/// A `--vgpu-types` value that cannot be used; each names the flag, the value at fault and
/// what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VgpuTypesError {
    /// The value does not parse.
    #[error(
        "{FLAG} {value:?}: {problem}; give vGPU type names separated by commas for every GPU (e.g. H100-4C,H100-10C), or INDEXES=TYPES pairs separated by ';' per GPU index (e.g. 0-3=H100-4C;4-7=L40S-12Q,L40S-24Q)"
    )]
    Syntax {
        /// The flag's value.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A listed name is not a type of the GPUs it is listed for.
    #[error("{FLAG}: {name:?} is not a vGPU type of {on}; valid: {valid}")]
    UnknownType {
        /// The name.
        name: String,
        /// `any GPU on this node`, or `GPU 3 (NVIDIA L40S)`.
        on: String,
        /// The time-sliced types of each model concerned, e.g.
        /// `NVIDIA H100 80GB HBM3 (GPU 0-7): H100-4C, H100-5C, …`.
        valid: String,
    },
    /// An index names no GPU of the node.
    #[error("{FLAG}: GPU index {index} is not on this node; its GPUs are {present}")]
    NoSuchGpu {
        /// The index.
        index: u32,
        /// The node's GPU indices as ranges (`0-7`), or `none`.
        present: String,
    },
    /// A GPU listed by index has no vGPU support.
    #[error(
        "{FLAG}: GPU {index} ({product}) reports no vGPU types (no NVIDIA vGPU manager on the host, or a model without vGPU); leave it out of the list"
    )]
    NoVgpu {
        /// The GPU's index.
        index: u32,
        /// Its product name.
        product: String,
    },
    /// A MIG-backed type is listed.
    #[error(
        "{FLAG}: {name} is a MIG-backed vGPU type (it runs inside a {profile} GPU instance); those are not offered yet, because the hardware rules for creating one are not confirmed (the reference leaves open whether a VF's gpu_instance_id is written before current_vgpu_type: \"vdev write order of gpu_instance_id is [?]\"); use a time-sliced type: {valid}"
    )]
    MigBacked {
        /// The name.
        name: String,
        /// The GPU-instance profile it runs on, `1g.10gb`.
        profile: String,
        /// The time-sliced types of that GPU's model.
        valid: String,
    },
    /// Two types on one GPU that the hardware never runs together, without compatibility
    /// groups.
    #[error(
        "{FLAG} {value:?}: on {on}, {types} cannot share a GPU ({why}): give them different GPUs, e.g. {FLAG} {suggestion}, or turn on --compatibility-groups (Kubernetes 1.37 DRADeviceCompatibilityGroups)"
    )]
    CannotMix {
        /// The flag's value.
        value: String,
        /// Where they are listed together: `GPU 0-7 (NVIDIA H100 80GB HBM3)`.
        on: String,
        /// The two types: `H100-4C and H100-10C`.
        types: String,
        /// The rule that keeps them apart.
        why: String,
        /// A value that gives them different GPUs, quoted; with a note naming the types left
        /// for another node when the GPUs are too few.
        suggestion: String,
    },
}

fn syntax(value: &str, problem: impl Into<String>) -> VgpuTypesError {
    VgpuTypesError::Syntax {
        value: value.to_string(),
        problem: problem.into(),
    }
}

/// Names separated by commas, each once, none empty.
fn names(value: &str, list: &str) -> Result<Vec<String>, VgpuTypesError> {
    let mut out: Vec<String> = Vec::new();
    for (i, name) in list.split(',').map(str::trim).enumerate() {
        if name.is_empty() {
            return Err(syntax(value, format!("type name {} is empty", i + 1)));
        }
        if !out.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// `3`, `0-3` or `0-3,6`.
fn indices(value: &str, list: &str) -> Result<Vec<u32>, VgpuTypesError> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        let bad = || {
            syntax(
                value,
                format!("{item:?} is not a GPU index or range (e.g. 3, 0-3)"),
            )
        };
        let (from, to) = match item.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (item, item),
        };
        let (from, to): (u32, u32) = (
            from.parse().map_err(|_| bad())?,
            to.parse().map_err(|_| bad())?,
        );
        if from > to {
            return Err(bad());
        }
        out.extend(from..=to);
    }
    Ok(out)
}

impl FromStr for VgpuTypes {
    type Err = VgpuTypesError;

    /// `""` (and `off`) is off; a value with `=` is per GPU index, anything else a list for
    /// every GPU. Fails on an empty name, a malformed index or range, an entry without `=`
    /// beside ones with it, or an index given twice.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let trimmed = value.trim();
        if trimmed.is_empty() || trimmed.eq_ignore_ascii_case("off") {
            return Ok(VgpuTypes::Off);
        }
        if !trimmed.contains('=') {
            return Ok(VgpuTypes::Every(names(value, trimmed)?));
        }
        let mut map = BTreeMap::new();
        for entry in trimmed.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((left, right)) = entry.split_once('=') else {
                return Err(syntax(value, format!("{entry:?} has no '='")));
            };
            let types = names(value, right)?;
            for index in indices(value, left)? {
                if map.insert(index, types.clone()).is_some() {
                    return Err(syntax(value, format!("GPU index {index} is given twice")));
                }
            }
        }
        Ok(VgpuTypes::PerGpu(map))
    }
}

/// The time-sliced types of `gpu`, as a list for messages; `none` without vGPU.
fn time_sliced(gpu: &GpuInfo) -> String {
    let names: Vec<&str> = gpu
        .vgpu
        .iter()
        .flat_map(|v| &v.supported)
        .filter(|t| t.mig_profile.is_none())
        .map(VgpuType::short_name)
        .collect();
    match names.is_empty() {
        true => "none".to_string(),
        false => names.join(", "),
    }
}

/// The types `types` lists for `gpu` that it offers, in list order.
///
/// A list for every GPU skips the names the GPU does not support. Fails (naming the GPU) on a
/// MIG-backed type, and for a per-GPU list also on a name the GPU does not support or a GPU
/// without vGPU. Pure: the device model calls it on every rebuild, [`check`] at start.
pub fn types_for<'g>(
    types: &VgpuTypes,
    gpu: &'g GpuInfo,
) -> Result<Vec<&'g VgpuType>, VgpuTypesError> {
    let listed = types.listed_for(gpu.index);
    let per_gpu = matches!(types, VgpuTypes::PerGpu(_));
    if listed.is_empty() {
        return Ok(Vec::new());
    }
    let Some(vgpu) = &gpu.vgpu else {
        return match per_gpu {
            true => Err(VgpuTypesError::NoVgpu {
                index: gpu.index,
                product: gpu.product_name.clone(),
            }),
            false => Ok(Vec::new()),
        };
    };
    let mut out = Vec::new();
    for name in listed {
        match vgpu.type_by_name(name) {
            Some(t) if t.mig_profile.is_some() => {
                return Err(VgpuTypesError::MigBacked {
                    name: t.short_name().to_string(),
                    profile: t.mig_profile.clone().unwrap_or_default(),
                    valid: format!(
                        "{} (GPU {}): {}",
                        gpu.product_name,
                        gpu.index,
                        time_sliced(gpu)
                    ),
                });
            }
            Some(t) => out.push(t),
            None if per_gpu => {
                return Err(VgpuTypesError::UnknownType {
                    name: name.clone(),
                    on: format!("GPU {} ({})", gpu.index, gpu.product_name),
                    valid: time_sliced(gpu),
                });
            }
            None => {}
        }
    }
    Ok(out)
}

/// The first two of `offered` that the hardware never runs on one GPU together.
pub fn conflict<'g>(
    offered: &[&'g VgpuType],
    heterogeneous: bool,
) -> Option<(&'g VgpuType, &'g VgpuType)> {
    offered.iter().enumerate().find_map(|(i, a)| {
        offered[i + 1..]
            .iter()
            .find(|b| !may_share_gpu(a, b, heterogeneous))
            .map(|b| (*a, *b))
    })
}

/// Why `a` and `b` never share a GPU, in NVML's terms.
pub fn why_apart(a: &VgpuType, b: &VgpuType, heterogeneous: bool) -> String {
    if a.mig_profile.is_some() != b.mig_profile.is_some() {
        return "MIG-backed and time-sliced types never share a GPU".to_string();
    }
    for t in [a, b] {
        if t.exclusive_type {
            return format!(
                "{} is exclusive: NVML's EXCLUSIVE_TYPE capability allows no other type beside it",
                t.short_name()
            );
        }
    }
    if !heterogeneous {
        return "heterogeneous mode off".to_string();
    }
    for t in [a, b] {
        if t.exclusive_size {
            return format!(
                "{} allows no other framebuffer size beside it (EXCLUSIVE_SIZE)",
                t.short_name()
            );
        }
    }
    "the GPU's vGPU rules".to_string()
}

/// The GPUs (indices) offering one list of types, and whether they are in heterogeneous mode.
type GpusOfList = (Vec<u32>, bool);

/// `types` split into classes whose members may all share a GPU, first fit in list order.
fn classes<'g>(types: &[&'g VgpuType], heterogeneous: bool) -> Vec<Vec<&'g VgpuType>> {
    let mut out: Vec<Vec<&VgpuType>> = Vec::new();
    for t in types {
        match out
            .iter_mut()
            .find(|c| c.iter().all(|m| may_share_gpu(m, t, heterogeneous)))
        {
            Some(class) => class.push(t),
            None => out.push(vec![t]),
        }
    }
    out
}

/// Checks `types` against the node (see the module docs for what is refused); nothing is
/// refused when it is off. With `compatibility_groups`, types that may not share a GPU may
/// be listed together: the groups keep them apart.
pub fn check(
    types: &VgpuTypes,
    inventory: &NodeInventory,
    compatibility_groups: bool,
) -> Result<(), VgpuTypesError> {
    match types {
        VgpuTypes::Off => return Ok(()),
        VgpuTypes::PerGpu(map) => {
            for index in map.keys() {
                if !inventory.gpus.iter().any(|g| g.index == *index) {
                    let present: Vec<u32> = inventory.gpus.iter().map(|g| g.index).collect();
                    return Err(VgpuTypesError::NoSuchGpu {
                        index: *index,
                        present: match present.is_empty() {
                            true => "none".to_string(),
                            false => index_ranges(&present),
                        },
                    });
                }
            }
        }
        VgpuTypes::Every(names) => {
            for name in names {
                let known = inventory
                    .gpus
                    .iter()
                    .filter_map(|g| g.vgpu.as_ref())
                    .any(|v| v.type_by_name(name).is_some());
                if !known {
                    return Err(VgpuTypesError::UnknownType {
                        name: name.clone(),
                        on: "any GPU on this node".to_string(),
                        valid: valid_by_model(inventory),
                    });
                }
            }
        }
    }
    let mut offers: Vec<(&GpuInfo, Vec<&VgpuType>)> = Vec::new();
    for gpu in &inventory.gpus {
        offers.push((gpu, types_for(types, gpu)?));
    }
    if compatibility_groups {
        return Ok(());
    }
    let heterogeneous = |g: &GpuInfo| g.vgpu.as_ref().is_some_and(|v| v.heterogeneous);
    let Some((gpu, (a, b))) = offers
        .iter()
        .find_map(|(g, o)| conflict(o, heterogeneous(g)).map(|pair| (*g, pair)))
    else {
        return Ok(());
    };
    // The GPUs listing the same two types together, and a value that splits every GPU's
    // conflicting list into classes spread over its GPUs.
    let together: Vec<u32> = offers
        .iter()
        .filter(|(g, o)| {
            g.product_name == gpu.product_name
                && o.iter().any(|t| t.id == a.id)
                && o.iter().any(|t| t.id == b.id)
                && !may_share_gpu(a, b, heterogeneous(g))
        })
        .map(|(g, _)| g.index)
        .collect();
    let mut suggestion: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut left_out: Vec<String> = Vec::new();
    // Type IDs are unique per model only: GPUs are grouped by model and list.
    let mut by_list: BTreeMap<(&str, Vec<u32>), GpusOfList> = BTreeMap::new();
    for (g, offered) in &offers {
        if offered.is_empty() {
            continue;
        }
        let ids: Vec<u32> = offered.iter().map(|t| t.id).collect();
        let entry = by_list.entry((&g.product_name, ids)).or_default();
        entry.0.push(g.index);
        entry.1 = heterogeneous(g);
    }
    for ((_, ids), (gpus, het)) in by_list {
        let Some(first) = offers.iter().find(|(g, _)| g.index == gpus[0]) else {
            continue;
        };
        let offered: Vec<&VgpuType> = ids
            .iter()
            .filter_map(|id| first.1.iter().find(|t| t.id == *id).copied())
            .collect();
        let split = classes(&offered, het);
        let (k, n) = (split.len(), gpus.len());
        let mut at = 0;
        for (c, class) in split.iter().enumerate() {
            let size = match n >= k {
                true => n / k + usize::from(c < n % k),
                false => usize::from(c < n),
            };
            let names: Vec<String> = class.iter().map(|t| t.short_name().to_string()).collect();
            if size == 0 {
                left_out.extend(names);
                continue;
            }
            for index in &gpus[at..at + size] {
                suggestion.insert(*index, names.clone());
            }
            at += size;
        }
    }
    let note = match left_out.is_empty() {
        true => String::new(),
        false => format!(
            " (too few GPUs for every type: {} on another node)",
            left_out.join(",")
        ),
    };
    Err(VgpuTypesError::CannotMix {
        value: types.to_string(),
        on: format!("GPU {} ({})", index_ranges(&together), gpu.product_name),
        types: format!("{} and {}", a.short_name(), b.short_name()),
        why: why_apart(a, b, heterogeneous(gpu)),
        suggestion: format!("'{}'{note}", VgpuTypes::PerGpu(suggestion)),
    })
}

/// The time-sliced types of each GPU model of the node, one entry per model in GPU order.
fn valid_by_model(inventory: &NodeInventory) -> String {
    let mut models: Vec<(&str, Vec<u32>, String)> = Vec::new();
    for gpu in inventory.gpus.iter().filter(|g| g.vgpu.is_some()) {
        match models.iter_mut().find(|(m, _, _)| *m == gpu.product_name) {
            Some((_, indices, _)) => indices.push(gpu.index),
            None => models.push((&gpu.product_name, vec![gpu.index], time_sliced(gpu))),
        }
    }
    if models.is_empty() {
        return "none: no GPU on this node reports vGPU types (no NVIDIA vGPU manager on the host, or models without vGPU)".to_string();
    }
    models
        .iter()
        .map(|(model, indices, types)| format!("{model} (GPU {}): {types}", index_ranges(indices)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_gpu(entries: &[(u32, &[&str])]) -> VgpuTypes {
        VgpuTypes::PerGpu(
            entries
                .iter()
                .map(|(i, names)| (*i, names.iter().map(|n| n.to_string()).collect()))
                .collect(),
        )
    }

    #[test]
    fn flag_values_parse_to_off_a_list_for_every_gpu_or_lists_per_gpu() {
        let cases: [(&str, VgpuTypes); 6] = [
            ("", VgpuTypes::Off),
            (" off ", VgpuTypes::Off),
            (
                "H100-4C, H100-10C,h100-4c",
                VgpuTypes::Every(vec!["H100-4C".into(), "H100-10C".into()]),
            ),
            ("1=T4-4Q", per_gpu(&[(1, &["T4-4Q"])])),
            (
                "0-1=H100-4C;2=L40S-12Q,L40S-24Q;",
                per_gpu(&[
                    (0, &["H100-4C"]),
                    (1, &["H100-4C"]),
                    (2, &["L40S-12Q", "L40S-24Q"]),
                ]),
            ),
            ("0,2=T4-4Q", per_gpu(&[(0, &["T4-4Q"]), (2, &["T4-4Q"])])),
        ];
        for (value, want) in cases {
            assert_eq!(Ok(want), value.parse::<VgpuTypes>(), "{value:?}");
        }
    }

    #[test]
    fn malformed_values_are_refused_naming_the_flag_the_value_and_the_problem() {
        for (value, problem) in [
            ("H100-4C,", "type name 2 is empty"),
            ("0-3=H100-4C;4-7", "\"4-7\" has no '='"),
            ("x=H100-4C", "\"x\" is not a GPU index or range"),
            ("3-1=H100-4C", "\"3-1\" is not a GPU index or range"),
            ("0-3=H100-4C;3=H100-10C", "GPU index 3 is given twice"),
            ("0=", "type name 1 is empty"),
        ] {
            let text = value.parse::<VgpuTypes>().unwrap_err().to_string();
            assert!(text.starts_with("--vgpu-types"), "{text}");
            assert!(text.contains(&format!("{value:?}")), "{text}");
            assert!(text.contains(problem), "{value}: {text}");
            assert!(text.contains("0-3=H100-4C;4-7=L40S-12Q,L40S-24Q"), "{text}");
        }
    }

    #[test]
    fn values_print_back_as_they_parse_with_runs_of_gpus_as_ranges() {
        for value in [
            "",
            "H100-4C,H100-10C",
            "0-3=H100-4C;4-7=H100-10C",
            "0=T4-4Q;2-3=T4-4Q",
        ] {
            let types: VgpuTypes = value.parse().unwrap();
            assert_eq!(value, types.to_string());
        }
        assert_eq!(index_ranges(&[6, 0, 1, 2, 3, 3]), "0-3,6");
    }

    fn t(id: u32, name: &str, fb: u64, exclusive_type: bool) -> VgpuType {
        VgpuType {
            id,
            name: format!("NVIDIA {name}"),
            framebuffer_mib: fb,
            max_instances: 2,
            exclusive_type,
            exclusive_size: false,
            mig_profile: None,
        }
    }

    #[test]
    fn the_first_pair_the_hardware_keeps_apart_is_found_with_the_rule_that_does() {
        let (b1, q12, q24) = (
            t(1, "L40S-1B", 1024, true),
            t(2, "L40S-12Q", 12288, false),
            t(3, "L40S-24Q", 24576, false),
        );
        // (offered, heterogeneous mode, the pair found as IDs, the start of the rule)
        type Case<'t> = (&'t [&'t VgpuType], bool, Option<(u32, u32)>, &'t str);
        let cases: [Case; 4] = [
            (&[&q12, &q24], true, None, ""),
            (&[&q12, &q24], false, Some((2, 3)), "heterogeneous mode off"),
            (&[&q12, &b1], true, Some((2, 1)), "L40S-1B is exclusive"),
            (&[&q12], false, None, ""),
        ];
        for (offered, heterogeneous, want, why) in cases {
            let got = conflict(offered, heterogeneous);
            assert_eq!(got.map(|(a, b)| (a.id, b.id)), want, "{why}");
            if let Some((a, b)) = got {
                assert!(why_apart(a, b, heterogeneous).starts_with(why));
            }
        }
    }
}
