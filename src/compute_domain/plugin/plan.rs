//! What a claim asks of the compute-domain plugin, pure: its devices (all channels or all
//! daemons) and the opaque config that names the domain, decoded strictly so that a bad
//! config fails the claim naming the field, the value and the valid choices.

use serde_json::Value;

use super::devices::CdDevice;
use crate::compute_domain::api::{self, AllocationMode};
use crate::k8s::{AllocatedClaim, OpaqueConfig};

/// One allocated device of the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDevice {
    /// The request it satisfies.
    pub request: String,
    /// Its name (`channel-3`).
    pub device: String,
    /// Its number (`3`).
    pub id: u32,
    /// The allocation's share of a device allocated to several claims (`channel-0`), as
    /// the scheduler recorded it; returned to the kubelet and part of the CDI device name.
    pub share_id: Option<String>,
}

/// What preparing the claim means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimPlan {
    /// A workload's IMEX channel(s).
    Channel {
        /// UID of the domain.
        domain_uid: String,
        /// `Single`: the allocated channels; `All`: every channel the node has.
        mode: AllocationMode,
        /// The allocated channel devices.
        devices: Vec<PlannedDevice>,
    },
    /// The node's IMEX daemon of a domain.
    Daemon {
        /// UID of the domain.
        domain_uid: String,
        /// The allocated daemon devices (one in practice).
        devices: Vec<PlannedDevice>,
    },
}

impl ClaimPlan {
    /// The domain's UID.
    pub fn domain_uid(&self) -> &str {
        match self {
            ClaimPlan::Channel { domain_uid, .. } | ClaimPlan::Daemon { domain_uid, .. } => {
                domain_uid
            }
        }
    }

    /// The allocated devices.
    pub fn devices(&self) -> &[PlannedDevice] {
        match self {
            ClaimPlan::Channel { devices, .. } | ClaimPlan::Daemon { devices, .. } => devices,
        }
    }
}

/// Why a claim cannot be prepared as allocated; each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The allocation names a device this plugin does not publish.
    #[error(
        "device {device:?} is not a compute-domain device of this node: valid are \
         channel-0..channel-{last} and daemon-0..daemon-{last}"
    )]
    UnknownDevice {
        /// The device name.
        device: String,
        /// The highest device number published.
        last: u32,
    },
    /// A claim holds both channel and daemon devices.
    #[error(
        "the claim holds both channel and daemon devices ({devices}); a claim is either a \
         workload's channel (class {channel_class}) or a daemon's (class {daemon_class})",
        channel_class = api::CHANNEL_DEVICE_CLASS,
        daemon_class = api::DAEMON_DEVICE_CLASS
    )]
    MixedDevices {
        /// The devices, comma-separated.
        devices: String,
    },
    /// No opaque config of the expected kind applies to a request.
    #[error(
        "request {request:?} has no opaque config for driver {driver}: it needs \
         {{\"apiVersion\": \"{api_version}\", \"kind\": \"{kind}\", \"domainID\": \"<ComputeDomain uid>\"}} \
         (the claim templates the ComputeDomain controller creates carry it)",
        driver = api::DRIVER_NAME,
        api_version = api::API_VERSION
    )]
    MissingConfig {
        /// The request.
        request: String,
        /// The config kind it needs.
        kind: &'static str,
    },
    /// The opaque config applying to a request is malformed.
    #[error("request {request:?}: opaque config field {field} = {value}: {valid}")]
    BadConfig {
        /// The request.
        request: String,
        /// The field at fault (`kind`, `domainID`, …).
        field: String,
        /// Its value as JSON (or `missing`).
        value: String,
        /// The valid choices.
        valid: String,
    },
    /// The claim's devices name different domains.
    #[error("the claim's devices belong to different ComputeDomains ({first} and {second})")]
    DomainsDiffer {
        /// One domain UID.
        first: String,
        /// Another.
        second: String,
    },
}

/// The plan for `claim`, whose devices were published with `max_domains`.
///
/// # Errors
/// [`PlanError`] naming the device, request or config field at fault.
pub fn plan(claim: &AllocatedClaim, max_domains: u32) -> Result<ClaimPlan, PlanError> {
    let mut channels = Vec::new();
    let mut daemons = Vec::new();
    for d in &claim.devices {
        let parsed =
            CdDevice::parse(&d.device, max_domains).ok_or_else(|| PlanError::UnknownDevice {
                device: d.device.clone(),
                last: max_domains.saturating_sub(1),
            })?;
        let (list, id) = match parsed {
            CdDevice::Channel(id) => (&mut channels, id),
            CdDevice::Daemon(id) => (&mut daemons, id),
        };
        list.push(PlannedDevice {
            request: d.request.clone(),
            device: d.device.clone(),
            id,
            share_id: d.share_id.clone(),
        });
    }
    if !channels.is_empty() && !daemons.is_empty() {
        let devices: Vec<&str> = claim.devices.iter().map(|d| d.device.as_str()).collect();
        return Err(PlanError::MixedDevices {
            devices: devices.join(", "),
        });
    }
    if daemons.is_empty() {
        let mut domain: Option<(String, AllocationMode)> = None;
        for d in &channels {
            let params = applying(&claim.config, &d.request, api::CHANNEL_CONFIG_KIND)?;
            let config = channel_config(&d.request, params)?;
            same_domain(&mut domain, (config.domain_id, config.allocation_mode))?;
        }
        let (domain_uid, mode) = domain.unwrap_or_default();
        Ok(ClaimPlan::Channel {
            domain_uid,
            mode,
            devices: channels,
        })
    } else {
        let mut domain: Option<(String, ())> = None;
        for d in &daemons {
            let params = applying(&claim.config, &d.request, api::DAEMON_CONFIG_KIND)?;
            let config = daemon_config(&d.request, params)?;
            same_domain(&mut domain, (config.domain_id, ()))?;
        }
        let (domain_uid, ()) = domain.unwrap_or_default();
        Ok(ClaimPlan::Daemon {
            domain_uid,
            devices: daemons,
        })
    }
}

fn same_domain<T>(seen: &mut Option<(String, T)>, next: (String, T)) -> Result<(), PlanError> {
    match seen {
        Some((first, _)) if *first != next.0 => Err(PlanError::DomainsDiffer {
            first: first.clone(),
            second: next.0,
        }),
        Some(_) => Ok(()),
        None => {
            *seen = Some(next);
            Ok(())
        }
    }
}

/// The last config entry applying to `request` (claim entries come after class entries, so
/// they win).
fn applying<'a>(
    config: &'a [OpaqueConfig],
    request: &str,
    kind: &'static str,
) -> Result<&'a Value, PlanError> {
    let parent = request.split('/').next().unwrap_or(request);
    config
        .iter()
        .rev()
        .find(|c| c.requests.is_empty() || c.requests.iter().any(|r| r == request || r == parent))
        .map(|c| &c.parameters)
        .ok_or_else(|| PlanError::MissingConfig {
            request: request.to_string(),
            kind,
        })
}

fn bad(request: &str, field: &str, value: Option<&Value>, valid: String) -> PlanError {
    PlanError::BadConfig {
        request: request.to_string(),
        field: field.to_string(),
        value: value.map_or_else(|| "missing".to_string(), Value::to_string),
        valid,
    }
}

/// Checks `apiVersion`, `kind` and that no field outside `fields` is set.
fn check_header(
    request: &str,
    params: &Value,
    kind: &'static str,
    fields: &[&str],
) -> Result<(), PlanError> {
    let Some(object) = params.as_object() else {
        return Err(bad(
            request,
            "parameters",
            Some(params),
            "a JSON object".to_string(),
        ));
    };
    let api_version = object.get("apiVersion");
    if api_version.and_then(Value::as_str) != Some(api::API_VERSION) {
        return Err(bad(
            request,
            "apiVersion",
            api_version,
            format!("valid: {:?}", api::API_VERSION),
        ));
    }
    let found = object.get("kind");
    if found.and_then(Value::as_str) != Some(kind) {
        return Err(bad(
            request,
            "kind",
            found,
            format!(
                "valid for this device: {kind:?} ({:?} configures channels, {:?} daemons)",
                api::CHANNEL_CONFIG_KIND,
                api::DAEMON_CONFIG_KIND
            ),
        ));
    }
    if let Some(unknown) = object
        .keys()
        .find(|k| !["apiVersion", "kind"].contains(&k.as_str()) && !fields.contains(&k.as_str()))
    {
        return Err(bad(
            request,
            unknown,
            object.get(unknown),
            format!(
                "unknown field; valid fields: apiVersion, kind, {}",
                fields.join(", ")
            ),
        ));
    }
    Ok(())
}

fn domain_id(request: &str, params: &Value) -> Result<String, PlanError> {
    let value = params.get("domainID");
    match value.and_then(Value::as_str) {
        Some(uid)
            if !uid.is_empty()
                && uid.len() <= 128
                && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
        {
            Ok(uid.to_string())
        }
        _ => Err(bad(
            request,
            "domainID",
            value,
            "the ComputeDomain's metadata.uid (letters, digits and '-')".to_string(),
        )),
    }
}

fn channel_config(
    request: &str,
    params: &Value,
) -> Result<api::ComputeDomainChannelConfig, PlanError> {
    check_header(
        request,
        params,
        api::CHANNEL_CONFIG_KIND,
        &["domainID", "allocationMode"],
    )?;
    let domain_id = domain_id(request, params)?;
    let mode = params.get("allocationMode");
    let allocation_mode = match mode.map(|m| m.as_str()) {
        None => AllocationMode::Single,
        Some(Some("Single")) => AllocationMode::Single,
        Some(Some("All")) => AllocationMode::All,
        Some(_) => {
            return Err(bad(
                request,
                "allocationMode",
                mode,
                "valid: \"Single\" (the allocated channel) or \"All\" (every channel)".to_string(),
            ));
        }
    };
    Ok(api::ComputeDomainChannelConfig {
        domain_id,
        allocation_mode,
    })
}

fn daemon_config(
    request: &str,
    params: &Value,
) -> Result<api::ComputeDomainDaemonConfig, PlanError> {
    check_header(request, params, api::DAEMON_CONFIG_KIND, &["domainID"])?;
    Ok(api::ComputeDomainDaemonConfig {
        domain_id: domain_id(request, params)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::{AllocatedDevice, ClaimRef, ConfigSource};
    use serde_json::json;

    fn claim(devices: &[&str], config: Vec<Value>) -> AllocatedClaim {
        AllocatedClaim {
            pod_claim_name: None,
            claim: ClaimRef {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "u".into(),
            },
            devices: devices
                .iter()
                .map(|d| AllocatedDevice {
                    request: "channel".into(),
                    pool: "n1".into(),
                    device: d.to_string(),
                    admin_access: false,
                    share_id: None,
                    consumed_capacity: Default::default(),
                })
                .collect(),
            config: config
                .into_iter()
                .map(|parameters| OpaqueConfig {
                    source: ConfigSource::FromClaim,
                    requests: vec![],
                    parameters,
                })
                .collect(),
            classes: Default::default(),
            reserved_pods: vec![],
        }
    }

    fn channel_config(uid: &str, mode: &str) -> Value {
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
               "domainID": uid, "allocationMode": mode})
    }

    #[test]
    fn a_channel_claim_plans_its_channels_for_the_configured_domain_and_mode() {
        let got = plan(
            &claim(&["channel-2"], vec![channel_config("d-1", "All")]),
            8,
        )
        .unwrap();
        let want = ClaimPlan::Channel {
            domain_uid: "d-1".into(),
            mode: AllocationMode::All,
            devices: vec![PlannedDevice {
                request: "channel".into(),
                device: "channel-2".into(),
                id: 2,
                share_id: None,
            }],
        };
        assert_eq!(got, want);
    }

    #[test]
    fn a_daemon_claim_plans_its_domain() {
        let config = json!({"apiVersion": "resource.nvidia.com/v1beta1",
                            "kind": "ComputeDomainDaemonConfig", "domainID": "d-2"});
        let got = plan(&claim(&["daemon-0"], vec![config]), 8).unwrap();
        assert_eq!(got.domain_uid(), "d-2");
        assert!(matches!(got, ClaimPlan::Daemon { .. }));
    }

    #[test]
    fn a_bad_allocation_mode_names_the_field_the_value_and_the_choices() {
        let error = plan(&claim(&["channel-0"], vec![channel_config("d", "Many")]), 8)
            .unwrap_err()
            .to_string();
        assert!(error.contains("allocationMode"), "{error}");
        assert!(error.contains("\"Many\""), "{error}");
        assert!(
            error.contains("\"Single\"") && error.contains("\"All\""),
            "{error}"
        );
    }

    #[test]
    fn a_missing_config_says_which_config_the_request_needs() {
        let error = plan(&claim(&["channel-0"], vec![]), 8)
            .unwrap_err()
            .to_string();
        assert!(error.contains("ComputeDomainChannelConfig"), "{error}");
        assert!(error.contains("domainID"), "{error}");
    }

    #[test]
    fn a_daemon_config_on_a_channel_is_refused_naming_the_kind() {
        let config = json!({"apiVersion": "resource.nvidia.com/v1beta1",
                            "kind": "ComputeDomainDaemonConfig", "domainID": "d"});
        let error = plan(&claim(&["channel-0"], vec![config]), 8).unwrap_err();
        assert!(
            matches!(&error, PlanError::BadConfig { field, .. } if field == "kind"),
            "{error}"
        );
    }

    #[test]
    fn unknown_fields_an_empty_domain_and_unknown_devices_are_refused() {
        let mut extra = channel_config("d", "Single");
        extra["numChannels"] = json!(3);
        let error = plan(&claim(&["channel-0"], vec![extra]), 8).unwrap_err();
        assert!(matches!(&error, PlanError::BadConfig { field, .. } if field == "numChannels"));
        let error = plan(
            &claim(&["channel-0"], vec![channel_config("", "Single")]),
            8,
        )
        .unwrap_err();
        assert!(matches!(&error, PlanError::BadConfig { field, .. } if field == "domainID"));
        let error = plan(&claim(&["gpu-0"], vec![]), 8).unwrap_err().to_string();
        assert!(error.contains("channel-0..channel-7"), "{error}");
    }

    #[test]
    fn channels_and_daemons_in_one_claim_are_refused() {
        let error = plan(
            &claim(
                &["channel-0", "daemon-0"],
                vec![channel_config("d", "Single")],
            ),
            8,
        )
        .unwrap_err();
        assert!(matches!(error, PlanError::MixedDevices { .. }));
    }
}
