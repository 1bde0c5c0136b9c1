//! Packing order, pure: the order in which a dynamic-MIG GPU's placements are published.
//!
//! The Kubernetes allocator takes the first device that fits, in slice order, so the order of
//! devices is the packing policy. Two rules follow from it:
//!
//! * **One GPU before the next.** Devices stay grouped by GPU, in GPU order (as
//!   [`super::build`] emits them), so a request tries every placement of the first GPU with
//!   room before it touches the next: small claims pile onto GPUs that are already carved and
//!   leave the others whole.
//! * **Small where they block big ones least.** Within a GPU, a profile's placements are
//!   ranked by what they leave for the larger profiles, computed from the GPU's own placement
//!   table: a placement that keeps more instances of the largest profile placeable comes first,
//!   ties go to the next largest profile, and so on; remaining ties go to the higher start (the
//!   end the driver itself fills from). On an 8-slice GPU this puts `1g` at slice 6 first
//!   (slice 7 serves only size-2 profiles and up), keeps slices 0–3 free for `4g` as long as
//!   the upper half has room, and tries `3g` at 4 before 0.
//!
//! Only the order within a profile changes: profiles stay in table order (smallest first),
//! names and attributes stay exactly as they are.
//!
//! kube-scheduler (1.36 and later, with its default feature gates) walks a pool's slices in
//! name order, so the order holds across the node; the `stable` allocator, which it runs when
//! the binding-conditions and consumable-capacity gates are off, and 1.35 and before walk the
//! slices in the cache's order, arbitrary and new each call, where the order holds within a
//! slice only: `cargo bench --bench churn` measures both walks (docs/device-model.md,
//! "Packing order (dynamic MIG)").

use std::cmp::Reverse;

use super::{DeviceKind, PublishedDevice};
use crate::hardware::geometry::{Occupant, check_placement};
use crate::hardware::{MigProfile, NodeInventory, Placement};

/// The starts of `profile`'s placements in packing order (see the module docs): first the
/// placement that leaves the most room for larger profiles of the same GPU.
///
/// `all_profiles` is every profile of the GPU, `profile` among them. Starts the profile allows
/// are all returned, each once.
pub fn placement_order(all_profiles: &[MigProfile], profile: &MigProfile) -> Vec<u32> {
    let mut larger: Vec<&MigProfile> = all_profiles
        .iter()
        .filter(|q| size(q) > size(profile))
        .collect();
    larger.sort_by_key(|q| Reverse(size(q)));
    let mut ranked: Vec<(Vec<u32>, u32)> = profile
        .placement_starts
        .iter()
        .map(|&start| {
            let occupant = Occupant {
                profile,
                placement: Placement {
                    start,
                    size: profile.memory_slices,
                },
            };
            let room = larger
                .iter()
                .map(|q| placeable(all_profiles, occupant, q))
                .collect();
            (room, start)
        })
        .collect();
    ranked.sort_by(|a, b| b.cmp(a));
    let mut starts: Vec<u32> = ranked.into_iter().map(|(_, start)| start).collect();
    starts.dedup();
    starts
}

/// How big a profile is for packing: memory slices, then compute slices, then memory.
fn size(p: &MigProfile) -> (u32, u32, u64) {
    (p.memory_slices, p.compute_slices, p.memory_mib)
}

/// How many instances of `q` still fit next to `occupant` on an otherwise idle GPU. A
/// profile's placements are equally sized and aligned, so taking them greedily finds the most.
fn placeable(all_profiles: &[MigProfile], occupant: Occupant<'_>, q: &MigProfile) -> u32 {
    let mut placed = vec![occupant];
    for &start in &q.placement_starts {
        if let Ok(placement) = check_placement(all_profiles, &placed, q, start) {
            placed.push(Occupant {
                profile: q,
                placement,
            });
        }
    }
    placed.len() as u32 - 1
}

/// Reorders each dynamic-MIG GPU's placements of every profile into [`placement_order`],
/// leaving everything else where it is: GPUs, the full GPU, static MIG devices and the order
/// of profiles. Devices of GPUs the inventory does not list are left alone.
pub fn order(devices: &mut [PublishedDevice], inventory: &NodeInventory) {
    let mut from = 0;
    while from < devices.len() {
        let gpu_index = devices[from].gpu_index;
        let len = devices[from..]
            .iter()
            .take_while(|d| d.gpu_index == gpu_index)
            .count();
        let run = &mut devices[from..from + len];
        from += len;
        let Some(gpu) = inventory.gpus.iter().find(|g| g.index == gpu_index) else {
            continue;
        };
        let ranks: Vec<(u32, Vec<u32>)> = gpu
            .mig_profiles
            .iter()
            .map(|p| (p.id, placement_order(&gpu.mig_profiles, p)))
            .collect();
        let rank = |d: &PublishedDevice| match &d.kind {
            DeviceKind::MigDynamic {
                profile_id,
                placement,
                ..
            } => ranks.iter().position(|(id, _)| id == profile_id).map(|p| {
                let within = ranks[p].1.iter().position(|s| *s == placement.start);
                (p, within.unwrap_or(usize::MAX))
            }),
            _ => None,
        };
        // Only the dynamic placements move, among the positions they already occupy.
        reorder_among(
            run,
            |d| rank(d).is_some(),
            |moved| moved.sort_by_key(|d| rank(d)),
        );
    }
}

/// Under `--mig-profiles split`: the whole GPUs, the VFIO devices and the MIG devices of the
/// whole-GPU profile, each kind reordered among the positions it holds by `rank` (the GPU's
/// place in [`super::split::whole_order`]), so a whole-GPU claim of any kind meets the GPUs
/// in that order. Devices `rank` gives no place keep theirs; equal ranks keep their order.
pub fn whole_order(
    devices: &mut [PublishedDevice],
    rank: &dyn Fn(&PublishedDevice) -> Option<usize>,
) {
    let kinds: [fn(&PublishedDevice) -> bool; 3] = [
        |d| matches!(d.kind, DeviceKind::Gpu),
        |d| matches!(d.kind, DeviceKind::Vfio { .. }),
        |d| matches!(d.kind, DeviceKind::MigDynamic { .. }),
    ];
    for kind in kinds {
        reorder_among(
            devices,
            |d| kind(d) && rank(d).is_some(),
            |moved| moved.sort_by_key(|d| rank(d)),
        );
    }
}

/// The devices `which` selects, reordered by `order` among the positions they hold; every
/// other device keeps its place. `order` must return the same devices (a permutation).
fn reorder_among(
    devices: &mut [PublishedDevice],
    which: impl Fn(&PublishedDevice) -> bool,
    order: impl FnOnce(&mut Vec<PublishedDevice>),
) {
    let at: Vec<usize> = (0..devices.len()).filter(|&i| which(&devices[i])).collect();
    let mut moved: Vec<PublishedDevice> = at.iter().map(|&i| devices[i].clone()).collect();
    order(&mut moved);
    for (i, d) in at.into_iter().zip(moved) {
        devices[i] = d;
    }
}

/// On a Fabric Manager node, the whole GPUs, and apart from them the VFIO devices, reordered
/// among the positions they hold by [`free_partitions_first`] over their `gpuModuleID`:
/// GPUs of free partitions first, so kube-scheduler's first-fit walk reaches a free partition
/// before a GPU of a busy one (see [`crate::fabric_manager::order`] for the upstream quirk
/// that makes this necessary). Everything else stays where it is; with nothing `busy` the
/// order does not change. Devices without a module ID keep their places.
///
/// [`free_partitions_first`]: crate::fabric_manager::order::free_partitions_first
pub fn fabric_order(
    devices: &mut [PublishedDevice],
    table: &crate::fabric_manager::PartitionTable,
    busy: &std::collections::BTreeSet<u32>,
) {
    let module = |d: &PublishedDevice| -> Option<u32> {
        let attrs = d.device.attributes.as_ref()?;
        let id = attrs
            .get(crate::fabric_manager::partitions::MODULE_ATTRIBUTE)?
            .int?;
        u32::try_from(id).ok()
    };
    let whole = |d: &PublishedDevice| matches!(d.kind, DeviceKind::Gpu);
    let vfio = |d: &PublishedDevice| matches!(d.kind, DeviceKind::Vfio { .. });
    for kind in [&whole as &dyn Fn(&PublishedDevice) -> bool, &vfio] {
        reorder_among(
            devices,
            |d| kind(d) && module(d).is_some(),
            |moved| {
                let modules: Vec<u32> = moved.iter().filter_map(module).collect();
                let wanted =
                    crate::fabric_manager::order::free_partitions_first(table, &modules, busy);
                let mut rest = std::mem::take(moved);
                for m in wanted {
                    if let Some(at) = rest.iter().position(|d| module(d) == Some(m)) {
                        moved.push(rest.remove(at));
                    }
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::catalog;

    fn orders(model: &str) -> Vec<(String, Vec<u32>)> {
        let profiles = &catalog::model(model).unwrap().profiles;
        profiles
            .iter()
            .map(|p| (p.name.clone(), placement_order(profiles, p)))
            .collect()
    }

    fn want(rows: &[(&str, &[u32])]) -> Vec<(String, Vec<u32>)> {
        rows.iter()
            .map(|(name, starts)| (name.to_string(), starts.to_vec()))
            .collect()
    }

    #[test]
    fn h100_placements_fill_the_upper_half_first_and_slice_six_before_the_rest() {
        assert_eq!(
            orders("h100"),
            want(&[
                ("1g.10gb", &[6, 5, 4, 3, 2, 1, 0]),
                ("1g.10gb+me", &[6, 5, 4, 3, 2, 1, 0]),
                ("1g.20gb", &[6, 4, 2, 0]),
                ("2g.20gb", &[4, 2, 0]),
                ("3g.40gb", &[4, 0]),
                ("4g.40gb", &[0]),
                ("7g.80gb", &[0]),
            ])
        );
    }

    #[test]
    fn a100_40gb_keeps_the_4g_half_free_as_long_as_the_upper_half_has_room() {
        let got = orders("a100-40gb");
        let get = |name: &str| got.iter().find(|(n, _)| n == name).unwrap().1.clone();
        assert_eq!(get("1g.5gb"), [6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(get("1g.10gb"), [6, 4, 2, 0]);
        assert_eq!(get("2g.10gb"), [4, 2, 0]);
        assert_eq!(get("3g.20gb"), [4, 0]);
        assert_eq!(get("4g.20gb"), [0]);
    }

    #[test]
    fn a30_small_profiles_take_the_upper_half_first() {
        let got = orders("a30");
        let get = |name: &str| got.iter().find(|(n, _)| n == name).unwrap().1.clone();
        assert_eq!(get("1g.6gb"), [3, 2, 1, 0]);
        assert_eq!(get("2g.12gb"), [2, 0]);
        assert_eq!(get("4g.24gb"), [0]);
    }

    #[test]
    fn every_model_orders_each_allowed_start_exactly_once() {
        for model in catalog::models().unwrap() {
            for p in &model.profiles {
                let mut got = placement_order(&model.profiles, p);
                got.sort_unstable();
                let mut starts = p.placement_starts.clone();
                starts.sort_unstable();
                assert_eq!(got, starts, "{} {}", model.key, p.name);
            }
        }
    }

    #[test]
    fn the_first_placement_leaves_the_largest_smaller_profile_placeable_wherever_possible() {
        // For every profile of every model, the first placement keeps at least as many
        // instances of each larger profile placeable as the last one does, biggest first.
        for model in catalog::models().unwrap() {
            let all = &model.profiles;
            for p in all {
                let order = placement_order(all, p);
                let room = |start: u32| -> Vec<u32> {
                    let mut larger: Vec<&MigProfile> =
                        all.iter().filter(|q| size(q) > size(p)).collect();
                    larger.sort_by_key(|q| Reverse(size(q)));
                    let occupant = Occupant {
                        profile: p,
                        placement: Placement {
                            start,
                            size: p.memory_slices,
                        },
                    };
                    larger.iter().map(|q| placeable(all, occupant, q)).collect()
                };
                for pair in order.windows(2) {
                    assert!(
                        room(pair[0]) >= room(pair[1]),
                        "{} {}: {} before {}",
                        model.key,
                        p.name,
                        pair[0],
                        pair[1]
                    );
                }
            }
        }
    }
}
