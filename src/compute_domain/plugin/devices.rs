//! The devices the compute-domain plugin publishes, pure: `channel-0..N-1` and
//! `daemon-0..N-1`, each with attributes `type` and `id`. `channel-0` alone is published
//! with `allowMultipleAllocations: true` ([`SHARED_CHANNEL`]): every workload pod of a domain
//! gets it, however many land on one node.
//!
//! They go through the GPU plugin's publisher, which takes a [`DeviceModel`]; the hardware
//! coordinates of a [`PublishedDevice`] mean nothing here. Channel `i` and daemon `i` share a
//! group number (`gpu_index = i`) so the slice packer keeps pairs together and a node with
//! more than 64 of each still gets valid slices of at most 128 devices; with the default of
//! 8 the node has one slice.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use crate::compute_domain::api;
use crate::devices::{DeviceKind, DeviceModel, PublishedDevice};

/// What a compute-domain device is, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CdDevice {
    /// `channel-<n>`: IMEX channel `n` for a workload.
    Channel(u32),
    /// `daemon-<n>`: the node's IMEX daemon of one domain.
    Daemon(u32),
}

impl CdDevice {
    /// Parses `channel-<n>` / `daemon-<n>` with `n` below `max`; `None` for anything else.
    pub fn parse(name: &str, max: u32) -> Option<CdDevice> {
        let number = |rest: &str| {
            rest.parse::<u32>()
                .ok()
                .filter(|n| *n < max && n.to_string() == rest)
        };
        if let Some(rest) = name.strip_prefix("channel-") {
            number(rest).map(CdDevice::Channel)
        } else if let Some(rest) = name.strip_prefix("daemon-") {
            number(rest).map(CdDevice::Daemon)
        } else {
            None
        }
    }
}

/// The channel every workload pod of a ComputeDomain gets (the default channel class pins
/// `id == 0`). IMEX lets a process import memory only from a process on the same channel, so
/// all pods of a domain, on every node, must hold the same number; and several of them may
/// share a node. Safe to share: a node serves one domain at a time (its node label), so the
/// pods holding it on a node are always of one domain.
pub const SHARED_CHANNEL: u32 = 0;

/// The binding condition every channel device carries with `--binding-conditions`: the
/// scheduler holds a pod in PreBind until the controller sets it `True` in the claim's
/// `status.devices[]` entry, which it does once the node's IMEX daemon is Ready.
pub const IMEX_DAEMON_READY: &str = "IMEXDaemonReady";
/// The binding failure condition of a channel device: `True` (set by the controller when the
/// node's daemon failed or was not Ready within `--binding-timeout`) makes the scheduler
/// de-allocate the claim and try another node.
pub const IMEX_DAEMON_FAILED: &str = "IMEXDaemonFailed";

/// The attributes a channel or daemon device is published with: `type` (`kind`) and `id`.
pub fn attributes(kind: &str, id: u32) -> BTreeMap<String, DeviceAttribute> {
    BTreeMap::from([
        (
            api::ATTR_TYPE.to_string(),
            DeviceAttribute {
                string: Some(kind.to_string()),
                ..Default::default()
            },
        ),
        (
            api::ATTR_ID.to_string(),
            DeviceAttribute {
                int: Some(i64::from(id)),
                ..Default::default()
            },
        ),
    ])
}

/// The device model of a node publishing `max_domains` channels and daemons: `channel-0` may
/// be allocated to any number of claims, every other device to one claim at a time. With
/// `binding_conditions` every channel carries `bindingConditions: [IMEXDaemonReady]` and
/// `bindingFailureConditions: [IMEXDaemonFailed]` (KEP-5007); daemon devices never do (the
/// daemon's own claim must bind at once: it is what makes the channel ready).
pub fn model(max_domains: u32, binding_conditions: bool) -> DeviceModel {
    let device = |name: String, kind: &str, id: u32| Device {
        name,
        attributes: Some(attributes(kind, id)),
        allow_multiple_allocations: (kind == api::DEVICE_TYPE_CHANNEL && id == SHARED_CHANNEL)
            .then_some(true),
        binding_conditions: (binding_conditions && kind == api::DEVICE_TYPE_CHANNEL)
            .then(|| vec![IMEX_DAEMON_READY.to_string()]),
        binding_failure_conditions: (binding_conditions && kind == api::DEVICE_TYPE_CHANNEL)
            .then(|| vec![IMEX_DAEMON_FAILED.to_string()]),
        ..Default::default()
    };
    let published = |id: u32, device: Device| PublishedDevice {
        gpu_index: id,
        gpu_minor: id,
        gpu_uuid: String::new(),
        kind: DeviceKind::Gpu,
        device,
    };
    let devices = (0..max_domains)
        .flat_map(|i| {
            [
                published(
                    i,
                    device(api::channel_device_name(i), api::DEVICE_TYPE_CHANNEL, i),
                ),
                published(
                    i,
                    device(api::daemon_device_name(i), api::DEVICE_TYPE_DAEMON, i),
                ),
            ]
        })
        .collect();
    DeviceModel {
        devices,
        counter_sets: Vec::new(),
        warnings: Vec::new(),
        // Channel and daemon devices only, no GPUs or MIG: one group per "GPU" in order.
        slice_layout: crate::devices::SliceLayout::ByGpu,
        partition_type_attribute: None,
        whole_gpu_mig: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::{PoolOptions, build};

    fn pool() -> PoolOptions {
        PoolOptions {
            driver_name: api::DRIVER_NAME.into(),
            node_name: "n1".into(),
            generation: 0,
        }
    }

    #[test]
    fn a_node_publishes_one_slice_of_channels_and_daemons_with_type_and_id() {
        let slices = build(&model(2, false), &pool()).unwrap();
        assert_eq!(slices.len(), 1);
        let devices = slices[0].spec.devices.as_ref().unwrap();
        let got: Vec<(String, String, i64)> = devices
            .iter()
            .map(|d| {
                let attrs = d.attributes.as_ref().unwrap();
                (
                    d.name.clone(),
                    attrs["type"].string.clone().unwrap(),
                    attrs["id"].int.unwrap(),
                )
            })
            .collect();
        let want = vec![
            ("channel-0".to_string(), "channel".to_string(), 0),
            ("daemon-0".to_string(), "daemon".to_string(), 0),
            ("channel-1".to_string(), "channel".to_string(), 1),
            ("daemon-1".to_string(), "daemon".to_string(), 1),
        ];
        assert_eq!(got, want);
        assert_eq!(slices[0].spec.driver, "compute-domain.nvidia.com");
    }

    #[test]
    fn only_channel_0_may_be_allocated_to_several_claims() {
        let slices = build(&model(3, false), &pool()).unwrap();
        let shared: Vec<(String, Option<bool>)> = slices[0]
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| (d.name.clone(), d.allow_multiple_allocations))
            .collect();
        let want = vec![
            ("channel-0".to_string(), Some(true)),
            ("daemon-0".to_string(), None),
            ("channel-1".to_string(), None),
            ("daemon-1".to_string(), None),
            ("channel-2".to_string(), None),
            ("daemon-2".to_string(), None),
        ];
        assert_eq!(shared, want);
    }

    #[test]
    fn many_domains_split_into_valid_slices_keeping_pairs_together() {
        let slices = build(&model(100, false), &pool()).unwrap();
        assert_eq!(slices.len(), 2);
        let sizes: Vec<usize> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, vec![128, 72]);
    }

    /// A device's name, binding conditions and binding failure conditions.
    type Conditions = (String, Option<Vec<String>>, Option<Vec<String>>);

    #[test]
    fn with_binding_conditions_only_channels_wait_for_the_daemon() {
        let conditions = |binding: bool| -> Vec<Conditions> {
            build(&model(2, binding), &pool()).unwrap()[0]
                .spec
                .devices
                .iter()
                .flatten()
                .map(|d| {
                    (
                        d.name.clone(),
                        d.binding_conditions.clone(),
                        d.binding_failure_conditions.clone(),
                    )
                })
                .collect()
        };
        let ready = Some(vec!["IMEXDaemonReady".to_string()]);
        let failed = Some(vec!["IMEXDaemonFailed".to_string()]);
        let want = vec![
            ("channel-0".to_string(), ready.clone(), failed.clone()),
            ("daemon-0".to_string(), None, None),
            ("channel-1".to_string(), ready, failed),
            ("daemon-1".to_string(), None, None),
        ];
        assert_eq!(conditions(true), want);
        assert!(
            conditions(false)
                .iter()
                .all(|(_, ready, failed)| ready.is_none() && failed.is_none())
        );
    }

    #[test]
    fn device_names_parse_back_only_within_the_published_range() {
        assert_eq!(CdDevice::parse("channel-3", 8), Some(CdDevice::Channel(3)));
        assert_eq!(CdDevice::parse("daemon-0", 8), Some(CdDevice::Daemon(0)));
        for bad in ["channel-8", "channel-03", "gpu-0", "daemon-", "channel--1"] {
            assert_eq!(CdDevice::parse(bad, 8), None, "{bad}");
        }
    }
}
