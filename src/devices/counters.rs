//! Shared counters of dynamic-MIG GPUs (KEP-4815 partitionable devices).
//!
//! Each GPU gets one counter set: a counter per memory slice (value 1) that placements
//! consume, plus memory and engine counters. The memory-slice counters alone encode the
//! placement geometry; the engine counters carry the limits geometry does not — above all the
//! single optical-flow/JPEG media engine that a `+me` profile and the full-GPU profile both
//! want. Engine totals are the largest sums any valid set of GPU instances reaches
//! ([`crate::hardware::geometry::max_totals`]), so the counters never refuse a layout the
//! hardware accepts.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::attributes::mib_quantity;
use crate::hardware::geometry::{self, MigTotals};
use crate::hardware::{GpuInfo, MigProfile, Placement};

/// The counter set name of GPU `minor`.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

fn counter(v: String) -> Counter {
    Counter { value: Quantity(v) }
}

/// Totals for a GPU with these profiles, memoised for the process: the enumeration takes about
/// a millisecond, profile tables never change while MIG mode is on, and a node has few models.
pub fn totals(profiles: &[MigProfile]) -> MigTotals {
    static CACHE: Mutex<Vec<(Vec<MigProfile>, MigTotals)>> = Mutex::new(Vec::new());
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, t)) = cache.iter().find(|(p, _)| p.as_slice() == profiles) {
        return *t;
    }
    let t = geometry::max_totals(profiles);
    cache.push((profiles.to_vec(), t));
    t
}

/// Engine and memory counters (name, value) of a GPU.
fn resource_counters(gpu: &GpuInfo, totals: &MigTotals) -> [(&'static str, String); 7] {
    [
        (
            "memory",
            mib_quantity(gpu.memory_mib.max(totals.memory_mib)),
        ),
        (
            "multiprocessors",
            gpu.multiprocessors.max(totals.multiprocessors).to_string(),
        ),
        ("copy-engines", totals.copy_engines.to_string()),
        ("decoders", totals.decoders.to_string()),
        ("encoders", totals.encoders.to_string()),
        ("jpeg-engines", totals.jpeg_engines.to_string()),
        ("ofa-engines", totals.ofa_engines.to_string()),
    ]
}

/// The counter set of a dynamic-MIG GPU.
pub fn counter_set(gpu: &GpuInfo, totals: &MigTotals) -> CounterSet {
    let mut counters = BTreeMap::new();
    for slice in 0..gpu.memory_slices {
        counters.insert(format!("memory-slice-{slice}"), counter("1".to_string()));
    }
    for (name, value) in resource_counters(gpu, totals) {
        // A counter nothing can consume (e.g. encoders on a compute GPU) is noise.
        if value != "0" {
            counters.insert(name.to_string(), counter(value));
        }
    }
    CounterSet {
        name: counter_set_name(gpu.minor),
        counters,
    }
}

/// The full GPU consumes every counter of its set entirely.
pub fn full_gpu_consumption(gpu: &GpuInfo, set: &CounterSet) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: counter_set_name(gpu.minor),
        counters: set.counters.clone(),
        ..Default::default()
    }
}

/// A MIG placement consumes its memory slices and its profile's resources (zero amounts are
/// left out).
pub fn mig_consumption(
    gpu: &GpuInfo,
    profile: &MigProfile,
    placement: Placement,
) -> DeviceCounterConsumption {
    let mut counters = BTreeMap::new();
    for slice in placement.start..placement.start + placement.size {
        counters.insert(format!("memory-slice-{slice}"), counter("1".to_string()));
    }
    counters.insert(
        "memory".to_string(),
        counter(mib_quantity(profile.memory_mib)),
    );
    for (name, value) in [
        ("multiprocessors", profile.multiprocessors),
        ("copy-engines", profile.copy_engines),
        ("decoders", profile.decoders),
        ("encoders", profile.encoders),
        ("jpeg-engines", profile.jpeg_engines),
        ("ofa-engines", profile.ofa_engines),
    ] {
        if value > 0 {
            counters.insert(name.to_string(), counter(value.to_string()));
        }
    }
    DeviceCounterConsumption {
        counter_set: counter_set_name(gpu.minor),
        counters,
        ..Default::default()
    }
}
