//! From a share of a device (its `consumedCapacity`) to the MPS limits of the share's clients.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::Device;

use super::sharing::{MEMORY, MULTIPROCESSORS, SharingError};
use crate::quantity::Quantity;

const MIB: u64 = 1024 * 1024;

/// The MPS limits of one share's clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimits {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, 1..=100: the share's multiprocessors as a
    /// percentage of the device's, rounded down but never 0; 100 when the share consumes no
    /// multiprocessors (or the device publishes none).
    pub active_thread_percentage: u8,
    /// Pinned device memory limit in bytes, a whole number of MiB; `None` when the share
    /// consumes all of the device's memory or none is recorded (nothing to limit).
    pub pinned_memory_bytes: Option<u64>,
}

impl ShareLimits {
    /// The limit in the form the MPS control daemon takes (`<MiB>M`, e.g. `10240M`), if any.
    pub fn pinned_memory_limit_arg(&self) -> Option<String> {
        self.pinned_memory_bytes.map(|b| format!("{}M", b / MIB))
    }
}

fn quantity(device: &str, field: String, text: &str) -> Result<Quantity, SharingError> {
    text.parse().map_err(|source| SharingError::Quantity {
        device: device.to_string(),
        field,
        value: text.to_string(),
        source: Box::new(source),
    })
}

fn integer(device: &str, field: String, q: Quantity) -> Result<i64, SharingError> {
    q.as_i64().map_err(|source| SharingError::Quantity {
        device: device.to_string(),
        field,
        value: q.to_string(),
        source: Box::new(source),
    })
}

/// The limits for one share of `device` consuming `consumed` (the allocation result's
/// `consumedCapacity`: capacity name → quantity, names as the device publishes them or
/// qualified with a domain).
///
/// Pure. Fails with [`SharingError::UnknownCapacity`] when `consumed` names a capacity the
/// device does not publish, [`SharingError::Quantity`] when a value is not a quantity (or
/// multiprocessors not a whole number), and [`SharingError::OutOfRange`] when the share
/// consumes more than the device has, or memory below the 1 MiB MPS minimum.
pub fn share_limits(
    device: &Device,
    consumed: &BTreeMap<String, String>,
) -> Result<ShareLimits, SharingError> {
    let name = device.name.as_str();
    let published = device.capacity.clone().unwrap_or_default();
    let mut limits = ShareLimits {
        active_thread_percentage: 100,
        pinned_memory_bytes: None,
    };
    for (key, text) in consumed {
        let bare = if published.contains_key(key) {
            key.as_str()
        } else {
            key.rsplit_once('/').map_or(key.as_str(), |(_, b)| b)
        };
        let Some(capacity) = published.get(bare) else {
            return Err(SharingError::UnknownCapacity {
                device: name.to_string(),
                capacity: key.clone(),
                published: published.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let total = quantity(name, format!("capacity.{bare}.value"), &capacity.value.0)?;
        let amount = quantity(name, format!("consumedCapacity.{key}"), text)?;
        let out_of_range = |valid: String| SharingError::OutOfRange {
            device: name.to_string(),
            capacity: key.clone(),
            value: text.clone(),
            valid,
        };
        match bare {
            MEMORY => {
                let one_mib = Quantity::from_i64(MIB as i64);
                if amount < one_mib || amount > total {
                    return Err(out_of_range(format!("1Mi to {}", capacity.value.0)));
                }
                if amount < total {
                    let bytes = integer(name, format!("consumedCapacity.{key}"), amount)?;
                    // Rounded down to whole MiB: a limit never grants more than was consumed.
                    limits.pinned_memory_bytes = Some(bytes as u64 / MIB * MIB);
                }
            }
            MULTIPROCESSORS => {
                let sms = integer(name, format!("consumedCapacity.{key}"), amount)?;
                let all = integer(name, format!("capacity.{bare}.value"), total)?;
                if sms < 0 || sms > all {
                    return Err(out_of_range(format!("0 to {all}")));
                }
                if sms > 0 && all > 0 {
                    let percent = (sms * 100 / all).clamp(1, 100);
                    limits.active_thread_percentage = percent as u8;
                }
            }
            _ => {
                if amount.sign() < 0 || amount > total {
                    return Err(out_of_range(format!("0 to {}", capacity.value.0)));
                }
            }
        }
    }
    Ok(limits)
}
