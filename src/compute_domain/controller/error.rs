//! The controller's errors: each names the step and the object, the cause in `source`.

/// What went wrong in `gpu-dra compute-domain-controller`.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The API client could not be built (kubeconfig or in-cluster configuration).
    #[error("connecting to the API server")]
    Connect(#[source] crate::k8s::K8sError),
    /// Reading or writing the leader-election Lease failed.
    #[error("reading or writing Lease {name}")]
    Lease {
        /// Lease name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Another candidate holds the lease now, or renewing failed past the renew deadline.
    #[error(
        "lost the leadership of Lease {name}{}",
        if holder.is_empty() { String::new() } else { format!(" to {holder}") }
    )]
    LostLease {
        /// Lease name.
        name: String,
        /// The new holder, when known.
        holder: String,
    },
    /// One step of reconciling a domain failed; retried with a backoff.
    #[error("{step} for ComputeDomain {namespace}/{name}")]
    Reconcile {
        /// What was being done, e.g. `creating DaemonSet gpu-dra/imex-<uid>`.
        step: String,
        /// The domain's namespace.
        namespace: String,
        /// The domain's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A watch ended for good (the stream of a watcher does not end while the controller
    /// runs).
    #[error("the watch of {resource} ended")]
    WatchEnded {
        /// `computedomains` or `computedomainnodes`.
        resource: &'static str,
    },
    /// The metrics and health server could not start.
    #[error("serving metrics on {addr}")]
    Metrics {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}
