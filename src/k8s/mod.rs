//! The API-server side of the plugin: publishing this node's ResourceSlices, reading the
//! ResourceClaims the kubelet asks to prepare, and the cluster facts checked at start.
//!
//! Everything here talks to the API server through a [`kube::Client`]; the decisions are pure
//! functions beside it ([`plan`] decides what to write, [`compare`] what counts as a change,
//! [`claims::allocated`] what a claim gives this driver), so they are tested without a server.
//! The effectful parts are tested against a mocked API server at the HTTP layer.

pub mod backoff;
pub mod claim_lookup;
pub mod claim_status;
pub mod claims;
pub mod cluster;
pub mod compare;
mod connect;
mod error;
pub mod events;
pub mod plan;
pub mod publisher;

pub use backoff::Backoff;
pub use claim_lookup::{ClaimLookup, ClaimState, Freshness};
pub use claim_status::{ClaimStatusWriter, ConditionStatus, DeviceStatus, Readiness, SyncOutcome};
pub use claims::{
    AllocatedClaim, AllocatedDevice, ClaimReader, ConfigSource, OpaqueConfig, ReservedPod,
};
pub use cluster::{ClusterFacts, ServerVersion};
pub use connect::connect;
pub use error::{ClaimRef, K8sError, Step};
pub use events::{EventType, NodeEvents};
pub use publisher::{PublishOutcome, PublishStatus, PublisherOptions, SlicePublisher};
