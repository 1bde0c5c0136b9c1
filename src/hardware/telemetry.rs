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
    /// XID errors seen since the backend started watching, by XID: every XID of the GPU,
    /// those NVML attributed to one of its GPU instances included.
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
    /// XID errors NVML attributed to this GPU instance (`gpuInstanceId`), by XID, since the
    /// backend started watching or the instance was created; XIDs of the whole GPU are not
    /// here but only in its [`GpuTelemetry::xid_errors`].
    pub xid_errors: BTreeMap<u64, u64>,
}

/// XID counts of MIG devices, kept from one sample to the next by both backends.
///
/// NVML names the GPU instance of a MIG-scoped XID by its id, which a later instance may
/// reuse; counts are therefore kept per MIG device UUID (new for every instance created):
/// each event is attributed to the instance that holds its GI id at the sample that takes
/// it, so a new instance starts from zero.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MigXidCounts(BTreeMap<(String, String), BTreeMap<u64, u64>>);

impl MigXidCounts {
    /// Counts `events` — `(GI id, XID)` of the XIDs attributed to one of `gpu`'s GPU
    /// instances since the previous call for `gpu` — against the MIG devices `gpu` lists,
    /// sets each one's [`MigTelemetry::xid_errors`], and forgets the devices of `gpu` that
    /// no longer exist. An event whose GI holds no MIG device (destroyed since) counts for
    /// the GPU only. Call it only with a complete MIG list (not for a lost GPU, whose MIG
    /// devices are unknown, not gone). Pure.
    pub fn attribute(
        &mut self,
        gpu: &mut GpuTelemetry,
        events: impl IntoIterator<Item = (u32, u64)>,
    ) {
        for (gi, xid) in events {
            if let Some(mig) = gpu.mig.iter().find(|m| m.gi_id == gi) {
                *self
                    .0
                    .entry((gpu.uuid.clone(), mig.uuid.clone()))
                    .or_default()
                    .entry(xid)
                    .or_default() += 1;
            }
        }
        self.0.retain(|(parent, mig), _| {
            *parent != gpu.uuid || gpu.mig.iter().any(|m| m.uuid == *mig)
        });
        for mig in &mut gpu.mig {
            mig.xid_errors = self
                .0
                .get(&(gpu.uuid.clone(), mig.uuid.clone()))
                .cloned()
                .unwrap_or_default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_with(migs: &[(u32, &str)]) -> GpuTelemetry {
        let mut gpu = GpuTelemetry::new(0, 0, "GPU-0");
        gpu.mig = migs
            .iter()
            .map(|(gi, uuid)| MigTelemetry {
                uuid: (*uuid).into(),
                profile: "1g.10gb".into(),
                placement_start: 0,
                gi_id: *gi,
                sm_active: None,
                memory_used_bytes: None,
                memory_total_bytes: None,
                xid_errors: BTreeMap::new(),
            })
            .collect();
        gpu
    }

    fn xids(gpu: &GpuTelemetry) -> Vec<(String, Vec<(u64, u64)>)> {
        gpu.mig
            .iter()
            .map(|m| {
                (
                    m.uuid.clone(),
                    m.xid_errors.iter().map(|(x, n)| (*x, *n)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn an_attributed_xid_counts_for_the_instance_holding_its_gi_and_accumulates() {
        let mut counts = MigXidCounts::default();
        let mut gpu = gpu_with(&[(1, "MIG-a"), (2, "MIG-b")]);
        counts.attribute(&mut gpu, [(2, 31), (2, 31), (7, 43)]);
        let mut gpu = gpu_with(&[(1, "MIG-a"), (2, "MIG-b")]);
        counts.attribute(&mut gpu, [(1, 13), (2, 31)]);
        assert_eq!(
            xids(&gpu),
            vec![
                ("MIG-a".to_string(), vec![(13, 1)]),
                ("MIG-b".to_string(), vec![(31, 3)]),
            ]
        );
    }

    #[test]
    fn a_new_instance_reusing_a_gi_id_starts_from_zero() {
        let mut counts = MigXidCounts::default();
        counts.attribute(&mut gpu_with(&[(2, "MIG-old")]), [(2, 31)]);
        let mut gpu = gpu_with(&[(2, "MIG-new")]);
        counts.attribute(&mut gpu, []);
        assert_eq!(xids(&gpu), vec![("MIG-new".to_string(), vec![])]);
        assert_eq!(
            counts,
            MigXidCounts::default(),
            "the old instance is forgotten"
        );
    }

    #[test]
    fn another_gpus_instances_are_kept_when_one_gpu_is_counted() {
        let mut counts = MigXidCounts::default();
        counts.attribute(&mut gpu_with(&[(2, "MIG-a")]), [(2, 31)]);
        let mut other = GpuTelemetry::new(1, 1, "GPU-1");
        counts.attribute(&mut other, []);
        let mut gpu = gpu_with(&[(2, "MIG-a")]);
        counts.attribute(&mut gpu, []);
        assert_eq!(xids(&gpu), vec![("MIG-a".to_string(), vec![(31, 1)])]);
    }
}
