//! The clean-up progress of a deleted `ComputeDomain`: what the reconciler keeps per domain
//! between steps ([`super::reconcile::Reconciler`] holds it) and the clean-up steps
//! ([`super::cleanup`]) advance. Its own module so that neither of those two imports the other
//! for it.

use std::time::Instant;

/// How far the clean-up of one deleted domain got.
#[derive(Debug, Clone)]
pub struct Deleting {
    /// When this controller first saw the domain deleted.
    pub(super) since: Instant,
    /// The DaemonSet's deletion was asked for; from then on it is only read.
    pub(super) daemon_set_deleted: bool,
    /// The two templates were deleted.
    pub(super) templates_deleted: bool,
    /// Looks at the DaemonSet so far.
    pub(super) looks: u32,
}

impl Deleting {
    /// The progress of a clean-up that starts now: nothing deleted, no look taken.
    pub(super) fn start() -> Deleting {
        Deleting {
            since: Instant::now(),
            daemon_set_deleted: false,
            templates_deleted: false,
            looks: 0,
        }
    }
}
