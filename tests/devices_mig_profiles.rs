//! `--mig-profiles`: a dynamic-MIG GPU publishes every placement of the listed profiles and
//! nothing else, with the same counters, so every allocation the scheduler can make is still
//! carvable; names no GPU of the node knows are refused with the valid ones.

use gpu_dra::devices::{self, DeviceKind, MigProfileSet, ModelOptions};
use gpu_dra::explain_inputs::{SimSliceOptions, sim_slices};
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::{GpuBackend, MigPolicy};
use mig_layout_support::{counters_allow, dynamic_mig_names, hardware_allows};

mod mig_layout_support;

const H100: &str = "gpus:\n  - model: H100-SXM5-80GB\n    mig: dynamic\n";

fn sim(yaml: &str) -> SimBackend {
    let plan = gpu_dra::hardware::sim::NodeSpec::parse("t", yaml)
        .unwrap()
        .plan("t", "t")
        .unwrap();
    SimBackend::from_plan(plan, None)
}

fn model(yaml: &str, profiles: &str) -> devices::DeviceModel {
    let options = ModelOptions {
        default_policy: Some(MigPolicy::Dynamic),
        mig_profiles: profiles.parse().unwrap(),
        ..Default::default()
    };
    devices::build(&sim(yaml).inventory().unwrap(), &options)
}

fn names(model: &devices::DeviceModel) -> Vec<&str> {
    model.devices.iter().map(|d| d.name()).collect()
}

#[test]
fn listed_profiles_keep_every_placement_and_the_full_gpu_and_nothing_else() {
    let got = model(H100, "1g.10gb,3g.40gb,7g.80gb");
    // In packing order (devices::packing): small profiles where they block big ones least.
    let want = [
        "gpu-0",
        "gpu-0-mig-1g10gb-6",
        "gpu-0-mig-1g10gb-5",
        "gpu-0-mig-1g10gb-4",
        "gpu-0-mig-1g10gb-3",
        "gpu-0-mig-1g10gb-2",
        "gpu-0-mig-1g10gb-1",
        "gpu-0-mig-1g10gb-0",
        "gpu-0-mig-3g40gb-4",
        "gpu-0-mig-3g40gb-0",
        "gpu-0-mig-7g80gb-0",
    ];
    assert_eq!(want.to_vec(), names(&got));
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);
}

#[test]
fn a_filtered_model_is_the_full_model_minus_unlisted_profiles_with_the_same_counters() {
    let all = model(H100, "all");
    for list in [
        "1g.10gb",
        "1g.10gb,7g.80gb",
        "1g.10gb+me,2g.20gb,4g.40gb",
        "7g.80gb",
    ] {
        let set: MigProfileSet = list.parse().unwrap();
        let filtered = model(H100, list);
        assert_eq!(all.counter_sets, filtered.counter_sets, "{list}");
        let kept: Vec<_> = all
            .devices
            .iter()
            .filter(|d| match &d.kind {
                DeviceKind::MigDynamic { profile, .. } => set.offers(profile),
                _ => true,
            })
            .cloned()
            .collect();
        assert_eq!(kept, filtered.devices, "{list}");
    }
}

#[test]
fn every_set_of_filtered_devices_the_counters_allow_is_carvable_and_no_other() {
    // All 2^10 subsets of the ten MIG devices of 1g.10gb, 3g.40gb and 7g.80gb on an H100.
    let model = model(H100, "1g.10gb,3g.40gb,7g.80gb");
    let migs = dynamic_mig_names(&model);
    assert_eq!(10, migs.len());
    let mut allowed = 0;
    for mask in 1u32..(1 << migs.len()) {
        let set: Vec<&str> = (0..migs.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| migs[i])
            .collect();
        let counters = counters_allow(&model, &set);
        assert_eq!(counters, hardware_allows(H100, &model, &set), "{set:?}");
        allowed += usize::from(counters);
    }
    // Every layout of the three profiles the table has: 1g subsets (127), 7g alone (1),
    // one or two 3g with the 1g slots they leave free.
    assert!(allowed > 127, "{allowed}");
}

#[test]
fn a_gpu_without_any_listed_profile_publishes_no_mig_device_and_says_so() {
    // 7g.80gb is an H100 profile; the H200 has 7g.141gb instead.
    let mixed = "gpus:\n  - model: H100-SXM5-80GB\n    mig: dynamic\n  - model: H200-SXM-141GB\n    mig: dynamic\n";
    let got = model(mixed, "7g.80gb");
    let want = ["gpu-0", "gpu-0-mig-7g80gb-0", "gpu-1"];
    assert_eq!(want.to_vec(), names(&got));
    assert_eq!(1, got.warnings.len(), "{:?}", got.warnings);
    assert!(
        got.warnings[0].starts_with("GPU 1 ") && got.warnings[0].contains("--mig-profiles 7g.80gb"),
        "{:?}",
        got.warnings
    );
}

#[test]
fn an_unknown_profile_is_refused_naming_the_flag_the_value_and_each_models_profiles() {
    let mixed = "gpus:\n  - model: H100-SXM5-80GB\n    mig: dynamic\n  - model: A100-SXM4-40GB\n    mig: dynamic\n";
    let inventory = sim(mixed).inventory().unwrap();
    let set: MigProfileSet = "1g.10gb,1g.6gb".parse().unwrap();
    let err = devices::profiles::check(&set, &inventory).unwrap_err();
    let text = err.to_string();
    for part in [
        "--mig-profiles",
        "\"1g.6gb\"",
        "NVIDIA H100 80GB HBM3 (GPU 0): 1g.10gb, 1g.10gb+me,",
        "NVIDIA A100-SXM4-40GB (GPU 1): 1g.5gb,",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    // Names valid on one model of a mixed node are accepted.
    let per_gpu: MigProfileSet = "1g.5gb,1g.10gb,7g.80gb".parse().unwrap();
    assert_eq!(Ok(()), devices::profiles::check(&per_gpu, &inventory));
}

#[test]
fn explains_sim_slices_follow_the_profile_list_and_refuse_unknown_names() {
    let options = |list: &str| SimSliceOptions {
        mig_profiles: list.parse().unwrap(),
        ..Default::default()
    };
    let count = |list: &str| -> usize {
        sim_slices("dgx-h100", "gpu.nvidia.com", options(list))
            .unwrap()
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum()
    };
    assert_eq!(208, count("all"));
    // Per GPU: the full GPU, 7 × 1g.10gb, 1 × 7g.80gb.
    assert_eq!(8 * 9, count("1g.10gb,7g.80gb"));
    let err = sim_slices("dgx-h100", "gpu.nvidia.com", options("1g.5gb")).unwrap_err();
    assert!(err.to_string().contains("1g.5gb"), "{err}");
}
