//! Whole-GPU claims on a `--mig-profiles split` node (the default) through the allocator, as
//! kube-scheduler's first-fit walk decides them: under `split` the GPUs offer different MIG
//! profiles, so which GPU a full-GPU or `7g` claim takes decides which profiles the node
//! still offers. They take GPUs in `devices::split::whole_order` (the families the node has
//! most of first, the small profile last), so every profile stays claimable while the node
//! has a GPU of each family left, and no claim sequence below loses a profile that another
//! order could have kept.
//!
//! Each sequence allocates one claim after another on the slices the plugin publishes, each
//! claim seeing the earlier ones as allocated, as the scheduler sees a node between the
//! plugin's republishes.

mod alloc_fixtures;

use alloc_fixtures::{allocated, claim, device_names};
use gpu_dra::alloc::{Allocator, Detail, Node};
use gpu_dra::devices::MigProfileSet;
use gpu_dra::explain_inputs::{SimSliceOptions, builtin_classes, sim_slices};
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

fn split_slices(preset: &str) -> Vec<ResourceSlice> {
    let options = SimSliceOptions {
        mig_profiles: MigProfileSet::Split,
        ..Default::default()
    };
    sim_slices(preset, "gpu.nvidia.com", options).unwrap()
}

/// A one-device claim: `gpu` for a full GPU, else a MIG device of that profile.
fn one(name: &str, what: &str) -> ResourceClaim {
    let request = match what {
        "gpu" => "- name: r\n  exactly:\n    deviceClassName: gpu.nvidia.com".to_string(),
        profile => format!(
            "- name: r\n  exactly:\n    deviceClassName: mig.nvidia.com\n    selectors:\n    - cel:\n        expression: device.attributes['gpu.nvidia.com'].profile == '{profile}'"
        ),
    };
    claim(name, &format!("requests:\n{request}"))
}

/// Allocates `sequence` one claim at a time on `preset`; returns the device each got, `None`
/// for a claim that does not fit.
fn run(preset: &str, sequence: &[&str]) -> Vec<(String, Option<String>)> {
    let slices = split_slices(preset);
    let classes = builtin_classes().unwrap();
    let mut held: Vec<ResourceClaim> = Vec::new();
    let mut out = Vec::new();
    for (i, what) in sequence.iter().enumerate() {
        let name = format!("c{i}");
        let allocator = Allocator::new(&CelEngine, &classes, &slices, &held).unwrap();
        let claims = [one(&name, what)];
        let prepared = allocator.prepare(&claims).unwrap();
        let outcome = allocator.allocate(&prepared, &Node::named(preset), Detail::Full);
        let device = device_names(&outcome)
            .into_iter()
            .flatten()
            .next()
            .map(|r| r.trim_start_matches("r=").to_string());
        if let Some(device) = &device {
            held.push(allocated(&name, preset, &[("r", device)]));
        }
        out.push((what.to_string(), device));
    }
    out
}

fn refused(got: &[(String, Option<String>)]) -> Vec<&str> {
    got.iter()
        .filter(|(_, d)| d.is_none())
        .map(|(w, _)| w.as_str())
        .collect()
}

fn gpu_of(device: &str) -> &str {
    device.split('-').take(2).last().unwrap()
}

/// Every MIG profile of the H100, from the simulator's catalog.
fn h100_profiles() -> Vec<String> {
    gpu_dra::hardware::catalog::model("h100")
        .unwrap()
        .profiles
        .iter()
        .map(|p| p.name.clone())
        .collect()
}

#[test]
fn four_whole_gpu_claims_of_either_kind_leave_every_profile_claimable_on_a_dgx_h100() {
    // A DGX H100 under `split` has four families (small, two-slice, larger, one-slice
    // variants) on 3, 2, 2 and 1 GPUs: four GPUs can go whole and each family keep one.
    for whole in [
        ["gpu", "gpu", "gpu", "gpu"],
        ["7g.80gb", "7g.80gb", "7g.80gb", "7g.80gb"],
        ["gpu", "7g.80gb", "gpu", "7g.80gb"],
    ] {
        for profile in h100_profiles() {
            let mut sequence = whole.to_vec();
            sequence.push(&profile);
            let got = run("dgx-h100", &sequence);
            assert!(refused(&got).is_empty(), "{got:?}");
        }
        // And all of them at once, after the whole GPUs.
        let mut sequence = whole.to_vec();
        sequence.extend([
            "1g.20gb",
            "1g.10gb+me",
            "3g.40gb",
            "4g.40gb",
            "2g.20gb",
            "1g.10gb",
        ]);
        let got = run("dgx-h100", &sequence);
        assert!(refused(&got).is_empty(), "{got:?}");
    }
}

#[test]
fn whole_gpu_claims_of_both_kinds_take_the_same_gpus_and_leave_the_small_family_for_last() {
    let got = run("dgx-h100", &["gpu", "7g.80gb", "gpu", "7g.80gb", "gpu"]);
    let gpus: Vec<&str> = got
        .iter()
        .map(|(_, d)| gpu_of(d.as_deref().unwrap()))
        .collect();
    // GPU 5 (1g.10gb), 3 (2g), 1 (3g/4g), 6 and 7 (1g.10gb): one GPU of each family with
    // two or more, each from the end its MIG walk does not start at, then the small family;
    // never GPU 0, the only one with the one-slice variants.
    assert_eq!(gpus, ["5", "3", "1", "6", "7"], "{got:?}");
    // A 1g.10gb claim still starts its walk on the last GPU.
    let got = run("dgx-h100", &["1g.10gb"]);
    assert_eq!(got[0].1.as_deref(), Some("gpu-7-mig-1g10gb-6"));
}

#[test]
fn the_scarcest_profiles_stay_while_any_order_could_keep_them_on_other_models() {
    // dgx-a100-80: MIG mode on needs a reset on Ampere, so no full GPU is published and the
    // `7g` devices alone are the whole-GPU walk.
    let got = run(
        "dgx-a100-80",
        &["7g.80gb"; 5]
            .iter()
            .chain(&["2g.20gb", "1g.10gb"])
            .copied()
            .collect::<Vec<_>>(),
    );
    assert!(refused(&got).is_empty(), "{got:?}");
    // a30-x4: three families on four GPUs. After two whole-GPU claims one family must go;
    // it is the one-slice variant, not the small profile.
    let got = run("a30-x4", &["4g.24gb", "4g.24gb", "1g.6gb", "2g.12gb"]);
    assert!(refused(&got).is_empty(), "{got:?}");
}
