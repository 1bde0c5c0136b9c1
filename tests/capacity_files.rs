//! `gpu-dra capacity --slices/--claims` reads `kubectl get -o json` lists through a fast path
//! that parses only what the view needs: its report equals the one from the same objects read
//! in full (as YAML, through the general path), holders, counters and warnings included.

use std::path::Path;

use gpu_dra::capacity::{CapacityOptions, CapacityReport, InputFiles, build_from_files};
use gpu_dra::explain_inputs::sim_slices;
use serde_json::{Value, json};

fn slices() -> Vec<Value> {
    let mut out = Vec::new();
    for preset in ["dgx-h100", "mixed"] {
        for s in sim_slices(preset, "gpu.nvidia.com", Default::default()).unwrap() {
            let mut v = serde_json::to_value(s).unwrap();
            v["apiVersion"] = json!("resource.k8s.io/v1");
            v["kind"] = json!("ResourceSlice");
            out.push(v);
        }
    }
    out
}

fn claims() -> Vec<Value> {
    let claim = |name: &str, pool: &str, device: &str, extra: Value| {
        let mut result = json!({"request": "r", "driver": "gpu.nvidia.com", "pool": pool,
                                "device": device});
        for (k, v) in extra.as_object().unwrap() {
            result[k] = v.clone();
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": "team-a", "uid": name},
               "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
               "status": {"allocation": {"devices": {"results": [result]}},
                          "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"), "uid": "u"}]}})
    };
    vec![
        claim("mig", "dgx-h100", "gpu-0-mig-3g40gb-0", json!({})),
        claim("full", "dgx-h100", "gpu-3", json!({})),
        claim("admin", "dgx-h100", "gpu-4", json!({"adminAccess": true})),
        claim("static", "mixed", "gpu-0-mig-1g5gb-0", json!({})),
        claim("ghost", "dgx-h100", "gpu-9", json!({})),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "pending", "namespace": "team-a"}, "spec": {}}),
    ]
}

#[test]
fn json_lists_give_the_same_report_as_the_same_objects_read_in_full() {
    let dir = tempfile::tempdir().unwrap();
    let list = |items: Vec<Value>| json!({"apiVersion": "v1", "kind": "List", "items": items});
    let (json_slices, json_claims) = (dir.path().join("s.json"), dir.path().join("c.json"));
    std::fs::write(&json_slices, list(slices()).to_string()).unwrap();
    std::fs::write(&json_claims, list(claims()).to_string()).unwrap();
    // The same objects as multi-document YAML: the general path.
    let yaml = |items: Vec<Value>| {
        items
            .iter()
            .map(|v| serde_yaml::to_string(v).unwrap())
            .collect::<Vec<_>>()
            .join("---\n")
    };
    let (yaml_slices, yaml_claims) = (dir.path().join("s.yaml"), dir.path().join("c.yaml"));
    std::fs::write(&yaml_slices, yaml(slices())).unwrap();
    std::fs::write(&yaml_claims, yaml(claims())).unwrap();

    // `kubectl get -o json` indents: the same lists pretty-printed take the fast path too.
    let (pretty_slices, pretty_claims) = (dir.path().join("sp.json"), dir.path().join("cp.json"));
    std::fs::write(
        &pretty_slices,
        serde_json::to_string_pretty(&list(slices())).unwrap(),
    )
    .unwrap();
    std::fs::write(
        &pretty_claims,
        serde_json::to_string_pretty(&list(claims())).unwrap(),
    )
    .unwrap();

    let report = |slices: &Path, claims: &Path| -> CapacityReport {
        let options = CapacityOptions {
            driver: "gpu.nvidia.com".into(),
            pool_label: None,
            node: None,
        };
        let files = InputFiles {
            slices,
            claims: Some(claims),
            nodes: None,
        };
        build_from_files(files, &options).unwrap()
    };
    let fast = report(&json_slices, &json_claims);
    let full = report(&yaml_slices, &yaml_claims);
    assert_eq!(fast, full);
    assert_eq!(report(&pretty_slices, &pretty_claims), full);
    // `kubectl get --raw /apis/resource.k8s.io/v1/resourceslices`: the API server's typed
    // list, compact, whose items carry no apiVersion or kind.
    let raw = dir.path().join("raw.json");
    let items: Vec<Value> = slices()
        .into_iter()
        .map(|mut v| {
            let object = v.as_object_mut().unwrap();
            object.remove("apiVersion");
            object.remove("kind");
            v
        })
        .collect();
    let typed = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                       "metadata": {"resourceVersion": "7"}, "items": items});
    std::fs::write(&raw, typed.to_string()).unwrap();
    assert_eq!(report(&raw, &json_claims), full);
    // The same with an escape: read in full, where the items take the list's kind too.
    let raw_escaped = dir.path().join("raw-escaped.json");
    let text = typed
        .to_string()
        .replace("NVIDIA H100", "NVIDIA \\u0048100");
    std::fs::write(&raw_escaped, text).unwrap();
    assert_eq!(report(&raw_escaped, &json_claims), full);
    // A string with an escape (Go's encoder writes `<`, `>` and `&` so) cannot be borrowed
    // from the bytes: the file is read in full instead, to the same report.
    let escaped = dir.path().join("escaped.json");
    let text = list(slices()).to_string();
    assert!(text.contains("\"NVIDIA H100 80GB HBM3\""));
    std::fs::write(&escaped, text.replace("NVIDIA H100", "NVIDIA \\u0048100")).unwrap();
    assert_eq!(report(&escaped, &json_claims), full);
    // mig, full, static (admin access holds nothing; the ghost device is not published).
    assert_eq!(fast.totals.allocated_devices, 3, "{:?}", fast.totals);
    assert_eq!(
        fast.warnings.len(),
        1,
        "the ghost device: {:?}",
        fast.warnings
    );
}
