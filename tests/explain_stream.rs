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

/// An allocated claim as the API server or kubectl has it, with a spec and managed fields that
/// explain never reads.
fn held_claim(name: &str, device: &str, with_kind: bool) -> serde_json::Value {
    let mut claim = serde_json::json!({
        "metadata": {"name": name, "namespace": "t", "uid": format!("uid-{name}"),
                     "managedFields": [{"manager": "kube-scheduler", "operation": "Update"}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": device}
        ]}}}
    });
    if with_kind {
        claim["apiVersion"] = "resource.k8s.io/v1".into();
        claim["kind"] = "ResourceClaim".into();
    }
    claim
}

#[test]
fn an_allocated_json_list_streams_to_what_the_general_reader_reads_kept_to_what_it_holds() {
    use gpu_dra::explain::load_allocated;
    use gpu_dra::explain_inputs::allocated_file;
    let dir = tempfile::tempdir().unwrap();
    let unallocated = serde_json::json!({"metadata": {"name": "pending", "namespace": "t"},
                                         "spec": {"devices": {"requests": []}}});
    for (form, with_kind, list_kind) in [
        ("kubectl get -o json", true, "List"),
        ("the API server's list", false, "ResourceClaimList"),
    ] {
        let mut pending = unallocated.clone();
        if with_kind {
            pending["apiVersion"] = "resource.k8s.io/v1".into();
            pending["kind"] = "ResourceClaim".into();
        }
        let list = serde_json::json!({
            "apiVersion": if with_kind { "v1" } else { "resource.k8s.io/v1" },
            "kind": list_kind,
            "metadata": {"resourceVersion": "7"},
            "items": [held_claim("a", "gpu-0", with_kind), pending, held_claim("b", "gpu-1", with_kind)],
        });
        let path = dir.path().join("claims.json");
        std::fs::write(&path, serde_json::to_string_pretty(&list).unwrap()).unwrap();
        let streamed = allocated_file(&path).unwrap_or_else(|| panic!("{form}: not streamed"));
        let general = load_allocated(&path).unwrap();
        let key = |c: &ResourceClaim| {
            (
                c.metadata.name.clone(),
                c.metadata.namespace.clone(),
                c.status.as_ref().and_then(|s| s.allocation.clone()),
            )
        };
        assert_eq!(
            streamed.iter().map(key).collect::<Vec<_>>(),
            general.iter().map(key).collect::<Vec<_>>(),
            "{form}"
        );
        assert_eq!(streamed.len(), 2, "{form}: the pending claim is left out");
        assert!(
            streamed
                .iter()
                .all(|c| c.spec.is_none() && c.metadata.managed_fields.is_none()),
            "{form}: only what a claim holds is kept"
        );
    }
    // YAML is read the general way.
    let yaml = dir.path().join("claims.yaml");
    std::fs::write(
        &yaml,
        serde_yaml::to_string(&held_claim("a", "gpu-0", true)).unwrap(),
    )
    .unwrap();
    assert!(allocated_file(&yaml).is_none());
}
