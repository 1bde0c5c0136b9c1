//! From evaluated GPUs to the report: nodes, per-profile and per-pool sums, totals.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::book::{Evaluated, ProfileCount};
use k8s_openapi::api::core::v1::Node;

use super::{
    CapacityOptions, CapacityReport, FULL_GPU, NodeCapacity, PoolSummary, ProfileSummary, Totals,
};

/// Pool value of nodes without the label.
pub const NO_POOL: &str = "<none>";

/// Sort key of a profile: full GPUs first (by model), then MIG profiles by compute slices,
/// memory and name, so `1g.5gb` comes before `1g.10gb`.
fn profile_order(profile: &str, model: &str) -> (bool, u32, u32, String, String) {
    if profile == FULL_GPU {
        return (false, 0, 0, String::new(), model.to_string());
    }
    let number = |s: &str| -> u32 {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(u32::MAX)
    };
    let (compute, memory) = profile.split_once('.').unwrap_or((profile, ""));
    (
        true,
        number(compute),
        number(memory),
        profile.to_string(),
        String::new(),
    )
}

/// Sums of per-GPU profile counts: full GPUs per model, MIG profiles across models.
#[derive(Default)]
struct ProfileSums<'a> {
    /// By profile and, for full GPUs, model ("" for MIG profiles, summed across models).
    rows: HashMap<(&'a str, &'a str), ProfileSummary>,
}

impl<'a> ProfileSums<'a> {
    fn add(&mut self, model: &'a str, counts: &'a [ProfileCount]) {
        for count in counts {
            let profile = count.profile.as_str();
            let key = (profile, if profile == FULL_GPU { model } else { "" });
            let row = self.rows.entry(key).or_insert_with(|| ProfileSummary {
                profile: profile.to_string(),
                models: Vec::new(),
                capacity: 0,
                allocated: 0,
                free: 0,
            });
            if !row.models.iter().any(|m| m == model) {
                row.models.push(model.to_string());
                row.models.sort();
            }
            row.capacity += count.capacity;
            row.allocated += count.allocated;
            row.free += count.free;
        }
    }

    fn finish(self) -> Vec<ProfileSummary> {
        let mut rows: Vec<_> = self
            .rows
            .into_iter()
            .map(|((profile, model), row)| (profile_order(profile, model), row))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.into_iter().map(|(_, row)| row).collect()
    }
}

#[derive(Default)]
struct PoolSums<'a> {
    nodes: BTreeSet<String>,
    gpus: usize,
    busy: usize,
    profiles: ProfileSums<'a>,
}

/// Sums the evaluated GPUs up into the report: nodes in name order, each node's GPUs by minor
/// number (GPUs of one node with the same minor, from different pools, in the order given).
pub(super) fn assemble(
    mut gpus: Vec<Evaluated>,
    nodes: &[Node],
    options: &CapacityOptions,
    warnings: Vec<String>,
) -> CapacityReport {
    let labels: HashMap<&str, &str> = match &options.pool_label {
        Some(label) => nodes
            .iter()
            .filter_map(|n| {
                let name = n.metadata.name.as_deref()?;
                let value = n.metadata.labels.as_ref()?.get(label)?;
                Some((name, value.as_str()))
            })
            .collect(),
        None => HashMap::new(),
    };
    gpus.sort_by(|a, b| (&a.node, a.minor).cmp(&(&b.node, b.minor)));
    let pool_of = |node: &str| {
        options
            .pool_label
            .as_ref()
            .map(|_| labels.get(node).copied().unwrap_or(NO_POOL))
    };
    let mut profiles = ProfileSums::default();
    let mut pools: BTreeMap<String, PoolSums> = BTreeMap::new();
    let mut totals = Totals::default();
    let mut claims: BTreeSet<(String, String)> = BTreeSet::new();
    for Evaluated {
        node,
        model,
        gpu,
        counts,
        ..
    } in &gpus
    {
        let busy = !gpu.allocated.is_empty();
        totals.gpus += 1;
        totals.busy_gpus += usize::from(busy);
        totals.allocated_devices += gpu.allocated.len();
        for holder in gpu.allocated.iter().flat_map(|a| &a.holders) {
            claims.insert((holder.namespace.clone(), holder.claim.clone()));
        }
        profiles.add(model, counts);
        if let Some(pool) = pool_of(node) {
            let sums = pools.entry(pool.to_string()).or_default();
            sums.nodes.insert(node.clone());
            sums.gpus += 1;
            sums.busy += usize::from(busy);
            sums.profiles.add(model, counts);
        }
    }
    let profiles = profiles.finish();
    let pools = pools
        .into_iter()
        .map(|(pool, sums)| PoolSummary {
            pool,
            nodes: sums.nodes.len(),
            gpus: sums.gpus,
            busy_gpus: sums.busy,
            profiles: sums.profiles.finish(),
        })
        .collect();
    let mut report_nodes: Vec<NodeCapacity> = Vec::new();
    for Evaluated { node, gpu, .. } in gpus {
        match report_nodes.last_mut() {
            Some(last) if last.name == node => last.gpus.push(gpu),
            _ => report_nodes.push(NodeCapacity {
                pool: pool_of(&node).map(str::to_string),
                name: node,
                gpus: vec![gpu],
            }),
        }
    }
    totals.nodes = report_nodes.len();
    totals.claims = claims.len();
    totals.namespaces = claims
        .iter()
        .map(|(ns, _)| ns)
        .collect::<BTreeSet<_>>()
        .len();
    CapacityReport {
        driver: options.driver.clone(),
        pool_label: options.pool_label.clone(),
        totals,
        profiles,
        pools,
        nodes: report_nodes,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_sort_full_gpus_first_then_by_compute_and_memory() {
        let mut names = vec![
            "7g.80gb",
            "1g.10gb",
            "gpu",
            "1g.5gb",
            "1g.10gb+me",
            "3g.40gb",
        ];
        names.sort_by_key(|p| profile_order(p, "M"));
        assert_eq!(
            names,
            [
                "gpu",
                "1g.5gb",
                "1g.10gb",
                "1g.10gb+me",
                "3g.40gb",
                "7g.80gb"
            ]
        );
    }
}
