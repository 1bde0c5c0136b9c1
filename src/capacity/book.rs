//! One GPU evaluated: what its holders take, which devices are still free, and how many of
//! each profile a request could get together. The counters and devices it reads are
//! `counters.rs`'s, which `blocked.rs` reads too (neither of the two imports the other).

use super::blocked;
use super::counters::{Book, Dev, Kind, Meet, Use};
use super::{Allocation, FULL_GPU, FreeProfile, GpuCapacity, MigMode, VgpuTypeCapacity};
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
/// engine amounts, so greedy finds the maximum. On a GPU whose devices declare compatibility
/// groups, `meet` is what the devices on it have in common, and a device joins only if its
/// groups meet it (the devices of one profile declare the same groups, so greedy still finds
/// the maximum); `None` on other GPUs.
fn greedy<'a>(
    devices: &[Dev<'a>],
    profile: &str,
    left: &mut [Quantity],
    mut meet: Option<Meet<'a>>,
    skip_held: bool,
) -> Vec<u32> {
    let mut starts = Vec::new();
    for dev in devices.iter().filter(|d| d.profile == profile) {
        if skip_held && dev.holders.is_some() {
            continue;
        }
        if !fits(left, &dev.uses) || meet.as_ref().is_some_and(|m| !m.admits(&dev.groups)) {
            continue;
        }
        take(left, &dev.uses);
        meet = meet.map(|m| m.with(&dev.groups));
        starts.push(dev.placement.map_or(0, |p| p.start));
    }
    starts
}

/// `namespace/claim` of every holder of `devices`, sorted, each once.
fn claims_holding(devices: &[&Dev]) -> Vec<String> {
    let mut claims: Vec<String> = devices
        .iter()
        .flat_map(|d| d.holders.into_iter().flatten())
        .map(|h| format!("{}/{}", h.namespace, h.claim))
        .collect();
    claims.sort();
    claims.dedup();
    claims
}

impl<'a> GpuEntry<'a> {
    /// How the GPU's MIG devices are published: none, static (no counters) or dynamic.
    fn mig_mode(&self) -> MigMode {
        let mig = || self.devices.iter().filter(|d| d.kind == Kind::Mig);
        match (mig().next().is_some(), mig().any(|d| !d.uses.is_empty())) {
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
        // Only GPUs on which some device declares compatibility groups are judged by them.
        let grouped = self.devices.iter().any(|d| !d.groups.is_empty());
        let mut held = Meet::default();
        for dev in &self.devices {
            let Some(holders) = dev.holders else {
                continue;
            };
            take(&mut left, &dev.uses);
            held = held.with(&dev.groups);
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
        let mut profiles: Vec<(&str, Kind)> = Vec::new();
        for dev in &self.devices {
            if !profiles.iter().any(|(p, _)| *p == dev.profile) {
                profiles.push((dev.profile, dev.kind));
            }
        }
        let mut free = Vec::with_capacity(profiles.len());
        let mut counts = Vec::with_capacity(profiles.len());
        let mut vgpu = Vec::new();
        let mut scratch = left.clone();
        for &(profile, kind) in &profiles {
            scratch.copy_from_slice(&left);
            let starts = greedy(
                &self.devices,
                profile,
                &mut scratch,
                grouped.then(|| held.clone()),
                true,
            );
            scratch.copy_from_slice(&self.book.totals);
            let capacity = greedy(
                &self.devices,
                profile,
                &mut scratch,
                grouped.then(Meet::default),
                false,
            );
            let of_profile: Vec<&Dev> = self
                .devices
                .iter()
                .filter(|d| d.profile == profile)
                .collect();
            let holding: Vec<&Dev> = of_profile
                .iter()
                .copied()
                .filter(|d| d.holders.is_some())
                .collect();
            counts.push(ProfileCount {
                profile: profile.to_string(),
                capacity: capacity.len(),
                allocated: holding.len(),
                free: starts.len(),
            });
            if kind == Kind::Vgpu {
                vgpu.push(VgpuTypeCapacity {
                    vgpu_type: profile.to_string(),
                    slots: of_profile.len(),
                    in_use: holding.len(),
                    free: starts.len(),
                    claims: claims_holding(&holding),
                });
            }
            let placed = mig == MigMode::Dynamic && kind == Kind::Mig;
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
                .zip(&profiles)
                .filter(|(c, (_, kind))| *kind == Kind::Mig && c.capacity > 0 && c.free == 0)
                .filter_map(|(c, _)| blocked::blocked(&self.devices, &self.book, &left, &c.profile))
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
            vgpu,
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
            kind: if profile == FULL_GPU {
                Kind::Gpu
            } else {
                Kind::Mig
            },
            placement: Some(Placement {
                start,
                size: Some(1),
            }),
            uses,
            holders,
            groups: Vec::new(),
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

    fn vgpu<'a>(
        name: &'a str,
        profile: &'a str,
        fb: (usize, i64),
        groups: Vec<&'a str>,
        holders: Option<&'a [Holder]>,
    ) -> Dev<'a> {
        Dev {
            name,
            profile,
            kind: Kind::Vgpu,
            placement: None,
            uses: vec![(fb.0, q(fb.1))],
            holders,
            groups,
        }
    }

    /// The holder of a VM's claim `vms/vm-a`.
    fn vm_holder() -> Holder {
        Holder {
            namespace: "vms".into(),
            claim: "vm-a".into(),
            pods: vec![],
            request: "r".into(),
            share_id: None,
            consumed: Default::default(),
        }
    }

    #[test]
    fn a_type_that_runs_alone_is_not_free_beside_another_type_held_on_a_grouped_gpu() {
        let holder = [vm_holder()];
        let mut book = Book::default();
        let fb = book.index((0, 0), "framebuffer", q(48), None);
        let mixed = || vec!["vgpu-12q", "vgpu-mixed"];
        let gpu = GpuEntry {
            node: "n".into(),
            minor: 0,
            name: "gpu-0".into(),
            uuid: None,
            model: "NVIDIA L40S",
            devices: vec![
                vgpu("vgpu-0-12q-0", "L40S-12Q", (fb, 12), mixed(), Some(&holder)),
                vgpu("vgpu-0-12q-1", "L40S-12Q", (fb, 12), mixed(), None),
                vgpu(
                    "vgpu-0-24q-0",
                    "L40S-24Q",
                    (fb, 24),
                    vec!["vgpu-24q", "vgpu-mixed"],
                    None,
                ),
                vgpu("vgpu-0-1b-0", "L40S-1B", (fb, 1), vec!["vgpu-1b"], None),
                vgpu("vgpu-0-1b-1", "L40S-1B", (fb, 1), vec!["vgpu-1b"], None),
            ],
            book,
        };
        let Evaluated { gpu, counts, .. } = gpu.evaluate();
        let got: Vec<(&str, usize, usize, usize, Vec<String>)> = gpu
            .vgpu
            .iter()
            .map(|t| {
                (
                    t.vgpu_type.as_str(),
                    t.slots,
                    t.in_use,
                    t.free,
                    t.claims.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("L40S-12Q", 2, 1, 1, vec!["vms/vm-a".to_string()]),
                ("L40S-1B", 2, 0, 0, vec![]),
                ("L40S-24Q", 1, 0, 1, vec![]),
            ]
        );
        assert_eq!(gpu.mig, MigMode::Off);
        let caps: Vec<usize> = counts.iter().map(|c| c.capacity).collect();
        assert_eq!(
            caps,
            [2, 2, 1],
            "alone, each type fits as often as it has slots"
        );
    }

    #[test]
    fn without_groups_only_the_framebuffer_limits_the_other_types() {
        let holder = [vm_holder()];
        let mut book = Book::default();
        let fb = book.index((0, 0), "framebuffer", q(48), None);
        let gpu = GpuEntry {
            node: "n".into(),
            minor: 0,
            name: "gpu-0".into(),
            uuid: None,
            model: "NVIDIA L40S",
            devices: vec![
                vgpu("vgpu-0-24q-0", "L40S-24Q", (fb, 24), vec![], Some(&holder)),
                vgpu("vgpu-0-24q-1", "L40S-24Q", (fb, 24), vec![], None),
                vgpu("vgpu-0-12q-0", "L40S-12Q", (fb, 12), vec![], None),
                vgpu("vgpu-0-12q-1", "L40S-12Q", (fb, 12), vec![], None),
                vgpu("vgpu-0-12q-2", "L40S-12Q", (fb, 12), vec![], None),
            ],
            book,
        };
        let Evaluated { gpu, .. } = gpu.evaluate();
        let free: Vec<(&str, usize)> = gpu
            .vgpu
            .iter()
            .map(|t| (t.vgpu_type.as_str(), t.free))
            .collect();
        assert_eq!(free, [("L40S-12Q", 2), ("L40S-24Q", 1)]);
    }
}
