//! Names and wire types shared by the ComputeDomain controller, kubelet plugin and IMEX
//! daemon.
//!
//! Everything here is a contract with NVIDIA's driver (so existing manifests and claims
//! work) or between this binary's parts across versions: the CRD group/version/kinds, the
//! DRA driver and DeviceClass names, device names and attributes, opaque config kinds, the
//! node label, the channel device path and the IMEX ports. Change nothing here lightly.
//!
//! The custom resources are plain serde types wrapped in [`kube::core::Object`], addressed
//! through an [`ApiResource`] ([`compute_domain_resource`], [`compute_domain_node_resource`]):
//! no schema derive is needed, and unknown fields are ignored on read.

use kube::core::{ApiResource, GroupVersionKind, Object};
use serde::{Deserialize, Serialize};

/// API group of the custom resources and opaque configs.
pub const GROUP: &str = "resource.nvidia.com";
/// API version of the custom resources and opaque configs.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of the custom resources and opaque configs.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// The second DRA driver's name.
pub const DRIVER_NAME: &str = "compute-domain.nvidia.com";
/// DeviceClass of the workload's IMEX channel.
pub const CHANNEL_DEVICE_CLASS: &str = "compute-domain-default-channel.nvidia.com";
/// DeviceClass of the per-node IMEX daemon's claim.
pub const DAEMON_DEVICE_CLASS: &str = "compute-domain-daemon.nvidia.com";

/// Node label set while a node takes part in a domain: `<label>=<domain uid>`. The domain's
/// IMEX DaemonSet selects nodes by it.
pub const NODE_LABEL: &str = "resource.nvidia.com/computeDomain";
/// Label on every object the controller creates for a domain, and on
/// [`ComputeDomainNode`]s: the domain's UID.
pub const DOMAIN_UID_LABEL: &str = "resource.nvidia.com/computeDomain.uid";
/// Finalizer the controller puts on a `ComputeDomain` to clean up objects in other
/// namespaces (owner references cannot cross namespaces).
pub const FINALIZER: &str = "resource.nvidia.com/computeDomain";

/// Directory of the IMEX channel device nodes.
pub const CHANNEL_DEVICE_DIR: &str = "/dev/nvidia-caps-imex-channels";
/// Number of IMEX channels the kernel driver offers (`channel0` … `channel2047`).
pub const MAX_CHANNELS: u32 = 2048;
/// IMEX daemon's peer port (`SERVER_PORT`).
pub const IMEX_SERVER_PORT: u16 = 50000;
/// IMEX daemon's command port (`IMEX_CMD_PORT`), what `nvidia-imex-ctl` talks to.
pub const IMEX_CMD_PORT: u16 = 50005;

/// Device attribute naming what a device is: [`DEVICE_TYPE_CHANNEL`] or
/// [`DEVICE_TYPE_DAEMON`].
pub const ATTR_TYPE: &str = "type";
/// Device attribute: the channel or daemon number (int).
pub const ATTR_ID: &str = "id";
/// `type` of a channel device.
pub const DEVICE_TYPE_CHANNEL: &str = "channel";
/// `type` of a daemon device.
pub const DEVICE_TYPE_DAEMON: &str = "daemon";

/// Name of channel device `n`: `channel-<n>`.
pub fn channel_device_name(n: u32) -> String {
    format!("channel-{n}")
}

/// Name of daemon device `n`: `daemon-<n>`.
pub fn daemon_device_name(n: u32) -> String {
    format!("daemon-{n}")
}

/// Host path of IMEX channel `n`'s device node: `/dev/nvidia-caps-imex-channels/channel<n>`.
pub fn channel_device_path(n: u32) -> String {
    format!("{CHANNEL_DEVICE_DIR}/channel{n}")
}

/// How a workload claim's channel is allocated (`spec.channel.allocationMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum AllocationMode {
    /// One channel, the one allocated, is injected.
    #[default]
    Single,
    /// Every channel the driver offers is injected.
    All,
}

/// `spec.channel.resourceClaimTemplate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// Name of the ResourceClaimTemplate the controller creates in the domain's namespace.
    pub name: String,
}

/// `spec.channel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ChannelSpec {
    /// The workload's claim template the controller creates.
    pub resource_claim_template: TemplateRef,
    /// `Single` (default) or `All`.
    #[serde(default)]
    pub allocation_mode: AllocationMode,
}

/// `ComputeDomain.spec` (immutable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainSpec {
    /// Deprecated: nodes expected before the domain is Ready; 0 (default) means "every node
    /// whose daemon started".
    #[serde(default)]
    pub num_nodes: u32,
    /// The workload channel; absent only in malformed objects (the controller reports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<ChannelSpec>,
}

/// `Ready` / `NotReady`, for a domain and for one of its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Readiness {
    /// Every expected daemon reached quorum.
    Ready,
    /// Not (yet) ready; see the reason.
    #[default]
    NotReady,
}

/// One node of a domain, as the controller aggregates it into `status.nodes[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainNodeStatus {
    /// Node name.
    pub name: String,
    /// The IMEX daemon's IP address (what peers connect to).
    pub ip_address: String,
    /// `<clusterUuid>.<cliqueId>`.
    #[serde(rename = "cliqueID")]
    pub clique_id: String,
    /// The daemon's stable index within its clique (its line in the IMEX nodes config).
    pub index: u32,
    /// The daemon's readiness.
    pub status: Readiness,
}

/// `ComputeDomain.status`, written by the controller only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainStatus {
    /// `Ready` when every expected daemon is ready.
    #[serde(default)]
    pub status: Readiness,
    /// Every node whose daemon reported, sorted by clique then index.
    #[serde(default)]
    pub nodes: Vec<ComputeDomainNodeStatus>,
    /// Machine-readable reason when NotReady (e.g. `DaemonStartFailed`, `InvalidSpec`,
    /// `WaitingForNodes`). An addition to NVIDIA's schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail of `reason`. An addition to NVIDIA's schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The `ComputeDomain` custom resource (namespaced).
pub type ComputeDomain = Object<ComputeDomainSpec, ComputeDomainStatus>;

/// Kind of [`ComputeDomain`].
pub const COMPUTE_DOMAIN_KIND: &str = "ComputeDomain";
/// Plural of [`ComputeDomain`].
pub const COMPUTE_DOMAIN_PLURAL: &str = "computedomains";

/// Addresses [`ComputeDomain`] objects: `Api::<ComputeDomain>::namespaced_with(client, ns,
/// &compute_domain_resource())`.
pub fn compute_domain_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, COMPUTE_DOMAIN_KIND),
        COMPUTE_DOMAIN_PLURAL,
    )
}

/// `ComputeDomainNode.spec`: which domain, node and clique the object speaks for. Set at
/// creation and never changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainNodeSpec {
    /// UID of the `ComputeDomain`.
    #[serde(rename = "domainUID")]
    pub domain_uid: String,
    /// Namespace of the `ComputeDomain`.
    pub domain_namespace: String,
    /// Name of the `ComputeDomain`.
    pub domain_name: String,
    /// The node this daemon runs on.
    pub node_name: String,
    /// `<clusterUuid>.<cliqueId>` of the node's GPUs.
    #[serde(rename = "cliqueID")]
    pub clique_id: String,
}

/// `ComputeDomainNode.status`, written by that node's IMEX daemon only. The CRD has no
/// status subresource, so one PUT writes spec and status together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainNodeState {
    /// The daemon's IP address.
    #[serde(default)]
    pub ip_address: String,
    /// Stable index within the clique: chosen once as the lowest free one, never changed
    /// while the object exists.
    #[serde(default)]
    pub index: u32,
    /// `Ready` once `nvidia-imex-ctl -q` reports quorum.
    #[serde(default)]
    pub status: Readiness,
    /// Machine-readable reason when NotReady (e.g. `DaemonStarting`, `DaemonCrashed`,
    /// `ConfigError`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail of `reason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The per-node status object of one domain (namespaced, in the driver's namespace), named
/// by [`compute_domain_node_name`] and labelled [`DOMAIN_UID_LABEL`]`=<uid>`.
pub type ComputeDomainNode = Object<ComputeDomainNodeSpec, ComputeDomainNodeState>;

/// Kind of [`ComputeDomainNode`].
pub const COMPUTE_DOMAIN_NODE_KIND: &str = "ComputeDomainNode";
/// Plural of [`ComputeDomainNode`].
pub const COMPUTE_DOMAIN_NODE_PLURAL: &str = "computedomainnodes";

/// Addresses [`ComputeDomainNode`] objects.
pub fn compute_domain_node_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, COMPUTE_DOMAIN_NODE_KIND),
        COMPUTE_DOMAIN_NODE_PLURAL,
    )
}

/// Name of the [`ComputeDomainNode`] of domain `uid` on `node`: `<uid>.<node>`, or, when that
/// would exceed the 253 characters of a DNS subdomain, `<uid>.<first 200 chars of
/// node>.<8 hex of sha256(node)>` — unique and stable either way.
pub fn compute_domain_node_name(uid: &str, node: &str) -> String {
    let plain = format!("{uid}.{node}");
    if plain.len() <= 253 {
        return plain;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(node.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let head: String = node.chars().take(200).collect();
    format!("{uid}.{}.{hex}", head.trim_end_matches(['.', '-']))
}

/// Opaque config kind of a workload channel claim.
pub const CHANNEL_CONFIG_KIND: &str = "ComputeDomainChannelConfig";
/// Opaque config kind of a daemon claim.
pub const DAEMON_CONFIG_KIND: &str = "ComputeDomainDaemonConfig";

/// `ComputeDomainChannelConfig`: the opaque parameters the controller puts in the workload
/// claim template, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":
/// "ComputeDomainChannelConfig","domainID":"<uid>","allocationMode":"Single"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainChannelConfig {
    /// UID of the `ComputeDomain`.
    #[serde(rename = "domainID")]
    pub domain_id: String,
    /// `Single` or `All`.
    #[serde(default)]
    pub allocation_mode: AllocationMode,
}

/// `ComputeDomainDaemonConfig`: the opaque parameters of a daemon claim,
/// `{"apiVersion":…,"kind":"ComputeDomainDaemonConfig","domainID":"<uid>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainDaemonConfig {
    /// UID of the `ComputeDomain`.
    #[serde(rename = "domainID")]
    pub domain_id: String,
}

/// Environment variables the daemon claim's CDI spec sets in the IMEX daemon container, read
/// by `gpu-dra imex-daemon`.
pub mod daemon_env {
    /// UID of the domain.
    pub const DOMAIN_UID: &str = "COMPUTE_DOMAIN_UUID";
    /// Name of the domain.
    pub const DOMAIN_NAME: &str = "COMPUTE_DOMAIN_NAME";
    /// Namespace of the domain.
    pub const DOMAIN_NAMESPACE: &str = "COMPUTE_DOMAIN_NAMESPACE";
    /// `<clusterUuid>.<cliqueId>` of the node's GPUs.
    pub const CLIQUE_ID: &str = "CLIQUE_ID";
    /// Directory (inside the container) holding the IMEX config the plugin wrote; the daemon
    /// renders the nodes config there.
    pub const CONFIG_DIR: &str = "IMEX_CONFIG_DIR";
}

/// Where the daemon claim's config directory is mounted in the IMEX daemon container.
pub const DAEMON_CONFIG_MOUNT: &str = "/etc/nvidia-imex";
/// File name of the IMEX daemon config the plugin writes (`nvidia-imex -c <dir>/<this>`).
pub const IMEX_CONFIG_FILE: &str = "config.cfg";
/// File name of the nodes config (one peer IP per line, in index order) the daemon renders.
pub const IMEX_NODES_CONFIG_FILE: &str = "nodes_config.cfg";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compute_domain_parses_from_nvidias_manifest_shape() {
        let cd: ComputeDomain = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": "imex", "namespace": "default"},
            "spec": {"numNodes": 0, "channel": {
                "resourceClaimTemplate": {"name": "imex-channel"},
                "allocationMode": "All"}},
            "status": {"status": "Ready", "nodes": [{"name": "n1", "ipAddress": "10.0.0.1",
                "cliqueID": "c2a0e7d4-1111-2222-3333-444455556666.1", "index": 0,
                "status": "Ready"}]}
        }))
        .unwrap();
        let channel = cd.spec.channel.as_ref().unwrap();
        assert_eq!(channel.resource_claim_template.name, "imex-channel");
        assert_eq!(channel.allocation_mode, AllocationMode::All);
        let status = cd.status.unwrap();
        assert_eq!(status.status, Readiness::Ready);
        assert_eq!(
            status.nodes[0].clique_id,
            "c2a0e7d4-1111-2222-3333-444455556666.1"
        );
    }

    #[test]
    fn opaque_configs_use_nvidias_field_names() {
        let c = ComputeDomainChannelConfig {
            domain_id: "u1".into(),
            allocation_mode: AllocationMode::Single,
        };
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"domainID": "u1", "allocationMode": "Single"})
        );
        let d: ComputeDomainDaemonConfig =
            serde_json::from_value(serde_json::json!({"domainID": "u2"})).unwrap();
        assert_eq!(d.domain_id, "u2");
    }

    #[test]
    fn node_object_names_stay_valid_dns_subdomains_for_long_node_names() {
        assert_eq!(compute_domain_node_name("u", "n1"), "u.n1");
        let long = "a".repeat(250);
        let name = compute_domain_node_name("0a1b2c3d-0000-1111-2222-333344445555", &long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(
            name,
            compute_domain_node_name("0a1b2c3d-0000-1111-2222-333344445555", &"a".repeat(251))
        );
    }

    #[test]
    fn resources_address_the_resource_nvidia_com_group() {
        let r = compute_domain_resource();
        assert_eq!(
            (r.group.as_str(), r.version.as_str(), r.plural.as_str()),
            (GROUP, VERSION, "computedomains")
        );
        assert_eq!(compute_domain_node_resource().plural, "computedomainnodes");
        assert_eq!(
            channel_device_path(3),
            "/dev/nvidia-caps-imex-channels/channel3"
        );
    }
}
