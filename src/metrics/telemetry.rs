//! The per-device telemetry families (`gpu_dra_device_*`), built from plain readings.
//!
//! Every series carries the device's labels (`gpu`, `uuid`, `device`, `profile`) and its
//! holder (`namespace`, `claim`, `pod`). A free device has one series with empty holder
//! labels; a held device has one series per (claim, pod), so a claim shared by two pods, or a
//! device shared by two claims, repeats the device's figures under each holder. Aggregations
//! that must count each device once use `max by (uuid)` (or `by (gpu, device)`).

use std::sync::{Arc, Mutex};

use super::text::{self, Family, Kind, Sample};

/// Who holds a device: one claim and one of its pods (empty when unknown).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub claim: String,
    /// A pod the claim is reserved for; empty when the claim named none.
    pub pod: String,
}

/// One device's readings and labels. `None` readings are left out of the exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceReadings {
    /// GPU index (the parent's for a MIG device).
    pub gpu: u32,
    /// UUID of the device (`GPU-…` or `MIG-…`).
    pub uuid: String,
    /// DRA device name.
    pub device: String,
    /// MIG profile; empty for a full GPU.
    pub profile: String,
    /// Holders; empty: free.
    pub holders: Vec<Holder>,
    /// Watts.
    pub power_watts: Option<f64>,
    /// Watts.
    pub power_limit_watts: Option<f64>,
    /// 0–1.
    pub sm_active: Option<f64>,
    /// Bytes.
    pub memory_used_bytes: Option<u64>,
    /// Bytes.
    pub memory_total_bytes: Option<u64>,
    /// °C.
    pub temperature_celsius: Option<f64>,
    /// `(type, scope, count)`: `single_bit|double_bit`, `volatile|aggregate`.
    pub ecc_errors: Vec<(&'static str, &'static str, u64)>,
    /// `(xid, count)`.
    pub xid_errors: Vec<(u64, u64)>,
    /// `(cause, pages)`.
    pub retired_pages: Vec<(&'static str, u64)>,
}

/// Names and help texts of the families, in the order [`families`] returns them.
pub const FAMILIES: [(&str, &str, Kind); 9] = [
    (
        "gpu_dra_device_power_watts",
        "Board power draw in watts (nvmlDeviceGetPowerUsage). NVML measures power per GPU: a MIG device reports its parent GPU's figure; select profile=\"\" for one series per GPU.",
        Kind::Gauge,
    ),
    (
        "gpu_dra_device_power_limit_watts",
        "Enforced power limit in watts (nvmlDeviceGetEnforcedPowerLimit); a MIG device reports its parent GPU's.",
        Kind::Gauge,
    ),
    (
        "gpu_dra_device_sm_active_ratio",
        "SM activity 0-1. GPUs with MIG off: NVML utilization (nvmlDeviceGetUtilizationRates: the share of time a kernel ran, coarser than per-SM activity). MIG devices: GPM SM utilization between two samples (Hopper and later; absent before Hopper and on an instance's first sample). Absent for a GPU in MIG mode, where NVML reports no utilization.",
        Kind::Gauge,
    ),
    (
        "gpu_dra_device_memory_used_bytes",
        "Framebuffer memory in use, bytes (nvmlDeviceGetMemoryInfo; per MIG device on its MIG handle).",
        Kind::Gauge,
    ),
    (
        "gpu_dra_device_memory_total_bytes",
        "Framebuffer memory, bytes (per MIG device: the instance's memory).",
        Kind::Gauge,
    ),
    (
        "gpu_dra_device_temperature_celsius",
        "GPU core temperature, degrees Celsius; a MIG device reports its parent GPU's.",
        Kind::Gauge,
    ),
    (
        "gpu_dra_device_ecc_errors_total",
        "ECC errors by type (single_bit corrected, double_bit uncorrected) and scope (volatile: since the last driver load or GPU reset; aggregate: over the GPU's life). Counted per GPU; a MIG device reports its parent's.",
        Kind::Counter,
    ),
    (
        "gpu_dra_device_xid_errors_total",
        "XID errors by code seen since the plugin started watching (NVML replays none). A full GPU counts every XID of the GPU, those attributed to its MIG instances included; a MIG device counts only the XIDs NVML attributed to its GPU instance (gpuInstanceId).",
        Kind::Counter,
    ),
    (
        "gpu_dra_device_retired_pages",
        "Memory taken out of service, by cause: retired pages (multiple_single_bit, double_bit; before Ampere) or remapped rows (row_remap_correctable, row_remap_uncorrectable; Ampere and later). Per GPU; a MIG device reports its parent's.",
        Kind::Gauge,
    ),
];

const FREE: [Holder; 1] = [Holder {
    namespace: String::new(),
    claim: String::new(),
    pod: String::new(),
}];

/// The `gpu_dra_device_*` families of `rows`; every family is present (HELP and TYPE) even
/// without samples, so a scraper learns the names on a node without GPUs.
pub fn families(rows: &[DeviceReadings]) -> Vec<Family> {
    let mut samples: [Vec<Sample>; 9] = Default::default();
    for row in rows {
        let holders: &[Holder] = if row.holders.is_empty() {
            &FREE
        } else {
            &row.holders
        };
        for h in holders {
            let base = || {
                vec![
                    ("gpu", row.gpu.to_string()),
                    ("uuid", row.uuid.clone()),
                    ("device", row.device.clone()),
                    ("profile", row.profile.clone()),
                    ("namespace", h.namespace.clone()),
                    ("claim", h.claim.clone()),
                    ("pod", h.pod.clone()),
                ]
            };
            let gauges = [
                row.power_watts,
                row.power_limit_watts,
                row.sm_active,
                row.memory_used_bytes.map(|b| b as f64),
                row.memory_total_bytes.map(|b| b as f64),
                row.temperature_celsius,
            ];
            for (i, value) in gauges.into_iter().enumerate() {
                if let Some(value) = value {
                    samples[i].push(Sample::new(base(), value));
                }
            }
            for (kind, scope, n) in &row.ecc_errors {
                let mut labels = base();
                labels.push(("type", (*kind).to_string()));
                labels.push(("scope", (*scope).to_string()));
                samples[6].push(Sample::new(labels, *n as f64));
            }
            for (xid, n) in &row.xid_errors {
                let mut labels = base();
                labels.push(("xid", xid.to_string()));
                samples[7].push(Sample::new(labels, *n as f64));
            }
            for (cause, n) in &row.retired_pages {
                let mut labels = base();
                labels.push(("cause", (*cause).to_string()));
                samples[8].push(Sample::new(labels, *n as f64));
            }
        }
    }
    FAMILIES
        .iter()
        .zip(samples)
        .map(|((name, help, kind), samples)| Family {
            name,
            help,
            kind: *kind,
            samples,
        })
        .collect()
}

/// Every `gpu_dra_device_*` name sorts after this and before the next family.
pub(super) const PREFIX: &str = "gpu_dra_device_";

/// One telemetry sample: its rows, and their families and exposition, built at the first
/// scrape (or [`super::Metrics::families`] call) after the sample and kept for the next
/// ones. A sample nobody reads costs a copy of its rows: an unscraped plugin builds no
/// labels and renders nothing every `--telemetry-interval`.
pub(super) struct Snapshot {
    rows: Vec<DeviceReadings>,
    built: std::sync::OnceLock<Built>,
}

/// What [`Snapshot::built`] makes of a sample's rows.
pub(super) struct Built {
    /// What [`families`] built from the sample's rows.
    pub(super) families: Vec<Family>,
    /// [`text::render`] of `families`.
    pub(super) text: String,
}

impl Snapshot {
    /// The sample's families and exposition, built on the first call.
    pub(super) fn built(&self) -> &Built {
        self.built.get_or_init(|| {
            let families = families(&self.rows);
            let text = text::render(&families);
            Built { families, text }
        })
    }
}

/// The last sample's [`Snapshot`], shared so a scrape takes a reference under the lock and
/// copies the text outside it.
#[derive(Default)]
pub(super) struct LastSample(Mutex<Option<Arc<Snapshot>>>);

impl LastSample {
    /// Makes `rows` the last sample (built into families when first read).
    pub(super) fn set(&self, rows: &[DeviceReadings]) {
        let snapshot = Snapshot {
            rows: rows.to_vec(),
            built: std::sync::OnceLock::new(),
        };
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(snapshot));
    }

    /// The last sample; `None` before the first.
    pub(super) fn get(&self) -> Option<Arc<Snapshot>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::text;

    fn gpu_row() -> DeviceReadings {
        DeviceReadings {
            gpu: 0,
            uuid: "GPU-1".into(),
            device: "gpu-0".into(),
            power_watts: Some(87.5),
            sm_active: None,
            memory_total_bytes: Some(1024),
            ecc_errors: vec![("double_bit", "volatile", 1)],
            xid_errors: vec![(48, 1)],
            retired_pages: vec![("row_remap_uncorrectable", 1)],
            ..DeviceReadings::default()
        }
    }

    #[test]
    fn a_free_device_has_one_series_with_empty_holder_labels_and_absent_readings_are_left_out() {
        let text = text::render(&families(&[gpu_row()]));
        let want = [
            "gpu_dra_device_power_watts{gpu=\"0\",uuid=\"GPU-1\",device=\"gpu-0\",profile=\"\",namespace=\"\",claim=\"\",pod=\"\"} 87.5",
            "gpu_dra_device_memory_total_bytes{gpu=\"0\",uuid=\"GPU-1\",device=\"gpu-0\",profile=\"\",namespace=\"\",claim=\"\",pod=\"\"} 1024",
            "gpu_dra_device_ecc_errors_total{gpu=\"0\",uuid=\"GPU-1\",device=\"gpu-0\",profile=\"\",namespace=\"\",claim=\"\",pod=\"\",type=\"double_bit\",scope=\"volatile\"} 1",
            "gpu_dra_device_xid_errors_total{gpu=\"0\",uuid=\"GPU-1\",device=\"gpu-0\",profile=\"\",namespace=\"\",claim=\"\",pod=\"\",xid=\"48\"} 1",
            "gpu_dra_device_retired_pages{gpu=\"0\",uuid=\"GPU-1\",device=\"gpu-0\",profile=\"\",namespace=\"\",claim=\"\",pod=\"\",cause=\"row_remap_uncorrectable\"} 1",
        ];
        for line in want {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(
            !text.contains("gpu_dra_device_sm_active_ratio{"),
            "no figure, no series"
        );
        assert!(text.contains("# TYPE gpu_dra_device_sm_active_ratio gauge"));
    }

    #[test]
    fn a_device_held_by_a_claim_shared_by_two_pods_has_one_series_per_pod() {
        let holder = |pod: &str| Holder {
            namespace: "team-a".into(),
            claim: "shared".into(),
            pod: pod.into(),
        };
        let row = DeviceReadings {
            holders: vec![holder("p1"), holder("p2")],
            ..gpu_row()
        };
        let fams = families(&[row]);
        let power = &fams[0];
        let pods: Vec<&str> = power
            .samples
            .iter()
            .map(|s| {
                s.labels
                    .iter()
                    .find(|(k, _)| *k == "pod")
                    .unwrap()
                    .1
                    .as_str()
            })
            .collect();
        assert_eq!(pods, ["p1", "p2"]);
        assert!(power.samples.iter().all(|s| s.value == 87.5));
    }
}
