//! What the claim lifecycle is given: the claim the kubelet names, its allocation as the API
//! server has it (through [`ClaimSource`]), and the host facts CDI specs need (through
//! [`HostFactsSource`]).

use std::fmt;

use crate::cdi::{self, GpuDeviceRef, HostFacts};

/// The claim the kubelet names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimId {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl fmt::Display for ClaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One allocated device of this driver in this node's pool (shared with the API adapter).
pub use crate::allocation::AllocatedDevice;

/// One opaque config entry of this driver.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    /// From the DeviceClass (lower precedence) rather than the claim.
    pub from_class: bool,
    /// Requests it applies to; empty = all.
    pub requests: Vec<String>,
    /// The raw parameters object.
    pub parameters: serde_json::Value,
}

/// What the API server says about a claim, already filtered to this driver and node.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAllocation {
    /// Allocated devices in allocation order.
    pub devices: Vec<AllocatedDevice>,
    /// Opaque config entries (class first, then claim).
    pub config: Vec<ConfigEntry>,
    /// The claim's `resource.kubernetes.io/pod-claim-name` annotation (a claim made from a
    /// template): where its device metadata appears in the containers.
    pub pod_claim_name: Option<String>,
}

/// Where allocations come from (the API server in production, a table in tests).
pub trait ClaimSource: Send + Sync {
    /// Reads the claim and checks its UID; the error text names the claim and the cause.
    fn fetch(&self, id: &ClaimId) -> impl Future<Output = Result<ClaimAllocation, String>> + Send;

    /// The kubelet asked to prepare claim `id` again while it is prepared: typically for
    /// another pod of a shared claim. A source may re-read who the claim is reserved for, but
    /// must not make the call wait for it. Default: nothing.
    fn prepared_again(&self, _id: &ClaimId) {}

    /// Reads `ids` ahead of their prepare, before the call waits for the plugin lock, so a
    /// slow API server holds up only the calls that wait for it; the next [`fetch`] of each
    /// answers with what was read. Default: nothing (every fetch reads).
    ///
    /// [`fetch`]: ClaimSource::fetch
    fn prefetch(&self, _ids: &[ClaimId]) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// Drops what [`ClaimSource::prefetch`] read for `ids` and no fetch used (the claim
    /// turned out prepared already). Default: nothing.
    fn forget_prefetched(&self, _ids: &[ClaimId]) {}
}

/// Where CDI edits for devices come from: the real host, or a simulated node's device nodes.
pub trait HostFactsSource: Send + Sync {
    /// Facts for these devices; the error text says what is missing.
    fn facts(&self, gpus: &[GpuDeviceRef]) -> Result<HostFacts, String>;

    /// The CDI device node of the VFIO node `path` (`/dev/vfio/3`, `/dev/vfio/vfio`,
    /// `/dev/iommu`, `/dev/vfio/devices/vfio0`), as the host has it under `host_root`. The
    /// default, for a real host, reads its type and numbers there (the runtime on the host
    /// finds it at `path`); the error says which node is missing.
    fn vfio_node(
        &self,
        path: &str,
        host_root: &std::path::Path,
    ) -> Result<cdi::DeviceNode, String> {
        let at = host_root.join(path.trim_start_matches('/'));
        let info = cdi::stat_node(&at)
            .map_err(|e| crate::errors::error_chain(&e))?
            .ok_or_else(|| {
                format!(
                    "{} does not exist after the switch to vfio-pci",
                    at.display()
                )
            })?;
        Ok(cdi::node_edit(path, std::path::Path::new(path), info).0)
    }
}

impl HostFactsSource for cdi::HostMode {
    fn facts(&self, gpus: &[GpuDeviceRef]) -> Result<HostFacts, String> {
        cdi::HostMode::facts(self, gpus).map_err(|e| crate::errors::error_chain(&e))
    }
}
