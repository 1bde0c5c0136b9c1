//! The order in which a Fabric Manager node offers its whole GPUs, pure: free partitions
//! first.
//!
//! A partition claim (`count: N` with `matchAttribute: gpu.nvidia.com/partitionN`) is placed
//! by kube-scheduler's first-fit walk. From k8s.io/dynamic-resource-allocation v0.34.0 through
//! v0.37.0-alpha.2, `allocateDevice` (`structured/internal/*/allocator_*.go`) reserves a
//! candidate's shared counters (`checkAvailableCounters`) before it checks the claim's
//! constraints, and returns on a constraint refusal without releasing them
//! (kubernetes/kubernetes#140436, fixed by #140431, 1.36 backport #140663). Every full GPU of
//! a dynamic-MIG or passthrough node consumes counters, so once the walk has started a set on
//! a GPU of a partition it cannot fill, each GPU of another partition it passes over keeps
//! its counters reserved, and the walk cannot start a set on it afterwards: the claim is
//! refused although a free partition exists. The walk succeeds exactly when the first free
//! GPU it meets lies in a partition it can fill.
//!
//! So the node offers first the GPUs whose partitions are all free, largest size first: the
//! first free GPU then lies in a free partition of every size that has one (HGX partitions
//! nest, 2 inside 4 inside 8). An idle node keeps its plain order.

use std::collections::{BTreeMap, BTreeSet};

use super::PartitionTable;

/// `modules` (module IDs in the order a node publishes their GPUs) reordered so that, for the
/// largest partition size first, the GPUs whose partition of that size holds no `busy` module
/// come before the others; then the same for each smaller size, a busy GPU itself last; ties
/// keep their order. With nothing busy, `modules` is returned as it is.
///
/// `busy` are the modules whose GPU cannot join a new partition claim (MIG devices on it, its
/// full GPU not published, or bound to `vfio-pci`). A module FM does not list sorts last.
pub fn free_partitions_first(
    table: &PartitionTable,
    modules: &[u32],
    busy: &BTreeSet<u32>,
) -> Vec<u32> {
    let mut sizes: Vec<u32> = table
        .partitions()
        .iter()
        .map(|p| p.gpu_info.len() as u32)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    sizes.reverse();
    let members: BTreeMap<u32, BTreeSet<u32>> = table
        .partitions()
        .iter()
        .map(|p| (p.partition_id, p.modules()))
        .collect();
    let key = |module: u32| -> Vec<bool> {
        let of = table.partitions_of(module);
        sizes
            .iter()
            .map(|size| match of.get(size).and_then(|id| members.get(id)) {
                Some(set) => !set.is_disjoint(busy),
                None => true,
            })
            .chain([busy.contains(&module)])
            .collect()
    };
    let mut ranked: Vec<(Vec<bool>, usize, u32)> = modules
        .iter()
        .enumerate()
        .map(|(i, &m)| (key(m), i, m))
        .collect();
    ranked.sort();
    ranked.into_iter().map(|(_, _, m)| m).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric_manager::partitions::hgx_8gpu_table;

    fn order(busy: &[u32]) -> Vec<u32> {
        let table = PartitionTable::new(hgx_8gpu_table(&[], &BTreeSet::new())).unwrap();
        let modules: Vec<u32> = (1..=8).collect();
        free_partitions_first(&table, &modules, &busy.iter().copied().collect())
    }

    #[test]
    fn an_idle_node_keeps_its_order() {
        assert_eq!(order(&[]), vec![1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn a_busy_module_puts_the_free_half_first_then_the_free_pair_of_its_own_half() {
        // Module 1 busy: half {5,6,7,8} is free; of half {1,2,3,4}, pair {2,4} is free, then
        // module 3 (its pair {1,3} is not), then module 1.
        assert_eq!(order(&[1]), vec![5, 6, 7, 8, 2, 4, 3, 1]);
        assert_eq!(order(&[8]), vec![1, 2, 3, 4, 5, 7, 6, 8]);
    }

    #[test]
    fn with_both_halves_busy_free_pairs_come_first() {
        // Modules 1 and 5 busy: pairs {2,4} and {6,8} are free.
        assert_eq!(order(&[1, 5]), vec![2, 4, 6, 8, 3, 7, 1, 5]);
    }

    #[test]
    fn the_published_order_breaks_ties() {
        let table = PartitionTable::new(hgx_8gpu_table(&[], &BTreeSet::new())).unwrap();
        let got = free_partitions_first(&table, &[8, 7, 6, 5, 4, 3, 2, 1], &[1].into());
        assert_eq!(got, vec![8, 7, 6, 5, 4, 2, 3, 1]);
    }
}
