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
    /// The finalizers changed again between reading the domain afresh and patching them
    /// (someone else writes them at the same moment); retried with a backoff.
    #[error(
        "{step} of ComputeDomain {namespace}/{name}: its finalizers changed twice while \
         being written"
    )]
    FinalizerRace {
        /// The domain's namespace.
        namespace: String,
        /// The domain's name.
        name: String,
        /// `adding the finalizer` or `removing the finalizer`.
        step: &'static str,
    },
    /// The controller's own pod could not be read for the image of the IMEX daemons.
    #[error(
        "reading the controller's own pod {namespace}/{name} for the IMEX daemons' image \
         (pass --image, or GPU_DRA_IMEX_IMAGE, to name it instead)"
    )]
    OwnPod {
        /// `POD_NAMESPACE`.
        namespace: String,
        /// `POD_NAME`.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The controller's own pod has no container with an image.
    #[error("the controller's own pod {namespace}/{name} names no container image")]
    OwnPodNoImage {
        /// `POD_NAMESPACE`.
        namespace: String,
        /// `POD_NAME`.
        name: String,
    },
    /// Neither an image nor the controller's own pod is known.
    #[error(
        "no image for the IMEX daemon pods: pass --image (or GPU_DRA_IMEX_IMAGE), or run the \
         controller in a pod with POD_NAME and POD_NAMESPACE set from the downward API \
         (metadata.name, metadata.namespace) so it uses its own image"
    )]
    NoImage,
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
