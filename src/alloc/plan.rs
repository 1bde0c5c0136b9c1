//! What the search works from once claims are checked: one slot per request or
//! `firstAvailable` sub-request, with compiled selectors. Types only: `claim.rs` builds them into
//! a `Prepared`, `constraint.rs`, `capacity.rs` and the search read them.

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceToleration, ResourceClaim};

use super::reason::Wants;
use crate::quantity::Quantity;

pub(crate) struct ClaimPlan<'a> {
    pub(crate) claim: &'a ResourceClaim,
    pub(crate) display: String,
    /// Top-level request indices in [`Prepared::requests`].
    pub(crate) requests: Vec<usize>,
}

/// A top-level request: one slot, or the `firstAvailable` alternatives in order.
pub(crate) struct RequestPlan {
    pub(crate) claim: usize,
    pub(crate) alternatives: Vec<usize>,
}

/// A compiled selector and where it came from.
pub(crate) struct Selector<'a> {
    pub(crate) program: usize,
    pub(crate) expression: &'a str,
    pub(crate) index: usize,
}

/// A capacity amount a request asks for.
pub(crate) struct CapacityRequest<'a> {
    pub(crate) name: &'a str,
    /// As written, so that reports print it in the request's format.
    pub(crate) amount: Quantity,
}

/// One request or sub-request: what a device must satisfy and how many are wanted.
pub(crate) struct Slot<'a> {
    pub(crate) claim: usize,
    /// `<request>` or `<request>/<subrequest>`.
    pub(crate) name: String,
    /// The top-level request name.
    pub(crate) base: &'a str,
    pub(crate) class: &'a DeviceClass,
    pub(crate) class_name: &'a str,
    pub(crate) class_selectors: Vec<Selector<'a>>,
    pub(crate) selectors: Vec<Selector<'a>>,
    pub(crate) wants: Wants,
    pub(crate) admin: bool,
    pub(crate) tolerations: &'a [DeviceToleration],
    pub(crate) capacity: Vec<CapacityRequest<'a>>,
}
