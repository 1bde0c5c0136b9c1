//! One device the scheduler allocated to a claim, as plain data: what the API server's
//! `status.allocation.devices.results[]` says for this driver and node, and what the claim
//! lifecycle prepares. Both the API adapter ([`crate::k8s`]) and the lifecycle
//! ([`crate::claims`]) use this one type, so a claim read from the API server goes to
//! prepare without a copy field by field.

use std::collections::BTreeMap;

/// One device the allocation gives this driver on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// The request it satisfies (`req`, or `req/subrequest` for firstAvailable).
    pub request: String,
    /// Pool (this node's).
    pub pool: String,
    /// Device name.
    pub device: String,
    /// Admin access: the device is shared with other claims for monitoring; never change it.
    pub admin_access: bool,
    /// Share ID of a device allocated to several claims (consumable capacity).
    pub share_id: Option<String>,
    /// Capacity this allocation consumes (name → quantity, e.g. `"10Gi"`).
    pub consumed_capacity: BTreeMap<String, String>,
}
