//! `gpu-dra capacity --kubeconfig` as an operator runs it: the binary reads slices, claims and
//! nodes from a (fake) API server on a TCP port and shows which pod holds which device.

mod plugin_support;

use std::process::Command;

use plugin_support::FakeApiServer;
use serde_json::json;

#[test]
fn capacity_from_a_cluster_shows_which_pod_holds_which_device() {
    let api = FakeApiServer::start("dgx-h100");
    for slice in
        gpu_dra::explain_inputs::sim_slices("dgx-h100", "gpu.nvidia.com", Default::default())
            .unwrap()
    {
        let mut value = serde_json::to_value(&slice).unwrap();
        value["apiVersion"] = json!("resource.k8s.io/v1");
        value["kind"] = json!("ResourceSlice");
        api.put_slice(value);
    }
    api.put_claim(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "llm-mig", "namespace": "inference", "uid": "u-1"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "mig", "driver": "gpu.nvidia.com", "pool": "dgx-h100", "device": "gpu-4-mig-1g10gb-3"}]}},
            "reservedFor": [{"resource": "pods", "name": "llm-5f7c9", "uid": "p-1"}]}
    }));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["capacity", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--pool-label", "gpu-pool"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.contains("gpu-4-mig-1g10gb-3"))
        .unwrap_or_else(|| panic!("no allocation row in\n{stdout}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        row,
        [
            "dgx-h100",
            "gpu-4",
            "gpu-4-mig-1g10gb-3",
            "1g.10gb",
            "3",
            "inference",
            "llm-5f7c9",
            "llm-mig"
        ]
    );
    assert!(stdout.contains("\n<none>  1      1/8"), "{stdout}");
    let paths: Vec<String> = api
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        paths,
        [
            "GET /apis/resource.k8s.io/v1/resourceclaims",
            "GET /apis/resource.k8s.io/v1/resourceslices",
            "GET /api/v1/nodes"
        ]
    );
}
