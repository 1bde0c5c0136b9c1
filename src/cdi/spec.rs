//! The subset of the CDI spec format that this driver emits, with the exact JSON keys of the
//! official schema and Go types (`cdiVersion`, `containerEdits`, `deviceNodes`, `hostPath`,
//! `fileMode`, `additionalGids`, …).
//!
//! Empty optional fields are omitted on output: strict CDI readers reject unknown keys, and a
//! key that is present pulls in the spec version that introduced it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A complete CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// Semver of the CDI spec the document follows, e.g. `0.5.0`.
    pub cdi_version: String,
    /// `<vendor>/<class>`, e.g. `k8s.gpu.nvidia.com/claim`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    /// Edits applied once when any device of this spec is injected.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One injectable device of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// Name within the spec's kind; the qualified ID is `<kind>=<name>`.
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Required by the schema, and must not be empty for the Go validator.
    pub container_edits: ContainerEdits,
}

/// Changes a runtime applies to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `NAME=value` entries; a later entry with the same name replaces an earlier one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// True when applying these edits would change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
            && self.additional_gids.is_empty()
    }

    /// Appends `other`'s entries after this one's, keeping order (no de-duplication).
    pub fn append(&mut self, other: ContainerEdits) {
        self.env.extend(other.env);
        self.device_nodes.extend(other.device_nodes);
        self.mounts.extend(other.mounts);
        self.hooks.extend(other.hooks);
        self.additional_gids.extend(other.additional_gids);
    }
}

/// A device node to create in the container.
///
/// When `type` and `major` are set the runtime creates the node even if `host_path` does not
/// exist; otherwise it copies the missing details from the host node, which must exist.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path inside the container.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Permission bits as a decimal integer (Go `os.FileMode`), e.g. `438` for `0666`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// cgroup access, a subset of `rwm`; absent means `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A bind (or other) mount into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    /// Filesystem type; setting it requires CDI 0.4.0.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Mount {
    /// A read-only bind of a host file at the same path in the container, with the options
    /// NVIDIA's tooling uses for driver files.
    pub fn read_only_bind(host_path: String, container_path: String) -> Self {
        Mount {
            host_path,
            container_path,
            kind: None,
            options: ["ro", "nosuid", "nodev", "rbind", "rprivate"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// An OCI hook to run at a container lifecycle point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// One of `prestart`, `createRuntime`, `createContainer`, `startContainer`,
    /// `poststart`, `poststop`.
    pub hook_name: String,
    /// Absolute host path of the executable.
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Seconds; must be positive when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_optional_fields_are_omitted_and_keys_use_schema_casing() {
        let spec = Spec {
            cdi_version: "0.5.0".into(),
            kind: "k8s.gpu.nvidia.com/claim".into(),
            annotations: BTreeMap::new(),
            devices: vec![Device {
                name: "u-gpu-0".into(),
                annotations: BTreeMap::new(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/nvidia0".into(),
                        host_path: Some("/dev/nvidia0".into()),
                        kind: Some("c".into()),
                        file_mode: Some(438),
                        ..DeviceNode::default()
                    }],
                    ..ContainerEdits::default()
                },
            }],
            container_edits: ContainerEdits::default(),
        };
        let want = serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [{
                "name": "u-gpu-0",
                "containerEdits": {"deviceNodes": [{
                    "path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "type": "c", "fileMode": 438
                }]}
            }]
        });
        assert_eq!(serde_json::to_value(&spec).unwrap(), want);
        let back: Spec = serde_json::from_value(want).unwrap();
        assert_eq!(back, spec);
    }
}
