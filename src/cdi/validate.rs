//! The checks a CDI runtime applies when it loads a spec, applied before we write one, so a
//! spec we hand over is never silently dropped by the runtime's cache.

use std::collections::BTreeSet;

use super::naming::{NameError, validate_device_name, validate_vendor_or_class};
use super::spec::{ContainerEdits, Spec};
use super::version::minimum_version;

/// CDI `major.minor` releases that runtimes know and accept.
const SUPPORTED_VERSIONS: [(u32, u32); 8] = [
    (0, 3),
    (0, 4),
    (0, 5),
    (0, 6),
    (0, 7),
    (0, 8),
    (1, 0),
    (1, 1),
];

/// Hook lifecycle points a CDI hook may name.
const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Why a spec would be rejected by a CDI runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `cdiVersion` is not a supported release.
    #[error("cdiVersion {value:?} is not a supported CDI version (0.3.0 to 1.1.0)")]
    UnknownVersion { value: String },
    /// `cdiVersion` is lower than what the spec's features need.
    #[error("cdiVersion {value} is too low: the spec uses features of CDI {required}")]
    VersionTooLow { value: String, required: String },
    /// `kind` is not `<vendor>/<class>` or a part is invalid.
    #[error("spec kind {kind:?} is invalid")]
    Kind {
        kind: String,
        #[source]
        source: Option<NameError>,
    },
    /// A device name is invalid.
    #[error("spec device name is invalid")]
    DeviceName {
        #[source]
        source: NameError,
    },
    /// The spec lists no devices.
    #[error("spec of kind {kind} lists no devices; CDI requires at least one")]
    NoDevices { kind: String },
    /// Two devices share a name.
    #[error("spec device name {name:?} appears more than once")]
    DuplicateDevice { name: String },
    /// A device has no edits at all, which runtimes reject.
    #[error("spec device {name:?} has empty containerEdits")]
    EmptyDevice { name: String },
    /// A field of the container edits is invalid.
    #[error("{location}: {field} {value:?} is invalid: {expected}")]
    Edit {
        location: String,
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Checks `spec` the way CDI runtimes do on load: known version high enough for the features
/// used, valid kind and device names, unique devices, non-empty device edits and well-formed
/// env, device nodes, mounts and hooks.
///
/// # Errors
/// The first [`SpecError`] found, naming the device and field.
pub fn validate_spec(spec: &Spec) -> Result<(), SpecError> {
    validate_version(spec)?;
    validate_kind(&spec.kind)?;
    if spec.devices.is_empty() {
        return Err(SpecError::NoDevices {
            kind: spec.kind.clone(),
        });
    }
    validate_edits("spec containerEdits", &spec.container_edits)?;
    let mut seen = BTreeSet::new();
    for device in &spec.devices {
        validate_device_name("device name", &device.name)
            .map_err(|source| SpecError::DeviceName { source })?;
        if !seen.insert(device.name.as_str()) {
            return Err(SpecError::DuplicateDevice {
                name: device.name.clone(),
            });
        }
        if device.container_edits.is_empty() {
            return Err(SpecError::EmptyDevice {
                name: device.name.clone(),
            });
        }
        validate_edits(&format!("device {}", device.name), &device.container_edits)?;
    }
    Ok(())
}

fn parse_version(value: &str) -> Option<(u32, u32, u32)> {
    let mut parts = value.strip_prefix('v').unwrap_or(value).split('.');
    let mut next = || parts.next()?.parse::<u32>().ok();
    let version = (next()?, next()?, next()?);
    parts.next().is_none().then_some(version)
}

fn validate_version(spec: &Spec) -> Result<(), SpecError> {
    let unknown = || SpecError::UnknownVersion {
        value: spec.cdi_version.clone(),
    };
    let have = parse_version(&spec.cdi_version).ok_or_else(unknown)?;
    if !SUPPORTED_VERSIONS.contains(&(have.0, have.1)) {
        return Err(unknown());
    }
    let required = minimum_version(spec);
    let need = parse_version(required.as_str()).unwrap_or((0, 3, 0));
    if have < need {
        return Err(SpecError::VersionTooLow {
            value: spec.cdi_version.clone(),
            required: required.to_string(),
        });
    }
    Ok(())
}

fn validate_kind(kind: &str) -> Result<(), SpecError> {
    let fail = |source| SpecError::Kind {
        kind: kind.to_string(),
        source,
    };
    let (vendor, class) = kind.split_once('/').ok_or_else(|| fail(None))?;
    validate_vendor_or_class("vendor", vendor).map_err(|e| fail(Some(e)))?;
    validate_vendor_or_class("class", class).map_err(|e| fail(Some(e)))
}

fn validate_edits(location: &str, edits: &ContainerEdits) -> Result<(), SpecError> {
    let fail = |field, value: &str, expected| SpecError::Edit {
        location: location.to_string(),
        field,
        value: value.to_string(),
        expected,
    };
    for env in &edits.env {
        if env.find('=').is_none_or(|i| i == 0) {
            return Err(fail("env", env, "NAME=value with a non-empty NAME"));
        }
    }
    for node in &edits.device_nodes {
        if !node.path.starts_with('/') {
            return Err(fail("deviceNodes.path", &node.path, "an absolute path"));
        }
        if let Some(kind) = &node.kind
            && !matches!(kind.as_str(), "" | "b" | "c" | "u" | "p")
        {
            return Err(fail("deviceNodes.type", kind, "one of b, c, u, p"));
        }
        if let Some(perms) = &node.permissions
            && !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
        {
            return Err(fail("deviceNodes.permissions", perms, "a subset of rwm"));
        }
    }
    for mount in &edits.mounts {
        if mount.host_path.is_empty() {
            return Err(fail(
                "mounts.hostPath",
                &mount.host_path,
                "a non-empty path",
            ));
        }
        if !mount.container_path.starts_with('/') {
            return Err(fail(
                "mounts.containerPath",
                &mount.container_path,
                "an absolute path",
            ));
        }
    }
    for hook in &edits.hooks {
        if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
            return Err(fail(
                "hooks.hookName",
                &hook.hook_name,
                "one of prestart, createRuntime, createContainer, startContainer, poststart, \
                 poststop",
            ));
        }
        if !hook.path.starts_with('/') {
            return Err(fail("hooks.path", &hook.path, "an absolute path"));
        }
        if hook.timeout == Some(0) {
            return Err(fail("hooks.timeout", "0", "a positive number of seconds"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cdi::spec::{Device, DeviceNode, Hook};

    fn valid() -> Spec {
        Spec {
            cdi_version: "0.5.0".into(),
            kind: "k8s.gpu.nvidia.com/claim".into(),
            annotations: BTreeMap::new(),
            devices: vec![Device {
                name: "uid-gpu-0".into(),
                annotations: BTreeMap::new(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/nvidia0".into(),
                        host_path: Some("/dev/nvidia0".into()),
                        ..DeviceNode::default()
                    }],
                    ..ContainerEdits::default()
                },
            }],
            container_edits: ContainerEdits::default(),
        }
    }

    #[test]
    fn a_well_formed_spec_passes() {
        assert_eq!(validate_spec(&valid()), Ok(()));
    }

    #[test]
    fn version_below_what_hostpath_needs_is_rejected() {
        let mut spec = valid();
        spec.cdi_version = "0.4.0".into();
        let want = SpecError::VersionTooLow {
            value: "0.4.0".into(),
            required: "0.5.0".into(),
        };
        assert_eq!(validate_spec(&spec), Err(want));
    }

    #[test]
    fn unknown_versions_are_rejected_and_leading_v_is_tolerated() {
        let cases = [
            ("v0.6.0", true),
            ("1.1.0", true),
            ("0.2.0", false),
            ("9.0.0", false),
            ("0.5", false),
        ];
        for (version, ok) in cases {
            let mut spec = valid();
            spec.cdi_version = version.into();
            assert_eq!(validate_spec(&spec).is_ok(), ok, "{version}");
        }
    }

    #[test]
    fn structural_mistakes_are_each_reported() {
        let mut no_devices = valid();
        no_devices.devices.clear();
        let mut duplicate = valid();
        duplicate.devices.push(duplicate.devices[0].clone());
        let mut empty = valid();
        empty.devices[0].container_edits = ContainerEdits::default();
        let mut bad_env = valid();
        bad_env.container_edits.env.push("=x".into());
        let mut bad_hook = valid();
        bad_hook.container_edits.hooks.push(Hook {
            hook_name: "preStart".into(),
            path: "/bin/true".into(),
            args: vec![],
            env: vec![],
            timeout: None,
        });
        let mut bad_kind = valid();
        bad_kind.kind = "nokind".into();
        let cases = [
            (no_devices, "lists no devices"),
            (duplicate, "more than once"),
            (empty, "empty containerEdits"),
            (bad_env, "env \"=x\""),
            (bad_hook, "hooks.hookName \"preStart\""),
            (bad_kind, "kind \"nokind\""),
        ];
        for (spec, want) in cases {
            let got = validate_spec(&spec).unwrap_err().to_string();
            assert!(got.contains(want), "want {want:?} in {got:?}");
        }
    }
}
