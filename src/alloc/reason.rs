//! What the allocator found out on one node, in typed form: the allocation, or for every
//! request which devices were usable and the first reason each other device was not.

use std::fmt;

use k8s_openapi::api::resource::v1::AllocationResult;
use serde::Serialize;

/// One device, identified the way allocation results identify it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DeviceRef {
    /// The driver publishing the device, e.g. `gpu.nvidia.com`.
    pub driver: String,
    /// The pool (our driver names it after the node).
    pub pool: String,
    /// The device name, unique within the pool.
    pub device: String,
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// How many devices a request wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "mode", content = "count")]
pub enum Wants {
    /// `allocationMode: ExactCount` with this `count`.
    ExactCount(usize),
    /// `allocationMode: All`.
    All,
}

/// The first reason a device could not serve a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "reason")]
pub enum Rejection {
    /// A selector of the request's DeviceClass is false for the device.
    #[serde(rename_all = "camelCase")]
    ClassSelector {
        /// DeviceClass name.
        class: String,
        /// Position in the class's `spec.selectors`.
        index: usize,
        expression: String,
    },
    /// A selector of the request itself is false for the device.
    #[serde(rename_all = "camelCase")]
    RequestSelector {
        /// Position in the request's `selectors`.
        index: usize,
        expression: String,
    },
    /// Evaluating a selector failed; Kubernetes aborts allocation on the node for this.
    #[serde(rename_all = "camelCase")]
    SelectorError {
        /// The class owning the selector; `None` for a request selector.
        class: Option<String>,
        expression: String,
        /// The engine's error message.
        message: String,
    },
    /// The device is allocated to another claim and is not shareable.
    #[serde(rename_all = "camelCase")]
    AlreadyAllocated {
        /// `<namespace>/<name>` of the holding claim.
        claim: String,
    },
    /// A NoSchedule/NoExecute taint of the device that the request does not tolerate.
    #[serde(rename_all = "camelCase")]
    TaintNotTolerated {
        key: String,
        value: Option<String>,
        effect: String,
    },
    /// A capacity of the device cannot serve the request.
    #[serde(rename_all = "camelCase")]
    Capacity {
        capacity: String,
        problem: CapacityProblem,
    },
    /// A shared counter of the device's pool has too little left.
    #[serde(rename_all = "camelCase")]
    CountersExhausted {
        counter_set: String,
        counter: String,
        /// What the device consumes of the counter, as a quantity.
        needed: String,
        /// What is left of it, as a quantity (never negative).
        left: String,
        /// Devices holding the counter: allocated to other claims, or chosen in this run.
        consumers: Vec<Consumer>,
    },
    /// The device's compatibility groups on a counter set have no name in common with those
    /// of the devices already on it (KEP-5963): it may not be allocated beside them.
    #[serde(rename_all = "camelCase")]
    CompatibilityGroups {
        counter_set: String,
        /// The groups the device declares on the set; empty: none.
        groups: Vec<String>,
        /// What the devices on the set have in common; empty: they declare none.
        held: Vec<String>,
        /// Devices on the set: allocated to other claims, or chosen in this run.
        consumers: Vec<Consumer>,
    },
    /// A `matchAttribute` / `distinctAttribute` constraint of the claim rejects the device.
    #[serde(rename_all = "camelCase")]
    Constraint {
        /// Position in the claim's `spec.devices.constraints`.
        index: usize,
        kind: ConstraintKind,
        attribute: String,
        /// The device's value of the attribute; `None` if it lacks it.
        value: Option<String>,
        /// The device already chosen that this one conflicts with, if any.
        chosen: Option<Holder>,
    },
    /// Chosen for another request of the claims being allocated.
    #[serde(rename_all = "camelCase")]
    TakenByRequest {
        /// The request (or `<request>/<subrequest>`) holding it.
        request: String,
    },
}

/// Why a capacity cannot serve a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum CapacityProblem {
    /// The request names a capacity the device does not publish.
    NotOffered,
    /// The device's request policy does not allow the amount.
    #[serde(rename_all = "camelCase")]
    PolicyViolated { requested: String, policy: String },
    /// Not enough left after what other allocations consume.
    #[serde(rename_all = "camelCase")]
    Insufficient { requested: String, left: String },
}

/// Which kind of constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ConstraintKind {
    MatchAttribute,
    DistinctAttribute,
}

/// A device already chosen in this run, as seen by a constraint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// Device name.
    pub device: String,
    /// The request it was chosen for.
    pub request: String,
    /// Its value of the constrained attribute.
    pub value: String,
}

/// Who consumes a shared counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumer {
    /// Device name.
    pub device: String,
    /// `claim <namespace>/<name>` for earlier allocations, `request <name>` for this run.
    pub by: String,
}

/// Why the search on a node stopped before trying everything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "abort")]
pub enum Abort {
    /// A selector failed to evaluate on a device.
    #[serde(rename_all = "camelCase")]
    SelectorError {
        request: String,
        device: DeviceRef,
        class: Option<String>,
        expression: String,
        message: String,
    },
    /// A request for `All` devices cannot be decided while a pool is incomplete or invalid.
    #[serde(rename_all = "camelCase")]
    PoolNotReady { request: String, pool: String },
    /// A request for `All` devices includes one that a claim constraint rejects.
    #[serde(rename_all = "camelCase")]
    AllBlockedByConstraint { request: String, device: DeviceRef },
    /// More devices than one claim can hold.
    #[serde(rename_all = "camelCase")]
    TooManyDevices {
        request: String,
        count: usize,
        limit: usize,
    },
    /// The search tried this many steps without an answer and gave up.
    #[serde(rename_all = "camelCase")]
    StepLimit { steps: u64 },
    /// A slice field the allocator needs could not be read.
    #[serde(rename_all = "camelCase")]
    InvalidSlice {
        slice: String,
        field: String,
        value: String,
        problem: String,
    },
}

/// A pool reachable from the node whose devices were not considered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IgnoredPool {
    /// Driver of the pool.
    pub driver: String,
    /// Pool name.
    pub pool: String,
    /// `incomplete: 2 of 3 slices` or `duplicate device name gpu-0`.
    pub why: String,
}

/// Where a request ended up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RequestStatus {
    /// Part of the allocation.
    Allocated,
    /// Fewer usable devices than wanted, whatever else is chosen.
    Unsatisfiable,
    /// Enough usable devices alone, but not together with the other requests' choices.
    Blocked,
    /// A `firstAvailable` alternative listed after the one that was allocated.
    NotTried,
    /// The search stopped early (see the outcome's abort).
    Aborted,
}

/// One device and the first reason it was rejected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejected {
    pub device: DeviceRef,
    #[serde(flatten)]
    pub reason: Rejection,
}

/// What happened to one request (or `firstAvailable` sub-request) on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestTrace {
    /// `<namespace>/<name>` of the claim.
    pub claim: String,
    /// The request name; `<request>/<subrequest>` for `firstAvailable`.
    pub request: String,
    /// The DeviceClass the request names.
    pub class: String,
    /// How many devices it wants.
    pub wants: Wants,
    /// `adminAccess: true` was requested.
    pub admin_access: bool,
    /// Where it ended up.
    pub status: RequestStatus,
    /// Devices allocated to this request.
    pub allocated: Vec<DeviceRef>,
    /// Devices that pass every check on their own.
    pub usable: Vec<DeviceRef>,
    /// Every other device of the node, with the first reason it failed.
    pub rejected: Vec<Rejected>,
    /// Usable devices that the search could not combine with other choices: first reason.
    pub conflicts: Vec<Rejected>,
}

/// How far the search got: the most devices it held at once, and the fewest it needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Most devices held at once during the search (all of them when the claims fit).
    pub placed: usize,
    /// Fewest devices the claims need (an `All` request counts as one).
    pub needed: usize,
}

/// The result of allocating a set of claims on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The node tried (empty when the slices name no node).
    pub node: String,
    /// One result per claim, in input order, when every claim fits.
    pub allocations: Option<Vec<AllocationResult>>,
    /// How far the search got.
    pub progress: Progress,
    /// Why the search stopped early, if it did.
    pub abort: Option<Abort>,
    /// Pools reachable from the node that were not considered.
    pub ignored_pools: Vec<IgnoredPool>,
    /// Per request and sub-request; empty unless [`Detail::Full`](super::Detail) was asked.
    pub requests: Vec<RequestTrace>,
}

impl Outcome {
    /// True when every claim got its devices.
    pub fn fits(&self) -> bool {
        self.allocations.is_some()
    }
}
