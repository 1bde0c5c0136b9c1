//! Shared counters of dynamic-MIG GPUs (KEP-4815 partitionable devices).
//!
//! Each GPU gets one counter set holding only the counters the placement rules need
//! ([`crate::hardware::geometry`]), since every counter a device consumes is work for the
//! scheduler on every node it evaluates and bytes in every copy of the slice:
//! * `memory-slice-0..N-1` (value 1 each): a placement consumes the slices it occupies, so two
//!   placements that overlap never fit together;
//! * `ofa-engines` (the GPU's single optical-flow engine, value 1), when a profile holds it: the
//!   `+me` profiles and the full GPU consume it, so at most one of them exists;
//! * `<profile>-instances` (value: the profile's instance limit), only for a profile whose
//!   instance limit is below the number of its placements that fit side by side, which no
//!   profile of the known GPU models has.
//!
//! The full GPU consumes every counter of its set. Memory, multiprocessor and engine counters
//! are not published: a set of placements that fits the memory slices and the media engine
//! never exceeds them (checked against the simulator's rules for every set of placements of
//! every GPU model, `tests/slices_layout.rs` and `tests/devices_mig_profiles.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::hardware::{GpuInfo, MigProfile, Placement};

/// The counter set name of GPU `minor`.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

/// The counter of memory slice `slice`.
fn memory_slice(slice: u32) -> String {
    format!("memory-slice-{slice}")
}

/// The counter of the GPU's optical-flow (media) engine.
const MEDIA_ENGINE: &str = "ofa-engines";

fn counter(v: impl Into<String>) -> Counter {
    Counter {
        value: Quantity(v.into()),
    }
}

/// The instance counter of `profile` and its value, when the profile's instance limit is
/// below both the number of its placements that fit side by side and what the media engine
/// allows (`media` engines on the GPU); otherwise those counters already enforce it.
fn instance_limit(profile: &MigProfile, media: u32) -> Option<(String, u32)> {
    let mut starts = profile.placement_starts.clone();
    starts.sort_unstable();
    let mut fits = 0u32;
    let mut free_from = 0u32;
    for start in starts {
        if start >= free_from {
            fits += 1;
            free_from = start + profile.memory_slices;
        }
    }
    if let Some(by_media) = media.checked_div(profile.ofa_engines) {
        fits = fits.min(by_media);
    }
    (profile.max_instances < fits).then(|| {
        let name: String = profile
            .name
            .chars()
            .filter(|c| *c != '.')
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        (format!("{name}-instances"), profile.max_instances)
    })
}

/// The GPU's media engines: the most any one profile holds (the driver's limit, as
/// [`crate::hardware::geometry`] applies it).
fn media_engines(gpu: &GpuInfo) -> u32 {
    gpu.mig_profiles
        .iter()
        .map(|p| p.ofa_engines)
        .max()
        .unwrap_or(0)
}

/// The counter set of a dynamic-MIG GPU.
pub fn counter_set(gpu: &GpuInfo) -> CounterSet {
    let mut counters = BTreeMap::new();
    for slice in 0..gpu.memory_slices {
        counters.insert(memory_slice(slice), counter("1"));
    }
    let media = media_engines(gpu);
    if media > 0 {
        counters.insert(MEDIA_ENGINE.to_string(), counter(media.to_string()));
    }
    for (name, limit) in gpu
        .mig_profiles
        .iter()
        .filter_map(|p| instance_limit(p, media))
    {
        counters.insert(name, counter(limit.to_string()));
    }
    CounterSet {
        name: counter_set_name(gpu.minor),
        counters,
    }
}

/// The counter that makes a GPU without dynamic MIG exclusive between its full-GPU and VFIO
/// devices (passthrough only).
const WHOLE_GPU: &str = "gpu";

/// The counter set of a GPU without dynamic MIG on a passthrough node: one counter its
/// full-GPU device and its VFIO device both consume entirely, so the scheduler hands out
/// at most one of them.
pub fn exclusive_set(minor: u32) -> CounterSet {
    CounterSet {
        name: counter_set_name(minor),
        counters: BTreeMap::from([(WHOLE_GPU.to_string(), counter("1"))]),
    }
}

/// The counter of the framebuffer a GPU's vGPUs share (GPUs offering vGPU types only).
pub const FRAMEBUFFER: &str = "framebuffer";

/// Adds the [`FRAMEBUFFER`] counter (`mib`) to the set of a GPU that offers vGPU types.
pub fn add_framebuffer(set: &mut CounterSet, mib: u64) {
    set.counters
        .insert(FRAMEBUFFER.to_string(), counter(super::mib_quantity(mib)));
}

/// The counter set of a GPU without dynamic MIG that offers vGPU types: only the
/// [`FRAMEBUFFER`] (`mib`).
pub fn framebuffer_set(minor: u32, mib: u64) -> CounterSet {
    let mut set = CounterSet {
        name: counter_set_name(minor),
        counters: BTreeMap::new(),
    };
    add_framebuffer(&mut set, mib);
    set
}

/// A vGPU of `mib` framebuffer consumes that much of GPU `minor`'s [`FRAMEBUFFER`].
pub fn framebuffer_consumption(minor: u32, mib: u64) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: counter_set_name(minor),
        counters: BTreeMap::from([(FRAMEBUFFER.to_string(), counter(super::mib_quantity(mib)))]),
        ..Default::default()
    }
}

/// The full GPU consumes every counter of its set entirely.
pub fn full_gpu_consumption(gpu: &GpuInfo, set: &CounterSet) -> DeviceCounterConsumption {
    whole_set_consumption(gpu.minor, set)
}

/// Every counter of GPU `minor`'s set consumed entirely: the full GPU, or its VFIO device.
pub fn whole_set_consumption(minor: u32, set: &CounterSet) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: counter_set_name(minor),
        counters: set.counters.clone(),
        ..Default::default()
    }
}

/// A MIG placement consumes its memory slices, the media engine when its profile holds it,
/// and one instance of its profile when the profile has an instance counter.
pub fn mig_consumption(
    gpu: &GpuInfo,
    profile: &MigProfile,
    placement: Placement,
) -> DeviceCounterConsumption {
    let mut counters = BTreeMap::new();
    for slice in placement.start..placement.start + placement.size {
        counters.insert(memory_slice(slice), counter("1"));
    }
    if profile.ofa_engines > 0 {
        counters.insert(
            MEDIA_ENGINE.to_string(),
            counter(profile.ofa_engines.to_string()),
        );
    }
    if let Some((name, _)) = instance_limit(profile, media_engines(gpu)) {
        counters.insert(name, counter("1"));
    }
    DeviceCounterConsumption {
        counter_set: counter_set_name(gpu.minor),
        counters,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(max_instances: u32, memory_slices: u32, starts: &[u32], ofa: u32) -> MigProfile {
        MigProfile {
            name: "1g.10gb+me".to_string(),
            index: 0,
            id: 0,
            memory_mib: 0,
            multiprocessors: 0,
            copy_engines: 0,
            decoders: 0,
            encoders: 0,
            jpeg_engines: 0,
            ofa_engines: ofa,
            max_instances,
            compute_slices: 1,
            memory_slices,
            placement_starts: starts.to_vec(),
        }
    }

    #[test]
    fn an_instance_counter_exists_only_where_the_limit_is_below_what_fits_side_by_side() {
        assert_eq!(
            instance_limit(&profile(7, 1, &[0, 1, 2, 3, 4, 5, 6], 0), 1),
            None
        );
        assert_eq!(instance_limit(&profile(4, 2, &[0, 2, 4, 6], 0), 1), None);
        // Overlapping starts: only two fit side by side, so a limit of 2 needs no counter.
        assert_eq!(instance_limit(&profile(2, 4, &[0, 2, 4], 0), 1), None);
        assert_eq!(
            instance_limit(&profile(1, 1, &[0, 1, 2], 0), 1),
            Some(("1g10gb-me-instances".to_string(), 1))
        );
        // The single media engine already allows one `+me` instance.
        assert_eq!(instance_limit(&profile(1, 1, &[0, 1, 2], 1), 1), None);
    }
}
