//! Bad node files fail with an error naming the file, the field and the valid choices.

use gpu_dra::hardware::sim::{NodeSource, SimBackend};

/// Writes `yaml` to a node file and returns the error `SimBackend::open` gives.
fn open_err(yaml: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("my-node.yaml");
    std::fs::write(&path, yaml).unwrap();
    let err = SimBackend::open(path.to_str().unwrap(), None)
        .unwrap_err()
        .to_string();
    (err, path.display().to_string())
}

#[test]
fn an_unknown_model_lists_the_valid_models() {
    let (err, file) = open_err("gpus:\n  - model: V100\n");
    assert!(
        err.starts_with(&format!(
            "{file}: gpus[0].model: unknown GPU model \"V100\"; valid models: "
        )),
        "{err}"
    );
    assert!(
        err.contains("H100-SXM5-80GB") && err.contains("RTX-4090"),
        "{err}"
    );
}

#[test]
fn an_impossible_pre_partitioning_is_refused() {
    let (err, file) = open_err(
        "gpus:\n  - model: A100-SXM4-40GB\n    mig: static\n    migDevices: [3g.20gb, 3g.20gb, 1g.5gb]\n",
    );
    assert_eq!(
        err,
        format!(
            "{file}: gpus[0].migDevices: [3g.20gb, 3g.20gb, 1g.5gb] do not fit together on one A100-SXM4-40GB (memory slices overlap, an instance limit is exceeded, or two instances want the single media engine)"
        )
    );
}

#[test]
fn an_unknown_profile_lists_the_models_profiles() {
    let (err, _) = open_err("gpus:\n  - model: h100\n    mig: static\n    migDevices: [1g.5gb]\n");
    assert!(
        err.ends_with("gpus[0].migDevices: unknown MIG profile \"1g.5gb\" for H100-SXM5-80GB; valid profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
        "{err}"
    );
}

#[test]
fn a_pinned_start_the_profile_does_not_allow_is_refused() {
    let (err, _) =
        open_err("gpus:\n  - model: h100\n    mig: static\n    migDevices: [3g.40gb@2]\n");
    assert!(
        err.ends_with("gpus[0].migDevices: \"3g.40gb@2\": 3g.40gb cannot start at memory slice 2; valid starts: 0, 4"),
        "{err}"
    );
}

#[test]
fn pinned_starts_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.yaml");
    std::fs::write(
        &path,
        "gpus:\n  - model: h100\n    mig: static\n    migDevices: [3g.40gb@0, 1g.10gb@4]\n",
    )
    .unwrap();
    let plan = NodeSource::resolve(path.to_str().unwrap())
        .unwrap()
        .plan()
        .unwrap();
    let got: Vec<u32> = plan.gpus[0]
        .mig_devices
        .iter()
        .map(|(_, p)| p.start)
        .collect();
    assert_eq!(got, [0, 4]);
    assert_eq!(plan.node_name, "n", "node name defaults to the file stem");
}

#[test]
fn wrong_types_and_unknown_fields_name_the_field() {
    let (err, file) = open_err("gpus:\n  - model: L4\n    count: many\n");
    assert!(
        err.starts_with(&format!("{file}: gpus[0].count: invalid type")),
        "{err}"
    );
    let (err, _) = open_err("gpus:\n  - model: L4\n    colour: green\n");
    assert!(
        err.contains("unknown field `colour`, expected one of `model`, `count`, `mig`"),
        "{err}"
    );
    let (err, _) = open_err("gpus:\n  - model: L4\n    mig: sometimes\n");
    assert!(
        err.contains(
            "unknown variant `sometimes`, expected one of `disabled`, `static`, `dynamic`"
        ),
        "{err}"
    );
}

#[test]
fn mig_on_a_gpu_without_mig_is_refused() {
    let (err, _) = open_err("gpus:\n  - model: L4\n    mig: dynamic\n");
    assert!(
        err.ends_with(
            "gpus[0].mig: L4 does not support MIG; the only valid choice is \"disabled\""
        ),
        "{err}"
    );
}

#[test]
fn empty_nodes_zero_counts_and_bad_names_are_refused() {
    let (err, _) = open_err("gpus: []\n");
    assert!(
        err.ends_with("gpus: at least one GPU group is required"),
        "{err}"
    );
    let (err, _) = open_err("gpus:\n  - model: L4\n    count: 0\n");
    assert!(err.ends_with("gpus[0].count: must be at least 1"), "{err}");
    let (err, _) = open_err("nodeName: Node_1\ngpus:\n  - model: L4\n");
    assert!(
        err.contains("nodeName: \"Node_1\" is not a valid Kubernetes node name"),
        "{err}"
    );
    let (err, _) = open_err("gpus:\n  - model: L4\n    count: 65\n");
    assert!(
        err.ends_with("gpus: 65 GPUs in all; a node holds at most 64"),
        "{err}"
    );
}

#[test]
fn an_unknown_preset_or_missing_file_lists_the_presets() {
    let err = SimBackend::open("dgx-z9", None).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "--sim-node \"dgx-z9\" is neither a preset nor a file; presets: mixed, dgx-a100,"
        ),
        "{err}"
    );
}

#[test]
fn a_fabric_with_a_malformed_cluster_uuid_is_refused_naming_the_field() {
    let (err, file) =
        open_err("gpus:\n  - model: GB200\n    fabric: {clusterUuid: rack-1, cliqueId: 1}\n");
    assert_eq!(
        err,
        format!(
            "{file}: gpus[0].fabric.clusterUuid: \"rack-1\" is not a UUID; write it as xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex digits), or all zeros for no clique"
        )
    );
}

#[test]
fn an_unknown_fabric_state_lists_the_nvml_states() {
    let (err, _) = open_err(
        "gpus:\n  - model: GB200\n    fabric: {clusterUuid: 6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f, state: Done}\n",
    );
    for state in ["NotSupported", "NotStarted", "InProgress", "Completed"] {
        assert!(err.contains(state), "{err}");
    }
}

#[test]
fn nodes_of_one_clique_differ_in_identity_and_share_the_clique() {
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "nodeName: {name}\ngpus:\n  - model: GB200\n    count: 4\n    fabric: {{clusterUuid: 6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f, cliqueId: 3}}\n"
            ),
        )
        .unwrap();
        SimBackend::open(path.to_str().unwrap(), None)
            .unwrap()
            .inventory()
            .unwrap()
    };
    use gpu_dra::hardware::GpuBackend;
    let (a, b) = (open("tray-a"), open("tray-b"));
    let cliques = |inv: &gpu_dra::hardware::NodeInventory| -> Vec<Option<String>> {
        inv.gpus
            .iter()
            .map(|g| g.fabric.as_ref().and_then(|f| f.clique()))
            .collect()
    };
    let one = Some("6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f.3".to_string());
    assert_eq!(cliques(&a), vec![one.clone(); 4]);
    assert_eq!(cliques(&b), vec![one; 4]);
    assert_ne!(
        a.gpus[0].uuid, b.gpus[0].uuid,
        "each node's GPUs have their own UUIDs"
    );
}

#[test]
fn the_gb200_preset_is_one_clique_of_four_registered_gpus() {
    use gpu_dra::hardware::GpuBackend;
    use gpu_dra::hardware::fabric::FabricState;
    let inv = SimBackend::open("gb200-nvl72-node", None)
        .unwrap()
        .inventory()
        .unwrap();
    assert_eq!(inv.gpus.len(), 4);
    assert!(inv.gpus.iter().all(|g| g.product_name == "NVIDIA GB200"));
    let fabrics: std::collections::BTreeSet<_> = inv
        .gpus
        .iter()
        .map(|g| {
            let f = g.fabric.clone().unwrap();
            assert_eq!(f.state, FabricState::Completed);
            f.clique().unwrap()
        })
        .collect();
    assert_eq!(fabrics.len(), 1, "{fabrics:?}");
}

#[test]
fn shared_nvswitch_mode_without_an_8_gpu_nvswitch_board_is_refused_naming_the_field() {
    let (err, file) = open_err("fabricMode: 1\ngpus:\n  - model: H100-SXM5-80GB\n    count: 8\n");
    assert_eq!(
        err,
        format!(
            "{file}: fabricMode: 1 (shared NVSwitch partitions) needs `nvswitch: true` and 8 GPUs (the HGX 8-GPU partition table)"
        )
    );
    let (err, _) = open_err("nvswitch: true\nfabricMode: 3\ngpus:\n  - model: H100-SXM5-80GB\n");
    assert!(
        err.contains("fabricMode: 3 is not a FABRIC_MODE; valid choices are 0 (bare metal), 1 (shared NVSwitch), 2 (vGPU)"),
        "{err}"
    );
}

#[test]
fn the_fabric_manager_preset_numbers_its_gpus_as_baseboard_modules_1_to_8() {
    use gpu_dra::hardware::GpuBackend;
    let modules = |preset: &str| -> Vec<u32> {
        let sim = SimBackend::open(preset, None).unwrap();
        sim.inventory()
            .unwrap()
            .gpus
            .iter()
            .map(|g| g.module_id)
            .collect()
    };
    assert_eq!(modules("hgx-h100-fm"), (1..=8).collect::<Vec<u32>>());
    assert_eq!(
        modules("dgx-h100"),
        vec![0; 8],
        "no NVSwitch board declared"
    );
}
