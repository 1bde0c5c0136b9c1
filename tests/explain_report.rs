//! What a person reads from explain, and the machine form.

mod alloc_fixtures;

use alloc_fixtures::*;
use gpu_dra::explain::{ExplainInput, explain};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

fn input(
    slices: Vec<k8s_openapi::api::resource::v1::ResourceSlice>,
    allocated: Vec<ResourceClaim>,
    claims: Vec<ResourceClaim>,
) -> ExplainInput {
    ExplainInput {
        classes: classes(),
        slices,
        allocated,
        claims,
    }
}

fn one_gpu() -> ResourceClaim {
    claim(
        "one",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}",
    )
}

fn mig(name: &str, profile: &str) -> String {
    format!(
        "- {{name: {name}, exactly: {{deviceClassName: mig.nvidia.com, selectors: [{{cel: {{expression: \"{}\"}}}}]}}}}\n",
        profile_selector(profile)
    )
}

fn trio() -> ResourceClaim {
    let text = format!(
        "requests:\n{}{}{}constraints:\n- {{requests: [mig-1g, mig-2g, mig-3g], matchAttribute: gpu.nvidia.com/parentUUID}}",
        mig("mig-1g", "1g.10gb"),
        mig("mig-2g", "2g.20gb"),
        mig("mig-3g", "3g.40gb")
    );
    claim("trio", &text)
}

#[test]
fn a_blocked_gpu_names_the_claim_holding_its_memory_slices() {
    let holder = allocated("holder", "node-a", &[("x", "gpu-0-mig-4g40gb-0")]);
    let report = explain(
        &engine(),
        &input(h100_node("node-a", 1), vec![holder], vec![one_gpu()]),
    );
    let want = "\
claim default/one: does not fit on node node-a
  node node-a: placed 0 of 1 devices
    request gpu (gpu.nvidia.com, 1 device): not enough devices: 0 of 26 usable
      not usable:
        1 x shared counters used up by claim default/holder: gpu-0 (gpu-0-counter-set/memory-slice-0: needs 1, 0 left, held by gpu-0-mig-4g40gb-0)
        25 x not in class gpu.nvidia.com (selector 0 is false: device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'): gpu-0-mig-1g10gb-0, gpu-0-mig-1g10gb-1, gpu-0-mig-1g10gb-2, and 22 more
";
    assert_eq!(want, report.render_human());
    assert!(!report.fits());
}

#[test]
fn a_blocked_mig_trio_shows_which_request_took_the_slice() {
    let holder = allocated("holder", "node-a", &[("x", "gpu-0-mig-4g40gb-0")]);
    let report = explain(
        &engine(),
        &input(h100_node("node-a", 1), vec![holder], vec![trio()]),
    );
    let text = report.render_human();
    let want_lines = [
        "claim default/trio: does not fit on node node-a",
        "    request mig-3g (mig.nvidia.com, 1 device): 1 of 26 devices usable alone, but not together with the other requests",
        "        1 x shared counters used up by request mig-2g: gpu-0-mig-3g40gb-4 (gpu-0-counter-set/memory-slice-4: needs 1, 0 left, held by gpu-0-mig-2g20gb-4)",
    ];
    for line in want_lines {
        assert!(
            text.lines().any(|l| l == line),
            "missing line {line:?} in:\n{text}"
        );
    }
}

#[test]
fn a_node_with_208_devices_stays_a_few_lines_per_request() {
    let report = explain(
        &engine(),
        &input(
            h100_node("node-a", 8),
            vec![],
            vec![claim(
                "nine",
                "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 9}}",
            )],
        ),
    );
    let text = report.render_human();
    let want = "\
claim default/nine: does not fit on node node-a
  node node-a: placed 8 of 9 devices
    request gpu (gpu.nvidia.com, 9 devices): not enough devices: 8 of 208 usable
      not usable:
        200 x not in class gpu.nvidia.com (selector 0 is false: device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'): gpu-0-mig-1g10gb-0, gpu-0-mig-1g10gb-1, gpu-0-mig-1g10gb-2, and 197 more
";
    assert_eq!(want, text);
}

#[test]
fn a_fitting_claim_shows_its_devices() {
    let report = explain(
        &engine(),
        &input(h100_node("node-a", 1), vec![], vec![one_gpu()]),
    );
    let want = "\
claim default/one: fits on node node-a
  node node-a
    request gpu (gpu.nvidia.com, 1 device): allocated gpu-0
";
    assert_eq!(want, report.render_human());
}

fn cluster() -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    let mut slices = h100_node("node-a", 1);
    slices.extend(h100_node("node-b", 1));
    slices.extend(h100_node("node-c", 2));
    slices
}

#[test]
fn over_a_cluster_a_claim_fits_if_one_node_fits() {
    let holder = allocated("holder", "node-a", &[("gpu", "gpu-0")]);
    let report = explain(&engine(), &input(cluster(), vec![holder], vec![one_gpu()]));
    let want = "\
claim default/one: fits on 2 of 3 nodes (node-b, node-c)
  node node-b
    request gpu -> gpu-0
";
    assert_eq!(want, report.render_human());
    assert_eq!(vec!["node-b", "node-c"], report.fitting_nodes);
}

#[test]
fn over_a_cluster_the_closest_nodes_are_explained_first() {
    let three = claim(
        "three",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 3}}",
    );
    let report = explain(&engine(), &input(cluster(), vec![], vec![three]));
    let text = report.render_human();
    let first = text.lines().next().unwrap_or_default();
    assert_eq!(
        "claim default/three: fits on none of 3 nodes; closest: node-c (placed 2 of 3), node-a (placed 1 of 3), node-b (placed 1 of 3)",
        first
    );
    let nodes: Vec<&str> = report.near_misses.iter().map(|o| o.node.as_str()).collect();
    assert_eq!(vec!["node-c", "node-a", "node-b"], nodes);
}

#[test]
fn bad_input_is_reported_instead_of_an_allocation() {
    let bad = claim(
        "typo",
        "requests:\n- {name: gpu, exactly: {deviceClassName: gpu.nvidia}}",
    );
    let report = explain(&engine(), &input(h100_node("node-a", 1), vec![], vec![bad]));
    assert_eq!(
        "claim default/typo: cannot be checked\n  claim default/typo: spec.devices.requests[0].exactly.deviceClassName \
         is \"gpu.nvidia\", which is not a known DeviceClass (known: gpu.nvidia.com, mig.nvidia.com)\n",
        report.render_human()
    );
    assert!(report.input_error().is_some());
}

#[test]
fn json_carries_the_allocation_when_the_claim_fits() {
    let report = explain(
        &engine(),
        &input(h100_node("node-a", 1), vec![], vec![one_gpu()]),
    );
    let json = report.to_json();
    let got: Vec<AllocationResult> =
        serde_json::from_value(json["chosen"]["allocations"].clone()).expect("allocations decode");
    let want: AllocationResult = yaml(
        "devices: {results: [{request: gpu, driver: gpu.nvidia.com, pool: node-a, device: gpu-0}]}\n\
         nodeSelector: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [node-a]}]}]}",
    );
    assert_eq!((true, vec![want]), (json["fits"] == true, got));
}

#[test]
fn json_carries_typed_reasons_when_the_claim_does_not_fit() {
    let holder = allocated("holder", "node-a", &[("gpu", "gpu-0")]);
    let report = explain(
        &engine(),
        &input(h100_node("node-a", 1), vec![holder], vec![one_gpu()]),
    );
    let json = report.to_json();
    let first = &json["nearMisses"][0]["requests"][0]["rejected"][0];
    let want = serde_json::json!({
        "device": {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
        "reason": "alreadyAllocated",
        "claim": "default/holder",
    });
    assert_eq!(want, *first);
    let yaml_text = report.to_yaml();
    assert!(
        yaml_text.contains("reason: alreadyAllocated"),
        "{yaml_text}"
    );
}

#[test]
fn allocated_devices_no_slice_publishes_are_named_not_silently_dropped() {
    // One device the node publishes, one of another node's pool, one misspelled.
    let holder = allocated(
        "holder",
        "node-a",
        &[("x", "gpu-0-mig-4g40gb-0"), ("y", "gpu-0-mig-4g40gbb-0")],
    );
    let elsewhere = allocated("elsewhere", "node-b", &[("z", "gpu-0")]);
    let report = explain(
        &engine(),
        &input(
            h100_node("node-a", 1),
            vec![holder, elsewhere],
            vec![one_gpu()],
        ),
    );
    assert_eq!(
        report.unpublished_allocations,
        vec![
            "default/holder: gpu.nvidia.com/node-a/gpu-0-mig-4g40gbb-0".to_string(),
            "default/elsewhere: gpu.nvidia.com/node-b/gpu-0".to_string(),
        ]
    );
    let text = report.render_human();
    assert!(
        text.ends_with(
            "  note: left out, no slice publishes what these allocated claims hold: \
             default/holder: gpu.nvidia.com/node-a/gpu-0-mig-4g40gbb-0, \
             default/elsewhere: gpu.nvidia.com/node-b/gpu-0\n"
        ),
        "{text}"
    );
    // The published one still blocks the GPU, as before.
    assert!(!report.fits());
    assert_eq!(
        report.to_json()["unpublishedAllocations"][1],
        "default/elsewhere: gpu.nvidia.com/node-b/gpu-0"
    );
    // Nothing unpublished: the field stays out of the machine form.
    let clean = explain(
        &engine(),
        &input(h100_node("node-a", 1), vec![], vec![one_gpu()]),
    );
    assert!(clean.to_json().get("unpublishedAllocations").is_none());
    // A claim that fits only because a held device is not published says so too.
    let typo = allocated("typo", "node-a", &[("x", "gpu-0-mig-4g40gbb-0")]);
    let report = explain(
        &engine(),
        &input(h100_node("node-a", 1), vec![typo], vec![one_gpu()]),
    );
    assert!(report.fits());
    let text = report.render_human();
    assert!(
        text.ends_with(
            "  note: left out, no slice publishes what these allocated claims hold: \
             default/typo: gpu.nvidia.com/node-a/gpu-0-mig-4g40gbb-0\n"
        ),
        "{text}"
    );
}
