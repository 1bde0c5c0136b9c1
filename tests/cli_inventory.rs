//! The `gpu-dra` binary as users run it: `demo`, `inventory` and their errors.

use std::process::Command;

use k8s_openapi::api::resource::v1::ResourceSlice;

fn gpu_dra(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .env_remove("GPU_DRA_SIM_NODE")
        .output()
        .expect("run gpu-dra");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn inventory_yaml_is_a_stream_of_resource_slices_kubectl_can_create() {
    let (code, out, err) = gpu_dra(&["inventory", "--sim-node", "dgx-h100", "-o", "yaml"]);
    assert_eq!(code, 0, "{err}");
    let mut slices = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&out) {
        let value = serde_yaml::Value::deserialize(doc).unwrap();
        assert_eq!(value["apiVersion"].as_str(), Some("resource.k8s.io/v1"));
        assert_eq!(value["kind"].as_str(), Some("ResourceSlice"));
        slices.push(serde_yaml::from_value::<ResourceSlice>(value).unwrap());
    }
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    // The default `--mig-profiles split`: 8 whole GPUs and 54 MIG placements shared out among
    // them (tests/cli_mig_split.rs checks the share-out).
    assert_eq!(devices, 62);
}

use serde::Deserialize;

#[test]
fn inventory_json_is_a_list_object() {
    let (code, out, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        "hgx-h100-16",
        "-o",
        "json",
        "--node-name",
        "gpu-node-7",
    ]);
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    // Two counter slices; with the default `--mig-profiles split` (120 devices): the 16 whole
    // GPUs with the MIG devices of GPUs 15 down to 9 (62), then those of GPUs 8 down to 0 (58).
    assert_eq!(items.len(), 4);
    assert!(items.iter().all(
        |i| i["spec"]["nodeName"] == "gpu-node-7" && i["spec"]["pool"]["name"] == "gpu-node-7"
    ));
}

#[test]
fn inventory_table_lists_gpus_devices_and_slices() {
    let (code, out, _) = gpu_dra(&["inventory", "--sim-node", "mixed"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("Node mixed (sim backend): 3 GPU(s), driver 580.95.05, CUDA 13.0"),
        "{out}"
    );
    assert!(out.contains("gpu-1-mig-3g40gb-4"), "{out}");
    assert!(out.contains("(carved on demand)"), "{out}");
    assert!(out.contains("mixed-gpu.nvidia.com-00"), "{out}");
}

#[test]
fn demo_runs_on_the_default_preset() {
    let (code, out, err) = gpu_dra(&["demo"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Node \"mixed\""), "{out}");
    assert!(out.contains("25 MIG placements carved on demand"), "{out}");
    assert!(out.contains("3. ResourceSlices"), "{out}");
    assert!(
        out.contains("mig-h100.yaml") && out.contains("allocated mig=gpu-1-mig-3g40gb-4"),
        "{out}"
    );
    assert!(
        out.contains("\"kind\": \"k8s.gpu.nvidia.com/claim\""),
        "a CDI spec is shown: {out}"
    );
    assert!(
        out.contains("GPU 1 3g.40gb@4"),
        "the carved MIG device is listed: {out}"
    );
    assert!(
        out.contains("CDI specs removed (0 left); MIG devices remaining: 4"),
        "{out}"
    );
}

#[test]
fn demo_runs_every_example_on_a_dgx_a100() {
    let (code, out, err) = gpu_dra(&["demo", "--sim-node", "dgx-a100"]);
    assert_eq!(code, 0, "{err}");
    let pending: Vec<&str> = out.lines().filter(|l| l.contains("pending")).collect();
    assert_eq!(
        pending.len(),
        1,
        "only the H100 profile waits on A100s: {out}"
    );
    assert!(pending[0].contains("mig-h100.yaml"), "{out}");
}

#[test]
fn a_bad_sim_node_fails_with_the_valid_choices() {
    let (code, out, err) = gpu_dra(&["inventory", "--sim-node", "dgx-z9"]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.starts_with(
            "error: --sim-node \"dgx-z9\" is neither a preset nor a file; presets: mixed,"
        ),
        "{err}"
    );
}

#[test]
fn presets_can_be_listed_and_printed_as_node_files() {
    let (code, out, _) = gpu_dra(&["inventory", "--list-presets"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("hgx-h100-16") && out.contains("H100-SXM5-80GB"),
        "{out}"
    );
    let (code, out, _) = gpu_dra(&["inventory", "--print-preset", "dgx-a100"]);
    assert_eq!(code, 0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("copy.yaml");
    std::fs::write(&file, out).unwrap();
    let (code, out, err) = gpu_dra(&["inventory", "--sim-node", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gpu-0-mig-3g20gb-4"), "{out}");
}

#[test]
fn the_nvml_backend_fails_cleanly_without_a_driver() {
    let (code, out, err) = gpu_dra(&["inventory", "--gpu-backend", "nvml"]);
    if code == 0 {
        // A machine with a GPU driver: the real inventory printed.
        assert!(out.starts_with("Node "), "{out}");
        return;
    }
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("libnvidia-ml.so.1"), "{err}");
    assert!(err.contains("--gpu-backend sim"), "{err}");
}

#[test]
fn inventory_shares_the_simulated_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let (code, _, err) = gpu_dra(&["inventory", "--sim-node", "dgx-h100", "--state-dir", state]);
    assert_eq!(code, 0, "{err}");
    assert!(
        dir.path()
            .join(gpu_dra::hardware::sim::STATE_FILE)
            .is_file()
    );
}

fn published_devices(yaml: &str) -> Vec<String> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            serde_yaml::from_value::<ResourceSlice>(serde_yaml::Value::deserialize(doc).unwrap())
                .unwrap()
        })
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| d.name)
        .collect()
}

#[test]
fn mig_profiles_from_the_flag_or_the_env_var_limit_what_inventory_publishes() {
    let (code, out, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        "dgx-h100",
        "--mig-profiles",
        "1g.10gb,7g.80gb",
        "-o",
        "yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    let names = published_devices(&out);
    assert_eq!(8 * 9, names.len());
    assert!(
        names
            .iter()
            .all(|n| !n.contains("3g40gb") && !n.contains("-me-"))
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["inventory", "--sim-node", "dgx-h100", "-o", "yaml"])
        .env("GPU_DRA_MIG_PROFILES", "7g.80gb")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        8 * 2,
        published_devices(&String::from_utf8_lossy(&out.stdout)).len()
    );
}

#[test]
fn an_unknown_mig_profile_fails_naming_the_flag_the_value_and_the_valid_profiles() {
    let (code, _, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        "dgx-h100",
        "--mig-profiles",
        "1g.5gb",
    ]);
    assert_ne!(code, 0);
    for part in [
        "--mig-profiles",
        "\"1g.5gb\"",
        "NVIDIA H100 80GB HBM3 (GPU 0,1,2,3,4,5,6,7): 1g.10gb, 1g.10gb+me, 1g.20gb",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    let (code, _, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        "dgx-h100",
        "--mig-profiles",
        "1g.10gb,,7g.80gb",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("--mig-profiles \"1g.10gb,,7g.80gb\": name 2 is empty"),
        "{err}"
    );
}

#[test]
fn inventory_shows_each_gpus_nvlink_clique_on_fabric_nodes() {
    let clique = "6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f.1";
    let (code, out, err) = gpu_dra(&["inventory", "--sim-node", "gb200-nvl72-node"]);
    assert_eq!(code, 0, "{err}");
    let header = out.lines().find(|l| l.starts_with("GPU ")).unwrap();
    assert!(header.contains(" CLIQUE "), "{header}");
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("NVIDIA GB200")).collect();
    assert_eq!(rows.len(), 4, "{out}");
    assert!(rows.iter().all(|r| r.contains(clique)), "{out}");

    let (code, yaml, err) = gpu_dra(&["inventory", "--sim-node", "gb200-nvl72-node", "-o", "yaml"]);
    assert_eq!(code, 0, "{err}");
    let comments: Vec<&str> = yaml.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(comments.len(), 4, "{yaml}");
    assert!(
        comments[0].starts_with("# gpu 0 GPU-")
            && comments[0].ends_with(&format!("clique: {clique}"))
    );
    // Still a stream kubectl takes: the comments are not documents.
    let docs = serde_yaml::Deserializer::from_str(&yaml).count();
    assert!(docs >= 1);

    // Nodes off any fabric keep the table's shape.
    let (_, plain, _) = gpu_dra(&["inventory", "--sim-node", "dgx-h100"]);
    assert!(!plain.contains("CLIQUE"), "{plain}");
    let (_, list, _) = gpu_dra(&["inventory", "--list-presets"]);
    assert!(list.contains("gb200-nvl72-node"), "{list}");
    assert!(
        list.contains("GB200") && list.contains("7g.186gb"),
        "{list}"
    );
}

#[test]
fn slice_layout_by_profile_groups_each_profile_in_one_slice_and_a_bad_layout_names_the_choices() {
    // Every profile on every GPU (208 devices): the 1g profiles' groups then nearly fill a
    // slice each, where `split`'s 62 devices would all fit in one slice.
    let (code, out, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        "dgx-h100",
        "--mig-profiles",
        "all",
        "--slice-layout",
        "by-profile",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut home: std::collections::BTreeMap<String, usize> = Default::default();
    let mut devices = 0;
    for (i, slice) in list["items"].as_array().unwrap().iter().enumerate() {
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            devices += 1;
            let profile = d["attributes"]["profile"]["string"]
                .as_str()
                .unwrap_or("gpu")
                .to_string();
            assert_eq!(
                *home.entry(profile.clone()).or_insert(i),
                i,
                "{profile} split"
            );
        }
    }
    assert_eq!(devices, 208);
    assert_eq!(home.len(), 8, "whole GPUs and 7 profiles: {home:?}");

    let (code, _, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        "dgx-h100",
        "--slice-layout",
        "by-node",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--slice-layout")
            && err.contains("by-node")
            && err.contains("gpus-first, by-gpu, by-profile"),
        "{err}"
    );
}

#[test]
fn passthrough_without_an_iommu_is_refused_as_the_plugin_refuses_to_start() {
    for verb in [
        vec![
            "inventory",
            "--sim-node",
            "hgx-h100-passthrough-iommu-off",
            "--passthrough",
        ],
        vec![
            "explain",
            "--sim-node",
            "hgx-h100-passthrough-iommu-off",
            "--passthrough",
            "--claim",
            "examples/dedicated-gpu.yaml",
        ],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
            .args(&verb)
            .env_remove("KUBECONFIG")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{verb:?}");
        assert!(err.contains("the IOMMU is not enabled"), "{verb:?}: {err}");
        assert!(out.stdout.is_empty(), "{verb:?}: published anyway");
    }
}
