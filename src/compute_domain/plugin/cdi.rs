//! CDI specs of compute-domain claims: a channel claim's containers get the IMEX channel
//! device node(s); a daemon claim's container gets the domain's config directory at
//! [`api::DAEMON_CONFIG_MOUNT`] and the environment of [`api::daemon_env`].
//!
//! Building a spec is pure; where the channel nodes come from ([`ChannelNodes`]) is the one
//! effect: described (type `c`, a fixed major, minor = channel) on a simulated node, stat-ed
//! under the dev root on a real one.

use std::path::{Path, PathBuf};

use super::imex::DomainNames;
use super::plan::PlannedDevice;
use crate::cdi::{ClaimNaming, ContainerEdits, Device, DeviceNode, Mount, NameError, Spec};
use crate::compute_domain::api::{self, daemon_env};

/// Character major of `nvidia-caps-imex-channels` on a simulated node (the real one is
/// assigned at module load and read from the host's node).
pub const SIM_IMEX_CHANNELS_MAJOR: u32 = 234;

/// The CDI version of the specs written here (device nodes, env, mounts: 0.3.0 features;
/// 0.5.0 is what the GPU plugin's specs start from too).
const CDI_VERSION: &str = "0.5.0";

/// A spec could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A name breaks the CDI grammar.
    #[error("naming the CDI device of {device}")]
    Name {
        /// The DRA device.
        device: String,
        /// Cause.
        #[source]
        source: NameError,
    },
    /// A channel's device node is missing on the host.
    #[error(
        "IMEX channel device {path} does not exist: load the NVIDIA driver with \
         NVreg_CreateImexChannel0=1 or create it with `nvidia-modprobe -i {channel}`"
    )]
    MissingChannel {
        /// The host path looked at.
        path: PathBuf,
        /// The channel.
        channel: u32,
    },
    /// A channel's device node could not be read.
    #[error("reading IMEX channel device {path}")]
    Stat {
        /// The host path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: crate::cdi::DevNodeError,
    },
    /// The channel directory could not be listed (`All` mode on a real node).
    #[error("listing IMEX channel devices in {dir}")]
    List {
        /// The directory.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Where channel device nodes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelNodes {
    /// A node without the driver: described nodes the runtime creates.
    Simulated,
    /// A real node: `<dev_root>/dev/nvidia-caps-imex-channels/channel<N>`.
    Host {
        /// Root under which `/dev` is found.
        dev_root: PathBuf,
    },
}

impl ChannelNodes {
    /// Every channel the node has: all [`api::MAX_CHANNELS`] when simulated, the `channelN`
    /// nodes present on a real node.
    ///
    /// # Errors
    /// [`CdiError::List`] when the directory cannot be read.
    pub fn all(&self) -> Result<Vec<u32>, CdiError> {
        match self {
            ChannelNodes::Simulated => Ok((0..api::MAX_CHANNELS).collect()),
            ChannelNodes::Host { dev_root } => {
                let dir = host_path(dev_root, api::CHANNEL_DEVICE_DIR);
                let entries = std::fs::read_dir(&dir).map_err(|source| CdiError::List {
                    dir: dir.clone(),
                    source,
                })?;
                let mut ids: Vec<u32> = entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let name = e.file_name();
                        name.to_str()?.strip_prefix("channel")?.parse().ok()
                    })
                    .filter(|n| *n < api::MAX_CHANNELS)
                    .collect();
                ids.sort_unstable();
                Ok(ids)
            }
        }
    }

    /// The CDI entries of `channels`' device nodes.
    ///
    /// # Errors
    /// [`CdiError::MissingChannel`] / [`CdiError::Stat`] on a real node.
    pub fn nodes(&self, channels: &[u32]) -> Result<Vec<DeviceNode>, CdiError> {
        channels
            .iter()
            .map(|&n| {
                let path = api::channel_device_path(n);
                match self {
                    ChannelNodes::Simulated => Ok(crate::cdi::SimulatedHost::char_node(
                        &path,
                        SIM_IMEX_CHANNELS_MAJOR,
                        n,
                    )),
                    ChannelNodes::Host { dev_root } => {
                        let host = host_path(dev_root, &path);
                        match crate::cdi::stat_node(&host) {
                            Ok(Some(info)) => Ok(crate::cdi::node_edit(&path, &host, info).0),
                            Ok(None) => Err(CdiError::MissingChannel {
                                path: host,
                                channel: n,
                            }),
                            Err(source) => Err(CdiError::Stat { path: host, source }),
                        }
                    }
                }
            })
            .collect()
    }
}

fn host_path(dev_root: &Path, path: &str) -> PathBuf {
    dev_root.join(path.trim_start_matches('/'))
}

/// The spec of a channel claim: one CDI device per allocated channel device, each injecting
/// `nodes` (the allocated channel, or every channel in `All` mode).
///
/// # Errors
/// [`CdiError::Name`] when the claim UID or a device name breaks the CDI grammar.
pub fn channel_spec(
    naming: &ClaimNaming,
    claim_uid: &str,
    devices: &[PlannedDevice],
    nodes_of: impl Fn(&PlannedDevice) -> Vec<DeviceNode>,
) -> Result<Spec, CdiError> {
    spec(naming, claim_uid, devices, |d| ContainerEdits {
        device_nodes: nodes_of(d),
        ..Default::default()
    })
}

/// The spec of a daemon claim: the config directory `config_dir` bound read-write at
/// [`api::DAEMON_CONFIG_MOUNT`] (the daemon renders the nodes file there) and the
/// domain's names, clique and config directory in the environment.
///
/// # Errors
/// [`CdiError::Name`] when the claim UID or a device name breaks the CDI grammar.
pub fn daemon_spec(
    naming: &ClaimNaming,
    claim_uid: &str,
    devices: &[PlannedDevice],
    domain: &DomainNames,
    clique: &str,
    config_dir: &Path,
) -> Result<Spec, CdiError> {
    let edits = ContainerEdits {
        env: vec![
            format!("{}={}", daemon_env::DOMAIN_UID, domain.uid),
            format!("{}={}", daemon_env::DOMAIN_NAME, domain.name),
            format!("{}={}", daemon_env::DOMAIN_NAMESPACE, domain.namespace),
            format!("{}={clique}", daemon_env::CLIQUE_ID),
            format!("{}={}", daemon_env::CONFIG_DIR, api::DAEMON_CONFIG_MOUNT),
        ],
        mounts: vec![Mount {
            host_path: config_dir.to_string_lossy().into_owned(),
            container_path: api::DAEMON_CONFIG_MOUNT.to_string(),
            kind: None,
            options: ["rw", "nosuid", "nodev", "rbind", "rprivate"]
                .map(String::from)
                .to_vec(),
        }],
        ..Default::default()
    };
    spec(naming, claim_uid, devices, |_| edits.clone())
}

/// The CDI device ID returned to the kubelet for `device` of the claim:
/// `<kind>=<claim uid>-<device>[-<share id>]`.
///
/// # Errors
/// [`CdiError::Name`] as for the specs.
pub fn device_id(
    naming: &ClaimNaming,
    claim_uid: &str,
    device: &PlannedDevice,
) -> Result<String, CdiError> {
    naming
        .device_id(claim_uid, &device.device, device.share_id.as_deref())
        .map_err(|source| CdiError::Name {
            device: device.device.clone(),
            source,
        })
}

/// The spec's device name: with the share ID of a shared channel, so that one claim holding
/// `channel-0` through two requests still names two distinct CDI devices.
fn device_name(
    naming: &ClaimNaming,
    claim_uid: &str,
    device: &PlannedDevice,
) -> Result<String, CdiError> {
    naming
        .device_name(claim_uid, &device.device, device.share_id.as_deref())
        .map_err(|source| CdiError::Name {
            device: device.device.clone(),
            source,
        })
}

/// A spec with one device per allocated device, each with `edits_of` it.
fn spec(
    naming: &ClaimNaming,
    claim_uid: &str,
    devices: &[PlannedDevice],
    edits_of: impl Fn(&PlannedDevice) -> ContainerEdits,
) -> Result<Spec, CdiError> {
    let devices = devices
        .iter()
        .map(|d| {
            Ok(Device {
                name: device_name(naming, claim_uid, d)?,
                annotations: Default::default(),
                container_edits: edits_of(d),
            })
        })
        .collect::<Result<Vec<_>, CdiError>>()?;
    Ok(Spec {
        cdi_version: CDI_VERSION.to_string(),
        kind: naming.kind(),
        annotations: Default::default(),
        devices,
        container_edits: ContainerEdits::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naming() -> ClaimNaming {
        ClaimNaming::for_driver(api::DRIVER_NAME).unwrap()
    }

    fn channel(id: u32) -> PlannedDevice {
        PlannedDevice {
            request: "channel".into(),
            device: api::channel_device_name(id),
            id,
            share_id: None,
        }
    }

    #[test]
    fn a_channel_spec_injects_the_allocated_channels_device_node() {
        let nodes = ChannelNodes::Simulated;
        let spec = channel_spec(&naming(), "uid-1", &[channel(3)], |d| {
            nodes.nodes(&[d.id]).unwrap()
        })
        .unwrap();
        assert_eq!(spec.kind, "k8s.compute-domain.nvidia.com/claim");
        assert_eq!(spec.devices[0].name, "uid-1-channel-3");
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(
            (node.path.as_str(), node.kind.as_deref(), node.minor),
            (
                "/dev/nvidia-caps-imex-channels/channel3",
                Some("c"),
                Some(3)
            )
        );
        crate::cdi::validate_spec(&spec).unwrap();
    }

    #[test]
    fn two_shares_of_channel_0_in_one_claim_name_two_cdi_devices_each_injecting_channel0() {
        let nodes = ChannelNodes::Simulated;
        let share = |id: &str| PlannedDevice {
            share_id: Some(id.to_string()),
            ..channel(0)
        };
        let devices = [share("s-1"), share("s-2")];
        let spec = channel_spec(&naming(), "uid-1", &devices, |d| {
            nodes.nodes(&[d.id]).unwrap()
        })
        .unwrap();
        let got: Vec<(&str, &str)> = spec
            .devices
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.container_edits.device_nodes[0].path.as_str(),
                )
            })
            .collect();
        let want = vec![
            (
                "uid-1-channel-0-s-1",
                "/dev/nvidia-caps-imex-channels/channel0",
            ),
            (
                "uid-1-channel-0-s-2",
                "/dev/nvidia-caps-imex-channels/channel0",
            ),
        ];
        assert_eq!(got, want);
        assert_eq!(
            device_id(&naming(), "uid-1", &devices[1]).unwrap(),
            "k8s.compute-domain.nvidia.com/claim=uid-1-channel-0-s-2"
        );
        crate::cdi::validate_spec(&spec).unwrap();
    }

    #[test]
    fn all_mode_on_a_simulated_node_injects_every_channel() {
        let nodes = ChannelNodes::Simulated;
        let all = nodes.all().unwrap();
        assert_eq!(all.len(), 2048);
        let spec = channel_spec(&naming(), "uid-1", &[channel(0)], |_| {
            nodes.nodes(&all).unwrap()
        })
        .unwrap();
        let paths = &spec.devices[0].container_edits.device_nodes;
        assert_eq!(paths.len(), 2048);
        assert_eq!(
            paths[2047].path,
            "/dev/nvidia-caps-imex-channels/channel2047"
        );
    }

    #[test]
    fn a_missing_host_channel_says_how_to_create_it() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = ChannelNodes::Host {
            dev_root: dir.path().to_path_buf(),
        };
        let error = nodes.nodes(&[5]).unwrap_err().to_string();
        assert!(error.contains("nvidia-modprobe -i 5"), "{error}");
        assert!(nodes.all().is_err());
    }

    #[test]
    fn a_daemon_spec_mounts_the_config_dir_and_sets_the_daemon_environment() {
        let domain = DomainNames {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "imex".into(),
        };
        let devices = [PlannedDevice {
            request: "daemon".into(),
            device: "daemon-0".into(),
            id: 0,
            share_id: None,
        }];
        let spec = daemon_spec(
            &naming(),
            "uid-2",
            &devices,
            &domain,
            "c.1",
            Path::new("/state/compute-domains/u"),
        )
        .unwrap();
        let edits = &spec.devices[0].container_edits;
        assert_eq!(
            edits.env,
            vec![
                "COMPUTE_DOMAIN_UUID=u",
                "COMPUTE_DOMAIN_NAME=imex",
                "COMPUTE_DOMAIN_NAMESPACE=ns",
                "CLIQUE_ID=c.1",
                "IMEX_CONFIG_DIR=/etc/nvidia-imex",
            ]
        );
        assert_eq!(edits.mounts[0].host_path, "/state/compute-domains/u");
        assert_eq!(edits.mounts[0].container_path, "/etc/nvidia-imex");
        crate::cdi::validate_spec(&spec).unwrap();
    }
}
