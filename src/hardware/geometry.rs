//! MIG placement rules, pure: which GPU instances can sit side by side on one GPU.
//!
//! The rules are those of the driver as `reference/mig-profiles.md` records them: a GPU
//! instance occupies the memory slices of its placement and creation fails on overlap; each
//! profile has an instance-count limit; and the GPU has a single optical-flow accelerator
//! (with the JPEG engine on Ampere), so at most one GPU instance that holds it (a `+me`
//! profile, or the full-GPU profile) exists at a time. The simulator enforces these rules and
//! the device model derives its shared counters from them.

use super::{MigProfile, Placement};

/// A GPU instance that exists (or is planned) on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupant<'a> {
    /// Its profile.
    pub profile: &'a MigProfile,
    /// Where it sits.
    pub placement: Placement,
}

/// Why a GPU instance cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementConflict {
    /// The profile does not allow this start (NVML: INVALID_ARGUMENT).
    InvalidStart {
        /// Starts the profile allows.
        valid: Vec<u32>,
    },
    /// Another GPU instance occupies some of the memory slices (INSUFFICIENT_RESOURCES).
    Overlaps {
        /// The occupant's profile name.
        profile: String,
        /// The occupant's placement.
        placement: Placement,
    },
    /// The profile's instance limit is reached (INSUFFICIENT_RESOURCES).
    MaxInstances {
        /// The limit.
        max: u32,
    },
    /// The GPU's single optical-flow/JPEG engine is held by another instance
    /// (INSUFFICIENT_RESOURCES).
    MediaEnginesTaken {
        /// The holder's profile name.
        profile: String,
        /// The holder's placement.
        placement: Placement,
    },
}

impl std::fmt::Display for PlacementConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlacementConflict::InvalidStart { valid } => {
                let valid: Vec<String> = valid.iter().map(u32::to_string).collect();
                write!(
                    f,
                    "the profile allows placement starts {} only",
                    valid.join(", ")
                )
            }
            PlacementConflict::Overlaps { profile, placement } => write!(
                f,
                "memory slices overlap {profile} at {}:{}",
                placement.start, placement.size
            ),
            PlacementConflict::MaxInstances { max } => {
                write!(f, "the profile's limit of {max} instance(s) is reached")
            }
            PlacementConflict::MediaEnginesTaken { profile, placement } => write!(
                f,
                "the GPU's single OFA/JPEG media engine is held by {profile} at {}:{}",
                placement.start, placement.size
            ),
        }
    }
}

/// The largest optical-flow count a single profile of this GPU has: the number of OFA
/// engines the GPU can hand out (1 on every MIG GPU in the table).
fn ofa_capacity(profiles: &[MigProfile]) -> u32 {
    profiles.iter().map(|p| p.ofa_engines).max().unwrap_or(0)
}

/// Checks whether a GPU instance of `profile` can be created at `start` next to `existing`.
///
/// `all_profiles` is every profile of the GPU (it bounds the media engines).
pub fn check_placement(
    all_profiles: &[MigProfile],
    existing: &[Occupant<'_>],
    profile: &MigProfile,
    start: u32,
) -> Result<Placement, PlacementConflict> {
    if !profile.allows_start(start) {
        return Err(PlacementConflict::InvalidStart {
            valid: profile.placement_starts.clone(),
        });
    }
    let placement = Placement {
        start,
        size: profile.memory_slices,
    };
    if let Some(other) = existing.iter().find(|o| o.placement.overlaps(&placement)) {
        return Err(PlacementConflict::Overlaps {
            profile: other.profile.name.clone(),
            placement: other.placement,
        });
    }
    let same = existing
        .iter()
        .filter(|o| o.profile.id == profile.id)
        .count() as u32;
    if same >= profile.max_instances {
        return Err(PlacementConflict::MaxInstances {
            max: profile.max_instances,
        });
    }
    if profile.ofa_engines > 0 {
        let used: u32 = existing.iter().map(|o| o.profile.ofa_engines).sum();
        if used + profile.ofa_engines > ofa_capacity(all_profiles)
            && let Some(holder) = existing.iter().find(|o| o.profile.ofa_engines > 0)
        {
            return Err(PlacementConflict::MediaEnginesTaken {
                profile: holder.profile.name.clone(),
                placement: holder.placement,
            });
        }
    }
    Ok(placement)
}

/// Chooses placements for `wanted` GPU instances (each with an optional fixed start) next to
/// `existing`, the way `nvidia-smi mig -cgi` without placements fills a GPU: larger profiles
/// first, each at the highest free start, backtracking when a choice leaves no room for a
/// later one. Returns placements in the order of `wanted`, or `None` when no layout fits.
pub fn fill_placements(
    all_profiles: &[MigProfile],
    existing: &[Occupant<'_>],
    wanted: &[(&MigProfile, Option<u32>)],
) -> Option<Vec<Placement>> {
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    // Fixed starts first, then by size descending, so the search is small and deterministic.
    order.sort_by_key(|&i| {
        let (p, fixed) = wanted[i];
        (
            fixed.is_none(),
            std::cmp::Reverse(p.memory_slices),
            std::cmp::Reverse(p.compute_slices),
            i,
        )
    });
    let mut placed: Vec<Occupant<'_>> = existing.to_vec();
    let mut chosen: Vec<Option<Placement>> = vec![None; wanted.len()];
    if search(all_profiles, wanted, &order, 0, &mut placed, &mut chosen) {
        chosen.into_iter().collect()
    } else {
        None
    }
}

fn search<'a>(
    all_profiles: &[MigProfile],
    wanted: &[(&'a MigProfile, Option<u32>)],
    order: &[usize],
    depth: usize,
    placed: &mut Vec<Occupant<'a>>,
    chosen: &mut [Option<Placement>],
) -> bool {
    let Some(&i) = order.get(depth) else {
        return true;
    };
    let (profile, fixed) = wanted[i];
    let starts: Vec<u32> = match fixed {
        Some(start) => vec![start],
        None => profile.placement_starts.iter().rev().copied().collect(),
    };
    for start in starts {
        if let Ok(placement) = check_placement(all_profiles, placed, profile, start) {
            placed.push(Occupant { profile, placement });
            chosen[i] = Some(placement);
            if search(all_profiles, wanted, order, depth + 1, placed, chosen) {
                return true;
            }
            placed.pop();
            chosen[i] = None;
        }
    }
    false
}

/// Largest sums of each resource over every valid set of GPU instances on one GPU. These are
/// the totals of the GPU's shared counters: with them, the counters never refuse a layout the
/// hardware accepts, while the single media engine stays exclusive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigTotals {
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Decoders.
    pub decoders: u32,
    /// Encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
}

/// Computes [`MigTotals`] by enumerating every valid set of GPU instances (a few thousand at
/// most on an 8-slice GPU).
pub fn max_totals(profiles: &[MigProfile]) -> MigTotals {
    let mut totals = MigTotals::default();
    let mut placed: Vec<Occupant<'_>> = Vec::new();
    let candidates: Vec<(&MigProfile, u32)> = profiles
        .iter()
        .flat_map(|p| p.placement_starts.iter().map(move |&s| (p, s)))
        .collect();
    enumerate(profiles, &candidates, 0, &mut placed, &mut totals);
    totals
}

fn enumerate<'a>(
    profiles: &[MigProfile],
    candidates: &[(&'a MigProfile, u32)],
    from: usize,
    placed: &mut Vec<Occupant<'a>>,
    totals: &mut MigTotals,
) {
    let sum = |f: fn(&MigProfile) -> u32| placed.iter().map(|o| f(o.profile)).sum::<u32>();
    totals.memory_mib = totals
        .memory_mib
        .max(placed.iter().map(|o| o.profile.memory_mib).sum());
    totals.multiprocessors = totals.multiprocessors.max(sum(|p| p.multiprocessors));
    totals.copy_engines = totals.copy_engines.max(sum(|p| p.copy_engines));
    totals.decoders = totals.decoders.max(sum(|p| p.decoders));
    totals.encoders = totals.encoders.max(sum(|p| p.encoders));
    totals.jpeg_engines = totals.jpeg_engines.max(sum(|p| p.jpeg_engines));
    totals.ofa_engines = totals.ofa_engines.max(sum(|p| p.ofa_engines));
    for (i, &(profile, start)) in candidates.iter().enumerate().skip(from) {
        if let Ok(placement) = check_placement(profiles, placed, profile, start) {
            placed.push(Occupant { profile, placement });
            enumerate(profiles, candidates, i + 1, placed, totals);
            placed.pop();
        }
    }
}
