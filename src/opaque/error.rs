//! Errors of decoding and resolving opaque config. Each names the field path, the value and
//! what would be valid, because users fix their claims from these messages alone.

use std::fmt;

#[cfg(doc)]
use crate::quantity::QuantityError;

use super::TimeSliceInterval;

/// Whether an entry came from the DeviceClass or from the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryOrigin {
    /// The DeviceClass's config.
    Class,
    /// The claim's own config.
    Claim,
}

impl fmt::Display for EntryOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntryOrigin::Class => "the device class",
            EntryOrigin::Claim => "the claim",
        })
    }
}

/// Why an opaque config is invalid or cannot be applied to the claim's devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpaqueError {
    /// Resolution: this entry is invalid or does not fit the devices; the cause says why.
    #[error("opaque config entry {index} of {origin}{}", requests_note(requests))]
    Entry {
        /// Position among this driver's entries of the same origin, from 0.
        index: usize,
        /// Class or claim.
        origin: EntryOrigin,
        /// The requests the entry names (empty = all).
        requests: Vec<String>,
        /// What is wrong with it.
        #[source]
        source: Box<OpaqueError>,
    },
    /// Decoding: the parameters, or a block in them, is not a JSON object.
    #[error("{path}: expected {expected}, got {got}")]
    WrongType {
        /// Field path (`.` for the whole object).
        path: String,
        /// What the field must be.
        expected: &'static str,
        /// The value found, as JSON.
        got: String,
    },
    /// Decoding: a required field is absent.
    #[error("{path}: required field is missing; valid: {valid}")]
    Missing {
        /// Field path.
        path: String,
        /// Valid values.
        valid: String,
    },
    /// Decoding: a field this API does not have.
    #[error("{path}: unknown field; valid fields: {valid}")]
    UnknownField {
        /// Field path, ending in the unknown name.
        path: String,
        /// The fields valid at that level.
        valid: &'static str,
    },
    /// Decoding: `apiVersion` is not one this driver serves.
    #[error("apiVersion: {value:?} is not supported; valid: {valid}")]
    UnsupportedApiVersion {
        /// The value found.
        value: String,
        /// The accepted versions.
        valid: String,
    },
    /// Decoding: a field takes one of a fixed set of names.
    #[error("{path}: {value:?} is not valid; valid: {valid}")]
    InvalidChoice {
        /// Field path.
        path: String,
        /// The value found.
        value: String,
        /// The valid names.
        valid: String,
    },
    /// Decoding: a number outside its range.
    #[error("{path}: {value} is outside {range}")]
    OutOfRange {
        /// Field path.
        path: String,
        /// The value found, as written.
        value: String,
        /// The valid range.
        range: &'static str,
    },
    /// Decoding: a memory limit that does not parse as a Kubernetes quantity.
    #[error("{path}: {value:?} is not a quantity: {problem}")]
    NotAQuantity {
        /// Field path.
        path: String,
        /// The value found.
        value: String,
        /// Why it does not parse ([`QuantityError::problem`]: the value is not repeated).
        problem: String,
    },
    /// Decoding: a memory limit below the 1Mi MPS minimum (or beyond 2^64 bytes).
    #[error(
        "{path}: {value} is outside the valid range of memory limits: at least 1Mi (MPS takes \
         limits in whole MiB) and below 16Ei"
    )]
    MemoryLimitOutOfRange {
        /// Field path.
        path: String,
        /// The value found, as written.
        value: String,
    },
    /// Resolution: a claim's second `VfioDeviceConfig` (NVIDIA's driver allows one per claim:
    /// which of two would apply to a device is not for this driver to guess).
    #[error(
        "kind VfioDeviceConfig: a claim takes at most one; this is its second (the first is \
         entry {first}); merge them into one entry naming every request it is for"
    )]
    SecondVfioConfig {
        /// Position of the claim's first `VfioDeviceConfig` among its entries of this driver.
        first: usize,
    },
    /// Decoding: a block that belongs to the other strategy.
    #[error("sharing.{field}: not allowed with strategy {strategy}; use {expected} or drop it")]
    StrategyMismatch {
        /// The block given (`mpsConfig` or `timeSlicingConfig`).
        field: &'static str,
        /// The strategy chosen.
        strategy: &'static str,
        /// The block that goes with that strategy.
        expected: &'static str,
    },
    /// A time-slice interval other than Default for a MIG device.
    #[error(
        "sharing.timeSlicingConfig.interval: {interval} cannot be set on {}: the time-slice is a \
         whole-GPU setting, so only Default is valid (processes on one MIG device already share \
         it by time-slicing); to choose the interval, claim the full GPU with kind GpuConfig",
        mig_device(device)
    )]
    IntervalOnMig {
        /// The interval asked for.
        interval: TimeSliceInterval,
        /// The MIG device, when the config is being applied to one.
        device: Option<String>,
    },
    /// Resolution: a config names a request whose device it cannot configure
    /// (`VfioDeviceConfig` on a GPU or MIG device, `GpuConfig` / `MigDeviceConfig` on a VM's
    /// device, `VgpuDeviceConfig` on anything but a vGPU).
    #[error(
        "{kind} names request {request:?}, which got {device_kind}; GpuConfig and MigDeviceConfig configure GPUs and MIG devices, VfioDeviceConfig VFIO devices and vGPUs (classes vfio.gpu.nvidia.com, vgpu.gpu.nvidia.com), VgpuDeviceConfig vGPUs only"
    )]
    KindMismatch {
        /// The config's kind.
        kind: super::ConfigKind,
        /// The request named.
        request: String,
        /// What the request got.
        device_kind: &'static str,
    },
    /// Resolution: a `MigDeviceConfig` names a request that was given a full GPU.
    #[error(
        "kind: MigDeviceConfig applies to MIG devices only, but request {request:?} got the full \
         GPU {device}; use kind GpuConfig for full GPUs"
    )]
    MigConfigOnFullGpu {
        /// The request named by the entry.
        request: String,
        /// The full GPU it got.
        device: String,
    },
    /// Resolution: a per-device limit key that names no device of the group.
    #[error(
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{key}: no device of this config \
         has that key; valid keys: {valid} (index, UUID or device name)"
    )]
    UnknownDeviceKey {
        /// The key found.
        key: String,
        /// The keys that name devices of the group.
        valid: String,
    },
    /// Resolution: two per-device keys name the same device.
    #[error(
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: keys {first:?} and {second:?} both \
         name device {device}; keep one"
    )]
    DuplicateDeviceKey {
        /// One key.
        first: String,
        /// The other key.
        second: String,
        /// The device both name.
        device: String,
    },
    /// Resolution: a pinned memory limit larger than the device's memory.
    #[error(
        "{path}: {} is above the memory of device {device} ({})",
        bytes(*limit),
        bytes(*memory)
    )]
    LimitAboveMemory {
        /// Field path of the limit.
        path: String,
        /// The limit in bytes.
        limit: u64,
        /// The device.
        device: String,
        /// Its memory in bytes.
        memory: u64,
    },
}

fn requests_note(requests: &[String]) -> String {
    if requests.is_empty() {
        " (all requests)".to_owned()
    } else {
        format!(" (requests {})", requests.join(", "))
    }
}

fn mig_device(device: &Option<String>) -> String {
    match device {
        Some(name) => format!("MIG device {name}"),
        None => "a MIG device (kind MigDeviceConfig)".to_owned(),
    }
}

/// Bytes in the unit a user most likely wrote: `10Gi`, `512Mi`, else plain bytes.
fn bytes(value: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if value != 0 && value.is_multiple_of(GIB) {
        format!("{}Gi", value / GIB)
    } else if value != 0 && value.is_multiple_of(MIB) {
        format!("{}Mi", value / MIB)
    } else {
        format!("{value} bytes")
    }
}
