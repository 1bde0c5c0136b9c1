//! Sharing in the claim lifecycle: the claim's opaque config (time-slicing, MPS with limits)
//! and consumable-capacity shares (one MPS daemon per shared device, per-client limits), decided
//! before anything is touched, applied after the MIG devices exist, and undone on unprepare.
//!
//! What each device got is recorded in its checkpoint record (`DeviceRecord::sharing`, the
//! [`DeviceSharing`] JSON), so unprepare, start-up recovery and the MPS supervisor work from
//! the checkpoint alone.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{ClaimError, ClaimId};
use crate::checkpoint::DeviceRecord;
use crate::sharing::MpsManager;

mod daemons;
mod decide;

pub(super) use daemons::{apply, undo, wanted_daemons};
pub(super) use decide::decide;

/// How this node shares GPUs: the MPS manager (its tools also set time-slices) and which
/// strategies the administrator allows.
pub struct SharingSetup {
    /// MPS daemons (and, through its tools, `nvidia-smi`).
    pub mps: MpsManager,
    /// `--mps`: MPS (opaque config and consumable-capacity shares) allowed.
    pub mps_enabled: bool,
    /// `--time-slicing`: the TimeSlicing strategy allowed.
    pub time_slicing_enabled: bool,
}

/// What one device of a claim got, as stored in its checkpoint record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "camelCase", deny_unknown_fields)]
pub enum DeviceSharing {
    /// A full GPU whose time-slice was set (reset to Default on unprepare).
    #[serde(rename = "TimeSlicing")]
    TimeSlicing {
        /// `nvidia-smi compute-policy --set-timeslice` level.
        level: u8,
    },
    /// A device of the claim's own MPS daemon (opaque config).
    #[serde(rename = "MPS", rename_all = "camelCase")]
    Mps {
        /// Daemon id.
        daemon: String,
        /// Position in the daemon's `CUDA_VISIBLE_DEVICES`.
        ordinal: usize,
        /// Default active-thread percentage of the daemon.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        active_thread_percentage: Option<u8>,
        /// Pinned-memory limit of this device.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned_memory_bytes: Option<u64>,
        /// The daemon runs in multi-user mode (`-d -M`). Absent in records written before
        /// the field existed, which then mean single-user, as they were started.
        #[serde(default, skip_serializing_if = "is_false")]
        multi_user: bool,
    },
    /// A consumable-capacity share of a device whose MPS daemon all its shares use.
    #[serde(rename = "Share", rename_all = "camelCase")]
    Share {
        /// Daemon id (one per shared device).
        daemon: String,
        /// This client's active-thread percentage.
        active_thread_percentage: u8,
        /// This client's pinned-memory limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pinned_memory_bytes: Option<u64>,
    },
}

impl DeviceSharing {
    /// The record of a device, if it has one; an unreadable record is reported, not ignored.
    pub fn of(record: &DeviceRecord) -> Result<Option<DeviceSharing>, String> {
        match &record.sharing {
            None => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| format!("device {}: sharing record {v}: {e}", record.device)),
        }
    }

    fn daemon(&self) -> Option<&str> {
        match self {
            DeviceSharing::TimeSlicing { .. } => None,
            DeviceSharing::Mps { daemon, .. } | DeviceSharing::Share { daemon, .. } => Some(daemon),
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn config_error(id: &ClaimId, detail: impl Into<String>) -> ClaimError {
    ClaimError::Config {
        claim: id.to_string(),
        detail: detail.into(),
    }
}

/// The id of a claim's own MPS daemon: the claim UID and a digest of its device names, so
/// two config groups of one claim get two daemons and a retry gets the same one.
fn claim_daemon_id(uid: &str, devices: &[&str]) -> String {
    let digest = Sha256::digest(devices.join(",").as_bytes());
    let hex: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
    let uid: String = uid
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(50)
        .collect();
    format!("{uid}-{}", &hex[..5])
}

/// The id of the daemon all shares of one device use.
fn share_daemon_id(device: &str) -> String {
    let mut id = format!("share-{device}");
    id.truncate(63);
    id
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_daemon_ids_are_dns_labels_and_stable() {
        let id = claim_daemon_id("0b3e9f6c-1a2b-4c5d-8e9f-001122334455", &["gpu-0", "gpu-1"]);
        assert_eq!(
            id,
            claim_daemon_id("0b3e9f6c-1a2b-4c5d-8e9f-001122334455", &["gpu-0", "gpu-1"])
        );
        assert!(crate::sharing::validate_daemon_id(&id).is_ok(), "{id}");
        assert_ne!(
            id,
            claim_daemon_id("0b3e9f6c-1a2b-4c5d-8e9f-001122334455", &["gpu-0"])
        );
    }

    #[test]
    fn share_daemon_ids_are_dns_labels() {
        let id = share_daemon_id("gpu-7-mig-1g20gb-me-6");
        assert_eq!(id, "share-gpu-7-mig-1g20gb-me-6");
        assert!(crate::sharing::validate_daemon_id(&id).is_ok());
    }

    #[test]
    fn sharing_records_round_trip_as_json() {
        let want = DeviceSharing::Mps {
            daemon: "abc-12345".into(),
            ordinal: 1,
            active_thread_percentage: Some(50),
            pinned_memory_bytes: Some(1 << 30),
            multi_user: false,
        };
        let v = serde_json::to_value(&want).unwrap();
        assert_eq!(v["strategy"], "MPS");
        assert_eq!(v["activeThreadPercentage"], 50);
        assert!(
            v.get("multiUser").is_none(),
            "single-user records keep their old form: {v}"
        );
        let got: DeviceSharing = serde_json::from_value(v).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn multi_user_records_round_trip_as_json() {
        let want = DeviceSharing::Mps {
            daemon: "abc-12345".into(),
            ordinal: 0,
            active_thread_percentage: None,
            pinned_memory_bytes: None,
            multi_user: true,
        };
        let v = serde_json::to_value(&want).unwrap();
        assert_eq!(v["multiUser"], true);
        assert_eq!(serde_json::from_value::<DeviceSharing>(v).unwrap(), want);
    }
}
