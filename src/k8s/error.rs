//! The one error type of the API-server side, and the step each request belongs to.

use std::fmt;
use std::path::PathBuf;

use crate::slices::SliceError;

/// A ResourceClaim as the kubelet names it: `namespace/name (uid)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID the kubelet expects.
    pub uid: String,
}

impl fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// Which request to the API server failed, with the object it was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `GET /version`.
    GetVersion,
    /// `GET /apis` (API group discovery).
    ListApiGroups,
    /// `GET /api/v1/nodes/<node>`.
    GetNode {
        /// Node name.
        node: String,
    },
    /// Listing the driver's ResourceSlices of one node.
    ListSlices {
        /// Node name.
        node: String,
        /// Driver name.
        driver: String,
    },
    /// `POST` of one ResourceSlice.
    CreateSlice {
        /// Slice name.
        name: String,
    },
    /// `PUT` of one ResourceSlice.
    UpdateSlice {
        /// Slice name.
        name: String,
    },
    /// `DELETE` of one ResourceSlice.
    DeleteSlice {
        /// Slice name.
        name: String,
    },
    /// `GET` of one ResourceClaim.
    GetClaim {
        /// The claim.
        claim: Box<ClaimRef>,
    },
    /// `PUT` of one ResourceClaim's status subresource (its `status.devices`).
    UpdateClaimStatus {
        /// The claim.
        claim: Box<ClaimRef>,
    },
    /// `POST` of an Event about this node.
    CreateEvent {
        /// Node name.
        node: String,
        /// The event's reason.
        reason: String,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::GetVersion => f.write_str("reading the API server version"),
            Step::ListApiGroups => f.write_str("listing the API groups"),
            Step::GetNode { node } => write!(f, "reading Node {node}"),
            Step::ListSlices { node, driver } => {
                write!(
                    f,
                    "listing the ResourceSlices of driver {driver} on node {node}"
                )
            }
            Step::CreateSlice { name } => write!(f, "creating ResourceSlice {name}"),
            Step::UpdateSlice { name } => write!(f, "updating ResourceSlice {name}"),
            Step::DeleteSlice { name } => write!(f, "deleting ResourceSlice {name}"),
            Step::GetClaim { claim } => write!(f, "reading ResourceClaim {claim}"),
            Step::UpdateClaimStatus { claim } => {
                write!(f, "writing the status.devices of ResourceClaim {claim}")
            }
            Step::CreateEvent { node, reason } => {
                write!(f, "creating a {reason} Event on Node {node}")
            }
        }
    }
}

/// Everything that can go wrong talking to the API server. Each variant names the step and the
/// object; [`K8sError::is_transient`] tells whether trying again later can help.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// The kubeconfig file could not be read or used.
    #[error("cannot use kubeconfig {path:?}")]
    Kubeconfig {
        /// The file given with `--kubeconfig`.
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// No kubeconfig was given and the process does not run in a pod.
    #[error(
        "no in-cluster configuration (not running in a pod with a service account?); \
         pass --kubeconfig PATH"
    )]
    InCluster {
        #[source]
        source: kube::config::InClusterError,
    },

    /// The configuration was read but no client could be built from it (TLS, auth).
    #[error("cannot build an API client from {origin}")]
    BuildClient {
        /// `kubeconfig <path>` or `in-cluster configuration`.
        origin: String,
        #[source]
        source: Box<kube::Error>,
    },

    /// The API server answered with an error status.
    #[error("{step} was refused by the API server ({code} {reason}): {message}")]
    Api {
        /// What was being done.
        step: Step,
        /// HTTP status code.
        code: u16,
        /// Machine-readable reason (`Invalid`, `Forbidden`, `Conflict`, …).
        reason: String,
        /// The server's message.
        message: String,
        /// How long the server asked the client to wait before retrying (`429`/`503` with
        /// `details.retryAfterSeconds`, which the API server sends with `Retry-After`).
        retry_after: Option<std::time::Duration>,
    },

    /// The API server could not be reached or did not answer.
    #[error("{step} failed: the API server could not be reached")]
    Unreachable {
        /// What was being done.
        step: Step,
        #[source]
        source: Box<kube::Error>,
    },

    /// The API server answered something this client cannot read.
    #[error("{step} failed: unexpected answer from the API server")]
    Protocol {
        /// What was being done.
        step: Step,
        #[source]
        source: Box<kube::Error>,
    },

    /// The device model breaks a ResourceSlice limit.
    #[error("building the ResourceSlices of node {node} failed")]
    BuildSlices {
        /// Node name.
        node: String,
        #[source]
        source: SliceError,
    },

    /// The API server reports a version this client cannot read.
    #[error("API server version field {field} is {value:?}, not a number")]
    BadVersion {
        /// `major` or `minor`.
        field: &'static str,
        /// What the server sent.
        value: String,
    },

    /// The Node object came without a UID, so slices cannot be owned by it.
    #[error("Node {node} has no metadata.uid")]
    NodeWithoutUid {
        /// Node name.
        node: String,
    },

    /// The claim is gone: deleted since the kubelet asked.
    #[error("ResourceClaim {claim} not found (deleted?)")]
    ClaimNotFound {
        /// The claim.
        claim: Box<ClaimRef>,
    },

    /// A claim of that name exists, but it is another object: the claim was deleted and
    /// re-created since the kubelet asked.
    #[error("ResourceClaim {claim} has UID {found} in the cluster: it was deleted and re-created")]
    ClaimUidMismatch {
        /// The claim as the kubelet named it (with the expected UID).
        claim: Box<ClaimRef>,
        /// The UID found in the cluster.
        found: String,
    },

    /// The claim has no `status.allocation`.
    #[error("ResourceClaim {claim} is not allocated (no status.allocation)")]
    ClaimNotAllocated {
        /// The claim.
        claim: Box<ClaimRef>,
    },

    /// The allocation has no device of this driver in this node's pool.
    #[error(
        "ResourceClaim {claim} has no device of driver {driver} in pool {pool} \
         (allocated: {allocated})"
    )]
    ClaimNoResults {
        /// The claim.
        claim: Box<ClaimRef>,
        /// This driver.
        driver: String,
        /// This node's pool.
        pool: String,
        /// `driver/pool/device` of every result, or `nothing`.
        allocated: String,
    },

    /// A config entry of this driver has a source Kubernetes does not define.
    #[error(
        "ResourceClaim {claim}: status.allocation.devices.config[{index}].source is {value:?}; \
         valid: FromClass, FromClaim"
    )]
    ClaimConfigSource {
        /// The claim.
        claim: Box<ClaimRef>,
        /// Index in `status.allocation.devices.config`.
        index: usize,
        /// The source found.
        value: String,
    },
}

impl K8sError {
    /// Wraps a failed request of `step`, telling an error status (with the server's code, reason
    /// and message) from a transport failure.
    pub fn from_kube(step: Step, error: kube::Error) -> K8sError {
        match error {
            kube::Error::Api(status) => K8sError::Api {
                step,
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                retry_after: status
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|s| *s > 0)
                    .map(|s| std::time::Duration::from_secs(u64::from(s))),
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                K8sError::Unreachable {
                    step,
                    source: Box::new(error),
                }
            }
            other => K8sError::Protocol {
                step,
                source: Box::new(other),
            },
        }
    }

    /// Whether the same request may succeed later without anyone changing anything: the server
    /// was unreachable, overloaded (429), failing (5xx) or the object changed underneath
    /// (409 conflict). Invalid objects (422), missing permissions (403), missing objects and
    /// bad configuration are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            K8sError::Unreachable { .. } => true,
            K8sError::Api { code, .. } => *code == 409 || *code == 429 || *code >= 500,
            _ => false,
        }
    }

    /// How long the API server asked to wait before the next try, if it said.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            K8sError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status the API server answered with, if it answered with an error status.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            K8sError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}
