//! The simulated GPUs follow the MIG reference tables and NVML's behaviour: placements,
//! instance limits, error codes, MIG mode rules, identities and persistence.

use gpu_dra::hardware::sim::{NodeSpec, SimBackend};
use gpu_dra::hardware::{GpuBackend, HardwareError, MigModeChange, NvmlCode, catalog};

/// A one-GPU node of `model` with MIG on and nothing carved.
fn node(model: &str) -> SimBackend {
    let yaml = format!("nodeName: t\ngpus:\n  - model: {model}\n    mig: dynamic\n");
    let plan = NodeSpec::parse("test", &yaml)
        .unwrap()
        .plan("test", "t")
        .unwrap();
    SimBackend::from_plan(plan, None)
}

fn id(model: &str, profile: &str) -> u32 {
    catalog::model(model)
        .unwrap()
        .profiles
        .iter()
        .find(|p| p.name == profile)
        .unwrap_or_else(|| panic!("{model} has no {profile}"))
        .id
}

fn code(r: Result<u32, HardwareError>) -> Option<NvmlCode> {
    match r {
        Ok(_) => None,
        Err(HardwareError::Nvml { code, .. }) => Some(code),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn embedded_table_is_the_project_reference_when_it_is_at_hand() {
    let reference = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/reference/mig-profiles.json");
    let Ok(want) = std::fs::read_to_string(&reference) else {
        eprintln!("reference not beside the checkout; nothing to compare");
        return;
    };
    let got = include_str!("../src/hardware/data/mig-profiles.json");
    assert_eq!(
        got, want,
        "src/hardware/data/mig-profiles.json drifted from the reference"
    );
}

#[test]
fn every_profile_placement_of_every_model_can_be_created_on_an_empty_gpu() {
    for model in catalog::models()
        .unwrap()
        .iter()
        .filter(|m| m.mig_capable())
    {
        let sim = node(&model.key);
        for p in &model.profiles {
            for &start in &p.placement_starts {
                let dev = sim
                    .create_mig_device(0, p.id, start)
                    .unwrap_or_else(|e| panic!("{} {}@{start}: {e}", model.key, p.name));
                assert_eq!(dev.placement.start, start);
                assert_eq!(dev.placement.size, p.memory_slices);
                assert_eq!(dev.profile_name, p.name);
                assert!(dev.uuid.starts_with("MIG-"), "{}", dev.uuid);
                sim.destroy_mig_device(0, dev.gi_id, dev.ci_id).unwrap();
            }
        }
        assert!(sim.inventory().unwrap().gpus[0].mig_devices.is_empty());
    }
}

#[test]
fn seven_1g_instances_fit_and_an_eighth_does_not() {
    let sim = node("H100-SXM5-80GB");
    let one_g = id("H100-SXM5-80GB", "1g.10gb");
    for start in 0..7 {
        sim.create_gpu_instance(0, one_g, start).unwrap();
    }
    let inv = sim.inventory().unwrap();
    assert_eq!(inv.gpus[0].empty_gpu_instances.len(), 7);
    // Observed on H100: seven 1g GIs get ids 7 + start.
    let mut ids: Vec<u32> = inv.gpus[0]
        .empty_gpu_instances
        .iter()
        .map(|g| g.gi_id)
        .collect();
    ids.sort();
    assert_eq!(ids, [7, 8, 9, 10, 11, 12, 13]);
    let one_g_20 = id("H100-SXM5-80GB", "1g.20gb");
    assert_eq!(
        code(sim.create_gpu_instance(0, one_g_20, 6)),
        Some(NvmlCode::InsufficientResources)
    );
}

#[test]
fn two_3g_instances_leave_no_room_for_a_1g() {
    let m = "A100-SXM4-40GB";
    let sim = node(m);
    sim.create_gpu_instance(0, id(m, "3g.20gb"), 0).unwrap();
    sim.create_gpu_instance(0, id(m, "3g.20gb"), 4).unwrap();
    for start in 0..7 {
        assert_eq!(
            code(sim.create_gpu_instance(0, id(m, "1g.5gb"), start)),
            Some(NvmlCode::InsufficientResources),
            "1g@{start}"
        );
    }
}

#[test]
fn a_4g_at_0_blocks_a_3g_at_0_but_not_at_4() {
    let m = "A100-SXM4-40GB";
    let sim = node(m);
    sim.create_gpu_instance(0, id(m, "4g.20gb"), 0).unwrap();
    assert_eq!(
        code(sim.create_gpu_instance(0, id(m, "3g.20gb"), 0)),
        Some(NvmlCode::InsufficientResources)
    );
    assert_eq!(code(sim.create_gpu_instance(0, id(m, "3g.20gb"), 4)), None);
}

#[test]
fn worked_example_a_4g_2g_1g_fills_the_gpu_with_the_observed_ids() {
    let m = "A100-SXM4-40GB";
    let sim = node(m);
    let got = [
        sim.create_gpu_instance(0, id(m, "4g.20gb"), 0).unwrap(),
        sim.create_gpu_instance(0, id(m, "2g.10gb"), 4).unwrap(),
        sim.create_gpu_instance(0, id(m, "1g.5gb"), 6).unwrap(),
    ];
    assert_eq!(
        got,
        [1, 5, 13],
        "GI ids as the driver gave for -cgi 19,14,5"
    );
    for p in catalog::model(m).unwrap().profiles.iter() {
        for &start in &p.placement_starts {
            assert!(
                code(sim.create_gpu_instance(0, p.id, start)).is_some(),
                "{}@{start} should not fit",
                p.name
            );
        }
    }
}

#[test]
fn only_one_media_extension_instance_per_gpu() {
    for (m, me, plain) in [
        ("A100-SXM4-40GB", "1g.5gb+me", "1g.5gb"),
        ("H100-SXM5-80GB", "1g.10gb+me", "1g.10gb"),
        ("B200", "1g.23gb+me", "1g.23gb"),
    ] {
        let sim = node(m);
        sim.create_gpu_instance(0, id(m, me), 0).unwrap();
        assert_eq!(
            code(sim.create_gpu_instance(0, id(m, me), 1)),
            Some(NvmlCode::InsufficientResources),
            "{m}"
        );
        for start in 1..7 {
            sim.create_gpu_instance(0, id(m, plain), start).unwrap();
        }
    }
}

#[test]
fn a30_media_extensions_exclude_each_other_across_profiles() {
    let m = "A30-24GB";
    let sim = node(m);
    sim.create_gpu_instance(0, id(m, "1g.6gb+me"), 0).unwrap();
    assert_eq!(
        code(sim.create_gpu_instance(0, id(m, "2g.12gb+me"), 2)),
        Some(NvmlCode::InsufficientResources)
    );
    assert_eq!(code(sim.create_gpu_instance(0, id(m, "2g.12gb"), 2)), None);
    let sim = node(m);
    sim.create_gpu_instance(0, id(m, "2g.12gb"), 0).unwrap();
    sim.create_gpu_instance(0, id(m, "1g.6gb"), 2).unwrap();
    sim.create_gpu_instance(0, id(m, "1g.6gb"), 3).unwrap();
}

#[test]
fn a_placement_the_profile_does_not_allow_is_an_invalid_argument() {
    let m = "H100-SXM5-80GB";
    let sim = node(m);
    assert_eq!(
        code(sim.create_gpu_instance(0, id(m, "2g.20gb"), 6)),
        Some(NvmlCode::InvalidArgument)
    );
    assert_eq!(
        code(sim.create_gpu_instance(0, id(m, "3g.40gb"), 2)),
        Some(NvmlCode::InvalidArgument)
    );
    // The constant index (2 for 3_SLICE) is not the driver id (9): NVML takes only info.id.
    assert_eq!(
        code(sim.create_gpu_instance(0, 2, 0)),
        Some(NvmlCode::InvalidArgument)
    );
}

#[test]
fn creation_needs_mig_mode_on() {
    let yaml = "gpus:\n  - model: H100-SXM5-80GB\n    mig: dynamic\n    migEnabled: false\n";
    let plan = NodeSpec::parse("t", yaml).unwrap().plan("t", "t").unwrap();
    let sim = SimBackend::from_plan(plan, None);
    let one_g = id("H100-SXM5-80GB", "1g.10gb");
    assert_eq!(
        code(sim.create_gpu_instance(0, one_g, 0)),
        Some(NvmlCode::NotSupported)
    );
    assert_eq!(sim.set_mig_mode(0, true).unwrap(), MigModeChange::Applied);
    assert_eq!(code(sim.create_gpu_instance(0, one_g, 0)), None);
}

#[test]
fn ampere_mig_mode_waits_for_a_reset_while_hopper_applies_when_idle() {
    let yaml = "gpus:\n  - model: A100-SXM4-40GB\n  - model: H100-SXM5-80GB\n";
    let plan = NodeSpec::parse("t", yaml).unwrap().plan("t", "t").unwrap();
    let sim = SimBackend::from_plan(plan, None);
    assert_eq!(
        sim.set_mig_mode(0, true).unwrap(),
        MigModeChange::PendingReset
    );
    let gpu0 = &sim.inventory().unwrap().gpus[0];
    assert_eq!((gpu0.mig.current, gpu0.mig.pending), (false, true));
    sim.reset_gpu(0).unwrap();
    assert!(sim.inventory().unwrap().gpus[0].mig.current);

    assert_eq!(sim.set_mig_mode(1, true).unwrap(), MigModeChange::Applied);
    assert_eq!(sim.set_mig_mode(1, true).unwrap(), MigModeChange::Unchanged);
    sim.create_mig_device(1, id("H100-SXM5-80GB", "1g.10gb"), 0)
        .unwrap();
    let err = sim.set_mig_mode(1, false).unwrap_err();
    assert!(
        matches!(
            err,
            HardwareError::Nvml {
                code: NvmlCode::InUse,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn mig_mode_on_a_gpu_without_mig_is_not_supported() {
    let plan = NodeSpec::parse("t", "gpus:\n  - model: L4\n")
        .unwrap()
        .plan("t", "t")
        .unwrap();
    let sim = SimBackend::from_plan(plan, None);
    let err = sim.set_mig_mode(0, true).unwrap_err();
    assert!(
        matches!(
            err,
            HardwareError::Nvml {
                code: NvmlCode::NotSupported,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_gpu_instance_with_a_compute_instance_cannot_be_destroyed_first() {
    let m = "H100-SXM5-80GB";
    let sim = node(m);
    let dev = sim.create_mig_device(0, id(m, "3g.40gb"), 4).unwrap();
    let err = sim.destroy_gpu_instance(0, dev.gi_id).unwrap_err();
    assert!(
        matches!(
            err,
            HardwareError::Nvml {
                code: NvmlCode::InUse,
                ..
            }
        ),
        "{err}"
    );
    sim.destroy_mig_device(0, dev.gi_id, dev.ci_id).unwrap();
    let err = sim.destroy_mig_device(0, dev.gi_id, dev.ci_id).unwrap_err();
    assert!(
        matches!(
            err,
            HardwareError::Nvml {
                code: NvmlCode::NotFound,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn state_survives_a_restart_and_recreated_devices_get_new_uuids() {
    let dir = tempfile::tempdir().unwrap();
    let m = "H100-SXM5-80GB";
    let first = SimBackend::open("dgx-h100", Some(dir.path())).unwrap();
    let gpu_uuid = first.inventory().unwrap().gpus[3].uuid.clone();
    let dev = first.create_mig_device(3, id(m, "2g.20gb"), 2).unwrap();
    drop(first);

    let second = SimBackend::open("dgx-h100", Some(dir.path())).unwrap();
    let inv = second.inventory().unwrap();
    assert_eq!(
        inv.gpus[3].uuid, gpu_uuid,
        "GPU UUIDs are stable across restarts"
    );
    assert_eq!(
        inv.gpus[3].mig_devices,
        vec![dev.clone()],
        "the MIG device is still there"
    );
    second.destroy_mig_device(3, dev.gi_id, dev.ci_id).unwrap();
    let again = second.create_mig_device(3, id(m, "2g.20gb"), 2).unwrap();
    assert_eq!(again.gi_id, dev.gi_id);
    assert_ne!(
        again.uuid, dev.uuid,
        "a re-created MIG device has a new UUID"
    );
}

#[test]
fn a_corrupt_state_file_is_reported_not_reset() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(gpu_dra::hardware::sim::STATE_FILE),
        b"{not json",
    )
    .unwrap();
    let sim = SimBackend::open("mixed", Some(dir.path())).unwrap();
    let err = sim.inventory().unwrap_err().to_string();
    assert!(err.contains("sim-gpu-state.json is unreadable"), "{err}");
    assert!(err.contains("move it away"), "{err}");
}

#[test]
fn presets_build_the_documented_nodes() {
    let h100 = SimBackend::open("dgx-h100", None)
        .unwrap()
        .inventory()
        .unwrap();
    assert_eq!(h100.gpus.len(), 8);
    assert!(
        h100.gpus
            .iter()
            .all(|g| g.product_name == "NVIDIA H100 80GB HBM3" && g.mig.current)
    );
    let a100 = SimBackend::open("dgx-a100", None)
        .unwrap()
        .inventory()
        .unwrap();
    let layout: Vec<Vec<String>> = a100
        .gpus
        .iter()
        .map(|g| {
            g.mig_devices
                .iter()
                .map(|d| format!("{}@{}", d.profile_name, d.placement.start))
                .collect()
        })
        .collect();
    let half_balanced = vec!["1g.5gb@0", "1g.5gb@1", "2g.10gb@2", "3g.20gb@4"];
    assert_eq!(layout[..4], vec![half_balanced; 4][..]);
    assert!(layout[4..].iter().all(Vec::is_empty));
    assert!(a100.gpus[4..].iter().all(|g| !g.mig.current));
    let big = SimBackend::open("hgx-h100-16", None)
        .unwrap()
        .inventory()
        .unwrap();
    assert_eq!(big.gpus.len(), 16);
    let uuids: std::collections::BTreeSet<_> = big.gpus.iter().map(|g| g.uuid.clone()).collect();
    assert_eq!(uuids.len(), 16, "UUIDs are unique");
    for p in [
        "dgx-a100-80",
        "dgx-h200",
        "dgx-b200",
        "a30-x4",
        "l4-x4",
        "rtx4090",
        "mixed",
    ] {
        SimBackend::open(p, None).unwrap().inventory().unwrap();
    }
}
