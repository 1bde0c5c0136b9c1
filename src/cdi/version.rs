//! The lowest CDI spec version that covers the features a spec uses.
//!
//! Runtimes refuse specs whose `cdiVersion` is lower than what their content needs, and old
//! runtimes refuse versions they do not know, so a writer stamps the minimum (as NVIDIA's
//! tooling does) rather than the newest version.

use std::fmt;

use super::spec::{ContainerEdits, Spec};

/// CDI spec versions that a feature of our spec subset can require.
///
/// Later releases (0.8.0, 1.0.0, 1.1.0) only add features this driver never emits
/// (`intelRdt` changes, `netDevices`), so no spec of ours needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CdiVersion {
    /// Earliest supported release: env, device nodes, mounts, hooks.
    V0_3_0,
    /// `type` on a mount.
    V0_4_0,
    /// `hostPath` on a device node; device names starting with a digit.
    V0_5_0,
    /// `annotations` on spec or device; dots in the class part of `kind`.
    V0_6_0,
    /// `additionalGids` (and `intelRdt`, which we never emit).
    V0_7_0,
}

impl CdiVersion {
    /// The `cdiVersion` string, e.g. `0.5.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            CdiVersion::V0_3_0 => "0.3.0",
            CdiVersion::V0_4_0 => "0.4.0",
            CdiVersion::V0_5_0 => "0.5.0",
            CdiVersion::V0_6_0 => "0.6.0",
            CdiVersion::V0_7_0 => "0.7.0",
        }
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The lowest version whose features cover everything `spec` uses (its current
/// `cdiVersion` is ignored).
pub fn minimum_version(spec: &Spec) -> CdiVersion {
    let mut need = CdiVersion::V0_3_0;
    let class = spec.kind.split_once('/').map_or("", |(_, class)| class);
    if !spec.annotations.is_empty() || class.contains('.') {
        need = need.max(CdiVersion::V0_6_0);
    }
    need = need.max(edits_version(&spec.container_edits));
    for device in &spec.devices {
        if device.name.starts_with(|c: char| c.is_ascii_digit()) {
            need = need.max(CdiVersion::V0_5_0);
        }
        if !device.annotations.is_empty() {
            need = need.max(CdiVersion::V0_6_0);
        }
        need = need.max(edits_version(&device.container_edits));
    }
    need
}

fn edits_version(edits: &ContainerEdits) -> CdiVersion {
    let mut need = CdiVersion::V0_3_0;
    if edits
        .mounts
        .iter()
        .any(|m| m.kind.as_deref().is_some_and(|t| !t.is_empty()))
    {
        need = need.max(CdiVersion::V0_4_0);
    }
    if edits
        .device_nodes
        .iter()
        .any(|n| n.host_path.as_deref().is_some_and(|p| !p.is_empty()))
    {
        need = need.max(CdiVersion::V0_5_0);
    }
    if !edits.additional_gids.is_empty() {
        need = need.max(CdiVersion::V0_7_0);
    }
    need
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cdi::spec::{Device, DeviceNode, Mount};

    fn spec_with(kind: &str, name: &str, edits: ContainerEdits) -> Spec {
        Spec {
            cdi_version: String::new(),
            kind: kind.into(),
            annotations: BTreeMap::new(),
            devices: vec![Device {
                name: name.into(),
                annotations: BTreeMap::new(),
                container_edits: edits,
            }],
            container_edits: ContainerEdits::default(),
        }
    }

    fn env_only() -> ContainerEdits {
        ContainerEdits {
            env: vec!["A=1".into()],
            ..ContainerEdits::default()
        }
    }

    #[test]
    fn each_feature_requires_the_version_that_introduced_it() {
        let node = |host: Option<&str>| DeviceNode {
            path: "/dev/x".into(),
            host_path: host.map(String::from),
            ..DeviceNode::default()
        };
        let typed_mount = Mount {
            host_path: "/a".into(),
            container_path: "/a".into(),
            kind: Some("tmpfs".into()),
            options: vec![],
        };
        let mut annotated = spec_with("v.com/c", "dev", env_only());
        annotated.annotations.insert("a.com/k".into(), "v".into());
        let mut device_annotated = spec_with("v.com/c", "dev", env_only());
        device_annotated.devices[0]
            .annotations
            .insert("a.com/k".into(), "v".into());
        let cases = [
            ("env only", spec_with("v.com/c", "dev", env_only()), "0.3.0"),
            (
                "node without hostPath",
                spec_with(
                    "v.com/c",
                    "dev",
                    ContainerEdits {
                        device_nodes: vec![node(None)],
                        ..Default::default()
                    },
                ),
                "0.3.0",
            ),
            (
                "typed mount",
                spec_with(
                    "v.com/c",
                    "dev",
                    ContainerEdits {
                        mounts: vec![typed_mount],
                        ..Default::default()
                    },
                ),
                "0.4.0",
            ),
            (
                "node with hostPath",
                spec_with(
                    "v.com/c",
                    "dev",
                    ContainerEdits {
                        device_nodes: vec![node(Some("/dev/x"))],
                        ..Default::default()
                    },
                ),
                "0.5.0",
            ),
            (
                "name starting with a digit",
                spec_with("v.com/c", "3f2a-gpu-0", env_only()),
                "0.5.0",
            ),
            (
                "dot in class",
                spec_with("v.com/c.x", "dev", env_only()),
                "0.6.0",
            ),
            ("spec annotations", annotated, "0.6.0"),
            ("device annotations", device_annotated, "0.6.0"),
            (
                "additionalGids",
                spec_with(
                    "v.com/c",
                    "dev",
                    ContainerEdits {
                        additional_gids: vec![44],
                        ..Default::default()
                    },
                ),
                "0.7.0",
            ),
        ];
        for (what, spec, want) in cases {
            assert_eq!(minimum_version(&spec).as_str(), want, "{what}");
        }
    }

    #[test]
    fn spec_level_edits_count_too() {
        let mut spec = spec_with("v.com/c", "dev", env_only());
        spec.container_edits.additional_gids.push(44);
        assert_eq!(minimum_version(&spec), CdiVersion::V0_7_0);
    }
}
