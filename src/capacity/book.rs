//! One GPU evaluated: what its holders take, which devices are still free, and how many of
//! each profile a request could get together. The counters and devices it reads are
//! `counters.rs`'s, which `blocked.rs` reads too (neither of the two imports the other).

use super::blocked;
use super::counters::{Book, Dev, Use};
use super::{Allocation, FULL_GPU, FreeProfile, GpuCapacity, MigMode};
use crate::quantity::Quantity;

fn fits(left: &[Quantity], uses: &[Use]) -> bool {
    uses.iter().all(|(i, amount)| *amount <= left[*i])
}

fn take(left: &mut [Quantity], uses: &[Use]) {
    for (i, amount) in uses {
        left[*i] = left[*i].saturating_sub(amount);
    }
}

/// A GPU as read from the slices, before evaluation.
pub(super) struct GpuEntry<'a> {
    pub(super) node: String,
    pub(super) minor: i64,
    pub(super) name: String,
    pub(super) uuid: Option<&'a str>,
    pub(super) model: &'a str,
    pub(super) devices: Vec<Dev<'a>>,
    pub(super) book: Book<'a>,
}

/// Per-profile counts of one GPU, for the cluster and pool summaries.
pub(super) struct ProfileCount {
    pub(super) profile: String,
    pub(super) capacity: usize,
    pub(super) allocated: usize,
    pub(super) free: usize,
}

/// A greedy allocation of as many devices of `profile` as fit in `left`, in placement order.
/// Placements of one profile are aligned and equally sized, and its devices consume equal
/// engine amounts, so greedy finds the maximum.
fn greedy(devices: &[Dev], profile: &str, left: &mut [Quantity], skip_held: bool) -> Vec<u32> {
    let mut starts = Vec::new();
    for dev in devices.iter().filter(|d| d.profile == profile) {
        if skip_held && dev.holders.is_some() {
            continue;
        }
        if fits(left, &dev.uses) {
            take(left, &dev.uses);
            starts.push(dev.placement.map_or(0, |p| p.start));
        }
    }
    starts
}

impl<'a> GpuEntry<'a> {
    fn mig_mode(&self) -> MigMode {
        let mig = self.devices.iter().any(|d| d.profile != FULL_GPU);
        let counters = self.devices.iter().any(|d| !d.uses.is_empty());
        match (mig, counters) {
            (false, _) => MigMode::Off,
            (true, false) => MigMode::Static,
            (true, true) => MigMode::Dynamic,
        }
    }

    /// What claims hold on this GPU, what is free, and the per-profile counts; owns nothing
    /// of the slices it was read from, so the slices can go once their GPUs are evaluated.
    pub(super) fn evaluate(mut self) -> Evaluated {
        // Device names are unique in a pool, so an unstable sort orders them the same way.
        self.devices.sort_unstable_by(|a, b| {
            (a.profile != FULL_GPU, a.placement, a.name).cmp(&(
                b.profile != FULL_GPU,
                b.placement,
                b.name,
            ))
        });
        let mig = self.mig_mode();
        let mut left = self.book.totals.clone();
        let mut layout: Vec<u8> = vec![b'.'; self.book.memory_slices.len()];
        let mut allocated = Vec::new();
        for dev in &self.devices {
            let Some(holders) = dev.holders else {
                continue;
            };
            take(&mut left, &dev.uses);
            let letter = letter(allocated.len());
            for (i, _) in &dev.uses {
                if let Some(n) = self.book.memory_slices.iter().position(|s| *s == Some(*i)) {
                    layout[n] = letter;
                }
            }
            allocated.push(Allocation {
                device: dev.name.to_string(),
                profile: dev.profile.to_string(),
                placement: dev.placement.filter(|_| dev.profile != FULL_GPU),
                holders: holders.to_vec(),
            });
        }
        let mut profiles: Vec<&str> = Vec::new();
        for dev in &self.devices {
            if !profiles.contains(&dev.profile) {
                profiles.push(dev.profile);
            }
        }
        let mut free = Vec::with_capacity(profiles.len());
        let mut counts = Vec::with_capacity(profiles.len());
        let mut scratch = left.clone();
        for profile in profiles {
            scratch.copy_from_slice(&left);
            let starts = greedy(&self.devices, profile, &mut scratch, true);
            scratch.copy_from_slice(&self.book.totals);
            let capacity = greedy(&self.devices, profile, &mut scratch, false);
            let held = self
                .devices
                .iter()
                .filter(|d| d.profile == profile && d.holders.is_some())
                .count();
            counts.push(ProfileCount {
                profile: profile.to_string(),
                capacity: capacity.len(),
                allocated: held,
                free: starts.len(),
            });
            let placed = mig == MigMode::Dynamic && profile != FULL_GPU;
            free.push(FreeProfile {
                profile: profile.to_string(),
                count: starts.len(),
                starts: if placed { starts } else { Vec::new() },
            });
        }
        let dynamic = mig == MigMode::Dynamic;
        let blocked = if dynamic {
            counts
                .iter()
                .filter(|c| c.profile != FULL_GPU && c.capacity > 0 && c.free == 0)
                .filter_map(|c| blocked::blocked(&self.devices, &self.book, &left, &c.profile))
                .collect()
        } else {
            Vec::new()
        };
        let gpu = GpuCapacity {
            name: self.name,
            uuid: self.uuid.map(str::to_string),
            model: self.model.to_string(),
            mig,
            layout: (mig == MigMode::Dynamic && !layout.is_empty())
                .then(|| String::from_utf8_lossy(&layout).into_owned()),
            allocated,
            free,
            free_memory_slices: (dynamic && !self.book.memory_slices.is_empty())
                .then(|| blocked::free_memory_slices(&self.book, &left)),
            blocked,
        };
        Evaluated {
            node: self.node,
            minor: self.minor,
            model: self.model.to_string(),
            gpu,
            counts,
        }
    }
}

/// One GPU evaluated, with what the sums need.
pub(super) struct Evaluated {
    pub(super) node: String,
    pub(super) minor: i64,
    pub(super) model: String,
    pub(super) gpu: GpuCapacity,
    pub(super) counts: Vec<ProfileCount>,
}

/// `A`…`Z`, then `a`…`z`, then `*`: the layout letter of the n-th allocation.
pub(super) fn letter(n: usize) -> u8 {
    match n {
        0..26 => b'A' + n as u8,
        26..52 => b'a' + (n - 26) as u8,
        _ => b'*',
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{Holder, Placement};

    fn dev<'a>(
        name: &'a str,
        profile: &'a str,
        start: u32,
        uses: Vec<Use>,
        holders: Option<&'a [Holder]>,
    ) -> Dev<'a> {
        Dev {
            name,
            profile,
            placement: Some(Placement {
                start,
                size: Some(1),
            }),
            uses,
            holders,
        }
    }

    fn q(n: i64) -> Quantity {
        Quantity::from_i64(n)
    }

    #[test]
    fn placements_sharing_one_engine_count_as_one_free_device() {
        let mut book = Book::default();
        let ofa = book.index((0, 0), "ofa-engines", q(1), None);
        let slices: Vec<usize> = (0..2)
            .map(|n| book.index((0, n + 1), "memory-slice", q(1), Some(n)))
            .collect();
        let gpu = GpuEntry {
            node: "n".into(),
            minor: 0,
            name: "gpu-0".into(),
            uuid: None,
            model: "M",
            devices: vec![
                dev("a", "1g+me", 0, vec![(ofa, q(1)), (slices[0], q(1))], None),
                dev("b", "1g+me", 1, vec![(ofa, q(1)), (slices[1], q(1))], None),
            ],
            book,
        };
        let Evaluated { gpu, counts, .. } = gpu.evaluate();
        assert_eq!(gpu.free[0].count, 1);
        assert_eq!(counts[0].capacity, 1);
        assert_eq!(gpu.layout.as_deref(), Some(".."));
    }

    #[test]
    fn a_held_placement_blocks_the_overlapping_ones_and_marks_the_layout() {
        let holder = [Holder {
            namespace: "ns".into(),
            claim: "c".into(),
            pods: vec!["p".into()],
            request: "r".into(),
            share_id: None,
            consumed: Default::default(),
        }];
        let mut book = Book::default();
        let s: Vec<usize> = (0..4)
            .map(|n| book.index((0, n), "memory-slice", q(1), Some(n)))
            .collect();
        let all: Vec<Use> = s.iter().map(|&i| (i, q(1))).collect();
        let gpu = GpuEntry {
            node: "n".into(),
            minor: 0,
            name: "gpu-0".into(),
            uuid: None,
            model: "M",
            devices: vec![
                dev("gpu-0", FULL_GPU, 0, all, None),
                dev("half-0", "2g", 0, vec![(s[0], q(1)), (s[1], q(1))], None),
                dev("half-2", "2g", 2, vec![(s[2], q(1)), (s[3], q(1))], None),
                dev("one-3", "1g", 3, vec![(s[3], q(1))], Some(&holder)),
            ],
            book,
        };
        let Evaluated { gpu, counts, .. } = gpu.evaluate();
        assert_eq!(gpu.layout.as_deref(), Some("...A"));
        let free: Vec<(&str, usize)> = gpu
            .free
            .iter()
            .map(|f| (f.profile.as_str(), f.count))
            .collect();
        assert_eq!(free, [(FULL_GPU, 0), ("2g", 1), ("1g", 0)]);
        let caps: Vec<(usize, usize)> = counts.iter().map(|c| (c.capacity, c.allocated)).collect();
        assert_eq!(caps, [(1, 0), (2, 0), (1, 1)]);
    }
}
