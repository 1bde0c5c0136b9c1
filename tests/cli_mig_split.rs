//! The default `--mig-profiles split` as users meet it: `gpu-dra inventory` with no flags on a
//! simulated DGX H100 shares the MIG profiles out among the GPUs (src/devices/split.rs), keeps
//! every profile claimable, and puts a `1g.10gb` at the head of the scheduler's walk;
//! `--mig-profiles all` still publishes every placement on every GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// The MIG profiles of the H100 80GB (NVIDIA's MIG user guide, H100 profile table).
const H100_PROFILES: [&str; 7] = [
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
];

/// `gpu-dra inventory --sim-node <preset> -o json <extra>` with none of the variables that
/// would stand in for a flag, so "no flags" means the defaults; the slices' devices, in
/// slice order, of the slices that have devices.
fn inventory(preset: &str, extra: &[&str]) -> Vec<Vec<Value>> {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["inventory", "--sim-node", preset, "-o", "json"])
        .args(extra)
        .env_remove("GPU_DRA_SIM_NODE")
        .env_remove("GPU_DRA_MIG_PROFILES")
        .env_remove("GPU_DRA_SLICE_LAYOUT")
        .env_remove("GPU_DRA_GPU_MIG_POLICIES")
        .output()
        .expect("run gpu-dra");
    assert!(
        out.status.success(),
        "gpu-dra inventory --sim-node {preset} {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).expect("a JSON List");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|slice| slice["spec"]["devices"].as_array().cloned())
        .filter(|devices| !devices.is_empty())
        .collect()
}

fn name(device: &Value) -> &str {
    device["name"].as_str().expect("a device name")
}

/// A MIG device's profile; `None` for a whole GPU.
fn profile(device: &Value) -> Option<&str> {
    device["attributes"]["profile"]["string"].as_str()
}

/// Per GPU index, how many devices of each MIG profile it publishes.
fn profiles_per_gpu(devices: &[&Value]) -> BTreeMap<u32, BTreeMap<String, usize>> {
    let mut per_gpu: BTreeMap<u32, BTreeMap<String, usize>> = BTreeMap::new();
    for device in devices {
        let Some(profile) = profile(device) else {
            continue;
        };
        let gpu = name(device)
            .strip_prefix("gpu-")
            .and_then(|rest| rest.split_once("-mig-"))
            .and_then(|(index, _)| index.parse().ok())
            .unwrap_or_else(|| panic!("a MIG device named gpu-<i>-mig-…: {}", name(device)));
        *per_gpu
            .entry(gpu)
            .or_default()
            .entry(profile.to_string())
            .or_default() += 1;
    }
    per_gpu
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(p, n)| (p.to_string(), *n)).collect()
}

#[test]
fn a_dgx_h100_shares_its_mig_profiles_out_by_default_and_publishes_every_placement_with_all() {
    let slices = inventory("dgx-h100", &[]);
    let devices: Vec<&Value> = slices.iter().flatten().collect();
    assert_eq!(62, devices.len(), "8 whole GPUs and 54 MIG placements");

    let offered: BTreeSet<&str> = devices.iter().filter_map(|d| profile(d)).collect();
    assert_eq!(
        BTreeSet::from(H100_PROFILES),
        offered,
        "every H100 profile stays claimable on the node"
    );

    // The plan of src/devices/split.rs, from the lowest PCI address (GPU 0) up: the one-slice
    // variants, the larger family, the two-slice family (with a 1g.10gb on the memory slice
    // its placements leave free), the small family; every GPU its whole-GPU profile.
    let variants = counts(&[("7g.80gb", 1), ("1g.20gb", 4), ("1g.10gb+me", 7)]);
    let larger = counts(&[("7g.80gb", 1), ("3g.40gb", 2), ("4g.40gb", 1)]);
    let two = counts(&[("7g.80gb", 1), ("2g.20gb", 3), ("1g.10gb", 1)]);
    let small = counts(&[("7g.80gb", 1), ("1g.10gb", 7)]);
    let want: BTreeMap<u32, BTreeMap<String, usize>> = [
        (0, variants),
        (1, larger.clone()),
        (2, larger),
        (3, two.clone()),
        (4, two),
        (5, small.clone()),
        (6, small.clone()),
        (7, small),
    ]
    .into();
    assert_eq!(want, profiles_per_gpu(&devices));
    for gpu in [3, 4] {
        let filler = format!("gpu-{gpu}-mig-1g10gb-6");
        assert!(
            devices.iter().any(|d| name(d) == filler),
            "{filler}: the 1g.10gb beside 2g.20gb at 0, 2, 4"
        );
    }
    let whole: Vec<&str> = devices
        .iter()
        .filter(|d| profile(d).is_none())
        .map(|d| name(d))
        .collect();
    // Every GPU keeps its full GPU, in the order whole-GPU claims should take them
    // (split::whole_order): one GPU of each family with two or more, then the small family;
    // GPU 0 (the only one with the one-slice variants) and the last of each family last.
    assert_eq!(
        [
            "gpu-5", "gpu-3", "gpu-1", "gpu-6", "gpu-7", "gpu-2", "gpu-0", "gpu-4"
        ],
        whole[..],
        "every GPU keeps its full GPU"
    );
    let sevens: Vec<&str> = devices
        .iter()
        .filter(|d| profile(d) == Some("7g.80gb"))
        .map(|d| name(d).trim_end_matches("-mig-7g80gb-0"))
        .collect();
    assert_eq!(
        whole, sevens,
        "7g.80gb claims take the GPUs in the same order"
    );

    // kube-scheduler walks the slice first fit: whole GPUs interleaved with MIG devices from
    // the last GPU down, so a claim for the commonest profile meets one at once.
    let first = &slices[0];
    assert_eq!("gpu-5", name(&first[0]));
    let first_mig = first[1..]
        .iter()
        .find(|d| profile(d).is_some())
        .expect("a MIG device in the first slice");
    assert_eq!(
        (Some("1g.10gb"), true),
        (profile(first_mig), name(first_mig).starts_with("gpu-7-")),
        "first MIG device of the walk: {}",
        name(first_mig)
    );

    let all: usize = inventory("dgx-h100", &["--mig-profiles", "all"])
        .iter()
        .map(Vec::len)
        .sum();
    assert_eq!(208, all, "--mig-profiles all: every placement on every GPU");
}

#[test]
fn a_node_with_one_dynamic_mig_gpu_of_its_model_publishes_every_placement_by_default() {
    // `mixed`: a static-MIG A100, a dynamic-MIG H100 and an L4; the H100 is alone of its model.
    let names = |extra: &[&str]| -> Vec<String> {
        inventory("mixed", extra)
            .iter()
            .flatten()
            .map(|d| name(d).to_string())
            .collect()
    };
    let split = names(&[]);
    let h100_mig = split.iter().filter(|n| n.starts_with("gpu-1-mig-")).count();
    assert_eq!(25, h100_mig, "every placement of every H100 profile");
    assert_eq!(names(&["--mig-profiles", "all"]), split);
}
