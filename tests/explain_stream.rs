//! `explain` node by node ([`NodeScan`]) gives the report `explain` gives over the whole list,
//! whatever order the slices come in: runs of a node, nodes named twice, slices naming no
//! node arriving late, pools with an older generation next to the newer one.

use gpu_dra::explain::{ExplainInput, ExplainReport, NodeScan, explain};
use gpu_dra::explain_inputs::{builtin_classes, sim_slices};
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

fn node_slices(node: &str, generation: i64) -> Vec<ResourceSlice> {
    sim_slices("mixed", "gpu.nvidia.com", Default::default())
        .unwrap()
        .into_iter()
        .map(|mut s| {
            s.spec.node_name = Some(node.to_string());
            s.spec.pool.name = node.to_string();
            s.spec.pool.generation = generation;
            s.metadata.name = s.metadata.name.map(|n| format!("{node}-g{generation}-{n}"));
            s
        })
        .collect()
}

fn claim(count: u32) -> ResourceClaim {
    serde_yaml::from_str(&format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: c, namespace: t}}\n\
         spec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {{deviceClassName: gpu.nvidia.com, count: {count}}}\n"
    ))
    .unwrap()
}

fn streamed(slices: &[ResourceSlice], claims: &[ResourceClaim]) -> (ExplainReport, u32) {
    let classes = builtin_classes().unwrap();
    let mut scan = NodeScan::new(&CelEngine, &classes, &[], claims);
    let mut passes = 0;
    loop {
        passes += 1;
        for s in slices {
            scan.add(s.clone());
        }
        if !scan.end_pass() {
            return (scan.report(), passes);
        }
    }
}

fn whole(slices: &[ResourceSlice], claims: &[ResourceClaim]) -> ExplainReport {
    explain(
        &CelEngine,
        &ExplainInput {
            classes: builtin_classes().unwrap(),
            slices: slices.to_vec(),
            allocated: Vec::new(),
            claims: claims.to_vec(),
        },
    )
}

/// A slice of its own pool, reachable from every node.
fn everywhere() -> ResourceSlice {
    let mut s = node_slices("shared", 1).remove(1);
    s.spec.node_name = None;
    s.spec.all_nodes = Some(true);
    s.spec.pool.name = "shared".into();
    s.spec.pool.resource_slice_count = 1;
    s
}

#[test]
fn nodes_in_runs_take_one_pass_and_give_the_whole_lists_report() {
    let slices: Vec<ResourceSlice> = (0..5)
        .flat_map(|n| node_slices(&format!("node-{n}"), 1))
        .collect();
    for count in [1, 3, 99] {
        let claims = [claim(count)];
        let (report, passes) = streamed(&slices, &claims);
        assert_eq!(report, whole(&slices, &claims), "count {count}");
        assert_eq!(passes, 1, "count {count}");
    }
}

#[test]
fn any_order_gives_the_whole_lists_report() {
    let mut slices: Vec<ResourceSlice> = (0..4)
        .flat_map(|n| node_slices(&format!("node-{n}"), 2))
        .collect();
    // An older generation of node-1's pool, and a node only an old generation names.
    slices.extend(node_slices("node-1", 1));
    slices.extend(node_slices("gone", 1).into_iter().take(1));
    let late = everywhere();
    let orders: Vec<Vec<ResourceSlice>> = vec![
        slices.iter().rev().cloned().collect(),
        // Interleaved: every node named several times.
        (0..slices.len())
            .map(|i| slices[(i * 7) % slices.len()].clone())
            .collect(),
        {
            let mut v = slices.clone();
            v.push(late.clone());
            v
        },
        {
            let mut v = vec![late.clone()];
            v.extend(slices.iter().cloned());
            v
        },
    ];
    for (i, order) in orders.iter().enumerate() {
        for count in [1, 2, 99] {
            let claims = [claim(count)];
            let (report, passes) = streamed(order, &claims);
            assert_eq!(report, whole(order, &claims), "order {i}, count {count}");
            assert!(passes <= 3, "order {i}: {passes} passes");
        }
    }
}

#[test]
fn only_slices_naming_no_node_are_explained_for_any_node() {
    let slices = vec![everywhere()];
    let claims = [claim(1)];
    assert_eq!(streamed(&slices, &claims).0, whole(&slices, &claims));
}

#[test]
fn no_claims_is_bad_input_as_before() {
    let slices = node_slices("n", 1);
    assert_eq!(streamed(&slices, &[]).0, whole(&slices, &[]));
}
