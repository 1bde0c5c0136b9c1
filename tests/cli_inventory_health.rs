//! `gpu-dra inventory` on a simulated node whose GPUs have faults (injected by a real
//! `gpu-dra sim-fault` process into the shared state): the table shows each GPU's and
//! device's verdict, and the slices carry the taints the plugin would publish.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use gpu_dra::devices::ModelOptions;
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::health::HealthPolicy;
use serde_json::Value;

/// A100 with static MIG devices (GPU 0), H100 with dynamic MIG (GPU 1), L4 (GPU 2).
const NODE: &str = "mixed";
const DRIVER: &str = "gpu.nvidia.com";

/// Runs `gpu-dra <args>`: exit code, stdout, stderr.
fn gpu_dra(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .env_remove("GPU_DRA_SIM_NODE")
        .env_remove("GPU_DRA_HEALTH_POLICY")
        .output()
        .expect("run gpu-dra");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn inventory(state: &Path, extra: &[&str]) -> String {
    let mut args = vec!["inventory", "--sim-node", NODE, "--state-dir"];
    args.push(state.to_str().unwrap());
    args.extend_from_slice(extra);
    let (code, out, err) = gpu_dra(&args);
    assert_eq!(code, 0, "inventory {extra:?}: {err}");
    out
}

fn sim_fault(state: &Path, args: &[&str]) {
    let mut all = vec!["sim-fault", "--state-dir", state.to_str().unwrap()];
    all.extend_from_slice(args);
    let (code, _, err) = gpu_dra(&all);
    assert_eq!(code, 0, "sim-fault {args:?}: {err}");
}

/// A device's taints as (key, value, effect, timeAdded).
type Taints = Vec<(String, String, String, String)>;

/// `taints` (a JSON array of DeviceTaint) as [`Taints`].
fn taint_fields(taints: &Value) -> Taints {
    let field = |t: &Value, k: &str| t[k].as_str().unwrap_or_default().to_string();
    taints
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                field(t, "key"),
                field(t, "value"),
                field(t, "effect"),
                field(t, "timeAdded"),
            )
        })
        .collect()
}

/// The taints of every device in `inventory -o json`'s slices that has any, by device.
fn json_taints(list: &str) -> BTreeMap<String, Taints> {
    let list: Value = serde_json::from_str(list).expect("a JSON List");
    let mut out = BTreeMap::new();
    for slice in list["items"].as_array().unwrap() {
        for device in slice["spec"]["devices"].as_array().into_iter().flatten() {
            if device["taints"].is_array() {
                out.insert(
                    device["name"].as_str().unwrap().to_string(),
                    taint_fields(&device["taints"]),
                );
            }
        }
    }
    out
}

/// The taints the plugin's inventory watcher would publish for the node in `state` now,
/// judged with `policy`, in the shape of [`json_taints`].
fn plugin_taints(state: &Path, policy: &HealthPolicy) -> BTreeMap<String, Taints> {
    let sim = SimBackend::open_state_dir(state).expect("the simulated node's state");
    let inventory = sim.inventory().expect("inventory");
    let options = ModelOptions::with_policies(DRIVER, &sim.mig_policies());
    let now = gpu_dra::hardware::health::unix_now();
    let (model, _) = gpu_dra::plugin::inventory_watch::publishable(
        &inventory,
        &options,
        policy,
        &[],
        &Default::default(),
        now,
    );
    model
        .devices
        .iter()
        .filter_map(|d| {
            let taints = serde_json::to_value(d.device.taints.as_ref()?).unwrap();
            Some((d.device.name.clone(), taint_fields(&taints)))
        })
        .collect()
}

/// The table line that starts with `first` (a GPU index or a device name) then a space.
fn line<'t>(table: &'t str, first: &str) -> &'t str {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no line for {first}:\n{table}"))
}

/// The GPU instance id of the MIG device at `start` on GPU `gpu` of the node in `state`.
fn gpu_instance_at(state: &Path, gpu: u32, start: u32) -> u32 {
    let sim = SimBackend::open_state_dir(state).expect("the simulated node's state");
    sim.inventory()
        .unwrap()
        .gpus
        .iter()
        .find(|g| g.index == gpu)
        .and_then(|g| g.mig_devices.iter().find(|d| d.placement.start == start))
        .expect("a MIG device there")
        .gi_id
}

#[test]
fn inventory_shows_each_verdict_and_publishes_the_plugins_taints_after_sim_faults() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let healthy = inventory(state, &["-o", "json"]);
    assert_eq!(
        json_taints(&healthy),
        BTreeMap::new(),
        "no faults, no taints"
    );

    // A degrading XID on the L4, a failing one contained in one MIG instance of the A100.
    sim_fault(state, &["xid", "--gpu", "2", "--code", "62"]);
    let gi = gpu_instance_at(state, 0, 4).to_string();
    sim_fault(
        state,
        &["xid", "--gpu", "0", "--code", "94", "--gpu-instance", &gi],
    );

    let table = inventory(state, &[]);
    assert!(line(&table, "GPU").contains(" HEALTH "), "{table}");
    // GPU rows by index, device rows by name.
    let want = [
        ("0", "healthy"),
        ("1", "healthy"),
        ("2", "degraded: xid-62"),
        ("gpu-0-mig-3g20gb-4", "failed: xid-94"),
        ("gpu-0-mig-1g5gb-0", "healthy"),
        ("gpu-2", "degraded: xid-62"),
    ];
    for (row, verdict) in want {
        assert!(
            line(&table, row).contains(verdict),
            "{row}: {verdict}\n{table}"
        );
    }

    let got = json_taints(&inventory(state, &["-o", "json"]));
    let summary: Vec<(&str, &str, &str)> = got
        .iter()
        .flat_map(|(device, taints)| {
            taints.iter().map(move |(_, value, effect, _)| {
                (device.as_str(), value.as_str(), effect.as_str())
            })
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("gpu-0-mig-3g20gb-4", "xid-94", "NoExecute"),
            ("gpu-2", "xid-62", "NoSchedule"),
        ]
    );
    assert_eq!(got, plugin_taints(state, &HealthPolicy::default()));
}

#[test]
fn a_health_policy_file_judges_the_faults_as_the_plugin_would_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    inventory(&state, &[]);
    sim_fault(&state, &["xid", "--gpu", "2", "--code", "62"]);
    let text =
        "taintKey: example.com/gpu-health\neffects: {failed: NoSchedule}\nxid: {failed: [62]}\n";
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, text).unwrap();
    let policy_flag = ["--health-policy", file.to_str().unwrap()];

    let table = inventory(&state, &policy_flag);
    assert!(line(&table, "2").contains("failed: xid-62"), "{table}");
    let mut json_args = policy_flag.to_vec();
    json_args.extend(["-o", "json"]);
    let got = json_taints(&inventory(&state, &json_args));
    let policy = HealthPolicy::parse(text).unwrap();
    assert_eq!(got, plugin_taints(&state, &policy));
    let (key, value, effect, _) = &got["gpu-2"][0];
    assert_eq!(
        (key.as_str(), value.as_str(), effect.as_str()),
        ("example.com/gpu-health", "xid-62", "NoSchedule")
    );

    std::fs::write(&file, "effects: {failed: Evict}\n").unwrap();
    let (code, _, err) = gpu_dra(&[
        "inventory",
        "--sim-node",
        NODE,
        "--state-dir",
        state.to_str().unwrap(),
        "--health-policy",
        file.to_str().unwrap(),
    ]);
    assert!(
        code != 0 && err.contains("effects.failed") && err.contains("Evict"),
        "{code}: {err}"
    );
}
