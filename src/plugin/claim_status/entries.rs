//! What a prepared claim's entries say (pure): the `Ready` condition from device health and
//! the `data` from the checkpoint record.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::checkpoint::{ClaimPhase, ClaimRecord, DeviceRecord};
use crate::claims::sharing::DeviceSharing;
use crate::k8s::{ConditionStatus, DeviceStatus, Readiness};
use crate::kubelet::{DeviceHealth, HealthStatus};

/// Reason of a prepared, healthy device's `Ready=True`.
pub const REASON_PREPARED: &str = "Prepared";
/// Reason of `Ready=False` when the device's GPU is unhealthy.
pub const REASON_UNHEALTHY: &str = "Unhealthy";
/// Reason of `Ready=Unknown` when the health check has no verdict.
pub const REASON_HEALTH_UNKNOWN: &str = "HealthUnknown";
/// Reason of `Ready=Unknown` when the device is no longer published (its GPU is gone).
pub const REASON_NOT_PUBLISHED: &str = "NotPublished";

/// The devices' health by pool and device name: indexed once for a pass over many claims
/// (a regular round re-checks every tracked claim against an entry per published device),
/// or scanned for the few devices of the claims one call queued.
pub enum HealthIndex<'a> {
    /// By pool and device name.
    Map(HashMap<(&'a str, &'a str), &'a DeviceHealth>),
    /// The list as it is, searched per device.
    Scan(&'a [DeviceHealth]),
}

impl<'a> HealthIndex<'a> {
    /// Indexes `health` (the kubelet's list: an entry per published device).
    pub fn new(health: &'a [DeviceHealth]) -> Self {
        Self::Map(
            health
                .iter()
                .map(|h| ((h.pool_name.as_str(), h.device_name.as_str()), h))
                .collect(),
        )
    }

    /// `health` searched as it is: cheaper than [`HealthIndex::new`] for a few lookups
    /// (hashing every entry's names costs about as much as comparing them all a few times).
    pub fn scan(health: &'a [DeviceHealth]) -> Self {
        Self::Scan(health)
    }

    /// The health of `device` in `pool`, if the list has it.
    pub fn get(&self, pool: &str, device: &str) -> Option<&'a DeviceHealth> {
        match self {
            Self::Map(by_device) => by_device.get(&(pool, device)).copied(),
            Self::Scan(list) => list
                .iter()
                .find(|h| h.device_name == device && h.pool_name == pool),
        }
    }
}

/// The entries `record` should show, given the devices' health (`None`: the claim is not
/// prepared, so it should show none). Pure.
pub fn wanted(record: Option<&ClaimRecord>, health: &HealthIndex<'_>) -> Vec<DeviceStatus> {
    let Some(record) = record.filter(|r| r.phase == ClaimPhase::PrepareCompleted) else {
        return Vec::new();
    };
    record
        .devices
        .iter()
        .map(|d| DeviceStatus {
            pool: d.pool.clone(),
            device: d.device.clone(),
            share_id: d.share_id.clone(),
            ready: readiness(health.get(&d.pool, &d.device)),
            data: device_data(d),
        })
        .collect()
}

/// The `Ready` condition of a prepared device with health `health` (`None`: not published).
pub fn readiness(health: Option<&DeviceHealth>) -> Readiness {
    let (status, reason, message) = match health {
        None => (
            ConditionStatus::Unknown,
            REASON_NOT_PUBLISHED,
            "the device is no longer published by this node (its GPU is gone?)".to_string(),
        ),
        Some(h) => match h.status {
            HealthStatus::Healthy => (ConditionStatus::True, REASON_PREPARED, String::new()),
            HealthStatus::Unhealthy => {
                (ConditionStatus::False, REASON_UNHEALTHY, h.message.clone())
            }
            HealthStatus::Unknown => (
                ConditionStatus::Unknown,
                REASON_HEALTH_UNKNOWN,
                h.message.clone(),
            ),
        },
    };
    Readiness {
        status,
        reason: reason.to_string(),
        message,
    }
}

/// The `data` of one entry: what the checkpoint knows about the device. A full GPU gives
/// `type: gpu` and its `uuid`; a MIG device `type: mig`, its `uuid`, `parentUUID`, `profile`
/// and `placement`; a device with a sharing strategy adds `sharing` (`strategy`, and the MPS
/// limits or time-slice level). A few hundred bytes, far below the API's 10 KiB.
pub fn device_data(d: &DeviceRecord) -> Value {
    let mut data = Map::new();
    match &d.mig {
        None => {
            data.insert("type".into(), json!("gpu"));
            data.insert("uuid".into(), json!(d.gpu_uuid));
        }
        Some(mig) => {
            data.insert("type".into(), json!("mig"));
            if let Some(uuid) = &mig.uuid {
                data.insert("uuid".into(), json!(uuid));
            }
            data.insert("parentUUID".into(), json!(d.gpu_uuid));
            data.insert("profile".into(), json!(mig.profile));
            data.insert(
                "placement".into(),
                json!({"start": mig.placement_start, "size": mig.placement_size}),
            );
        }
    }
    if let Ok(Some(sharing)) = DeviceSharing::of(d) {
        data.insert("sharing".into(), sharing_data(&sharing));
    }
    Value::Object(data)
}

fn sharing_data(sharing: &DeviceSharing) -> Value {
    let mut out = Map::new();
    let limits = |out: &mut Map<String, Value>, threads: Option<u8>, pinned: Option<u64>| {
        if let Some(t) = threads {
            out.insert("activeThreadPercentage".into(), json!(t));
        }
        if let Some(p) = pinned {
            out.insert("pinnedMemoryLimitBytes".into(), json!(p));
        }
    };
    match sharing {
        DeviceSharing::TimeSlicing { level } => {
            out.insert("strategy".into(), json!("TimeSlicing"));
            out.insert("timeSliceLevel".into(), json!(level));
        }
        DeviceSharing::Mps {
            active_thread_percentage,
            pinned_memory_bytes,
            ..
        } => {
            out.insert("strategy".into(), json!("MPS"));
            limits(&mut out, *active_thread_percentage, *pinned_memory_bytes);
        }
        DeviceSharing::Share {
            active_thread_percentage,
            pinned_memory_bytes,
            ..
        } => {
            out.insert("strategy".into(), json!("MPS"));
            out.insert("perShare".into(), json!(true));
            limits(
                &mut out,
                Some(*active_thread_percentage),
                *pinned_memory_bytes,
            );
        }
    }
    Value::Object(out)
}

#[cfg(test)]
#[path = "entries_tests.rs"]
mod tests;
