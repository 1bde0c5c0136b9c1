//! `gpu-dra explain --fabric-manager` on the simulated `hgx-h100-passthrough` node: the
//! Fabric Manager partition claim of docs/fabric-manager.md (read from the doc itself), after
//! a MIG claim holds GPU 0, as the real binary answers it.

use std::process::Command;

const NODE: &str = "hgx-h100-passthrough";

fn explain(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .arg("explain")
        .args(args)
        .env_remove("KUBECONFIG")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `explain` of the docs' partition4 claim in `claim` on [`NODE`] as the plugin publishes it
/// with `--passthrough --fabric-manager --mig-profiles all`, with `more` flags.
fn explain_partition4(claim: &str, more: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "--sim-node",
        NODE,
        "--passthrough",
        "--fabric-manager",
        "--mig-profiles",
        "all",
        "--claim",
        claim,
    ];
    args.extend_from_slice(more);
    explain(&args)
}

/// The docs' `partition4` ResourceClaimTemplate and a claim holding a MIG device of GPU 0,
/// written to `dir`: (claim file, allocated file). The MIG device, `gpu-0-mig-1g10gb-0`, is
/// published with `--mig-profiles all` (the default `split` gives GPU 0 other profiles, and
/// explain does not count an allocation of a device the node does not publish).
fn inputs(dir: &std::path::Path) -> (String, String) {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/fabric-manager.md"),
    )
    .unwrap();
    let template = doc
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .find(|block| block.contains("matchAttribute: gpu.nvidia.com/partition4"))
        .expect("docs/fabric-manager.md shows the partition4 claim");
    let claim = dir.join("partition4.yaml");
    std::fs::write(&claim, template).unwrap();
    let held = dir.join("mig-on-gpu-0.yaml");
    std::fs::write(
        &held,
        format!(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: mig, namespace: default, uid: u-mig}}\nspec:\n  devices:\n    requests:\n    - name: mig\n      exactly: {{deviceClassName: mig.nvidia.com}}\nstatus:\n  allocation:\n    devices:\n      results:\n      - {{request: mig, driver: gpu.nvidia.com, pool: {NODE}, device: gpu-0-mig-1g10gb-0}}\n"
        ),
    )
    .unwrap();
    (
        claim.to_str().unwrap().to_string(),
        held.to_str().unwrap().to_string(),
    )
}

/// Devices the allocation picked, from the JSON report.
fn allocated(json: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["chosen"]["allocations"][0]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["device"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn with_fabric_manager_the_docs_partition4_claim_gets_gpus_4_to_7_beside_a_mig_claim_on_gpu_0() {
    let dir = tempfile::tempdir().unwrap();
    let (claim, held) = inputs(dir.path());
    let (code, out, err) = explain_partition4(&claim, &["--allocated", &held, "-o", "json"]);
    assert_eq!(code, 0, "{err}{out}");
    assert_eq!(allocated(&out), ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]);
}

#[test]
fn without_fabric_manager_the_refusal_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (claim, _) = inputs(dir.path());
    let (code, out, _) = explain(&["--sim-node", NODE, "--passthrough", "--claim", &claim]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "8 x constraint 0 (matchAttribute gpu.nvidia.com/partition4): device lacks the attribute (Fabric Manager attributes: published only with --fabric-manager)"
        ),
        "{out}"
    );
}

#[test]
fn as_the_old_scheduler_it_is_refused_and_the_report_names_the_counter_leak() {
    let dir = tempfile::tempdir().unwrap();
    let (claim, held) = inputs(dir.path());
    let (code, out, _) = explain_partition4(
        &claim,
        &["--allocated", &held, "--counter-rollback", "leaked"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("placed 3 of 4 devices"), "{out}");
    assert!(
        out.contains("note: fits on hgx-h100-passthrough when the counters of a device a constraint refused are released (kube-scheduler with kubernetes#140431"),
        "{out}"
    );
}

/// Without the MIG claim no device's counters are reserved before a constraint refuses it,
/// so the old scheduler places the claim too, and a report that fits says nothing of a leak.
#[test]
fn as_the_old_scheduler_a_claim_that_fits_carries_no_counter_leak_note() {
    let dir = tempfile::tempdir().unwrap();
    let (claim, _) = inputs(dir.path());
    let (code, out, err) =
        explain_partition4(&claim, &["--counter-rollback", "leaked", "-o", "json"]);
    assert_eq!(code, 0, "{err}{out}");
    assert_eq!(allocated(&out), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report.get("note").is_none(), "{out}");
}

#[test]
fn fabric_manager_on_a_node_without_shared_nvswitch_mode_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (claim, _) = inputs(dir.path());
    let (code, _, err) = explain(&[
        "--sim-node",
        "dgx-h100",
        "--fabric-manager",
        "--claim",
        &claim,
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the simulated node dgx-h100 is not in shared NVSwitch mode"),
        "{err}"
    );
}

#[test]
fn gpus_that_are_not_one_partition_fit_with_a_note_that_prepare_will_refuse_them() {
    let dir = tempfile::tempdir().unwrap();
    let claim = |count: u32, constraint: &str| {
        let path = dir
            .path()
            .join(format!("c{count}{}.yaml", constraint.len()));
        std::fs::write(
            &path,
            format!(
                "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: gpus, namespace: default}}\nspec:\n  devices:\n    requests:\n    - name: gpus\n      exactly:\n        deviceClassName: gpu.nvidia.com\n        allocationMode: ExactCount\n        count: {count}\n{constraint}"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    let run = |path: &str| {
        explain(&[
            "--sim-node",
            NODE,
            "--passthrough",
            "--fabric-manager",
            "--claim",
            path,
        ])
    };
    // Three GPUs: the scheduler gives them, no partition has three.
    let (code, out, err) = run(&claim(3, ""));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("are not one partition")
            && out.contains("no partition has 3 GPUs (sizes 1, 2, 4, 8)"),
        "{out}"
    );
    // Four without the constraint: any four the walk meets, here not one partition.
    let (code, out, err) = run(&claim(4, ""));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("ask with `matchAttribute: gpu.nvidia.com/partition4`"),
        "{out}"
    );
    // With it: one partition, no note.
    let constrained = claim(
        4,
        "    constraints:\n    - requests: [gpus]\n      matchAttribute: gpu.nvidia.com/partition4\n",
    );
    let (code, out, err) = run(&constrained);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("note:"), "{out}");
}
