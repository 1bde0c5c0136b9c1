//! Telemetry of the simulated node: a load model, the load a test or operator sets
//! (`gpu-dra sim-fault load`), and [`GpuBackend::telemetry`] for the sim backend.
//!
//! The model is pure and shared with the simulated NVML library, so the sim backend and the
//! NVML backend over `libgpu_dra_nvml_sim.so` report the same figures. Without a load set, a
//! GPU is idle (an eighth of its power limit, no SM activity) and every MIG device that
//! exists runs a workload at [`MIG_WORKLOAD_PERCENT`]: carving an instance is what a claim
//! does, so a held MIG device draws power and shows activity. A set load overrides the
//! figures it names, for the whole GPU and each of its MIG devices.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::SimBackend;
use crate::hardware::health::EVENT_XID_CRITICAL;
use crate::hardware::telemetry::{
    EccTelemetry, GpuTelemetry, MigTelemetry, MigXidCounts, NodeTelemetry, RetirementCause,
};
use crate::hardware::{Architecture, GpuBackend, GpuInfo, HardwareError};

/// SM activity (percent) of a MIG device that exists, when no load is set.
pub const MIG_WORKLOAD_PERCENT: u32 = 60;
const MIB: u64 = 1024 * 1024;

/// A load set on one simulated GPU; a field left `None` follows the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimLoad {
    /// SM activity of the GPU and each of its MIG devices, percent (0–100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active_percent: Option<u32>,
    /// Board power draw, watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<u32>,
    /// Memory in use on the whole GPU (MIG off), MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mib: Option<u64>,
    /// Core temperature, °C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_celsius: Option<u32>,
}

/// What a simulated GPU reads now, in NVML's units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimReadings {
    /// `nvmlDeviceGetPowerUsage`, milliwatts.
    pub power_mw: u32,
    /// `nvmlDeviceGetEnforcedPowerLimit`, milliwatts.
    pub power_limit_mw: u32,
    /// `nvmlDeviceGetUtilizationRates().gpu`, percent; `None` in MIG mode (as NVML).
    pub utilization_percent: Option<u32>,
    /// `nvmlDeviceGetTemperature`, °C.
    pub temperature_c: u32,
    /// Memory in use on the whole GPU, MiB.
    pub memory_used_mib: u64,
    /// Each MIG device by GPU instance id: (SM activity percent, memory in use MiB).
    pub mig: BTreeMap<u32, (u32, u64)>,
    /// The MIG devices' SM activity weighted by their share of the GPU's compute slices,
    /// percent: what GPM reports for a GPU in MIG mode.
    pub mig_activity_percent: u32,
}

/// Board power limit of the model, milliwatts (public specifications).
pub fn power_limit_mw(gpu: &GpuInfo) -> u32 {
    let name = &gpu.product_name;
    let watts = if name.contains("A30") {
        165
    } else if name.contains("A100") {
        400
    } else if name.contains("B200") {
        1000
    } else if name.contains("H100") || name.contains("H200") || name.contains("H20") {
        700
    } else if name.contains("L4") {
        72
    } else if name.contains("4090") {
        450
    } else {
        300
    };
    watts * 1000
}

/// Whether the board has ECC memory (data-centre GPUs; not GeForce).
pub fn ecc_capable(gpu: &GpuInfo) -> bool {
    gpu.brand != "GeForce"
}

/// Page retirement is how GPUs before Ampere handle bad memory; Ampere and later remap rows.
pub fn remaps_rows(gpu: &GpuInfo) -> bool {
    gpu.architecture >= Architecture::Ampere
}

/// The model: what `gpu` reads under `load`. Pure.
pub fn readings(gpu: &GpuInfo, load: Option<&SimLoad>) -> SimReadings {
    let load = load.copied().unwrap_or_default();
    let limit = power_limit_mw(gpu);
    let slices_total = gpu
        .mig_profiles
        .iter()
        .map(|p| p.compute_slices)
        .max()
        .unwrap_or(1)
        .max(1);
    let mut mig = BTreeMap::new();
    let mut busy_slices = 0u64;
    let mut mig_used = 0u64;
    for d in &gpu.mig_devices {
        let profile = gpu.profile_by_id(d.profile_id);
        let memory = profile.map_or(0, |p| p.memory_mib);
        let slices = profile.map_or(1, |p| p.compute_slices);
        let sm = load
            .sm_active_percent
            .unwrap_or(MIG_WORKLOAD_PERCENT)
            .min(100);
        let used = memory * u64::from(sm) / 100;
        busy_slices += u64::from(slices) * u64::from(sm);
        mig_used += used;
        mig.insert(d.gi_id, (sm, used));
    }
    let mig_activity_percent = (busy_slices / u64::from(slices_total)).min(100) as u32;
    let activity = match load.sm_active_percent {
        Some(sm) => sm.min(100),
        None => mig_activity_percent,
    };
    let idle = limit / 8;
    let power_mw = match load.power_watts {
        Some(w) => w.saturating_mul(1000),
        None => idle + (limit - idle) / 100 * activity,
    };
    let memory_used_mib = if gpu.mig.current {
        mig_used
    } else {
        load.memory_used_mib
            .unwrap_or(gpu.memory_mib * u64::from(activity) / 100)
    }
    .min(gpu.memory_mib);
    SimReadings {
        power_mw,
        power_limit_mw: limit,
        utilization_percent: (!gpu.mig.current).then_some(activity),
        temperature_c: load
            .temperature_celsius
            .unwrap_or(31 + gpu.minor % 4 + activity * 45 / 100),
        memory_used_mib,
        mig,
        mig_activity_percent,
    }
}

/// XID counts from the fault log, kept across the log's trimming: counting starts with the
/// first sample, as an NVML event set sees only events raised after it was created.
#[derive(Debug, Default)]
pub(super) struct XidTally(Mutex<Option<XidCounts>>);

/// What the tally has counted so far.
#[derive(Debug)]
struct XidCounts {
    /// The last event sequence number counted.
    cursor: u64,
    /// Every XID by (GPU slot, XID).
    gpus: BTreeMap<(u32, u64), u64>,
    /// The XIDs attributed to a GPU instance, by MIG device.
    mig: MigXidCounts,
}

/// An XID event attributed to a GPU instance: (GPU slot, GI id, XID).
type AttributedXid = (u32, u32, u64);

impl SimBackend {
    /// The load set on GPU `index`, if any.
    pub fn load(&self, index: u32) -> Result<Option<SimLoad>, HardwareError> {
        let i = self.check_index(index)? as u32;
        self.store.read(|s| Ok(s.loads.get(&i).copied()))
    }

    /// Sets (or with `None` clears) the load of GPU `index`; every process sharing the
    /// state sees it at its next reading. Fails when the GPU does not exist or the state
    /// cannot be written.
    pub fn set_load(&self, index: u32, load: Option<SimLoad>) -> Result<(), HardwareError> {
        let i = self.check_index(index)? as u32;
        self.store.with(|s| {
            let before = s.loads.get(&i).copied();
            match load {
                Some(l) => s.loads.insert(i, l),
                None => s.loads.remove(&i),
            };
            Ok(((), before != load))
        })
    }

    /// Counts the XID events raised since the previous call into `tally` and returns the
    /// counts and the new events attributed to a GPU instance.
    fn count_xids<'t>(
        &self,
        tally: &'t mut Option<XidCounts>,
    ) -> Result<(&'t mut XidCounts, Vec<AttributedXid>), HardwareError> {
        let counts = match tally {
            Some(counts) => counts,
            None => tally.insert(XidCounts {
                cursor: self.events_after(u64::MAX)?.1,
                gpus: BTreeMap::new(),
                mig: MigXidCounts::default(),
            }),
        };
        let (events, last) = self.events_after(counts.cursor)?;
        counts.cursor = last;
        let mut attributed = Vec::new();
        for e in events.iter().filter(|e| e.event_type == EVENT_XID_CRITICAL) {
            *counts.gpus.entry((e.gpu, e.data)).or_default() += 1;
            if let Some(gi) = e.gpu_instance {
                attributed.push((e.gpu, gi, e.data));
            }
        }
        Ok((counts, attributed))
    }

    pub(super) fn sim_telemetry(&self) -> Result<NodeTelemetry, HardwareError> {
        let inventory = self.inventory()?;
        let (loads, faults) = self.store.read(|s| {
            let faults: Vec<_> = s.gpus.iter().map(|g| (g.lost, g.ecc)).collect();
            Ok((s.loads.clone(), faults))
        })?;
        let mut tally = self.xids.0.lock().unwrap_or_else(|p| p.into_inner());
        let (xids, attributed) = self.count_xids(&mut tally)?;
        let mut gpus = Vec::with_capacity(inventory.gpus.len());
        for gpu in &inventory.gpus {
            let mut t = GpuTelemetry::new(gpu.index, gpu.minor, &gpu.uuid);
            t.xid_errors = xids
                .gpus
                .iter()
                .filter(|((slot, _), _)| *slot == gpu.minor)
                .map(|((_, xid), n)| (*xid, *n))
                .collect();
            let (lost, ecc) = faults.get(gpu.minor as usize).copied().unwrap_or_default();
            if lost {
                t.lost = true;
                gpus.push(t);
                continue;
            }
            let r = readings(gpu, loads.get(&gpu.minor));
            t.power_watts = Some(f64::from(r.power_mw) / 1000.0);
            t.power_limit_watts = Some(f64::from(r.power_limit_mw) / 1000.0);
            t.sm_active = r.utilization_percent.map(|p| f64::from(p) / 100.0);
            t.memory_used_bytes = Some(r.memory_used_mib * MIB);
            t.memory_total_bytes = Some(gpu.memory_mib * MIB);
            t.temperature_celsius = Some(f64::from(r.temperature_c));
            if ecc_capable(gpu) {
                t.ecc = Some(EccTelemetry {
                    single_bit_volatile: ecc.single_volatile,
                    single_bit_aggregate: ecc.single_aggregate,
                    double_bit_volatile: ecc.double_volatile,
                    double_bit_aggregate: ecc.double_aggregate,
                });
                let (single, double) = if remaps_rows(gpu) {
                    (
                        RetirementCause::RowRemapCorrectable,
                        RetirementCause::RowRemapUncorrectable,
                    )
                } else {
                    (
                        RetirementCause::MultipleSingleBit,
                        RetirementCause::DoubleBit,
                    )
                };
                t.retired_pages.insert(single, ecc.retired_single);
                t.retired_pages.insert(double, ecc.retired_double);
            }
            for d in &gpu.mig_devices {
                let (sm, used) = r.mig.get(&d.gi_id).copied().unwrap_or_default();
                let total = gpu.profile_by_id(d.profile_id).map_or(0, |p| p.memory_mib);
                t.mig.push(MigTelemetry {
                    uuid: d.uuid.clone(),
                    profile: d.profile_name.clone(),
                    placement_start: d.placement.start,
                    gi_id: d.gi_id,
                    // As through NVML: per-instance SM activity comes from GPM (Hopper on).
                    sm_active: (gpu.architecture >= Architecture::Hopper)
                        .then(|| f64::from(sm) / 100.0),
                    memory_used_bytes: Some(used * MIB),
                    memory_total_bytes: Some(total * MIB),
                    xid_errors: BTreeMap::new(),
                });
            }
            let slot = gpu.minor;
            let events = attributed
                .iter()
                .filter(|(s, _, _)| *s == slot)
                .map(|(_, gi, xid)| (*gi, *xid));
            xids.mig.attribute(&mut t, events);
            gpus.push(t);
        }
        Ok(NodeTelemetry { gpus })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::sim::SimBackend;

    fn h100_node() -> SimBackend {
        SimBackend::open("dgx-h100", None).unwrap()
    }

    /// A100 with static MIG devices, H100 with dynamic MIG, L4 without MIG.
    fn mixed_node() -> SimBackend {
        SimBackend::open("mixed", None).unwrap()
    }

    #[test]
    fn an_idle_gpu_draws_an_eighth_of_its_limit_and_shows_no_activity() {
        let inv = mixed_node().inventory().unwrap();
        let l4 = &inv.gpus[2];
        let r = readings(l4, None);
        assert_eq!(
            (r.power_mw, r.utilization_percent, r.memory_used_mib),
            (72_000 / 8, Some(0), 0)
        );
    }

    #[test]
    fn a_set_load_raises_power_activity_memory_and_temperature() {
        let inv = mixed_node().inventory().unwrap();
        let gpu = &inv.gpus[2];
        let load = SimLoad {
            sm_active_percent: Some(80),
            ..SimLoad::default()
        };
        let idle = readings(gpu, None);
        let busy = readings(gpu, Some(&load));
        assert_eq!(busy.utilization_percent, Some(80));
        assert!(busy.power_mw > idle.power_mw, "{busy:?} vs {idle:?}");
        assert!(busy.temperature_c > idle.temperature_c);
        assert_eq!(busy.memory_used_mib, gpu.memory_mib * 80 / 100);
        let pinned = SimLoad {
            power_watts: Some(60),
            memory_used_mib: Some(1024),
            temperature_celsius: Some(70),
            ..load
        };
        let r = readings(gpu, Some(&pinned));
        assert_eq!(
            (r.power_mw, r.memory_used_mib, r.temperature_c),
            (60_000, 1024, 70)
        );
    }

    #[test]
    fn each_mig_device_that_exists_runs_a_workload_and_the_gpu_reports_no_utilisation() {
        let sim = h100_node();
        let inv = sim.inventory().unwrap();
        let gpu = inv.gpus.iter().find(|g| g.mig.current).expect("a MIG GPU");
        let index = gpu.index;
        let profile = gpu.profile_by_name("1g.10gb").unwrap().clone();
        let free = (0..8)
            .find(|s| sim.create_mig_device(index, profile.id, *s).is_ok())
            .expect("a free 1g placement");
        let gpu = sim.inventory().unwrap().gpus[index as usize].clone();
        let carved = gpu
            .mig_devices
            .iter()
            .find(|d| d.placement.start == free)
            .unwrap();
        let r = readings(&gpu, None);
        assert_eq!(r.utilization_percent, None);
        assert_eq!(
            r.mig.get(&carved.gi_id),
            Some(&(
                MIG_WORKLOAD_PERCENT,
                profile.memory_mib * u64::from(MIG_WORKLOAD_PERCENT) / 100
            ))
        );
        assert!(r.power_mw > power_limit_mw(&gpu) / 8);
    }

    #[test]
    fn xid_errors_are_counted_per_gpu_and_code_from_the_first_sample_on() {
        use crate::hardware::sim::faults::Fault;
        let sim = h100_node();
        sim.inject(
            0,
            Fault::Xid {
                code: 13,
                gpu_instance: None,
            },
        )
        .unwrap();
        let before = sim.telemetry().unwrap();
        assert!(
            before.gpus[0].xid_errors.is_empty(),
            "events before the first sample"
        );
        sim.inject(
            0,
            Fault::Xid {
                code: 13,
                gpu_instance: None,
            },
        )
        .unwrap();
        sim.inject(
            0,
            Fault::Xid {
                code: 13,
                gpu_instance: None,
            },
        )
        .unwrap();
        sim.inject(1, Fault::Ecc { double_bit: true }).unwrap();
        let after = sim.telemetry().unwrap();
        assert_eq!(after.gpus[0].xid_errors, BTreeMap::from([(13, 2)]));
        assert_eq!(after.gpus[1].xid_errors, BTreeMap::from([(48, 1)]));
        let ecc = after.gpus[1].ecc.unwrap();
        assert_eq!((ecc.double_bit_volatile, ecc.double_bit_aggregate), (1, 1));
        assert_eq!(
            after.gpus[1].retired_pages[&RetirementCause::RowRemapUncorrectable],
            1
        );
    }

    #[test]
    fn a_mig_scoped_xid_counts_for_its_instance_and_the_gpu_and_a_gpu_wide_one_for_the_gpu_only() {
        use crate::hardware::sim::faults::Fault;
        let sim = h100_node();
        let index = sim
            .inventory()
            .unwrap()
            .gpus
            .iter()
            .find(|g| g.mig.current)
            .expect("a MIG GPU")
            .index;
        let profile = sim.inventory().unwrap().gpus[index as usize]
            .profile_by_name("1g.10gb")
            .unwrap()
            .id;
        let carved: Vec<u32> = (0..8)
            .filter(|s| sim.create_mig_device(index, profile, *s).is_ok())
            .take(2)
            .collect();
        assert_eq!(carved.len(), 2, "two free 1g placements");
        let gpu = sim.inventory().unwrap().gpus[index as usize].clone();
        let gi = |start: u32| {
            gpu.mig_devices
                .iter()
                .find(|d| d.placement.start == start)
                .unwrap()
                .gi_id
        };
        let (hit, spared) = (gi(carved[0]), gi(carved[1]));
        sim.telemetry().unwrap(); // counting starts with the first sample
        let xid = |code, gpu_instance| Fault::Xid { code, gpu_instance };
        sim.inject(index, xid(31, Some(hit))).unwrap();
        sim.inject(index, xid(31, Some(hit))).unwrap();
        sim.inject(index, xid(43, None)).unwrap();
        let t = sim.telemetry().unwrap();
        let t = &t.gpus[index as usize];
        assert_eq!(t.xid_errors, BTreeMap::from([(31, 2), (43, 1)]));
        let mig_xids = |gi_id: u32| {
            t.mig
                .iter()
                .find(|m| m.gi_id == gi_id)
                .unwrap()
                .xid_errors
                .clone()
        };
        assert_eq!(mig_xids(hit), BTreeMap::from([(31, 2)]));
        assert_eq!(mig_xids(spared), BTreeMap::new());
    }

    #[test]
    fn a_load_set_through_the_state_is_read_back_and_cleared() {
        let sim = h100_node();
        let load = SimLoad {
            sm_active_percent: Some(50),
            ..SimLoad::default()
        };
        sim.set_load(2, Some(load)).unwrap();
        assert_eq!(sim.load(2).unwrap(), Some(load));
        sim.set_load(2, None).unwrap();
        assert_eq!(sim.load(2).unwrap(), None);
    }
}
