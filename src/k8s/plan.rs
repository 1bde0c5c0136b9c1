//! What the publisher must write, decided from what the cluster holds: pure, so every case of
//! the generation rules is a table test.
//!
//! Readers (the scheduler) take a pool's slices at its highest generation and use the pool only
//! once they see `resourceSliceCount` of them. So a change of content gets a new generation on
//! every slice, all written before any left-over is deleted: until the last write the new
//! generation is incomplete and unused, and the old one is never mixed with it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use std::collections::BTreeSet;

use super::compare::{DroppedField, same_content_ignoring};

/// One slice to write, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// `POST` this slice.
    Create(ResourceSlice),
    /// `PUT` this slice (it carries the resourceVersion it was read at).
    Update(ResourceSlice),
}

impl Write {
    /// The slice written.
    pub fn slice(&self) -> &ResourceSlice {
        match self {
            Write::Create(s) | Write::Update(s) => s,
        }
    }
}

/// One slice to delete, after all writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// Slice name.
    pub name: String,
    /// Its UID when read, so a slice re-created meanwhile is not deleted by mistake.
    pub uid: Option<String>,
}

/// Everything one publish must do; empty at steady state.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pool generation the cluster holds once the plan is carried out.
    pub generation: i64,
    /// Creates and updates, in slice order.
    pub writes: Vec<Write>,
    /// Left-overs, by name.
    pub deletes: Vec<Delete>,
}

impl Plan {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.deletes.is_empty()
    }
}

/// The owner reference every slice of the node carries, so they go away with the Node.
pub fn node_owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: node.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// Plans the writes that turn `existing` (every slice of this driver on this node) into
/// `desired` (the pool's slices as built, whatever generation they carry) for pool `pool`.
///
/// The generation stays when every slice the cluster holds at its highest generation already
/// has the desired content (nothing changed, or an earlier publish of this same content was
/// interrupted); otherwise it is that highest generation plus one (1 for a new pool). A slice
/// is written when its content, generation or owner differs; slices not desired are deleted.
pub fn plan(
    desired: &[ResourceSlice],
    existing: &[ResourceSlice],
    pool: &str,
    owner: &OwnerReference,
) -> Plan {
    plan_ignoring(desired, existing, pool, owner, &BTreeSet::new())
}

/// [`plan`], where a field of `dropped` that the cluster's slices lack is no change: the API
/// server is known to drop it (a feature gate off there), so writing it again cannot help.
pub fn plan_ignoring(
    desired: &[ResourceSlice],
    existing: &[ResourceSlice],
    pool: &str,
    owner: &OwnerReference,
    dropped: &BTreeSet<DroppedField>,
) -> Plan {
    let by_name: BTreeMap<&str, &ResourceSlice> = existing
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, s)))
        .collect();
    let wanted: BTreeMap<&str, &ResourceSlice> = desired
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, s)))
        .collect();
    let highest = existing
        .iter()
        .filter(|s| s.spec.pool.name == pool)
        .map(|s| s.spec.pool.generation)
        .max();
    let generation = match highest {
        Some(g) if existing_at(existing, pool, g).all(|s| matches(&wanted, s, dropped)) => g,
        Some(g) => g.saturating_add(1),
        None => 1,
    };

    let mut writes = Vec::new();
    for slice in desired {
        let mut next = slice.clone();
        next.spec.pool.generation = generation;
        next.metadata.owner_references = Some(vec![owner.clone()]);
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        match by_name.get(name) {
            None => writes.push(Write::Create(next)),
            Some(current) => {
                let up_to_date = current.spec.pool.generation == generation
                    && same_content_ignoring(&next.spec, &current.spec, dropped)
                    && owned_by(current, owner);
                if !up_to_date {
                    writes.push(Write::Update(replacing(current, next)));
                }
            }
        }
    }
    let deletes = by_name
        .iter()
        .filter(|(name, _)| !wanted.contains_key(*name))
        .map(|(name, s)| Delete {
            name: name.to_string(),
            uid: s.metadata.uid.clone(),
        })
        .collect();
    Plan {
        generation,
        writes,
        deletes,
    }
}

fn existing_at<'a>(
    existing: &'a [ResourceSlice],
    pool: &'a str,
    generation: i64,
) -> impl Iterator<Item = &'a ResourceSlice> {
    existing
        .iter()
        .filter(move |s| s.spec.pool.name == pool && s.spec.pool.generation == generation)
}

/// Whether `current` is a desired slice with the desired content.
fn matches(
    wanted: &BTreeMap<&str, &ResourceSlice>,
    current: &ResourceSlice,
    dropped: &BTreeSet<DroppedField>,
) -> bool {
    let name = current.metadata.name.as_deref().unwrap_or_default();
    wanted
        .get(name)
        .is_some_and(|w| same_content_ignoring(&w.spec, &current.spec, dropped))
}

fn owned_by(slice: &ResourceSlice, owner: &OwnerReference) -> bool {
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == owner.kind && r.uid == owner.uid && r.name == owner.name)
}

/// `next` as an update of `current`: it keeps what others put in the metadata (labels,
/// annotations) and the resourceVersion, so a concurrent change makes the update conflict
/// instead of being overwritten.
fn replacing(current: &ResourceSlice, next: ResourceSlice) -> ResourceSlice {
    let mut metadata = current.metadata.clone();
    metadata.managed_fields = None;
    metadata.owner_references = next.metadata.owner_references;
    ResourceSlice {
        metadata,
        spec: next.spec,
    }
}
