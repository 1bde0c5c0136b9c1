//! vGPU devices and the allocator: the real device model of simulated one-GPU vGPU hosts,
//! published as slices and allocated with the built-in DeviceClasses and the real CEL engine.
//! A vGPU consumes its framebuffer from its GPU's counter set, which the full GPU and the VFIO
//! device consume whole, so neither is handed out beside a vGPU of the same GPU, in either
//! order; with compatibility groups MIG devices are kept apart from vGPUs the same way, and
//! two vGPU types share a GPU exactly when NVML's rules let them.

mod alloc_fixtures;

use alloc_fixtures::{allocated, claim, device_names};
use gpu_dra::alloc::{Detail, Node, Outcome, Rejection, allocate_claim};
use gpu_dra::devices::VgpuTypes;
use gpu_dra::explain::{ExplainInput, explain};
use gpu_dra::explain_inputs::{SimSliceOptions, builtin_classes, sim_slices};
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

const NODE: &str = "node-a";

/// One H100 with dynamic MIG and homogeneous vGPU.
const H100: &str = "  - model: H100-SXM5-80GB\n    mig: dynamic\n    vgpu:\n      framework: vdev\n      heterogeneous: false\n";
/// One T4 with vGPU on mediated devices: no SR-IOV VFs, so its VFIO device is published too.
const T4: &str = "  - model: T4\n    vgpu:\n      framework: mdev\n";
/// One L40S in heterogeneous vGPU mode.
const L40S: &str = "  - model: L40S\n    vgpu:\n      framework: vdev\n      heterogeneous: true\n";

/// The slices of a one-GPU passthrough host (`gpu` is its `gpus:` entry) offering `types`.
fn try_slices(gpu: &str, types: &str, groups: bool) -> Result<Vec<ResourceSlice>, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.yaml");
    std::fs::write(
        &file,
        format!("nodeName: {NODE}\ngpus:\n{gpu}passthrough:\n  iommu: true\n"),
    )
    .unwrap();
    sim_slices(
        file.to_str().unwrap(),
        "gpu.nvidia.com",
        SimSliceOptions {
            vgpu_types: types.parse::<VgpuTypes>().unwrap(),
            compatibility_groups: groups,
            passthrough: true,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}

fn slices(gpu: &str, types: &str, groups: bool) -> Vec<ResourceSlice> {
    try_slices(gpu, types, groups).expect("slices")
}

/// A claim with one request per entry: (class, vGPU type or "" for any device of the class).
fn claim_of(name: &str, requests: &[(&str, &str)]) -> ResourceClaim {
    let mut text = String::from("requests:\n");
    for (i, (class, profile)) in requests.iter().enumerate() {
        text.push_str(&format!(
            "- name: r{i}\n  exactly:\n    deviceClassName: {class}\n"
        ));
        if !profile.is_empty() {
            text.push_str(&format!(
                "    selectors:\n    - cel:\n        expression: \"device.attributes['gpu.nvidia.com'].profile == '{profile}'\"\n"
            ));
        }
    }
    claim(name, &text)
}

fn run(slices: &[ResourceSlice], held: &[ResourceClaim], claim: &ResourceClaim) -> Outcome {
    allocate_claim(
        &CelEngine,
        &builtin_classes().unwrap(),
        slices,
        held,
        claim,
        &Node::named(NODE),
        Detail::Full,
    )
    .expect("the claim is valid")
}

/// The devices a one-request claim for `class` (of vGPU type `profile`) gets beside `held`.
fn got(
    slices: &[ResourceSlice],
    held: &[ResourceClaim],
    class: &str,
    profile: &str,
) -> Vec<String> {
    device_names(&run(slices, held, &claim_of("new", &[(class, profile)])))
        .into_iter()
        .flatten()
        .collect()
}

fn holding(devices: &[&str]) -> Vec<ResourceClaim> {
    let results: Vec<(String, &str)> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("r{i}"), *d))
        .collect();
    let results: Vec<(&str, &str)> = results.iter().map(|(r, d)| (r.as_str(), *d)).collect();
    vec![allocated("vm", NODE, &results)]
}

const GPU: &str = "gpu.nvidia.com";
const MIG: &str = "mig.nvidia.com";
const VFIO: &str = "vfio.gpu.nvidia.com";
const VGPU: &str = "vgpu.gpu.nvidia.com";

#[test]
fn a_held_vgpu_keeps_the_full_gpu_and_the_vfio_device_of_its_gpu_from_the_allocator() {
    for groups in [false, true] {
        let slices = slices(H100, "H100-4C", groups);
        let held = holding(&["vgpu-0-4c-0"]);
        assert_eq!(
            got(&slices, &held, GPU, ""),
            Vec::<String>::new(),
            "groups {groups}"
        );
        assert_eq!(
            got(&slices, &held, VFIO, ""),
            Vec::<String>::new(),
            "groups {groups}"
        );
        assert_eq!(
            got(&slices, &held, VGPU, ""),
            ["r0=vgpu-0-4c-1"],
            "groups {groups}"
        );
        assert_eq!(got(&slices, &[], GPU, ""), ["r0=gpu-0"], "groups {groups}");
    }
}

#[test]
fn a_held_full_gpu_or_vfio_device_keeps_every_vgpu_of_its_gpu_from_the_allocator() {
    for groups in [false, true] {
        // An SR-IOV (vdev) GPU has its VFs on, so it offers no VFIO device at all: a GPU
        // with VFs cannot go to a VM whole.
        let slices = slices(H100, "H100-4C", groups);
        assert_eq!(got(&slices, &[], VFIO, ""), Vec::<String>::new());
        assert_eq!(
            got(&slices, &holding(&["gpu-0"]), VGPU, ""),
            Vec::<String>::new(),
            "gpu-0, groups {groups}"
        );
        assert_eq!(got(&slices, &[], VGPU, ""), ["r0=vgpu-0-4c-0"]);
        // An mdev GPU offers both, and either excludes the other.
        let slices = self::slices(T4, "T4-4Q", groups);
        for held in ["gpu-0", "gpu-vfio-0"] {
            assert_eq!(
                got(&slices, &holding(&[held]), VGPU, ""),
                Vec::<String>::new(),
                "{held}, groups {groups}"
            );
        }
        assert_eq!(got(&slices, &[], VGPU, ""), ["r0=vgpu-0-4q-0"]);
        assert_eq!(
            got(&slices, &holding(&["vgpu-0-4q-0"]), VFIO, ""),
            Vec::<String>::new()
        );
    }
}

#[test]
fn with_compatibility_groups_a_held_vgpu_keeps_the_mig_devices_of_its_gpu_from_the_allocator() {
    let slices = slices(H100, "H100-4C", true);
    let outcome = run(
        &slices,
        &holding(&["vgpu-0-4c-0"]),
        &claim_of("new", &[(MIG, "")]),
    );
    assert!(!outcome.fits());
    let refused: Vec<&Rejection> = outcome
        .requests
        .iter()
        .flat_map(|r| &r.rejected)
        .filter(|r| r.device.device == "gpu-0-mig-1g10gb-6")
        .map(|r| &r.reason)
        .collect();
    let Some(Rejection::CompatibilityGroups {
        counter_set,
        groups,
        held,
        consumers,
    }) = refused.first()
    else {
        panic!("gpu-0-mig-1g10gb-6 refused for {refused:?}");
    };
    assert_eq!(counter_set, "gpu-0-counter-set");
    assert_eq!(groups, &["mig"]);
    assert_eq!(held, &["vgpu-4c"]);
    assert_eq!(consumers.len(), 1);
    assert_eq!(
        (consumers[0].device.as_str(), consumers[0].by.as_str()),
        ("vgpu-0-4c-0", "claim default/vm")
    );
    // explain says it in one line.
    let report = explain(
        &CelEngine,
        &ExplainInput {
            classes: builtin_classes().unwrap(),
            slices: slices.clone(),
            allocated: holding(&["vgpu-0-4c-0"]),
            claims: vec![claim_of("new", &[(MIG, "")])],
        },
    );
    let text = report.render_human();
    assert!(
        text.contains("compatibility groups: mig does not meet vgpu-4c held by claim default/vm on counter set gpu-0-counter-set"),
        "{text}"
    );
}

#[test]
fn with_compatibility_groups_a_held_mig_device_keeps_every_vgpu_of_its_gpu_from_the_allocator() {
    let slices = slices(H100, "H100-4C", true);
    let held = holding(&["gpu-0-mig-1g10gb-0"]);
    assert_eq!(got(&slices, &held, VGPU, ""), Vec::<String>::new());
    assert_eq!(
        got(&slices, &held, MIG, "").len(),
        1,
        "MIG devices still go together"
    );
    // Nor in one claim.
    let both = run(&slices, &[], &claim_of("new", &[(MIG, ""), (VGPU, "")]));
    assert!(!both.fits());
}

#[test]
fn without_compatibility_groups_a_gpu_offering_vgpus_publishes_no_mig_device_to_allocate() {
    let slices = slices(H100, "H100-4C", false);
    assert_eq!(got(&slices, &[], MIG, ""), Vec::<String>::new());
    let other = self::slices(H100, "", false);
    assert_eq!(got(&other, &[], MIG, "").len(), 1);
}

#[test]
fn with_compatibility_groups_two_types_that_may_not_mix_are_never_on_one_gpu_and_two_that_may_are()
{
    let slices = slices(L40S, "L40S-1B,L40S-12Q,L40S-24Q", true);
    // L40S-1B is an exclusive type; the Q types mix in heterogeneous mode.
    let cases = [
        ("L40S-1B", "L40S-12Q", false),
        ("L40S-1B", "L40S-24Q", false),
        ("L40S-12Q", "L40S-24Q", true),
        ("L40S-12Q", "L40S-12Q", true),
        ("L40S-1B", "L40S-1B", true),
    ];
    for (a, b, together) in cases {
        for (first, second) in [(a, b), (b, a)] {
            // In one claim.
            let one = run(
                &slices,
                &[],
                &claim_of("new", &[(VGPU, first), (VGPU, second)]),
            );
            assert_eq!(one.fits(), together, "{first} + {second} in one claim");
            // Beside a claim already allocated.
            let held_device = got(&slices, &[], VGPU, first)[0]
                .trim_start_matches("r0=")
                .to_string();
            let beside = got(&slices, &holding(&[&held_device]), VGPU, second);
            assert_eq!(
                !beside.is_empty(),
                together,
                "{second} beside a held {first}"
            );
        }
    }
    let homogeneous = self::slices(H100, "H100-4C,H100-10C", true);
    let one = run(
        &homogeneous,
        &[],
        &claim_of("new", &[(VGPU, "H100-4C"), (VGPU, "H100-10C")]),
    );
    assert!(!one.fits(), "H100-4C and H100-10C on a homogeneous GPU");
    let same = run(
        &homogeneous,
        &[],
        &claim_of("new", &[(VGPU, "H100-4C"), (VGPU, "H100-4C")]),
    );
    assert!(same.fits());
}

#[test]
fn the_framebuffer_counter_caps_what_types_of_several_sizes_take_together() {
    let slices = slices(L40S, "L40S-12Q,L40S-24Q", false);
    let held = holding(&["vgpu-0-24q-0"]);
    // 24 + 2 × 12 fills the 48 GiB; a third 12Q does not fit.
    let two = run(
        &slices,
        &held,
        &claim_of("new", &[(VGPU, "L40S-12Q"), (VGPU, "L40S-12Q")]),
    );
    assert!(two.fits());
    let three = run(
        &slices,
        &held,
        &claim_of(
            "new",
            &[(VGPU, "L40S-12Q"), (VGPU, "L40S-12Q"), (VGPU, "L40S-12Q")],
        ),
    );
    assert!(!three.fits());
    let full = holding(&["vgpu-0-24q-0", "vgpu-0-24q-1"]);
    let refused = run(&slices, &full, &claim_of("new", &[(VGPU, "L40S-12Q")]));
    assert!(refused.requests[0].rejected.iter().any(|r| matches!(
        &r.reason,
        Rejection::CountersExhausted { counter, .. } if counter == "framebuffer"
    )));
}

#[test]
fn without_compatibility_groups_a_type_set_the_gpu_cannot_mix_is_refused_before_anything_is_published()
 {
    let text = try_slices(L40S, "L40S-1B,L40S-12Q", false).unwrap_err();
    assert!(
        text.contains("--vgpu-types \"L40S-1B,L40S-12Q\": on GPU 0 (NVIDIA L40S), L40S-1B and L40S-12Q cannot share a GPU (L40S-1B is exclusive: NVML's EXCLUSIVE_TYPE capability allows no other type beside it): give them different GPUs, e.g. --vgpu-types '0=L40S-1B' (too few GPUs for every type: L40S-12Q on another node), or turn on --compatibility-groups"),
        "{text}"
    );
    let text = try_slices(H100, "H100-4C,H100-10C", false).unwrap_err();
    assert!(
        text.contains("H100-4C and H100-10C cannot share a GPU (heterogeneous mode off)"),
        "{text}"
    );
    assert!(try_slices(L40S, "L40S-12Q,L40S-24Q", false).is_ok());
}

#[test]
fn more_slots_than_a_gpu_has_on_one_gpu_is_refused_after_a_few_steps_not_every_subset() {
    // 21 × H100-4C (20 a GPU) that must share a GPU: the slots of one GPU are interchangeable,
    // so once 20 of them failed to find a 21st the search tries no other subset of them
    // (2^20 otherwise; the scheduler's allocator and explain used to give up after minutes).
    let slices = slices(H100, "H100-4C", false);
    let claim = claim(
        "many",
        "requests:\n- name: vgpu\n  exactly:\n    deviceClassName: vgpu.gpu.nvidia.com\n    allocationMode: ExactCount\n    count: 21\nconstraints:\n- requests: [vgpu]\n  matchAttribute: gpu.nvidia.com/uuid\n",
    );
    let classes = builtin_classes().unwrap();
    let allocator = gpu_dra::alloc::Allocator::new(&CelEngine, &classes, &slices, &[])
        .unwrap()
        .with_step_limit(1_000);
    let prepared = allocator.prepare(std::slice::from_ref(&claim)).unwrap();
    let outcome = allocator.allocate(&prepared, &Node::named(NODE), Detail::Full);
    assert!(!outcome.fits());
    assert!(outcome.abort.is_none(), "{:?}", outcome.abort);
    assert_eq!((outcome.progress.placed, outcome.progress.needed), (20, 21));
    // Twenty fit, at once, as before.
    let twenty = yaml_claim_count(&claim, 20);
    let prepared = allocator.prepare(std::slice::from_ref(&twenty)).unwrap();
    let outcome = allocator.allocate(&prepared, &Node::named(NODE), Detail::Full);
    assert_eq!(device_names(&outcome)[0].len(), 20);
}

/// `claim` with its first request's count set to `count`.
fn yaml_claim_count(claim: &ResourceClaim, count: i64) -> ResourceClaim {
    let mut claim = claim.clone();
    let spec = claim.spec.as_mut().unwrap().devices.as_mut().unwrap();
    spec.requests.as_mut().unwrap()[0]
        .exactly
        .as_mut()
        .unwrap()
        .count = Some(count);
    claim
}
