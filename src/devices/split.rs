//! `--mig-profiles split` (the default): the dynamic-MIG GPUs of a node share the profiles out
//! instead of each publishing every profile at every placement.
//!
//! kube-scheduler converts every device a node publishes on every node evaluation of every
//! pod, whatever the claim asks for, so the scheduling rate at 1,000 nodes follows the devices
//! per node (docs/configuration.md, "Scheduling cost of the MIG layout"; issue 46's profile of
//! the upstream allocator: about 1 µs a device a node evaluation, counter entries and bytes
//! nearly free). A DGX H100 publishing every placement of every profile shows 208 devices;
//! `split` shows 62, and every profile of the model stays claimable on the node.
//!
//! How the GPUs of one model on a node are shared out (pure: [`plan`]):
//! - every GPU keeps its full GPU and the whole-GPU profile (`7g.80gb`), one device each, so
//!   a whole-GPU claim of either kind can use any idle GPU;
//! - the other profiles form families by compute slices: the *small* family (the smallest
//!   plain profile, `1g.10gb`, the one most claims ask for), the two-slice profiles (`2g.*`),
//!   the larger ones short of the whole GPU (`3g.*`, `4g.*`), and the one-slice variants
//!   (`1g.20gb`, `1g.10gb+me`);
//! - each GPU publishes one family at every placement, plus the small profile's placements on
//!   memory slices no placement of its family reaches (`1g.10gb` at 6 beside `2g.20gb` at 0,
//!   2, 4), so every GPU can be packed full with what it offers;
//! - with G GPUs: the two-slice and the larger families get ⌊G/4⌋ GPUs each (at least one),
//!   the one-slice variants one GPU, the small family the rest; from GPU 0 up: the one-slice
//!   variants, the larger, the two-slice, the small family last; with fewer GPUs than
//!   families, the first GPU takes all the families left, and a lone GPU publishes everything.
//!
//! Why the small family sits on the last GPUs: the default `interleaved` order walks MIG
//! devices from the last GPU down (and whole GPUs from GPU 0 up), so a claim for the small
//! profile, the commonest, meets a device it can take at the head of the walk, as with `all`:
//! three selector evaluations a node evaluation on an idle node, each of which costs
//! kube-scheduler about 18 µs (issue 46's profile), as much as 26 devices published.
//!
//! What it costs: a node holds fewer instances of each profile than the hardware could pack
//! (on a DGX H100: 23 × `1g.10gb` instead of 56, 6 × `2g.20gb` instead of 24, 4 × `3g.40gb`
//! instead of 16, 2 × `4g.40gb`, 4 × `1g.20gb`, 1 × `1g.10gb+me`; `7g.80gb` and full GPUs
//! unchanged). A cluster that hands out mostly one mid-size profile lists it instead
//! (`--mig-profiles 3g.40gb,7g.80gb`), and `--mig-profiles all` publishes everything.

use std::collections::{BTreeMap, BTreeSet};

use crate::hardware::{GpuInfo, MigProfile};

/// One published placement: profile name and start.
pub type Placement = (String, u32);

/// The placements each GPU of `gpus` publishes under `split`, by PCI bus ID. `gpus` are the
/// node's dynamic-MIG GPUs, those NVML lists and those it stopped listing because they went
/// to `vfio-pci`: roles follow PCI address order among all of them, so a GPU moving to a VM
/// and back, which shifts NVML's indices, changes no other GPU's role. GPUs of different
/// models are shared out separately (their profiles differ). A GPU without MIG profiles gets
/// an empty list.
pub fn plan(gpus: &[&GpuInfo]) -> BTreeMap<String, Vec<Placement>> {
    let mut by_model: BTreeMap<&str, Vec<&GpuInfo>> = BTreeMap::new();
    for gpu in gpus {
        by_model.entry(&gpu.product_name).or_default().push(gpu);
    }
    let mut out = BTreeMap::new();
    for (_, mut group) in by_model {
        group.sort_by_key(|g| crate::hardware::passthrough::normalize_address(&g.pci_bus_id));
        group.dedup_by_key(|g| crate::hardware::passthrough::normalize_address(&g.pci_bus_id));
        let Some(first) = group.first() else { continue };
        let families = families(&first.mig_profiles);
        let roles = assign(group.len(), families.len());
        for (gpu, role) in group.iter().zip(roles) {
            out.insert(
                crate::hardware::passthrough::normalize_address(&gpu.pci_bus_id),
                placements(&gpu.mig_profiles, &families, &role),
            );
        }
    }
    out
}

/// The order in which whole-GPU claims (a full GPU, the whole-GPU profile, a VFIO device)
/// should take the GPUs of `plan` ([`plan`] of `gpus`), by PCI address. At each step, the GPU
/// whose loss costs the node least, judged in this order:
/// 1. the fewest profiles left without a placement on the GPUs not yet taken, and of equal
///    counts one that keeps the small profile (`1g.10gb`, the one most claims ask for);
/// 2. the most of every profile left, as the list of each profile's share of its placements,
///    smallest first;
/// 3. the most of the small profile left.
///
/// So the first whole-GPU claims take GPUs of the families the node has most of, spread over
/// the families (DGX H100: a small-family GPU, a two-slice one, a larger one, then the small
/// family again), and a profile disappears only when no other order could keep it. Measured
/// under MIG churn (`cargo bench --bench churn`), it places `4g.40gb` and `7g.80gb` as
/// `7g.80gb` claims walking from the last GPU down did, within about a point at each load
/// (moderate: 77.0 % against 77.1 % for `4g.40gb`), where ranking the small profile's share
/// second cost `4g.40gb` 4 points at moderate load (72.7 %). Ties
/// go to the lower PCI address: the far end from where the MIG walk starts (the last GPU),
/// so whole-GPU claims and small MIG claims fill a family from opposite ends. GPUs of
/// different models rank together; their profiles differ, so each GPU's loss counts only
/// against its own model's. Were every GPU to offer the same (as under `all`), all would
/// tie, which gives PCI order.
pub fn whole_order(gpus: &[&GpuInfo], plan: &BTreeMap<String, Vec<Placement>>) -> Vec<String> {
    let small: BTreeSet<String> = gpus
        .iter()
        .filter_map(|g| families(&g.mig_profiles).first()?.first().cloned())
        .collect();
    // Placements of each profile per GPU; the whole-GPU profile counts too (every GPU has
    // one, so it never decides).
    let per_gpu: BTreeMap<&str, BTreeMap<&str, usize>> = plan
        .iter()
        .map(|(address, placements)| {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for (profile, _) in placements {
                *counts.entry(profile.as_str()).or_default() += 1;
            }
            (address.as_str(), counts)
        })
        .collect();
    let mut total: BTreeMap<&str, usize> = BTreeMap::new();
    for counts in per_gpu.values() {
        for (profile, n) in counts {
            *total.entry(profile).or_default() += n;
        }
    }
    let mut left = total.clone();
    let mut remaining: Vec<&str> = per_gpu.keys().copied().collect();
    let mut order = Vec::with_capacity(remaining.len());
    // What is left once `taken` is gone too, as the key above (greater is better); shares in
    // parts per million, so that they compare exactly.
    let after = |left: &BTreeMap<&str, usize>, taken: &str| {
        let share = |profile: &str, n: usize| {
            let gone = per_gpu[taken].get(profile).copied().unwrap_or(0);
            (n - gone) as u64 * 1_000_000 / total[profile].max(1) as u64
        };
        let mut shares: Vec<u64> = left.iter().map(|(p, &n)| share(p, n)).collect();
        shares.sort_unstable();
        let lost = shares.iter().filter(|&&s| s == 0).count();
        let small_left = left
            .iter()
            .filter(|(p, _)| small.contains(**p))
            .map(|(p, &n)| share(p, n))
            .min();
        let small_kept = small_left.is_none_or(|left| left > 0);
        (std::cmp::Reverse(lost), small_kept, shares, small_left)
    };
    while !remaining.is_empty() {
        // `max_by` keeps the last of equals: walk from the highest address down, so the
        // lowest wins a tie.
        let Some((at, _)) = remaining
            .iter()
            .enumerate()
            .rev()
            .map(|(i, gpu)| (i, after(&left, gpu)))
            .max_by(|a, b| a.1.cmp(&b.1))
        else {
            break;
        };
        let gpu = remaining.remove(at);
        for (profile, n) in &per_gpu[gpu] {
            if let Some(l) = left.get_mut(profile) {
                *l -= n;
            }
        }
        order.push(gpu.to_string());
    }
    order
}

/// The profiles of one family, by name.
type Family = Vec<String>;

/// The families of a model's profiles: `[small, two-slice, larger, one-slice variants]`,
/// empty families left out (the small family is always first when the model has MIG), and
/// the whole-GPU profile in none of them (every GPU publishes it).
fn families(profiles: &[MigProfile]) -> Vec<Family> {
    let Some(max_cs) = profiles.iter().map(|p| p.compute_slices).max() else {
        return Vec::new();
    };
    let Some(small) = profiles
        .iter()
        .filter(|p| !p.name.contains('+'))
        .min_by_key(|p| {
            (
                p.compute_slices,
                p.memory_mib,
                u32::MAX - p.placement_starts.len() as u32,
            )
        })
    else {
        return Vec::new();
    };
    let rest = |keep: &dyn Fn(&MigProfile) -> bool| -> Family {
        profiles
            .iter()
            .filter(|p| p.name != small.name && p.compute_slices < max_cs && keep(p))
            .map(|p| p.name.clone())
            .collect()
    };
    let two = rest(&|p| p.compute_slices == 2);
    let larger = rest(&|p| p.compute_slices > 2);
    let variants = rest(&|p| p.compute_slices == 1);
    std::iter::once(vec![small.name.clone()])
        .chain([two, larger, variants])
        .filter(|f| !f.is_empty())
        .collect()
}

/// Which families each of `gpus` GPUs publishes, by position: family indices.
fn assign(gpus: usize, families: usize) -> Vec<BTreeSet<usize>> {
    if families == 0 {
        return vec![BTreeSet::new(); gpus];
    }
    if gpus <= 1 {
        return vec![(0..families).collect(); gpus];
    }
    if gpus < families {
        // One family a GPU from the small one up; the last GPU takes the rest.
        let mut out: Vec<BTreeSet<usize>> = (0..gpus)
            .map(|i| {
                if i + 1 == gpus {
                    (i..families).collect()
                } else {
                    BTreeSet::from([i])
                }
            })
            .collect();
        out.reverse();
        return out;
    }
    // Counts for families 1.. (the last one, the one-slice variants, gets one GPU when the
    // model has four families); the small family takes what is left.
    let quarter = (gpus / 4).max(1);
    let mut counts: Vec<usize> = (1..families)
        .map(|f| if families == 4 && f == 3 { 1 } else { quarter })
        .collect();
    while counts.iter().sum::<usize>() >= gpus {
        // Never take the small family's last GPU.
        let Some(max) = counts.iter_mut().max() else {
            break;
        };
        *max -= 1;
    }
    let small = gpus - counts.iter().sum::<usize>();
    let mut out = vec![BTreeSet::from([0]); small];
    for (f, &count) in counts.iter().enumerate() {
        out.extend(std::iter::repeat_n(BTreeSet::from([f + 1]), count));
    }
    out.reverse();
    out
}

/// The memory slices a placement covers.
fn span(profile: &MigProfile, start: u32) -> std::ops::Range<u32> {
    start..start + profile.memory_slices
}

/// A GPU's placements for `role`: the whole-GPU profile, every placement of its families'
/// profiles, and the small profile's placements clear of those.
fn placements(
    profiles: &[MigProfile],
    families: &[Family],
    role: &BTreeSet<usize>,
) -> Vec<Placement> {
    let Some(max_cs) = profiles.iter().map(|p| p.compute_slices).max() else {
        return Vec::new();
    };
    let named: BTreeSet<&str> = role
        .iter()
        .flat_map(|f| families[*f].iter().map(String::as_str))
        .collect();
    let mut covered = BTreeSet::new();
    for p in profiles.iter().filter(|p| named.contains(p.name.as_str())) {
        for &start in &p.placement_starts {
            covered.extend(span(p, start));
        }
    }
    let small = families.first().and_then(|f| f.first());
    let mut out = Vec::new();
    // In the model's profile order, so the device order within a GPU is what `all` gives.
    for p in profiles {
        let whole = p.compute_slices == max_cs;
        let listed = named.contains(p.name.as_str());
        for &start in &p.placement_starts {
            let filler =
                Some(&p.name) == small && !listed && span(p, start).all(|s| !covered.contains(&s));
            if whole || listed || filler {
                out.push((p.name.clone(), start));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::GpuBackend;
    use crate::hardware::sim::SimBackend;

    fn gpus(preset: &str) -> Vec<GpuInfo> {
        SimBackend::open(preset, None)
            .unwrap()
            .inventory()
            .unwrap()
            .gpus
    }

    fn count(plan: &BTreeMap<String, Vec<Placement>>, profile: &str) -> usize {
        plan.values()
            .flatten()
            .filter(|(p, _)| p == profile)
            .count()
    }

    #[test]
    fn a_dgx_h100_publishes_54_mig_devices_every_profile_and_the_small_one_last() {
        let gpus = gpus("dgx-h100");
        let refs: Vec<&GpuInfo> = gpus.iter().collect();
        let plan = plan(&refs);
        let per_gpu: Vec<usize> = plan.values().map(Vec::len).collect();
        // GPU 0: 7g + 4 × 1g.20gb + 7 × 1g.10gb+me; 3g/4g GPUs: 7g + 2 × 3g + 4g; 2g GPUs:
        // 7g + 3 × 2g + 1g at 6; the last three: 7g + 7 × 1g.
        assert_eq!(per_gpu, [12, 4, 4, 5, 5, 8, 8, 8]);
        for profile in &gpus[0].mig_profiles {
            assert!(count(&plan, &profile.name) > 0, "{} missing", profile.name);
        }
        assert_eq!(count(&plan, "1g.10gb"), 23);
        assert_eq!(count(&plan, "2g.20gb"), 6);
        assert_eq!(count(&plan, "3g.40gb"), 4);
        assert_eq!(count(&plan, "7g.80gb"), 8);
    }

    #[test]
    fn whole_gpu_claims_take_the_families_a_node_has_most_of_first_and_the_small_one_last() {
        let gpus = gpus("dgx-h100");
        let refs: Vec<&GpuInfo> = gpus.iter().collect();
        let plan = plan(&refs);
        let index = |address: &String| {
            gpus.iter()
                .position(|g| {
                    crate::hardware::passthrough::normalize_address(&g.pci_bus_id) == *address
                })
                .unwrap()
        };
        let order: Vec<usize> = whole_order(&refs, &plan).iter().map(index).collect();
        // 1-2: 3g/4g, 3-4: 2g, 5-7: 1g.10gb, 0: the one-slice variants. Four GPUs go before
        // any family is gone, one of each family with two or more first.
        assert_eq!(order[..5], [5, 3, 1, 6, 7]);
        assert_eq!(order.len(), 8);
        // GPUs that offer the same tie, and ties go by PCI address.
        let same: BTreeMap<String, Vec<Placement>> = plan
            .keys()
            .map(|a| (a.clone(), vec![("1g.10gb".to_string(), 0)]))
            .collect();
        let order: Vec<usize> = whole_order(&refs, &same).iter().map(index).collect();
        assert_eq!(order, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn fewer_gpus_than_families_merge_into_the_last_and_a_lone_gpu_offers_everything() {
        assert_eq!(assign(1, 4), vec![BTreeSet::from([0, 1, 2, 3])]);
        assert_eq!(
            assign(2, 4),
            vec![BTreeSet::from([1, 2, 3]), BTreeSet::from([0])]
        );
        assert_eq!(
            assign(4, 4),
            vec![
                BTreeSet::from([3]),
                BTreeSet::from([2]),
                BTreeSet::from([1]),
                BTreeSet::from([0])
            ]
        );
        let sixteen = assign(16, 4);
        assert_eq!(sixteen.iter().filter(|r| r.contains(&0)).count(), 7);
        assert_eq!(sixteen.len(), 16);
    }

    #[test]
    fn every_gpu_of_an_a30_node_can_still_be_packed_full() {
        let gpus = gpus("a30-x4");
        let refs: Vec<&GpuInfo> = gpus.iter().collect();
        let plan = plan(&refs);
        for (address, placements) in &plan {
            let gpu = gpus
                .iter()
                .find(|g| {
                    crate::hardware::passthrough::normalize_address(&g.pci_bus_id) == *address
                })
                .unwrap();
            let mut slices = BTreeSet::new();
            for (name, start) in placements {
                let p = gpu.profile_by_name(name).unwrap();
                slices.extend(span(p, *start));
            }
            assert_eq!(
                slices.len() as u32,
                gpu.memory_slices,
                "GPU {address}: {placements:?}"
            );
        }
    }
}
