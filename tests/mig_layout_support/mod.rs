//! Shared checks of MIG layouts: what the published counters allow, and what the simulated
//! hardware accepts, for a set of published devices.

#![allow(dead_code)] // each test file uses a different part

use std::collections::BTreeMap;

use gpu_dra::devices::{DeviceKind, DeviceModel};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;

/// Quantities as they appear in our counters: plain integers, `Mi`, `Gi`.
pub fn amount(q: &str) -> u64 {
    if let Some(n) = q.strip_suffix("Mi") {
        n.parse::<u64>().unwrap() << 20
    } else if let Some(n) = q.strip_suffix("Gi") {
        n.parse::<u64>().unwrap() << 30
    } else {
        q.parse().unwrap()
    }
}

/// The names of the dynamic MIG devices of `model`, in published order.
pub fn dynamic_mig_names(model: &DeviceModel) -> Vec<&str> {
    model
        .devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceKind::MigDynamic { .. }))
        .map(|d| d.name())
        .collect()
}

/// Whether the first counter set of `model` has room for all of `names` at once.
pub fn counters_allow(model: &DeviceModel, names: &[&str]) -> bool {
    let set = &model.counter_sets[0];
    let mut used: BTreeMap<&str, u64> = BTreeMap::new();
    for n in names {
        for c in model
            .device(n)
            .unwrap()
            .device
            .consumes_counters
            .iter()
            .flatten()
        {
            for (k, q) in &c.counters {
                *used.entry(k.as_str()).or_default() += amount(&q.value.0);
            }
        }
    }
    used.iter()
        .all(|(k, v)| *v <= amount(&set.counters[*k].value.0))
}

/// Whether the simulated hardware accepts all of `names` at once.
pub fn hardware_allows(preset_yaml: &str, model: &DeviceModel, names: &[&str]) -> bool {
    let plan = gpu_dra::hardware::sim::NodeSpec::parse("t", preset_yaml)
        .unwrap()
        .plan("t", "t")
        .unwrap();
    let sim = SimBackend::from_plan(plan, None);
    names.iter().all(|n| match &model.device(n).unwrap().kind {
        DeviceKind::MigDynamic {
            profile_id,
            placement,
            ..
        } => sim
            .create_mig_device(0, *profile_id, placement.start)
            .is_ok(),
        DeviceKind::Gpu => sim.inventory().unwrap().gpus[0].mig_devices.is_empty(),
        DeviceKind::MigStatic { .. } | DeviceKind::Vfio { .. } | DeviceKind::Vgpu { .. } => {
            unreachable!()
        }
    })
}
