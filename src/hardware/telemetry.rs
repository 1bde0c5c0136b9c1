//! What a backend reads about each GPU and MIG device for `/metrics`: power, SM activity,
//! memory, temperature, ECC counters, XID counts and retired pages.
//!
//! A reading the hardware does not offer (utilisation of a GPU in MIG mode, ECC on a GeForce
//! board, page retirement on Ampere and later) is `None`, never a made-up zero, so the
//! exposition leaves the series out instead of reporting a false value.

use std::collections::BTreeMap;

/// One sample of every GPU on the node, in enumeration order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeTelemetry {
    /// One entry per GPU that answered; a GPU that fell off the bus is listed with
    /// [`GpuTelemetry::lost`] set and no readings.
    pub gpus: Vec<GpuTelemetry>,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTelemetry {
    /// NVML index.
    pub index: u32,
    /// Minor number (names the DRA device `gpu-<minor>`).
    pub minor: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// The GPU answered `NVML_ERROR_GPU_IS_LOST`: every reading below is absent.
    pub lost: bool,
    /// Board power draw, watts.
    pub power_watts: Option<f64>,
    /// Enforced power limit, watts.
    pub power_limit_watts: Option<f64>,
    /// SM activity 0–1 of the whole GPU: NVML's utilisation (the share of the sample period
    /// in which a kernel ran; NVML has no finer per-SM figure outside GPM), the load model on
    /// the simulator. `None` in MIG mode, where NVML reports no utilisation.
    pub sm_active: Option<f64>,
    /// Framebuffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// GPU core temperature, °C.
    pub temperature_celsius: Option<f64>,
    /// ECC counters; `None` without ECC.
    pub ecc: Option<EccTelemetry>,
    /// XID errors seen since the backend started watching, by XID.
    pub xid_errors: BTreeMap<u64, u64>,
    /// Pages retired (before Ampere) or rows remapped (Ampere and later), by cause.
    pub retired_pages: BTreeMap<RetirementCause, u64>,
    /// The MIG devices that exist on the GPU.
    pub mig: Vec<MigTelemetry>,
}

impl GpuTelemetry {
    /// A GPU with no readings yet.
    pub fn new(index: u32, minor: u32, uuid: impl Into<String>) -> GpuTelemetry {
        GpuTelemetry {
            index,
            minor,
            uuid: uuid.into(),
            lost: false,
            power_watts: None,
            power_limit_watts: None,
            sm_active: None,
            memory_used_bytes: None,
            memory_total_bytes: None,
            temperature_celsius: None,
            ecc: None,
            xid_errors: BTreeMap::new(),
            retired_pages: BTreeMap::new(),
            mig: Vec::new(),
        }
    }
}

/// `nvmlDeviceGetTotalEccErrors` for both error types and both counter types.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EccTelemetry {
    /// Corrected (single-bit) errors since the last driver load or reset.
    pub single_bit_volatile: u64,
    /// Corrected errors over the GPU's life.
    pub single_bit_aggregate: u64,
    /// Uncorrected (double-bit) errors since the last driver load or reset.
    pub double_bit_volatile: u64,
    /// Uncorrected errors over the GPU's life.
    pub double_bit_aggregate: u64,
}

/// Why memory was taken out of service: the `cause` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RetirementCause {
    /// Page retired after multiple single-bit errors (before Ampere).
    MultipleSingleBit,
    /// Page retired after a double-bit error (before Ampere).
    DoubleBit,
    /// Row remapped after correctable errors (Ampere and later).
    RowRemapCorrectable,
    /// Row remapped after an uncorrectable error (Ampere and later).
    RowRemapUncorrectable,
}

impl RetirementCause {
    /// The `cause` label value.
    pub fn label(self) -> &'static str {
        match self {
            RetirementCause::MultipleSingleBit => "multiple_single_bit",
            RetirementCause::DoubleBit => "double_bit",
            RetirementCause::RowRemapCorrectable => "row_remap_correctable",
            RetirementCause::RowRemapUncorrectable => "row_remap_uncorrectable",
        }
    }
}

/// One MIG device that exists. Power, temperature and ECC are properties of the parent GPU
/// (NVML reports them per GPU only); what is per instance is here.
#[derive(Debug, Clone, PartialEq)]
pub struct MigTelemetry {
    /// `MIG-…` UUID.
    pub uuid: String,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the GPU instance (names the DRA device).
    pub placement_start: u32,
    /// GPU instance id.
    pub gi_id: u32,
    /// SM activity 0–1 of the instance: GPM SM utilisation since the previous sample
    /// (Hopper and later); `None` without GPM or on the instance's first sample.
    pub sm_active: Option<f64>,
    /// Memory of the instance in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Memory of the instance, bytes.
    pub memory_total_bytes: Option<u64>,
}
