//! Fragmentation of one dynamic-MIG GPU: its free memory slices, and for every profile that
//! no longer fits, the allocated devices in the way of its most nearly free placement.

use super::counters::{Book, Dev};
use super::{BlockedProfile, Blocker};
use crate::quantity::Quantity;

/// The memory slices whose counter still has room, ascending.
pub(super) fn free_memory_slices(book: &Book, left: &[Quantity]) -> Vec<u32> {
    book.memory_slices
        .iter()
        .enumerate()
        .filter_map(|(n, i)| {
            let i = (*i)?;
            (left[i] > Quantity::from_i64(0)).then_some(n as u32)
        })
        .collect()
}

/// What keeps `profile` out of the GPU: among its placements, the one with the
/// fewest allocated devices consuming a counter it is short of, then the fewest slices and
/// counters they hold (the lowest start among equals, as `devices` are sorted by placement). `None` when no placement is blocked by an
/// allocation (none published, or every one held itself).
pub(super) fn blocked(
    devices: &[Dev],
    book: &Book,
    left: &[Quantity],
    profile: &str,
) -> Option<BlockedProfile> {
    let mut best: Option<BlockedProfile> = None;
    for dev in devices.iter().filter(|d| d.profile == profile) {
        let mut short: Vec<usize> = dev
            .uses
            .iter()
            .filter(|(i, amount)| left[*i] < *amount)
            .map(|(i, _)| *i)
            .collect();
        // Taken memory slices explain the conflict; the engine and sum counters they leave
        // short follow from them. Only with every slice free does another counter block.
        let is_slice = |i: &usize| book.memory_slices.contains(&Some(*i));
        if short.iter().any(is_slice) {
            short.retain(is_slice);
        }
        let blocked_by: Vec<Blocker> = devices
            .iter()
            .filter(|held| held.holders.is_some())
            .filter_map(|held| blocker(book, &short, held))
            .collect();
        let fewer = best
            .as_ref()
            .is_none_or(|b| cost(&blocked_by) < cost(&b.blocked_by));
        if let Some(placement) = dev.placement
            && !blocked_by.is_empty()
            && fewer
        {
            best = Some(BlockedProfile {
                profile: profile.to_string(),
                placement,
                blocked_by,
            });
        }
    }
    best
}

/// How much must be released: devices, then the slices and counters they hold.
fn cost(blockers: &[Blocker]) -> (usize, usize) {
    let held = blockers
        .iter()
        .map(|b| b.slices.len() + b.counters.len())
        .sum();
    (blockers.len(), held)
}

/// `held` as a blocker of a placement short of the counters `short`, if it consumes any.
fn blocker(book: &Book, short: &[usize], held: &Dev) -> Option<Blocker> {
    let (mut slices, mut counters) = (Vec::new(), Vec::new());
    for (i, amount) in &held.uses {
        if !short.contains(i) || *amount <= Quantity::from_i64(0) {
            continue;
        }
        match book.memory_slices.iter().position(|s| *s == Some(*i)) {
            Some(n) => slices.push(n as u32),
            None => counters.push(book.names[*i].to_string()),
        }
    }
    slices.sort_unstable();
    (!slices.is_empty() || !counters.is_empty()).then(|| Blocker {
        device: held.name.to_string(),
        slices,
        counters,
    })
}
