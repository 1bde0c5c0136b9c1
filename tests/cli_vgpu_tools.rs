//! The operator's tools on vGPU nodes, as an admin runs them: the real `gpu-dra` binary on the
//! simulated vGPU presets (SR-IOV `hgx-h100-vgpu` and `l40s-vgpu`, mdev `t4-vgpu-mdev`).
//! `inventory` shows each GPU's vGPU host and the vGPUs that exist, `capacity` which claim
//! holds each vGPU and what is free per type, `explain` allocates and refuses vGPUs naming
//! the holder, and `doctor --vgpu` checks the vGPU manager, the VFs or mdev types, the
//! configured types and the compatibility-groups gate, each with its fix and exit code.

mod k8s_support;
mod plugin_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use gpu_dra::doctor::vgpu::{GroupsGate, probe_gate};
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::hardware::sim::sysfs::SimKernel;
use gpu_dra::hardware::vgpu::VgpuHost;
use plugin_support::{Node, nvml_backend, nvml_sim};
use serde_json::Value;

const H100: &str = "hgx-h100-vgpu";
const L40S: &str = "l40s-vgpu";
const T4: &str = "t4-vgpu-mdev";
/// H100-4C's type ID in the simulator's (and NVIDIA's) table.
const H100_4C: u32 = 1056;

/// What one run printed and returned.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(command: &mut Command) -> Out {
    let out = command.output().expect("run gpu-dra");
    Out {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `gpu-dra <args>` without the environment the suites may set.
fn gpu_dra(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
    command
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env_remove("GPU_DRA_SIM_NODE")
        .env_remove("GPU_DRA_SIM_STATE_DIR")
        .env_remove("GPU_DRA_VGPU_TYPES")
        .env_remove("GPU_DRA_COMPATIBILITY_GROUPS")
        .env_remove("GPU_DRA_HOST_ROOT")
        .env_remove("GPU_DRA_PASSTHROUGH");
    command
}

/// The cells of the `inventory` table's vGPU row for GPU `gpu`.
fn vgpu_row(table: &str, gpu: u32) -> Vec<String> {
    let mut in_table = false;
    for line in table.lines() {
        if line.starts_with("VGPU ") {
            in_table = true;
            continue;
        }
        if in_table && line.trim().is_empty() {
            break;
        }
        let cells: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        if in_table && cells.first().map(String::as_str) == Some(&gpu.to_string()) {
            return cells;
        }
    }
    panic!("no vGPU row for GPU {gpu} in:\n{table}");
}

/// A simulated node's state directory at power-on, with one H100-4C created on GPU 0's first
/// VF as the plugin creates it.
fn h100_with_one_vgpu(dir: &Path) {
    let sim = SimBackend::open(H100, Some(dir)).unwrap();
    let root = sim.host_root().unwrap().to_path_buf();
    let host = VgpuHost::new(&root, Arc::new(SimKernel::new(&root)));
    let gpu0 = &host.scan().unwrap().gpus[0];
    host.create_vdev(&gpu0.vfs[0].address, H100_4C).unwrap();
}

#[test]
fn inventory_shows_each_gpus_vgpu_host_the_types_offered_and_the_vgpus_that_exist() {
    let dir = tempfile::tempdir().unwrap();
    h100_with_one_vgpu(dir.path());
    let mut command = gpu_dra(&["inventory", "--vgpu-types", "H100-4C"]);
    if nvml_backend() {
        command
            .args(["--gpu-backend", "nvml", "--nvml-lib"])
            .arg(nvml_sim::library())
            .arg("--host-root")
            .arg(dir.path().join("host-root"))
            .env("GPU_DRA_SIM_NODE", H100)
            .env("GPU_DRA_SIM_STATE_DIR", dir.path())
            // NVML cannot read the node file's MIG policies; the sim backend's default.
            .args(["--mig-policy", "dynamic"]);
    } else {
        command
            .args(["--sim-node", H100, "--state-dir"])
            .arg(dir.path());
    }
    let out = run(&mut command);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    // GPU 0 holds one H100-4C: heterogeneous mode off, so only H100-4C is creatable there.
    assert_eq!(
        vgpu_row(&out.stdout, 0),
        [
            "0",
            "vdev",
            "off",
            "32/32",
            "H100-4C×20",
            "H100-4C×1",
            "H100-4C"
        ]
    );
    assert_eq!(
        vgpu_row(&out.stdout, 7),
        [
            "7",
            "vdev",
            "off",
            "32/32",
            "H100-4C×20",
            "-",
            "H100-4C,H100-5C,H100-10C,H100-20C,H100-40C,H100-80C"
        ]
    );
    // A vGPU device's MEMORY is its type's framebuffer.
    let device = out
        .stdout
        .lines()
        .find(|l| l.starts_with("vgpu-0-4c-0 "))
        .unwrap_or_else(|| panic!("no vgpu-0-4c-0 in:\n{}", out.stdout));
    let cells: Vec<&str> = device.split_whitespace().collect();
    assert_eq!(
        cells[..6],
        ["vgpu-0-4c-0", "vgpu", "H100-4C", "slot", "0", "4Gi"]
    );
}

#[test]
fn inventory_of_an_mdev_node_at_power_on_shows_no_vfs_and_every_type_creatable() {
    let out = run(&mut gpu_dra(&[
        "inventory",
        "--sim-node",
        T4,
        "--vgpu-types",
        "T4-4Q",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        vgpu_row(&out.stdout, 3),
        [
            "3",
            "mdev",
            "off",
            "-",
            "T4-4Q×4",
            "-",
            "T4-1B,T4-2B,T4-1Q,T4-2Q,T4-4Q,T4-8Q,T4-16Q,T4-4C,T4-8C,T4-16C"
        ]
    );
}

#[test]
fn inventory_yaml_carries_the_vgpu_facts_as_comments_before_slices_kubectl_takes() {
    let out = run(&mut gpu_dra(&[
        "inventory",
        "--sim-node",
        L40S,
        "--vgpu-types",
        "L40S-12Q,L40S-24Q",
        "-o",
        "yaml",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let comments: Vec<&str> = out
        .stdout
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect();
    assert_eq!(comments.len(), 4, "{}", out.stdout);
    assert_eq!(
        comments[0],
        "# gpu 0 vgpu: framework vdev, heterogeneous on, VFs 32/32, offered L40S-12Q×4,L40S-24Q×2, active -, creatable L40S-1B,L40S-2B,L40S-4Q,L40S-6Q,L40S-8Q,L40S-16Q,L40S-12Q,L40S-24Q,L40S-48Q"
    );
    let slices: Vec<Value> = serde_yaml::Deserializer::from_str(&out.stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    assert!(slices.iter().all(|s| s["kind"] == "ResourceSlice"));
    let vgpus = slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["name"].as_str().unwrap().starts_with("vgpu-"))
        .count();
    assert_eq!(vgpus, 4 * (4 + 2));
}

/// Writes `text` to `<dir>/<name>` and returns the path as a string.
fn file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// A claim allocated `devices` of the `l40s-vgpu` pool, reserved for a VM's launcher pod.
fn allocated_claim(namespace: &str, name: &str, devices: &[&str]) -> String {
    let results: Vec<String> = devices
        .iter()
        .map(|d| {
            format!(
                "      - {{request: vgpu, driver: gpu.nvidia.com, pool: {L40S}, device: {d}}}\n"
            )
        })
        .collect();
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: {namespace}, uid: uid-{name}}}\n\
         spec:\n  devices:\n    requests:\n    - name: vgpu\n      exactly: {{deviceClassName: vgpu.gpu.nvidia.com}}\n\
         status:\n  allocation:\n    devices:\n      results:\n{}  reservedFor:\n  - {{resource: pods, name: virt-launcher-{name}, uid: pod-{name}}}\n",
        results.concat()
    )
}

/// `l40s-vgpu` offering two mixable Q types and the exclusive L40S-1B, with compatibility
/// groups, as `inventory -o json` publishes it.
fn l40s_slices(dir: &Path) -> String {
    let out = run(&mut gpu_dra(&[
        "inventory",
        "--sim-node",
        L40S,
        "--vgpu-types",
        "L40S-12Q,L40S-24Q,L40S-1B",
        "--compatibility-groups",
        "-o",
        "json",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    file(dir, "slices.json", &out.stdout)
}

#[test]
fn capacity_names_the_claim_holding_each_vgpu_and_the_slots_a_request_could_still_get() {
    let dir = tempfile::tempdir().unwrap();
    let slices = l40s_slices(dir.path());
    let claims = format!(
        "{}---\n{}",
        allocated_claim("tenant-a", "vm-a", &["vgpu-0-12q-0", "vgpu-0-12q-1"]),
        allocated_claim("tenant-b", "vm-b", &["vgpu-1-1b-0"])
    );
    let claims = file(dir.path(), "claims.yaml", &claims);
    let out = run(&mut gpu_dra(&[
        "capacity", "--slices", &slices, "--claims", &claims, "-o", "json",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    let gpus = report["nodes"][0]["gpus"].as_array().unwrap();
    let vgpu = |gpu: usize| -> Vec<(String, u64, u64, u64, Vec<String>)> {
        gpus[gpu]["vgpu"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["type"].as_str().unwrap().to_string(),
                    t["slots"].as_u64().unwrap(),
                    t["inUse"].as_u64().unwrap(),
                    t["free"].as_u64().unwrap(),
                    serde_json::from_value(t["claims"].clone()).unwrap(),
                )
            })
            .collect()
    };
    // GPU 0: two 12Q held (24 of 48 GB): two more 12Q or one 24Q fit beside them; the
    // exclusive 1B shares no compatibility group with them, so none is free.
    assert_eq!(
        vgpu(0),
        [
            (
                "L40S-12Q".into(),
                4,
                2,
                2,
                vec!["tenant-a/vm-a".to_string()]
            ),
            ("L40S-1B".into(), 32, 0, 0, vec![]),
            ("L40S-24Q".into(), 2, 0, 1, vec![]),
        ]
    );
    // GPU 1: one 1B held: more 1B, no Q type.
    assert_eq!(
        vgpu(1),
        [
            ("L40S-12Q".into(), 4, 0, 0, vec![]),
            (
                "L40S-1B".into(),
                32,
                1,
                31,
                vec!["tenant-b/vm-b".to_string()]
            ),
            ("L40S-24Q".into(), 2, 0, 0, vec![]),
        ]
    );
    // The full GPU of a GPU holding vGPUs is not free.
    let free_gpu = |gpu: usize| {
        gpus[gpu]["free"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["profile"] == "gpu")
            .unwrap()["count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!([free_gpu(0), free_gpu(1), free_gpu(2)], [0, 0, 1]);
    assert_eq!(gpus[0]["mig"], "off");

    let table = run(&mut gpu_dra(&[
        "capacity", "--slices", &slices, "--claims", &claims,
    ]));
    let node = table
        .stdout
        .lines()
        .find(|l| l.starts_with("l40s-vgpu "))
        .unwrap_or_else(|| panic!("no node row in:\n{}", table.stdout));
    assert!(node.ends_with("v2 v1 v0 v0"), "{node}");
    assert!(
        table.stdout.contains("v<n> vGPUs in use"),
        "{}",
        table.stdout
    );
    let detail = run(&mut gpu_dra(&[
        "capacity", "--slices", &slices, "--claims", &claims, "--node", L40S,
    ]));
    assert!(
        detail
            .stdout
            .contains("  vGPU L40S-12Q: 2 of 4 slots in use (tenant-a/vm-a), 2 free\n"),
        "{}",
        detail.stdout
    );
}

const CLAIM_1B: &str = "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: vm-c, namespace: tenant-c}
spec:
  devices:
    requests:
    - name: vgpu
      exactly:
        deviceClassName: vgpu.gpu.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes[\"gpu.nvidia.com\"].profile == \"L40S-1B\"'}
";

#[test]
fn explain_refuses_an_exclusive_type_beside_held_vgpus_naming_the_claim_and_fits_it_on_a_free_gpu()
{
    let dir = tempfile::tempdir().unwrap();
    let claim = file(dir.path(), "claim.yaml", CLAIM_1B);
    let every_gpu: Vec<String> = (0..4).map(|g| format!("vgpu-{g}-12q-0")).collect();
    let every_gpu: Vec<&str> = every_gpu.iter().map(String::as_str).collect();
    let held = file(
        dir.path(),
        "held.yaml",
        &allocated_claim("tenant-a", "vm-a", &every_gpu),
    );
    let explain = |allocated: &str| {
        run(&mut gpu_dra(&[
            "explain",
            "--claim",
            &claim,
            "--sim-node",
            L40S,
            "--vgpu-types",
            "L40S-12Q,L40S-1B",
            "--compatibility-groups",
            "--allocated",
            allocated,
        ]))
    };
    let refused = explain(&held);
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stdout.contains(
            "compatibility groups: vgpu-1b does not meet vgpu-12q+vgpu-mixed held by claim tenant-a/vm-a on counter set gpu-0-counter-set"
        ),
        "{}",
        refused.stdout
    );
    let three = file(
        dir.path(),
        "three.yaml",
        &allocated_claim("tenant-a", "vm-a", &every_gpu[1..]),
    );
    let fits = explain(&three);
    assert_eq!(fits.code, 0, "{}{}", fits.stdout, fits.stderr);
    assert!(
        fits.stdout.contains("allocated vgpu-0-1b-"),
        "{}",
        fits.stdout
    );
}

#[test]
fn explain_without_vgpu_types_notes_that_a_vgpu_node_publishes_vgpus_only_with_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let claim = file(dir.path(), "claim.yaml", CLAIM_1B);
    let out = run(&mut gpu_dra(&[
        "explain",
        "--claim",
        &claim,
        "--sim-node",
        L40S,
    ]));
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains(
            "note: the simulated node's GPUs support vGPU, but vGPU devices (vgpu.gpu.nvidia.com) are published only with --vgpu-types"
        ),
        "{}",
        out.stdout
    );
}

const CONTAINERD_2: &str =
    "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_selinux = false\n";

/// A node's directories as the kubelet and the chart create them, no plugin.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let host = Host {
            dir: tempfile::tempdir().unwrap(),
        };
        for sub in ["plugin", "registry", "cdi", "state"] {
            std::fs::create_dir_all(host.path(sub)).unwrap();
        }
        std::fs::write(host.path("containerd.toml"), CONTAINERD_2).unwrap();
        host
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `gpu-dra doctor -o json` with the plugin's flags on `sim_node` (the backend as the
    /// plugin suites choose it), plus `extra`.
    fn doctor(&self, sim_node: &str, extra: &[&str]) -> (i32, Vec<Value>) {
        let mut command = gpu_dra(&["doctor", "-o", "json"]);
        command
            .arg("--plugin-dir")
            .arg(self.path("plugin"))
            .arg("--registry-dir")
            .arg(self.path("registry"))
            .arg("--cdi-root")
            .arg(self.path("cdi"))
            .arg("--state-dir")
            .arg(self.path("state"))
            .arg("--containerd-config")
            .arg(self.path("containerd.toml"))
            .arg("--crio-config")
            .arg(self.path("no-crio.conf"));
        if nvml_backend() {
            command
                .args(["--gpu-backend", "nvml", "--simulated-host", "--nvml-lib"])
                .arg(nvml_sim::library())
                .env("GPU_DRA_SIM_NODE", sim_node)
                .env("GPU_DRA_SIM_STATE_DIR", self.path("state/sim"));
        } else {
            command.args(["--gpu-backend", "sim", "--sim-node", sim_node]);
        }
        let out = run(command.args(extra));
        let report: Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("no JSON ({e}):\n{}\n{}", out.stdout, out.stderr));
        (out.code, report["checks"].as_array().unwrap().clone())
    }
}

/// A check's `(name, status)`.
type Verdict = (String, String);

/// `(name, status)` of the checks whose name starts with `vgpu`, and those of every other
/// check that is not ok.
fn verdicts(checks: &[Value]) -> (Vec<Verdict>, Vec<Verdict>) {
    let pair = |c: &Value| {
        (
            c["name"].as_str().unwrap().to_string(),
            c["status"].as_str().unwrap().to_string(),
        )
    };
    let vgpu = checks
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("vgpu"))
        .map(pair)
        .collect();
    let others = checks
        .iter()
        .filter(|c| !c["name"].as_str().unwrap().starts_with("vgpu") && c["status"] != "ok")
        .map(pair)
        .collect();
    (vgpu, others)
}

fn check<'c>(checks: &'c [Value], name: &str) -> &'c Value {
    checks
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {checks:#?}"))
}

fn ok(names: &[&str]) -> Vec<Verdict> {
    names
        .iter()
        .map(|n| (n.to_string(), "ok".to_string()))
        .collect()
}

#[test]
fn doctor_vgpu_passes_on_each_simulated_vgpu_preset_with_its_types_and_exit_code_0() {
    for (preset, types, host_check) in [
        (H100, "H100-4C", "vgpu-vfs"),
        (L40S, "L40S-12Q,L40S-24Q", "vgpu-vfs"),
        (T4, "T4-4Q", "vgpu-mdev"),
    ] {
        let host = Host::new();
        let (code, checks) = host.doctor(preset, &["--quick", "--vgpu-types", types]);
        assert_eq!(
            (code, verdicts(&checks)),
            (0, (ok(&["vgpu-manager", host_check, "vgpu-types"]), vec![])),
            "{preset}: {checks:#?}"
        );
        let types_found = check(&checks, "vgpu-types")["found"].as_str().unwrap();
        assert!(
            types_found.starts_with(&format!("{types} on GPU 0-")),
            "{types_found}"
        );
    }
}

#[test]
fn doctor_vgpu_fails_the_vf_check_naming_sriov_manage_when_the_vfs_are_disabled() {
    let host = Host::new();
    let preset = run(&mut gpu_dra(&["inventory", "--print-preset", H100])).stdout;
    let node = preset.replace("    vgpu:\n", "    vgpu:\n      vfsEnabled: false\n");
    assert_ne!(node, preset, "the preset's vgpu section: {preset}");
    let node = file(&host.path(""), "no-vfs.yaml", &node);
    let (code, checks) = host.doctor(&node, &["--quick", "--vgpu-types", "H100-4C"]);
    assert_eq!(
        (code, verdicts(&checks)),
        (
            2,
            (
                vec![
                    ("vgpu-manager".into(), "ok".into()),
                    ("vgpu-vfs".into(), "fail".into()),
                    ("vgpu-types".into(), "ok".into()),
                ],
                vec![]
            )
        ),
        "{checks:#?}"
    );
    let vfs = check(&checks, "vgpu-vfs");
    assert_eq!(
        vfs["found"],
        "SR-IOV VFs not enabled: GPU 0-7: 0 of 32 VFs enabled"
    );
    let fix = vfs["fix"].as_str().unwrap();
    assert!(
        fix.contains("/usr/lib/nvidia/sriov-manage -e ALL")
            && fix.ends_with("(docs/troubleshooting.md#vgpu-vfs)"),
        "{fix}"
    );
}

#[test]
fn doctor_vgpu_fails_a_type_the_gpus_lack_naming_the_valid_ones_and_warns_without_types() {
    let host = Host::new();
    let (code, checks) = host.doctor(T4, &["--quick", "--vgpu-types", "T4-99Q"]);
    assert_eq!(code, 2, "{checks:#?}");
    let types = check(&checks, "vgpu-types");
    assert_eq!(types["status"], "fail");
    assert_eq!(
        types["found"],
        "--vgpu-types: \"T4-99Q\" is not a vGPU type of any GPU on this node; valid: Tesla T4 (GPU 0-3): T4-1B, T4-2B, T4-1Q, T4-2Q, T4-4Q, T4-8Q, T4-16Q, T4-4C, T4-8C, T4-16C"
    );
    // `--vgpu` alone, before any type is chosen: the host passes, the missing list warns.
    let (code, checks) = host.doctor(T4, &["--quick", "--vgpu"]);
    assert_eq!(
        (code, verdicts(&checks)),
        (
            1,
            (
                vec![
                    ("vgpu-manager".into(), "ok".into()),
                    ("vgpu-mdev".into(), "ok".into()),
                    ("vgpu-types".into(), "warn".into()),
                ],
                vec![]
            )
        ),
        "{checks:#?}"
    );
    // Without --vgpu or types, a vGPU node gets no vGPU checks.
    let (_, checks) = host.doctor(T4, &["--quick"]);
    assert_eq!(verdicts(&checks).0, vec![]);
}

#[test]
fn doctor_vgpu_fails_the_manager_check_on_gpus_without_vgpu() {
    let host = Host::new();
    let (code, checks) = host.doctor("l4-x4", &["--quick", "--vgpu"]);
    assert_eq!(code, 2, "{checks:#?}");
    let manager = check(&checks, "vgpu-manager");
    assert_eq!(manager["status"], "fail");
    assert!(
        manager["found"]
            .as_str()
            .unwrap()
            .starts_with("no vGPU support reported by GPU 0 (NVIDIA L4)"),
        "{manager}"
    );
    assert!(
        manager["fix"]
            .as_str()
            .unwrap()
            .contains("vGPU host driver"),
        "{manager}"
    );
}

#[tokio::test]
async fn doctor_with_compatibility_groups_checks_the_gate_with_one_dry_run_and_wants_the_vgpu_class()
 {
    let node = Node::new();
    let host = Host::new();
    let kubeconfig = node.root().join("kubeconfig");
    let kubeconfig = kubeconfig.to_str().unwrap();
    let before = node.api.requests().len();
    let (_, checks) = host.doctor(
        H100,
        &[
            "--kubeconfig",
            kubeconfig,
            "--node-name",
            H100,
            "--vgpu-types",
            "H100-4C",
            "--compatibility-groups",
        ],
    );
    let gate = check(&checks, "vgpu-compatibility-groups");
    assert_eq!(gate["status"], "ok", "{gate}");
    // The fake API server keeps every field, as one with the gate on does.
    assert!(
        gate["found"]
            .as_str()
            .unwrap()
            .starts_with("DRADeviceCompatibilityGroups on"),
        "{gate}"
    );
    let classes = check(&checks, "device-classes");
    assert!(
        classes["found"]
            .as_str()
            .unwrap()
            .contains("vgpu.gpu.nvidia.com"),
        "{classes}"
    );
    let dry_runs: Vec<Value> = node.api.requests()[before..]
        .iter()
        .filter(|r| r.query.contains_key("dryRun"))
        .filter_map(|r| r.body.clone())
        .collect();
    assert_eq!(
        dry_runs.len(),
        3,
        "two feature-gate probes and the groups probe"
    );
    let groups = &dry_runs
        .iter()
        .find(|b| b["metadata"]["name"] == format!("gpu-dra-doctor-{H100}-groups"))
        .expect("the groups probe")["spec"]["devices"][0]["consumesCounters"][0];
    assert_eq!(
        groups["compatibilityGroups"],
        serde_json::json!(["doctor-probe"])
    );
    // Without --compatibility-groups: no probe, no check.
    let (_, checks) = host.doctor(
        H100,
        &[
            "--kubeconfig",
            kubeconfig,
            "--node-name",
            H100,
            "--vgpu-types",
            "H100-4C",
        ],
    );
    assert!(
        checks
            .iter()
            .all(|c| c["name"] != "vgpu-compatibility-groups")
    );
}

#[tokio::test]
async fn the_gate_probe_reads_dropped_groups_as_off_and_dropped_counters_as_partitionable_devices_off()
 {
    let (api, client) = k8s_support::FakeApi::start(vec![]);
    assert_eq!(
        probe_gate(&client, "gpu.nvidia.com", "n1").await,
        GroupsGate::On
    );
    api.drop_fields_on_write(&["compatibilityGroups"]);
    assert_eq!(
        probe_gate(&client, "gpu.nvidia.com", "n2").await,
        GroupsGate::Off
    );
    api.drop_fields_on_write(&["consumesCounters"]);
    assert_eq!(
        probe_gate(&client, "gpu.nvidia.com", "n3").await,
        GroupsGate::CountersOff
    );
    let posts: Vec<String> = api
        .take_requests()
        .iter()
        .map(|r| format!("{} dryRun={:?}", r.line(), r.query.get("dryRun")))
        .collect();
    assert_eq!(
        posts,
        vec!["POST /apis/resource.k8s.io/v1/resourceslices dryRun=Some(\"All\")".to_string(); 3]
    );
}
