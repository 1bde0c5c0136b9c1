//! Compatibility groups of counter consumptions (KEP-5963, Kubernetes 1.37
//! `DRADeviceCompatibilityGroups`): devices that consume from one counter set may be allocated
//! together only if the groups they declare on that set have a name in common, all of them;
//! a device declaring no groups only goes with devices declaring none.
//!
//! As in Kubernetes, the devices on a set are those of already-allocated claims and those
//! chosen so far in the search, and the groups are read from the slices (the KEP's snapshot
//! of them in the allocation result is not in the `resource.k8s.io/v1` API we build against).
//! Deliberately as our counters: admin access and the later shares of a shared device take
//! part in nothing, and a candidate a constraint refuses under
//! [`CounterRollback::Leaked`](super::CounterRollback) keeps its counters but not its place
//! on the set (kube-scheduler versions that leak counters have no groups).

use std::collections::BTreeSet;

use super::SelectorEngine;
use super::reason::{Consumer, Rejection};
use super::search::NodeSearch;

/// A device's place on one counter set: the set (an index into the counter book) and the
/// groups it declares there (empty: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Member<'a> {
    pub(crate) set: usize,
    pub(crate) groups: &'a [String],
}

/// What the devices on a counter set have in common so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Meet {
    /// No device yet: any may join.
    #[default]
    Nobody,
    /// Only devices declaring no groups: only such devices may join.
    NoGroups,
    /// The groups every device declares (possibly none left: nothing more may join).
    Groups(BTreeSet<String>),
}

impl Meet {
    /// Whether a device declaring `groups` may join.
    pub(crate) fn admits(&self, groups: &[String]) -> bool {
        match self {
            Meet::Nobody => true,
            Meet::NoGroups => groups.is_empty(),
            Meet::Groups(common) => groups.iter().any(|g| common.contains(g)),
        }
    }

    /// The state once a device declaring `groups` has joined (callers check [`Meet::admits`]
    /// first; a mix of grouped and group-less devices, which no valid allocation makes, keeps
    /// the state as it was).
    pub(crate) fn with(&self, groups: &[String]) -> Meet {
        match (self, groups.is_empty()) {
            (Meet::Nobody, true) => Meet::NoGroups,
            (Meet::Nobody, false) => Meet::Groups(groups.iter().cloned().collect()),
            (Meet::Groups(common), false) => Meet::Groups(
                common
                    .iter()
                    .filter(|g| groups.contains(g))
                    .cloned()
                    .collect(),
            ),
            (same, _) => same.clone(),
        }
    }

    /// The groups in common, for messages; empty for [`Meet::Nobody`] and [`Meet::NoGroups`].
    pub(crate) fn groups(&self) -> Vec<String> {
        match self {
            Meet::Groups(common) => common.iter().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

/// A device that may not join a counter set: the set, what it declares, what the devices
/// already on the set have in common.
pub(crate) struct GroupConflict<'a> {
    pub(crate) set: usize,
    pub(crate) groups: &'a [String],
    pub(crate) held: Meet,
}

impl<'s, 'a, E: SelectorEngine> NodeSearch<'s, 'a, E> {
    /// The rejection of `conflict`, naming the devices on the set: those of earlier
    /// allocations and, with `with_search`, those chosen in this run.
    pub(crate) fn group_rejection(
        &self,
        conflict: &GroupConflict<'a>,
        with_search: bool,
    ) -> Rejection {
        let mut consumers =
            self.counters
                .set_consumers(&self.alloc.inventory, &self.alloc.state, conflict.set);
        if with_search {
            for pick in &self.picks {
                if pick.members.iter().any(|m| m.set == conflict.set) {
                    consumers.push(Consumer {
                        device: self.device_name(pick.pos).to_string(),
                        by: format!("request {}", self.prep.slots[pick.slot].name),
                    });
                }
            }
        }
        Rejection::CompatibilityGroups {
            counter_set: self.counters.set_name(conflict.set).to_string(),
            groups: conflict.groups.to_vec(),
            held: conflict.held.groups(),
            consumers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// Whether the devices declaring `each` (in turn) may all share a counter set.
    fn together(each: &[&[&str]]) -> bool {
        let mut meet = Meet::Nobody;
        for groups in each {
            let groups = g(groups);
            if !meet.admits(&groups) {
                return false;
            }
            meet = meet.with(&groups);
        }
        true
    }

    #[test]
    fn devices_share_a_counter_set_only_when_all_their_groups_meet() {
        let cases: [(&[&[&str]], bool); 9] = [
            (&[&["vgpu-4c"], &["vgpu-4c"], &["vgpu-4c"]], true),
            (&[&["vgpu-4c"], &["vgpu-10c"]], false),
            (
                &[&["vgpu-12q", "vgpu-mixed"], &["vgpu-24q", "vgpu-mixed"]],
                true,
            ),
            (
                &[
                    &["vgpu-12q", "vgpu-mixed"],
                    &["vgpu-24q", "vgpu-mixed"],
                    &["vgpu-12q", "vgpu-mixed"],
                ],
                true,
            ),
            (&[&["vgpu-1b"], &["vgpu-12q", "vgpu-mixed"]], false),
            (&[&["mig"], &["mig"]], true),
            (&[&["mig"], &["vgpu-4c"]], false),
            (&[&[], &[]], true),
            (&[&[], &["mig"]], false),
        ];
        for (each, want) in cases {
            assert_eq!(together(each), want, "{each:?}");
            let mut reversed = each.to_vec();
            reversed.reverse();
            assert_eq!(together(&reversed), want, "{reversed:?}");
        }
    }

    #[test]
    fn the_meet_narrows_to_what_every_device_declares() {
        let meet = Meet::Nobody
            .with(&g(&["vgpu-12q", "vgpu-mixed"]))
            .with(&g(&["vgpu-12q", "vgpu-mixed"]));
        assert_eq!(meet.groups(), g(&["vgpu-12q", "vgpu-mixed"]));
        let meet = meet.with(&g(&["vgpu-24q", "vgpu-mixed"]));
        assert_eq!(meet.groups(), g(&["vgpu-mixed"]));
        assert!(!meet.admits(&g(&["vgpu-12q"])));
        assert_eq!(Meet::Nobody.with(&[]), Meet::NoGroups);
    }
}
