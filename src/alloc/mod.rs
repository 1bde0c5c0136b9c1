//! The structured-parameters allocator: which devices of a node satisfy a set of
//! ResourceClaims, decided the way the Kubernetes scheduler's allocator decides it.
//!
//! Semantics follow `k8s.io/dynamic-resource-allocation/structured`: requests with
//! `exactly` (ExactCount or All, class and request selectors, admin access, tolerations,
//! capacity) and `firstAvailable` (first alternative that can be satisfied wins);
//! `matchAttribute` / `distinctAttribute` constraints; shared counters of partitionable
//! devices; devices held by earlier claims (exclusive unless `allowMultipleAllocations`,
//! then consumable capacity with request policies); device taints; only complete pools.
//! The search is depth-first with backtracking, devices tried in pool/slice order.
//!
//! Deliberate differences: admin-access requests consume neither counters nor capacity;
//! share IDs are derived deterministically instead of drawn at random; a search that takes
//! more than [`DEFAULT_STEP_LIMIT`] steps gives up on the node instead of running on.
//!
//! Pure: no I/O and no logging. Selector evaluation is injected through [`SelectorEngine`].

mod capacity;
mod checks;
mod claim;
mod constraint;
mod counters;
mod engine;
mod groups;
mod inventory;
mod node;
mod plan;
mod reason;
mod result;
mod search;
mod state;
pub mod table;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceClaim, ResourceSlice};

pub use claim::Prepared;
pub use engine::{Counting, SelectorEngine};
pub use node::Node;
pub use reason::{
    Abort, CapacityProblem, ConstraintKind, Consumer, DeviceRef, Holder, IgnoredPool, Outcome,
    Progress, Rejected, Rejection, RequestStatus, RequestTrace, Wants,
};
pub use state::{allocation_results, claim_display};

use inventory::Inventory;
use search::NodeSearch;
use state::AllocatedState;

/// At most this many devices in one claim's allocation (`AllocationResultsMaxSize`).
pub const MAX_DEVICES_PER_CLAIM: usize = 32;

/// Search steps per node before the allocator gives up on it.
pub const DEFAULT_STEP_LIMIT: u64 = 1_000_000;

/// How the search undoes a candidate device that a claim constraint refuses after its shared
/// counters were reserved.
///
/// kube-scheduler's `allocateDevice` (k8s.io/dynamic-resource-allocation,
/// `structured/internal/{stable,incubating,experimental}/allocator_*.go`, v0.34.0 through
/// v0.37.0-alpha.2) reserves a candidate's counters in `checkAvailableCounters`, then checks
/// taints and the claim's constraints, and returns on a refusal without
/// `deallocateCountersForDevice`: the counters stay taken for the rest of that node's
/// search, so a device refused once (a GPU of another partition, say) cannot be picked later
/// in the same search. kubernetes/kubernetes#140431 (backported to 1.36 as #140663) rolls
/// them back. docs/fabric-manager.md shows what it does to partition claims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CounterRollback {
    /// Released, as Kubernetes does with #140431.
    #[default]
    Released,
    /// Kept for the rest of the node's search, as kube-scheduler 1.34 to 1.36 without
    /// #140663 does (constraint refusals only; our taint check runs before counters).
    Leaked,
}

/// Input the allocator cannot work with. Each variant names the object, the field and the
/// offending value.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// A request names a DeviceClass that is not among the classes given.
    #[error(
        "claim {claim}: {field} is {value:?}, which is not a known DeviceClass (known: {known})"
    )]
    UnknownClass {
        claim: String,
        field: String,
        value: String,
        known: String,
    },
    /// A claim field has a value the allocator cannot honour.
    #[error("claim {claim}: {field} is {value:?}: {problem}")]
    InvalidClaim {
        claim: String,
        field: String,
        value: String,
        problem: String,
    },
    /// A selector does not compile.
    #[error("{owner}: {field}: selector {expression:?} does not compile: {message}")]
    SelectorCompile {
        owner: String,
        field: String,
        expression: String,
        message: String,
    },
    /// An already-allocated claim records something unreadable.
    #[error("allocated claim {claim}: {field} is {value:?}: {problem}")]
    AllocatedClaim {
        claim: String,
        field: String,
        value: String,
        problem: String,
    },
}

/// A slice field that could not be read, before the slice's name is attached.
pub(crate) struct SliceProblem {
    pub(crate) field: String,
    pub(crate) value: String,
    pub(crate) problem: String,
}

/// How much the allocator records besides the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// The result and how far the search got: cheap, for scanning many nodes.
    Brief,
    /// Also every device's first rejection reason for every request ([`Outcome::requests`]).
    Full,
}

/// Allocates claims against a fixed set of classes, slices and earlier allocations.
///
/// Build it once and use it for many nodes and claim sets: pools are indexed once and each
/// device's selector view is built at most once.
pub struct Allocator<'a, E: SelectorEngine> {
    engine: &'a E,
    classes: BTreeMap<&'a str, &'a DeviceClass>,
    inventory: Inventory<'a>,
    state: AllocatedState<'a>,
    views: Vec<OnceLock<Result<E::View<'a>, String>>>,
    step_limit: u64,
    counter_rollback: CounterRollback,
}

impl<'a, E: SelectorEngine> Allocator<'a, E> {
    /// Indexes `slices` and what the `allocated` claims hold.
    ///
    /// Fails only when an allocated claim records an unreadable `consumedCapacity`.
    pub fn new(
        engine: &'a E,
        classes: &'a [DeviceClass],
        slices: &'a [ResourceSlice],
        allocated: &'a [ResourceClaim],
    ) -> Result<Self, AllocError> {
        let inventory = Inventory::new(slices);
        let views = (0..inventory.device_count)
            .map(|_| OnceLock::new())
            .collect();
        Ok(Self {
            engine,
            classes: classes
                .iter()
                .filter_map(|c| c.metadata.name.as_deref().map(|n| (n, c)))
                .collect(),
            inventory,
            state: AllocatedState::new(allocated)?,
            views,
            step_limit: DEFAULT_STEP_LIMIT,
            counter_rollback: CounterRollback::default(),
        })
    }

    /// Replaces [`DEFAULT_STEP_LIMIT`].
    pub fn with_step_limit(mut self, steps: u64) -> Self {
        self.step_limit = steps;
        self
    }

    /// Replaces [`CounterRollback::Released`], e.g. to reproduce what an older kube-scheduler
    /// decides.
    pub fn with_counter_rollback(mut self, rollback: CounterRollback) -> Self {
        self.counter_rollback = rollback;
        self
    }

    /// The nodes that slices name (`spec.nodeName`), sorted.
    pub fn node_names(&self) -> Vec<String> {
        self.inventory.node_names()
    }

    /// Checks `claims` and compiles their selectors (and their classes'), each distinct
    /// expression once.
    ///
    /// Fails on bad input: an unknown class, a count below 1 or above
    /// [`MAX_DEVICES_PER_CLAIM`], an unknown allocation mode, a constraint naming an unknown
    /// request, a selector that does not compile, an unreadable capacity request.
    pub fn prepare(&self, claims: &'a [ResourceClaim]) -> Result<Prepared<'a, E>, AllocError> {
        let mut builder = claim::Builder::new(self.engine, &self.classes);
        for claim in claims {
            builder.add_claim(claim)?;
        }
        Ok(builder.finish())
    }

    /// Allocates all `prepared` claims together on `node`.
    ///
    /// Never fails: a claim that does not fit yields an [`Outcome`] without allocations,
    /// with how far the search got, why it stopped early if it did, and (with
    /// [`Detail::Full`]) every device's first rejection reason per request.
    pub fn allocate(&self, prepared: &Prepared<'a, E>, node: &Node, detail: Detail) -> Outcome {
        let devices = self.inventory.for_node(node);
        let full = detail == Detail::Full;
        let mut search = NodeSearch::new(self, prepared, &devices, full);
        let (found, abort) = match search.run() {
            Ok(found) => (found, None),
            Err(abort) => (false, Some(*abort)),
        };
        let allocations = found.then(|| search.results(node));
        let needed = prepared
            .requests
            .iter()
            .map(|r| {
                r.alternatives
                    .iter()
                    .map(|&s| match prepared.slots[s].wants {
                        Wants::ExactCount(n) => n,
                        Wants::All => 1,
                    })
                    .min()
                    .unwrap_or(0)
            })
            .sum();
        let requests = if full {
            search.traces(found, abort.is_some())
        } else {
            Vec::new()
        };
        let ignored_pools = devices
            .ignored_pools
            .iter()
            .map(|&p| {
                let pool = &self.inventory.pools[p];
                let why = match pool.duplicate {
                    Some(name) => format!("duplicate device name {name}"),
                    None => format!(
                        "incomplete: {} of {} slices at generation {}",
                        pool.slices.len(),
                        pool.expected_slices,
                        pool.slices
                            .first()
                            .map(|s| s.spec.pool.generation)
                            .unwrap_or_default()
                    ),
                };
                IgnoredPool {
                    driver: pool.driver.to_string(),
                    pool: pool.name.to_string(),
                    why,
                }
            })
            .collect();
        Outcome {
            node: node.name.clone(),
            progress: Progress {
                placed: if found {
                    search.picks.len()
                } else {
                    search.best
                },
                needed,
            },
            allocations,
            abort,
            ignored_pools,
            requests,
        }
    }

    /// The selector view of one device, built on first use.
    pub(crate) fn view(
        &self,
        global: usize,
        driver: &'a str,
        device: &'a Device,
    ) -> &Result<E::View<'a>, String> {
        self.views[global].get_or_init(|| self.engine.view(driver, device))
    }
}

/// Convenience for one claim on one node: builds an allocator, prepares and allocates.
pub fn allocate_claim<'a, E: SelectorEngine>(
    engine: &'a E,
    classes: &'a [DeviceClass],
    slices: &'a [ResourceSlice],
    allocated: &'a [ResourceClaim],
    claim: &'a ResourceClaim,
    node: &Node,
    detail: Detail,
) -> Result<Outcome, AllocError> {
    let allocator = Allocator::new(engine, classes, slices, allocated)?;
    let prepared = allocator.prepare(std::slice::from_ref(claim))?;
    Ok(allocator.allocate(&prepared, node, detail))
}
