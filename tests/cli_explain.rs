//! `gpu-dra explain` reproduces the scheduler's decision for every example claim on the
//! dgx-a100, dgx-h100 and mixed presets, with the documented exit codes.

use std::process::Command;

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

/// Devices the allocation picked, from the JSON report.
fn allocated(json: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["chosen"]["allocations"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| {
            a["devices"]["results"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|r| {
            format!(
                "{}={}",
                r["request"].as_str().unwrap(),
                r["device"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn every_example_gets_the_schedulers_decision_on_every_preset() {
    // (example, preset, fits, allocation)
    let table: &[(&str, &str, bool, &[&str])] = &[
        ("dedicated-gpu", "dgx-a100", true, &["gpu=gpu-4"]),
        ("dedicated-gpu", "dgx-h100", true, &["gpu=gpu-0"]),
        ("dedicated-gpu", "mixed", true, &["gpu=gpu-1"]),
        (
            "shared-gpu-two-containers",
            "dgx-a100",
            true,
            &["gpu=gpu-4"],
        ),
        ("shared-claim-two-pods", "mixed", true, &["gpu=gpu-1"]),
        (
            "mig-profiles",
            "dgx-a100",
            true,
            &[
                "mig-1g=gpu-0-mig-1g5gb-0",
                "mig-2g=gpu-0-mig-2g10gb-2",
                "mig-3g=gpu-0-mig-3g20gb-4",
            ],
        ),
        (
            "mig-profiles",
            "mixed",
            true,
            &[
                "mig-1g=gpu-0-mig-1g5gb-0",
                "mig-2g=gpu-0-mig-2g10gb-2",
                "mig-3g=gpu-0-mig-3g20gb-4",
            ],
        ),
        ("mig-profiles", "dgx-h100", false, &[]),
        // MIG claims fill a node from its last GPU (`--slice-layout gpus-first`).
        ("mig-h100", "dgx-h100", true, &["mig=gpu-7-mig-3g40gb-4"]),
        ("mig-h100", "mixed", true, &["mig=gpu-1-mig-3g40gb-4"]),
        ("mig-h100", "dgx-a100", false, &[]),
        ("first-available", "dgx-h100", true, &["gpu/h100=gpu-0"]),
        ("first-available", "mixed", true, &["gpu/h100=gpu-1"]),
        (
            "first-available",
            "dgx-a100",
            true,
            &["gpu/small-mig=gpu-0-mig-1g5gb-0"],
        ),
    ];
    for (example, preset, fits, want) in table {
        let file = format!("examples/{example}.yaml");
        // The table's placements are those of every profile on every GPU (the default `split`
        // gives dgx-h100's GPU 7 only 1g.10gb); tests/cli_mig_split.rs covers the default.
        let (code, out, err) = explain(&[
            "--claim",
            &file,
            "--sim-node",
            preset,
            "--mig-profiles",
            "all",
            "-o",
            "json",
        ]);
        assert_eq!(
            code,
            if *fits { 0 } else { 1 },
            "{example} on {preset}: {err}"
        );
        assert_eq!(allocated(&out), *want, "{example} on {preset}");
    }
}

#[test]
fn a_claim_that_does_not_fit_says_why_for_people() {
    // Every profile on every GPU: the 200 MIG placements the counts below name.
    let (code, out, _) = explain(&[
        "--claim",
        "examples/mig-profiles.yaml",
        "--sim-node",
        "dgx-h100",
        "--mig-profiles",
        "all",
    ]);
    assert_eq!(code, 1);
    assert!(
        out.starts_with("claim mig-devices-mig-devices: does not fit on node dgx-h100"),
        "{out}"
    );
    assert!(
        out.contains("200 x request selector 0 is false: device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"),
        "{out}"
    );
    assert!(out.contains("8 x not in class mig.nvidia.com"), "{out}");
}

#[test]
fn devices_held_by_allocated_claims_are_not_free() {
    let dir = tempfile::tempdir().unwrap();
    let held = dir.path().join("held.yaml");
    let mut text = String::new();
    for (i, gpu) in ["gpu-1", "gpu-2"].iter().enumerate() {
        text.push_str(&format!(
            "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: held-{i}, namespace: default, uid: u{i}}}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {{deviceClassName: gpu.nvidia.com}}\nstatus:\n  allocation:\n    devices:\n      results:\n      - {{request: gpu, driver: gpu.nvidia.com, pool: mixed, device: {gpu}}}\n"
        ));
    }
    std::fs::write(&held, text).unwrap();
    let held = held.to_str().unwrap();
    let (code, out, _) = explain(&[
        "--claim",
        "examples/dedicated-gpu.yaml",
        "--sim-node",
        "mixed",
        "--allocated",
        held,
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1 x allocated to claim default/held-0: gpu-1"),
        "{out}"
    );
    assert!(
        out.contains("1 x allocated to claim default/held-1: gpu-2"),
        "{out}"
    );
    // The H100's MIG placements remain: the MIG claim still fits, beside nothing.
    let (code, _, _) = explain(&[
        "--claim",
        "examples/mig-profiles.yaml",
        "--sim-node",
        "mixed",
        "--allocated",
        held,
    ]);
    assert_eq!(code, 0);
}

#[test]
fn bad_input_exits_2_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let (code, out, err) = explain(&["--claim", bad.to_str().unwrap(), "--sim-node", "mixed"]);
    assert_eq!(code, 2, "{out}");
    assert!(err.contains("bad.yaml"), "{err}");
    let (code, _, err) = explain(&[
        "--claim",
        "examples/dedicated-gpu.yaml",
        "--sim-node",
        "dgx-z9",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("neither a preset nor a file"), "{err}");
}

#[test]
fn slices_printed_by_inventory_explain_the_same_as_the_preset() {
    // With every profile on every GPU, as the preset's row of the table above.
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["inventory", "--sim-node", "dgx-h100", "-o", "yaml"])
        .args(["--mig-profiles", "all"])
        .output()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let slices = dir.path().join("slices.yaml");
    std::fs::write(&slices, out.stdout).unwrap();
    let (code, out, err) = explain(&[
        "--claim",
        "examples/mig-h100.yaml",
        "--slices",
        slices.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(allocated(&out), ["mig=gpu-7-mig-3g40gb-4"]);
}

#[test]
fn consumable_capacity_claims_share_one_gpu_only_when_the_node_publishes_shares() {
    let file = "examples/consumable-capacity.yaml";
    let (code, out, err) = explain(&[
        "--claim",
        file,
        "--sim-node",
        "dgx-h100",
        "--shared-gpus",
        "4",
        "-o",
        "json",
    ]);
    assert_eq!(0, code, "{err}");
    // Whole GPUs go in `split`'s whole-GPU order: GPU 5 (1g.10gb) first, then GPU 3 (2g).
    assert_eq!(vec!["gpu=gpu-5", "gpu=gpu-5"], allocated(&out));
    let (code, out, err) = explain(&["--claim", file, "--sim-node", "dgx-h100", "-o", "json"]);
    assert_eq!(0, code, "{err}");
    assert_eq!(vec!["gpu=gpu-5", "gpu=gpu-3"], allocated(&out));
    let (code, _, err) = explain(&["--claim", file, "--shared-gpus", "99"]);
    assert_eq!(2, code);
    assert!(err.contains("valid choices: off, memory"), "{err}");
}

#[test]
fn a_kubeconfig_in_the_environment_yields_to_a_simulated_node_and_an_unreadable_one_exits_2() {
    let run = |env: Option<&str>, args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
        command.arg("explain").args(args).env_remove("KUBECONFIG");
        if let Some(path) = env {
            command.env("KUBECONFIG", path);
        }
        let out = command
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let claim = ["--claim", "examples/dedicated-gpu.yaml"];
    // Most shells export KUBECONFIG: --sim-node must still work beside it.
    let (code, err) = run(
        Some("/nonexistent/kubeconfig"),
        &[claim[0], claim[1], "--sim-node", "dgx-a100"],
    );
    assert_eq!(code, 0, "{err}");
    // Without another source it is read as --kubeconfig; one that cannot be read is bad
    // input (2), not a claim that does not fit (1).
    let (code, err) = run(Some("/nonexistent/kubeconfig"), &claim);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    let (code, err) = run(
        None,
        &[claim[0], claim[1], "--kubeconfig", "/nonexistent/kc"],
    );
    assert_eq!(code, 2, "{err}");
    // --in-cluster is a source of its own.
    let (code, err) = run(
        None,
        &[claim[0], claim[1], "--slices", "x.yaml", "--in-cluster"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn a_claim_whose_opaque_config_prepare_would_refuse_is_bad_input_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let claim = dir.path().join("claim.yaml");
    std::fs::write(
        &claim,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: mps, namespace: default}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com}\n    config:\n    - requests: [gpu]\n      opaque:\n        driver: gpu.nvidia.com\n        parameters:\n          apiVersion: resource.nvidia.com/v1beta1\n          kind: GpuConfig\n          sharing:\n            strategy: MPS\n            mpsConfig: {defaultActiveThreadPercentage: 150}\n",
    )
    .unwrap();
    let (code, out, err) = explain(&["--claim", claim.to_str().unwrap(), "--sim-node", "dgx-h100"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("but the plugin's prepare refuses its config")
            && out
                .contains("sharing.mpsConfig.defaultActiveThreadPercentage: 150 is outside 0–100"),
        "{out}"
    );
    // The examples' configs are good: they fit.
    for example in [
        "examples/sharing-mps-limits.yaml",
        "examples/sharing-time-slicing.yaml",
        "examples/sharing-mps-on-mig.yaml",
    ] {
        let (code, out, err) = explain(&["--claim", example, "--sim-node", "dgx-h100"]);
        assert_eq!(code, 0, "{example}: {out}{err}");
    }
}
