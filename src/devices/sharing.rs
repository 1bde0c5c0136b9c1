//! Shared GPUs (KEP-5075 consumable capacity): which devices are published with
//! `allowMultipleAllocations: true`, and the request policy of each of their capacities.
//!
//! A share's consumed capacity becomes its MPS client limits on prepare (see
//! [`super::share_limits`]): `memory` the pinned-memory limit, `multiprocessors` the active
//! thread percentage. Kubernetes consumes a capacity's whole value when a request names no
//! amount and the capacity has no policy, so every capacity of a shared device gets a policy
//! with a default: the engines (`copyEngines`, `decoders`, …) default to nothing, because MPS
//! cannot split them and they must not stop a second share from fitting.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::attributes::mib_quantity;
use crate::quantity::QuantityError;

/// Fewest equal shares `--shared-gpus <N>` accepts.
pub const MIN_SHARES: u8 = 2;
/// Most equal shares: MPS serves at most 48 client contexts per device (Volta and later).
pub const MAX_SHARES: u8 = 48;

/// Capacity names whose consumption becomes an MPS limit.
pub const MEMORY: &str = "memory";
/// See [`MEMORY`].
pub const MULTIPROCESSORS: &str = "multiprocessors";

/// Whether and how GPUs and MIG devices are published for sharing between claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharedGpus {
    /// Every device is allocated to one claim at a time (the published output is the same as
    /// before sharing existed, byte for byte).
    #[default]
    Off,
    /// Shareable; a request names the memory it needs. A request naming no memory takes the
    /// whole device's memory, so it never squeezes in beside other shares.
    Memory,
    /// Shareable in `n` equal shares by default (`2..=48`): a request naming no amounts takes
    /// 1/n of the memory and 1/n of the multiprocessors; amounts can still be asked for.
    Shares(u8),
}

impl SharedGpus {
    /// Whether devices are published shareable.
    pub fn is_on(self) -> bool {
        self != SharedGpus::Off
    }
}

impl fmt::Display for SharedGpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedGpus::Off => f.write_str("off"),
            SharedGpus::Memory => f.write_str("memory"),
            SharedGpus::Shares(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for SharedGpus {
    type Err = SharingError;

    /// Parses `off`, `memory` or a share count `2`..`48` (case-insensitive, surrounding spaces
    /// ignored). Fails with [`SharingError::InvalidOption`] naming the value and the choices.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let word = text.trim().to_ascii_lowercase();
        match word.as_str() {
            "off" => return Ok(SharedGpus::Off),
            "memory" => return Ok(SharedGpus::Memory),
            _ => {}
        }
        match word.parse::<u32>() {
            Ok(n) if (u32::from(MIN_SHARES)..=u32::from(MAX_SHARES)).contains(&n) => {
                Ok(SharedGpus::Shares(n as u8))
            }
            _ => Err(SharingError::InvalidOption {
                value: text.to_string(),
            }),
        }
    }
}

/// Errors of the sharing option and of turning a share into MPS limits.
#[derive(Debug, thiserror::Error)]
pub enum SharingError {
    /// `--shared-gpus` / `GPU_DRA_SHARED_GPUS` has a value that is not one of the choices.
    #[error(
        "shared GPUs option is {value:?}; valid choices: off, memory, or a number of equal shares from {MIN_SHARES} to {MAX_SHARES}"
    )]
    InvalidOption {
        /// The value as given.
        value: String,
    },
    /// A share records consumption of a capacity its device does not publish.
    #[error(
        "device {device}: consumedCapacity names {capacity:?}, which the device does not publish (it publishes: {published})"
    )]
    UnknownCapacity {
        /// Device name.
        device: String,
        /// The capacity name as recorded.
        capacity: String,
        /// The capacities the device publishes.
        published: String,
    },
    /// A quantity (the device's value or the share's consumption) cannot be read.
    #[error("device {device}: {field} is {value:?}, which is not a usable quantity")]
    Quantity {
        /// Device name.
        device: String,
        /// `capacity.<name>.value` or `consumedCapacity.<name>`.
        field: String,
        /// The text.
        value: String,
        /// Why.
        #[source]
        source: Box<QuantityError>,
    },
    /// A share consumes an amount MPS cannot be set to.
    #[error("device {device}: consumedCapacity.{capacity} is {value}; valid range: {valid}")]
    OutOfRange {
        /// Device name.
        device: String,
        /// The capacity.
        capacity: String,
        /// The consumed amount.
        value: String,
        /// The valid range, e.g. `1Mi to 80Gi`.
        valid: String,
    },
}

fn q(text: String) -> Quantity {
    Quantity(text)
}

/// Memory: whole MiB (the unit MPS limits are set in), at least about 1/48 of the device so
/// that no more shares fit by memory than MPS has clients.
fn memory_policy(total_mib: u64, shared: SharedGpus) -> CapacityRequestPolicy {
    let min = (total_mib / u64::from(MAX_SHARES)).max(1);
    let default = match shared {
        SharedGpus::Shares(n) => (total_mib / u64::from(n)).max(min),
        SharedGpus::Off | SharedGpus::Memory => total_mib,
    };
    CapacityRequestPolicy {
        default: Some(q(mib_quantity(default))),
        valid_range: Some(CapacityRequestPolicyRange {
            min: q(mib_quantity(min)),
            max: Some(q(mib_quantity(total_mib))),
            step: Some(q("1Mi".to_string())),
        }),
        valid_values: None,
    }
}

/// Multiprocessors: whole SMs. Consuming none means "no compute limit" (see
/// [`super::share_limits`]), which is what a `memory`-mode share that names no amount gets.
fn multiprocessors_policy(total: u64, shared: SharedGpus) -> CapacityRequestPolicy {
    let default = match shared {
        SharedGpus::Shares(n) => (total / u64::from(n)).max(1),
        SharedGpus::Off | SharedGpus::Memory => 0,
    };
    CapacityRequestPolicy {
        default: Some(q(default.to_string())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: q("0".to_string()),
            max: Some(q(total.to_string())),
            step: Some(q("1".to_string())),
        }),
        valid_values: None,
    }
}

/// Engines and anything else: nothing by default; an explicit request still consumes what it
/// names, up to the value.
fn unshared_policy() -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(q("0".to_string())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: q("0".to_string()),
            max: None,
            step: None,
        }),
        valid_values: None,
    }
}

/// Makes `device` shareable under `shared`: `allowMultipleAllocations` and a request policy
/// for every capacity. `memory_mib` and `multiprocessors` are the device's own (as its
/// `memory` and `multiprocessors` capacities say). Does nothing when `shared` is off.
pub(crate) fn make_shareable(
    device: &mut Device,
    shared: SharedGpus,
    memory_mib: u64,
    multiprocessors: u32,
) {
    if !shared.is_on() {
        return;
    }
    device.allow_multiple_allocations = Some(true);
    for (name, capacity) in device.capacity.iter_mut().flatten() {
        let policy = match name.as_str() {
            MEMORY if memory_mib > 0 => memory_policy(memory_mib, shared),
            MULTIPROCESSORS if multiprocessors > 0 => {
                multiprocessors_policy(u64::from(multiprocessors), shared)
            }
            _ => unshared_policy(),
        };
        let DeviceCapacity { request_policy, .. } = capacity;
        *request_policy = Some(policy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_values_parse_and_print_back() {
        for (text, want) in [
            ("off", SharedGpus::Off),
            ("Memory", SharedGpus::Memory),
            (" 4 ", SharedGpus::Shares(4)),
            ("48", SharedGpus::Shares(48)),
        ] {
            let got: SharedGpus = text.parse().expect("valid");
            assert_eq!(want, got);
            assert_eq!(text.trim().to_ascii_lowercase(), got.to_string());
        }
    }

    #[test]
    fn option_values_outside_the_choices_are_refused_with_the_choices() {
        for text in ["1", "49", "0", "half", "", "-2"] {
            let got = text.parse::<SharedGpus>().expect_err("invalid");
            let want = format!(
                "shared GPUs option is {text:?}; valid choices: off, memory, or a number of equal shares from 2 to 48"
            );
            assert_eq!(want, got.to_string());
        }
    }
}
