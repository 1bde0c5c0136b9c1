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

/// One published device of a GPU.
pub(super) struct Dev<'a> {
    pub(super) name: &'a str,
    /// MIG profile, or [`FULL_GPU`](super::FULL_GPU).
    pub(super) profile: &'a str,
    pub(super) placement: Option<Placement>,
    pub(super) uses: Vec<Use>,
    pub(super) holders: Option<&'a [Holder]>,
}
