//! One GPU's shared counters (its [`Book`]) and the published devices that consume them
//! ([`Dev`]): what `gpus.rs` reads from the slices, and what `book.rs` (free devices and
//! counts) and `blocked.rs` (fragmentation) evaluate.

use super::{Holder, Placement};
use crate::quantity::Quantity;

/// A counter a device consumes: index into the GPU's book and amount.
pub(super) type Use = (usize, Quantity);

/// The counters of the counter sets a GPU's devices consume.
#[derive(Default)]
pub(super) struct Book<'a> {
    /// The pool's (counter set, counter) numbers per index.
    pub(super) keys: Vec<(u32, u32)>,
    /// Counter names per index.
    pub(super) names: Vec<&'a str>,
    pub(super) totals: Vec<Quantity>,
    /// Index of `memory-slice-<n>` for each n, when the GPU has them.
    pub(super) memory_slices: Vec<Option<usize>>,
}

impl<'a> Book<'a> {
    /// Index of a counter (the pool's set and counter numbers), adding it with its `name` and
    /// `total` on first sight; `memory_slice` is its `n` when it is `memory-slice-<n>`.
    pub(super) fn index(
        &mut self,
        key: (u32, u32),
        name: &'a str,
        total: Quantity,
        memory_slice: Option<u32>,
    ) -> usize {
        if let Some(i) = self.keys.iter().position(|k| *k == key) {
            return i;
        }
        self.keys.push(key);
        self.names.push(name);
        self.totals.push(total);
        if let Some(n) = memory_slice {
            let n = n as usize;
            if self.memory_slices.len() <= n {
                self.memory_slices.resize(n + 1, None);
            }
            self.memory_slices[n] = Some(self.totals.len() - 1);
        }
        self.totals.len() - 1
    }
}

/// `n` of a `memory-slice-<n>` counter.
pub(super) fn memory_slice(counter: &str) -> Option<u32> {
    counter.strip_prefix("memory-slice-")?.parse().ok()
}

/// What a published device is, from its `type` attribute (and its profile, for MIG devices
/// published without one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// The full GPU.
    Gpu,
    /// A MIG device, static or carved on demand.
    Mig,
    /// The GPU's VFIO device (`gpu-vfio-<i>`).
    Vfio,
    /// One instance slot of a vGPU type (`vgpu-<i>-<slug>-<slot>`).
    Vgpu,
}

/// One published device of a GPU.
pub(super) struct Dev<'a> {
    pub(super) name: &'a str,
    /// MIG profile, vGPU type (`H100-4C`), [`FULL_GPU`](super::FULL_GPU) or
    /// [`VFIO_GPU`](super::VFIO_GPU).
    pub(super) profile: &'a str,
    pub(super) kind: Kind,
    pub(super) placement: Option<Placement>,
    pub(super) uses: Vec<Use>,
    pub(super) holders: Option<&'a [Holder]>,
    /// The compatibility groups it declares where it consumes counters (KEP-5963); empty
    /// when it declares none.
    pub(super) groups: Vec<&'a str>,
}

/// What the devices on a GPU's counter set have in common, by the rule of Kubernetes 1.37's
/// compatibility groups (KEP-5963): a device may join only if it shares a group with every
/// device already there; a device declaring none only joins devices declaring none. Only
/// GPUs on which some device declares groups are judged by it, as the scheduler judges only
/// pools that declare groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) enum Meet<'a> {
    /// Nothing on the set yet.
    #[default]
    Nobody,
    /// Only devices declaring no groups.
    NoGroups,
    /// The groups every device on the set declares (possibly none left).
    Groups(Vec<&'a str>),
}

impl<'a> Meet<'a> {
    /// Whether a device declaring `groups` may join.
    pub(super) fn admits(&self, groups: &[&str]) -> bool {
        match self {
            Meet::Nobody => true,
            Meet::NoGroups => groups.is_empty(),
            Meet::Groups(common) => groups.iter().any(|g| common.contains(g)),
        }
    }

    /// The state once a device declaring `groups` has joined.
    pub(super) fn with(&self, groups: &[&'a str]) -> Meet<'a> {
        match (self, groups.is_empty()) {
            (Meet::Nobody, true) => Meet::NoGroups,
            (Meet::Nobody, false) => Meet::Groups(groups.to_vec()),
            (Meet::Groups(common), false) => Meet::Groups(
                common
                    .iter()
                    .filter(|g| groups.contains(g))
                    .copied()
                    .collect(),
            ),
            (same, _) => same.clone(),
        }
    }
}
