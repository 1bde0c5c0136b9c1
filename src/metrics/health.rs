//! Readiness of the plugin as `/readyz` reports it: three facts the plugin learns at
//! different times, each set by whoever learns it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Default)]
struct Inner {
    recovered: AtomicBool,
    published: AtomicBool,
    registered: AtomicBool,
}

/// Shared readiness state. Cheap to clone; every clone sees the same facts. Starts not ready.
#[derive(Clone, Default)]
pub struct Health(Arc<Inner>);

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("missing", &self.missing())
            .finish()
    }
}

impl Health {
    /// Nothing known yet: not ready.
    pub fn new() -> Health {
        Health::default()
    }

    /// Start-up recovery (checkpoint, orphaned MIG devices, stale CDI specs) finished.
    pub fn set_recovered(&self) {
        self.0.recovered.store(true, Ordering::Relaxed);
    }

    /// The node's ResourceSlices were published at least once. Later failures do not undo
    /// this: the published slices stay usable and the publisher keeps retrying.
    pub fn set_published(&self) {
        self.0.published.store(true, Ordering::Relaxed);
    }

    /// Whether the kubelet has (still) registered the plugin: it can withdraw a registration
    /// (a rejection, or a kubelet restart that has not re-registered yet).
    pub fn set_registered(&self, registered: bool) {
        self.0.registered.store(registered, Ordering::Relaxed);
    }

    /// What readiness still waits for, in start-up order; empty when ready.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.0.recovered.load(Ordering::Relaxed) {
            missing.push("start-up recovery has not finished");
        }
        if !self.0.published.load(Ordering::Relaxed) {
            missing.push("ResourceSlices have not been published yet");
        }
        if !self.0.registered.load(Ordering::Relaxed) {
            missing.push("the kubelet has not registered the plugin");
        }
        missing
    }

    /// Registered, published once and recovered.
    pub fn is_ready(&self) -> bool {
        self.missing().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_recovery_publishing_and_registration() {
        let health = Health::new();
        assert_eq!(3, health.missing().len());
        health.set_recovered();
        health.set_published();
        assert_eq!(
            vec!["the kubelet has not registered the plugin"],
            health.missing()
        );
        health.set_registered(true);
        assert!(health.is_ready());
        health.set_registered(false);
        assert!(!health.is_ready(), "a withdrawn registration is not ready");
    }
}
