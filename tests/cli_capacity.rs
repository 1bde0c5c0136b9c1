//! `gpu-dra capacity` through the binary: files written by `gpu-dra inventory`, claims in
//! every accepted file shape, the three output formats and the exit code of bad input.

use std::path::Path;
use std::process::Command;

fn gpu_dra(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `inventory -o <format> <extra>` of a preset, written to `dir/<preset>.<format>`.
fn inventory(dir: &Path, preset: &str, format: &str, extra: &[&str]) -> String {
    let mut args = vec!["inventory", "--sim-node", preset, "-o", format];
    args.extend(extra);
    let (code, out, err) = gpu_dra(&args);
    assert_eq!(code, 0, "{err}");
    let path = dir.join(format!("{preset}.{format}"));
    std::fs::write(&path, out).unwrap();
    path.to_string_lossy().into_owned()
}

const CLAIMS: &str = r#"apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata: {name: train, namespace: team-a}
  status:
    allocation: {devices: {results: [{request: r, driver: gpu.nvidia.com, pool: dgx-h100, device: gpu-2-mig-3g40gb-0}]}}
    reservedFor: [{resource: pods, name: trainer-0, uid: u1}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: whole, namespace: team-b}
status:
  allocation: {devices: {results: [{request: r, driver: gpu.nvidia.com, pool: dgx-h100, device: gpu-5}]}}
  reservedFor: [{resource: pods, name: big-0, uid: u2}]
"#;

const NODES: &str = r#"{"apiVersion": "v1", "kind": "NodeList", "items": [
  {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "dgx-h100", "labels": {"gpu-pool": "hopper"}}}]}"#;

#[test]
fn the_table_shows_profiles_pools_nodes_and_who_holds_what() {
    let dir = tempfile::tempdir().unwrap();
    // Every profile on every GPU, whose capacities the table below shows (3g.40gb: 2 on each
    // of 8 GPUs; the default `split` publishes 4).
    let slices = inventory(dir.path(), "dgx-h100", "yaml", &["--mig-profiles", "all"]);
    std::fs::write(dir.path().join("claims.yaml"), CLAIMS).unwrap();
    std::fs::write(dir.path().join("nodes.json"), NODES).unwrap();
    let claims = dir.path().join("claims.yaml");
    let nodes = dir.path().join("nodes.json");
    let (code, out, err) = gpu_dra(&[
        "capacity",
        "--slices",
        &slices,
        "--claims",
        claims.to_str().unwrap(),
        "--nodes",
        nodes.to_str().unwrap(),
        "--pool-label",
        "gpu-pool",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with(
        "Cluster (gpu.nvidia.com): 1 node(s), 8 GPU(s), 2 busy; 2 device(s) held by 2 claim(s) in 2 namespace(s)\n"
    ), "{out}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let has = |cells: &[&str]| lines.iter().any(|l| l.as_slice() == cells);
    assert!(
        has(&["3g.40gb", "NVIDIA", "H100", "80GB", "HBM3", "16", "1", "13"]),
        "{out}"
    );
    assert!(has(&["hopper", "1", "2/8", "gpu", "8", "1", "6"]), "{out}");
    assert!(
        has(&[
            "dgx-h100",
            "gpu-2",
            "gpu-2-mig-3g40gb-0",
            "3g.40gb",
            "0-3",
            "team-a",
            "trainer-0",
            "train"
        ]),
        "{out}"
    );
    assert!(
        has(&[
            "dgx-h100", "gpu-5", "gpu-5", "gpu", "-", "team-b", "big-0", "whole"
        ]),
        "{out}"
    );
    assert!(
        out.contains("........ ........ ####.... ........ ........ ######## ........ ........"),
        "{out}"
    );
    assert!(!out.contains("\nGPUS"), "per-GPU detail only on request");
}

#[test]
fn json_and_yaml_carry_the_same_report_and_a_node_gets_detail() {
    let dir = tempfile::tempdir().unwrap();
    let slices = inventory(dir.path(), "mixed", "json", &[]);
    let (code, json, err) = gpu_dra(&["capacity", "--slices", &slices, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let (code, yaml, _) = gpu_dra(&["capacity", "--slices", &slices, "-o", "yaml"]);
    assert_eq!(code, 0);
    let from_json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let from_yaml: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(from_json, from_yaml);
    let mig: Vec<&str> = from_json["nodes"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["mig"].as_str().unwrap())
        .collect();
    assert_eq!(mig, ["static", "dynamic", "off"]);
    let (code, table, _) = gpu_dra(&["capacity", "--slices", &slices, "--node", "mixed"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("mixed/gpu-2  NVIDIA L4  MIG off\n  free: gpu×1\n"),
        "{table}"
    );
}

#[test]
fn bad_input_exits_2_naming_the_flag_the_file_and_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let claims = dir.path().join("claims.yaml");
    std::fs::write(&claims, CLAIMS).unwrap();
    let (code, _, err) = gpu_dra(&["capacity", "--slices", claims.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        format!(
            "error: --slices: {}: no ResourceSlice found (kinds present: ResourceClaim)",
            claims.display()
        )
    );
    let slices = inventory(dir.path(), "l4-x4", "yaml", &[]);
    let (code, _, err) = gpu_dra(&["capacity", "--slices", &slices, "--node", "l4-x5"]);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "error: node \"l4-x5\" publishes no gpu.nvidia.com devices (nodes that do: l4-x4)"
    );
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: resource.k8s.io/v1alpha3\nkind: ResourceSlice\nmetadata: {name: s}\n",
    )
    .unwrap();
    let (code, _, err) = gpu_dra(&["capacity", "--slices", broken.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("ResourceSlice has apiVersion \"resource.k8s.io/v1alpha3\"; supported: resource.k8s.io/v1, resource.k8s.io/v1beta2"),
        "{err}"
    );
}

/// A passthrough node (`inventory --passthrough`): a VM holding `gpu-vfio-0` holds all of
/// GPU 0 (its counters), shown under the `vfio` profile, and the full GPU and MIG profiles
/// count GPU 0 as taken.
#[test]
fn a_vm_holding_a_vfio_device_takes_its_whole_gpu_in_the_capacity_view() {
    let dir = tempfile::tempdir().unwrap();
    // Every profile on every GPU: the 1g.10gb count below is 7 free GPUs' 7 placements each.
    let (code, out, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        "hgx-h100-passthrough",
        "--passthrough",
        "--mig-profiles",
        "all",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let slices = dir.path().join("slices.json");
    std::fs::write(&slices, out).unwrap();
    let claims = dir.path().join("claims.yaml");
    std::fs::write(
        &claims,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: vm, namespace: vms}\n\
         status:\n  allocation: {devices: {results: [{request: r, driver: gpu.nvidia.com, pool: hgx-h100-passthrough, device: gpu-vfio-0}]}}\n  \
         reservedFor: [{resource: pods, name: virt-launcher-vm, uid: u1}]\n",
    )
    .unwrap();
    let (code, out, err) = gpu_dra(&[
        "capacity",
        "--slices",
        slices.to_str().unwrap(),
        "--claims",
        claims.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let profile = |name: &str| {
        report["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["profile"] == name)
            .unwrap_or_else(|| panic!("no profile {name}: {out}"))
            .clone()
    };
    assert_eq!(
        (8, 1, 7),
        (
            profile("vfio")["capacity"].as_i64().unwrap(),
            profile("vfio")["allocated"].as_i64().unwrap(),
            profile("vfio")["free"].as_i64().unwrap()
        )
    );
    assert_eq!(7, profile("gpu")["free"].as_i64().unwrap());
    assert_eq!(49, profile("1g.10gb")["free"].as_i64().unwrap());
}

#[test]
fn a_cluster_that_cannot_be_read_is_bad_input() {
    let (code, _, err) = gpu_dra(&["capacity", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}
