//! Turns the devices the search chose into `AllocationResult`s in resource.k8s.io/v1 form.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::SelectorEngine;
use super::node::Node;
use super::search::NodeSearch;

/// 64-bit FNV-1a: stable across Rust releases, unlike the std hasher.
fn fnv(seed: u64, parts: &[&str]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// A share ID in UUID form, derived from what it identifies so that the same input always
/// gives the same allocation (the allocator is pure; Kubernetes draws a random one).
fn share_id(parts: &[&str], salt: u64) -> String {
    let high = fnv(salt, parts);
    let low = fnv(salt ^ 0x9e37_79b9_7f4a_7c15, parts);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0x0fff,
        ((low >> 48) & 0x3fff) | 0x8000,
        low & 0xffff_ffff_ffff
    )
}

impl<'s, 'a, E: SelectorEngine> NodeSearch<'s, 'a, E> {
    /// One result per claim, from the current (successful) picks.
    pub(crate) fn results(&self, node: &Node) -> Vec<AllocationResult> {
        let prep = self.prep;
        let mut issued: HashSet<(usize, String)> = HashSet::new();
        let mut out = Vec::with_capacity(prep.claims.len());
        for (ci, claim) in prep.claims.iter().enumerate() {
            let mut results = Vec::new();
            let mut node_bound = false;
            let mut merged = NodeSelectorTerm::default();
            for (k, pick) in self
                .picks
                .iter()
                .enumerate()
                .filter(|(_, p)| prep.slots[p.slot].claim == ci)
            {
                let spec = &prep.slots[pick.slot];
                let at = self.node.devices[pick.pos];
                let pool = &self.alloc.inventory.pools[at.pool];
                let found = &pool.devices[at.index];
                let device = found.device;
                let shareable = device.allow_multiple_allocations == Some(true);
                let share = shareable.then(|| {
                    let uid = claim
                        .claim
                        .metadata
                        .uid
                        .as_deref()
                        .unwrap_or(&claim.display);
                    let index = k.to_string();
                    let parts = [
                        uid,
                        spec.name.as_str(),
                        pool.driver,
                        pool.name,
                        &device.name,
                        &index,
                    ];
                    let mut salt = 0;
                    loop {
                        let id = share_id(&parts, salt);
                        let key = (pool.driver, pool.name, device.name.as_str());
                        if !self.alloc.state.share_ids.contains(&(key, id.as_str()))
                            && issued.insert((pick.pos, id.clone()))
                        {
                            break id;
                        }
                        salt += 1;
                    }
                });
                let consumed: BTreeMap<String, Quantity> = pick
                    .consumed
                    .iter()
                    .map(|c| (c.published.to_string(), c.amount.to_k8s()))
                    .collect();
                results.push(DeviceRequestAllocationResult {
                    request: spec.name.clone(),
                    driver: pool.driver.to_string(),
                    pool: pool.name.to_string(),
                    device: device.name.clone(),
                    admin_access: spec.admin.then_some(true),
                    tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.to_vec()),
                    share_id: share,
                    consumed_capacity: (!consumed.is_empty()).then_some(consumed),
                    binding_conditions: device.binding_conditions.clone(),
                    binding_failure_conditions: device.binding_failure_conditions.clone(),
                    ..Default::default()
                });
                let slice = &found.slice.spec;
                let (name, selector) = if slice.per_device_node_selection == Some(true) {
                    (device.node_name.as_deref(), device.node_selector.as_ref())
                } else {
                    (slice.node_name.as_deref(), slice.node_selector.as_ref())
                };
                node_bound |=
                    name.is_some_and(|n| !n.is_empty()) || device.binds_to_node == Some(true);
                if let Some(term) = selector.and_then(|s| s.node_selector_terms.first()) {
                    merge(&mut merged.match_fields, term.match_fields.as_deref());
                    merge(
                        &mut merged.match_expressions,
                        term.match_expressions.as_deref(),
                    );
                }
            }
            let node_selector = if node_bound {
                Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.name.clone()]),
                        }]),
                        ..Default::default()
                    }],
                })
            } else if merged.match_fields.is_some() || merged.match_expressions.is_some() {
                Some(NodeSelector {
                    node_selector_terms: vec![merged],
                })
            } else {
                None
            };
            let config = self.configs(ci);
            out.push(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: (!config.is_empty()).then_some(config),
                }),
                node_selector,
                ..Default::default()
            });
        }
        out
    }

    /// Class configs (once per class, naming the requests that use it), then the claim's
    /// configs that apply to a request or to a chosen sub-request. A config naming every
    /// request of the claim names none, which means "all".
    fn configs(&self, ci: usize) -> Vec<DeviceAllocationConfiguration> {
        let prep = self.prep;
        let claim = &prep.claims[ci];
        let chosen: Vec<usize> = claim
            .requests
            .iter()
            .map(|&r| prep.requests[r].alternatives[self.chosen[r]])
            .collect();
        let mut configs: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut by_class: Vec<(&str, std::ops::Range<usize>)> = Vec::new();
        for &slot in &chosen {
            let spec = &prep.slots[slot];
            if let Some((_, range)) = by_class.iter().find(|(c, _)| *c == spec.class_name) {
                for config in &mut configs[range.clone()] {
                    config
                        .requests
                        .get_or_insert_with(Vec::new)
                        .push(spec.name.clone());
                }
                continue;
            }
            let start = configs.len();
            let class_configs = spec.class.spec.as_ref().and_then(|s| s.config.as_deref());
            for config in class_configs.unwrap_or_default() {
                configs.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: Some(vec![spec.name.clone()]),
                    opaque: config.opaque.clone(),
                });
            }
            by_class.push((spec.class_name, start..configs.len()));
        }
        let devices = claim.claim.spec.as_ref().and_then(|s| s.devices.as_ref());
        for config in devices
            .and_then(|d| d.config.as_deref())
            .unwrap_or_default()
        {
            let names = config.requests.as_deref().unwrap_or_default();
            let applies = names.is_empty()
                || chosen.iter().any(|&slot| {
                    let spec = &prep.slots[slot];
                    names.iter().any(|n| n == spec.base || *n == spec.name)
                });
            if applies {
                configs.push(DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: (!names.is_empty()).then(|| names.to_vec()),
                    opaque: config.opaque.clone(),
                });
            }
        }
        for config in &mut configs {
            if config
                .requests
                .as_ref()
                .is_some_and(|r| r.len() == claim.requests.len())
            {
                config.requests = None;
            }
        }
        configs
    }
}

fn merge(
    into: &mut Option<Vec<NodeSelectorRequirement>>,
    from: Option<&[NodeSelectorRequirement]>,
) {
    for requirement in from.unwrap_or_default() {
        let list = into.get_or_insert_with(Vec::new);
        if !list.contains(requirement) {
            list.push(requirement.clone());
        }
    }
}
