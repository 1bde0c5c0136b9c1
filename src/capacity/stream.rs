//! The capacity view built pool by pool as ResourceSlices arrive one at a time (from a file
//! or a list response, split by [`crate::explain::stream`]), so that a 1,000-node cluster's
//! slices are never held at once.
//!
//! A slice is kept as its bytes until its pool is complete (as many slices of its newest
//! generation as `resourceSliceCount` says); the pool is then read into records, its GPUs
//! evaluated, and its bytes dropped. Pools still incomplete at the end are evaluated as they
//! are, as the whole-list path does. Lists sort a node's slices together, so one pool waits at
//! a time; any order gives the same report, holding more while pools interleave.
//!
//! A newer generation of a pool already evaluated replaces it; an older one is ignored. A
//! slice of the generation already evaluated, beyond the pool's count, would have to be read
//! together with the slices already dropped: the stream then gives up ([`Stop`]) and
//! the caller reads the whole list, as before this module.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Deserialize;

use super::book::Evaluated;
use super::fast_json;
use super::gpus::{self, Holders, Warnings};
use super::records::SliceRecord;
use super::{CapacityError, CapacityOptions, CapacityReport};
use crate::explain::stream::ListHead;

const API_VERSION: &str = "resource.k8s.io/v1";

/// The stream cannot give the report, and the caller reads the whole list instead, which
/// reports what is wrong as it always did: the input is not for this path (items that are
/// not v1 ResourceSlices, in a file), a pool's slices cannot be taken one pool at a time, or a
/// slice is one the model cannot read (the whole list names the first such in pool order).
#[derive(Debug)]
pub(super) struct Stop;

impl From<CapacityError> for Stop {
    fn from(_: CapacityError) -> Self {
        Stop
    }
}

/// What the stream reads of each slice before its pool is complete.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    spec: HeaderSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeaderSpec {
    driver: String,
    #[serde(default)]
    node_name: Option<String>,
    pool: HeaderPool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeaderPool {
    name: String,
    generation: i64,
    resource_slice_count: i64,
}

/// A pool's slices of its newest generation so far, as bytes.
struct Pending {
    generation: i64,
    expected: i64,
    items: Vec<Vec<u8>>,
}

/// A pool evaluated.
struct Done {
    generation: i64,
    gpus: Vec<Evaluated>,
    warnings: Warnings,
}

/// Where the slices come from, which decides what an unexpected item means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// A file: items must say they are `resource.k8s.io/v1` ResourceSlices (or the list must
    /// be the API server's typed list); anything else declines, and the caller reads the file
    /// in full, which reads every form and names what is wrong.
    File,
    /// An API server's answer to a ResourceSlice list: every item is a ResourceSlice, read
    /// through the full API type when the fast records cannot take it.
    Api,
}

/// The capacity view of slices fed one at a time; see the module docs.
pub(super) struct PoolStream<'h> {
    options: &'h CapacityOptions,
    holders: &'h Holders<'h>,
    source: Source,
    pending: HashMap<String, Pending>,
    done: BTreeMap<String, Done>,
    /// Nodes publishing slices of the driver, for the error naming an unknown `--node`.
    known_nodes: BTreeSet<String>,
    items: usize,
    /// Some item carried neither `apiVersion` nor `kind` (an API server's typed list).
    kindless: bool,
}

impl<'h> PoolStream<'h> {
    /// A stream counting `options.driver`'s slices, with what claims hold from `holders`.
    pub(super) fn new(
        options: &'h CapacityOptions,
        holders: &'h Holders<'h>,
        source: Source,
    ) -> Self {
        PoolStream {
            options,
            holders,
            source,
            pending: HashMap::new(),
            done: BTreeMap::new(),
            known_nodes: BTreeSet::new(),
            items: 0,
            kindless: false,
        }
    }

    /// Takes the next slice, as the bytes of one JSON object.
    pub(super) fn item(&mut self, bytes: Vec<u8>) -> Result<(), Stop> {
        self.items += 1;
        let header: Header = serde_json::from_slice(&bytes).map_err(|_| Stop)?;
        match (header.api_version.as_deref(), header.kind.as_deref()) {
            (None, None) => self.kindless = true,
            (Some(API_VERSION), Some("ResourceSlice")) => {}
            _ if self.source == Source::File => return Err(Stop),
            // An API server answers what it was asked; its decoder says whether it is right.
            _ => {}
        }
        let spec = header.spec;
        if spec.driver != self.options.driver {
            return Ok(());
        }
        if let Some(node) = &spec.node_name {
            self.known_nodes.insert(node.clone());
        }
        let node = spec.node_name.as_deref().unwrap_or(&spec.pool.name);
        if self.options.node.as_deref().is_some_and(|n| n != node) {
            return Ok(());
        }
        let pool = spec.pool;
        if let Some(done) = self.done.get(&pool.name) {
            match pool.generation.cmp(&done.generation) {
                std::cmp::Ordering::Less => return Ok(()),
                std::cmp::Ordering::Equal => return Err(Stop),
                std::cmp::Ordering::Greater => {
                    self.done.remove(&pool.name);
                }
            }
        }
        let entry = self
            .pending
            .entry(pool.name.clone())
            .or_insert_with(|| Pending {
                generation: pool.generation,
                expected: pool.resource_slice_count,
                items: Vec::new(),
            });
        if pool.generation > entry.generation {
            *entry = Pending {
                generation: pool.generation,
                expected: pool.resource_slice_count,
                items: Vec::new(),
            };
        }
        if pool.generation < entry.generation {
            return Ok(());
        }
        entry.items.push(bytes);
        if entry.items.len() as i64 == entry.expected
            && let Some(complete) = self.pending.remove(&pool.name)
        {
            let done = self.evaluate(complete)?;
            self.done.insert(pool.name, done);
        }
        Ok(())
    }

    /// Reads a pool's slices into records and evaluates its GPUs.
    fn evaluate(&self, pool: Pending) -> Result<Done, Stop> {
        let fast: Option<Vec<SliceRecord>> = pool
            .items
            .iter()
            .map(|bytes| fast_json::slice(bytes))
            .collect();
        let typed: Vec<ResourceSlice>;
        let records = match fast {
            Some(records) => records,
            None if self.source == Source::File => return Err(Stop),
            None => {
                typed = pool
                    .items
                    .iter()
                    .map(|bytes| serde_json::from_slice(bytes))
                    .collect::<Result<_, _>>()
                    .map_err(|_| Stop)?;
                typed.iter().map(SliceRecord::from_api).collect()
            }
        };
        let mut warnings = Warnings::default();
        let gpus = gpus::collect(&records, self.options, self.holders, &mut warnings)?;
        Ok(Done {
            generation: pool.generation,
            gpus: gpus.into_iter().map(|g| g.evaluate()).collect(),
            warnings,
        })
    }

    /// After the last slice: evaluates the pools still incomplete and sums everything up.
    ///
    /// `head` is the list's, when it was read to the end. Declines (files) when there were no
    /// slices, or items without `kind` outside an API server's typed v1 list. Fails as
    /// [`super::build`] does.
    pub(super) fn finish(
        mut self,
        head: Option<&ListHead>,
        nodes: &[Node],
    ) -> Result<CapacityReport, Stop> {
        if self.source == Source::File {
            let typed = head.is_some_and(|h| h.is_typed_list_of("ResourceSlice", API_VERSION));
            if self.items == 0 || (self.kindless && !typed) {
                return Err(Stop);
            }
        }
        for (name, pool) in std::mem::take(&mut self.pending) {
            let done = self.evaluate(pool)?;
            self.done.insert(name, done);
        }
        let mut warnings = Warnings::default();
        let mut evaluated = Vec::new();
        for done in self.done.into_values() {
            evaluated.extend(done.gpus);
            warnings.extend(done.warnings);
        }
        if let Some(node) = &self.options.node
            && evaluated.is_empty()
        {
            return Err(super::unknown_node(
                node,
                &self.options.driver,
                self.known_nodes.iter().map(String::as_str),
            )
            .into());
        }
        Ok(super::summary::assemble(
            evaluated,
            nodes,
            self.options,
            warnings.into_list(),
        ))
    }
}
