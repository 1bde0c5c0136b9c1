//! `gpu-dra doctor` as an admin runs it: the real binary, with the plugin's own flags, on a
//! simulated node (temp directories laid out as on a kubelet host, a real plugin process, a
//! fake API server). A correctly set-up node passes every check; each test then breaks one
//! thing on purpose and expects the check that names it, the JSON shape and the exit code.

mod plugin_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use plugin_support::apicatalog::{DEVICE_CLASSES, POLICIES, POLICY_BINDINGS};
use plugin_support::{Node, PRESET, claims, eventually, nvml_backend, nvml_sim};
use serde_json::{Value, json};

const CONTAINERD_2: &str =
    "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_selinux = false\n";

/// What one doctor run printed and returned.
struct Run {
    code: i32,
    checks: Vec<Value>,
}

impl Run {
    /// The check named `name`; panics listing every check when there is none.
    fn check(&self, name: &str) -> &Value {
        self.checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name} in {:#?}", self.checks))
    }

    /// Asserts that `name` is the one check not ok, with `status`, and the exit code `code`;
    /// returns what it found.
    fn only_bad(&self, name: &str, status: &str, code: i32) -> String {
        assert_eq!(
            (self.code, self.not_ok()),
            (code, vec![(name.to_string(), status.to_string())]),
            "{:#?}",
            self.checks
        );
        self.check(name)["found"].as_str().unwrap().to_string()
    }

    /// `(name, status)` of every check that is not ok.
    fn not_ok(&self) -> Vec<(String, String)> {
        self.checks
            .iter()
            .filter(|c| c["status"] != "ok")
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["status"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

/// The node's cluster side as the chart installs it: the two DeviceClasses from the
/// repository's files, and the admission policy with its binding.
fn install_chart_objects(node: &Node) {
    for file in [
        "device-classes/gpu.nvidia.com.yaml",
        "device-classes/mig.nvidia.com.yaml",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let class: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        node.api.put_object(DEVICE_CLASSES, class);
    }
    node.api.put_object(
        POLICIES,
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
               "metadata": {"name": "gpu-dra-own-node-slices"}, "spec": {}}),
    );
    node.api.put_object(
        POLICY_BINDINGS,
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "gpu-dra-own-node-slices"},
               "spec": {"policyName": "gpu-dra-own-node-slices", "validationActions": ["Deny"]}}),
    );
}

/// `gpu-dra doctor` with the flags the node's plugin runs with (`sim_node`: preset or node
/// file; the backend as the plugin suites choose it).
fn doctor_command(node: &Node, sim_node: &str) -> Command {
    let root = node.root();
    let containerd = root.join("containerd.toml");
    if !containerd.exists() {
        std::fs::write(&containerd, CONTAINERD_2).unwrap();
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
    command
        .arg("doctor")
        .args(["--node-name", claims::NODE])
        .arg("--kubeconfig")
        .arg(root.join("kubeconfig"))
        .arg("--plugin-dir")
        .arg(node.plugin_dir())
        .arg("--registry-dir")
        .arg(node.registry_dir())
        .arg("--cdi-root")
        .arg(node.cdi_root())
        .arg("--state-dir")
        .arg(node.state_dir())
        .arg("--containerd-config")
        .arg(&containerd)
        .arg("--crio-config")
        .arg(root.join("no-crio.conf"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("GPU_DRA_SIM_STATE_DIR")
        .env_remove("GPU_DRA_SIM_NODE")
        .env_remove("GPU_DRA_PASSTHROUGH")
        .env_remove("GPU_DRA_HOST_ROOT");
    if nvml_backend() {
        command
            .args(["--gpu-backend", "nvml", "--simulated-host"])
            .arg("--nvml-lib")
            .arg(nvml_sim::library())
            .env("GPU_DRA_SIM_NODE", sim_node)
            .env("GPU_DRA_SIM_STATE_DIR", node.state_dir().join("sim"));
    } else {
        command.args(["--gpu-backend", "sim", "--sim-node", sim_node]);
    }
    command
}

/// `gpu-dra doctor -o json` as [`doctor_command`] runs it, plus `extra`.
fn doctor_on(node: &Node, sim_node: &str, extra: &[&str]) -> Run {
    let mut command = doctor_command(node, sim_node);
    command.args(["-o", "json"]);
    let out = command.args(extra).output().expect("run gpu-dra doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let checks = report["checks"].as_array().expect("checks").clone();
    Run {
        code: out.status.code().expect("exit code"),
        checks,
    }
}

fn doctor(node: &Node, extra: &[&str]) -> Run {
    doctor_on(node, PRESET, extra)
}

/// A node without a plugin: the directories the kubelet and the chart create, nothing else.
fn bare_node() -> Node {
    let node = Node::new();
    for dir in [node.cdi_root(), node.plugin_dir(), node.registry_dir()] {
        std::fs::create_dir_all(dir).unwrap();
    }
    node
}

/// A node whose plugin runs and has published its slices, with the chart's objects installed.
async fn healthy_node() -> (Node, plugin_support::Plugin) {
    let node = Node::new();
    install_chart_objects(&node);
    // The kubelet creates its registry directory; the chart creates the CDI directory.
    std::fs::create_dir_all(node.registry_dir()).unwrap();
    std::fs::create_dir_all(node.cdi_root()).unwrap();
    let plugin = node.start().await;
    eventually("the node's slices", || node.api.complete_pool()).await;
    (node, plugin)
}

#[tokio::test]
async fn a_correctly_set_up_simulated_node_passes_every_check_with_exit_code_0() {
    let (node, plugin) = healthy_node().await;
    let run = doctor(&node, &[]);
    assert_eq!((run.code, run.not_ok()), (0, vec![]), "{:#?}", run.checks);
    let names: Vec<&str> = run
        .checks
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for name in [
        "nvml",
        "gpu-0",
        "driver-root",
        "device-nodes",
        "cdi-root",
        "container-runtime",
        "plugin-dir",
        "registry-dir",
        "tools",
        "plugin-socket",
        "nvidia-smi",
        "resource-api",
        "feature-gates",
        "resource-slices",
        "scheduling-cost",
        "device-classes",
        "admission-policy",
        "rbac",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    for check in &run.checks {
        let keys: Vec<&String> = check.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["fix", "found", "name", "status"], "{check}");
        assert_eq!(check["fix"], Value::Null, "an ok check has no fix: {check}");
    }
    // The simulated DGX H100 with the default `--mig-profiles split` publishes 62 devices (8
    // whole GPUs, 54 MIG placements shared out), each consuming shared counters; the fake API
    // server reports 1.37, whose scheduler converts a node's own devices only.
    assert!(
        run.check("scheduling-cost")["found"]
            .as_str()
            .unwrap()
            .starts_with("62 devices published, 62 consuming shared counters; v1.37.0-fake:"),
        "{}",
        run.check("scheduling-cost")
    );
    assert!(
        run.check("nvidia-smi")["found"]
            .as_str()
            .unwrap()
            .contains("agree with NVML")
    );
    // The plugin logged the quick checks at start: nothing failed (the runtime's config is not
    // where the default paths point, so that one warns).
    let log = plugin.log();
    let summary = log
        .lines()
        .find(|l| l.contains("doctor --quick at start"))
        .unwrap_or_else(|| panic!("no start-up doctor line in:\n{log}"));
    assert!(summary.contains("fail=0"), "{log}");
    // What one run costs the API server, counted on the requests only doctor makes (the
    // plugin keeps running beside it): discovery and version, two dry runs, three lists and
    // one access review per permission.
    let mut doctors: Vec<String> = node
        .api
        .requests()
        .iter()
        .filter(|r| {
            r.path == "/apis"
                || r.path == "/version"
                || r.query.contains_key("dryRun")
                || r.path.contains("deviceclasses")
                || r.path.contains("admissionregistration")
                || r.path.contains("accessreviews")
        })
        .map(|r| format!("{} {}", r.method, r.path.rsplit('/').next().unwrap()))
        .collect();
    doctors.sort();
    let mut want = vec![
        "GET apis".to_string(),
        "GET deviceclasses".into(),
        "GET validatingadmissionpolicies".into(),
        "GET validatingadmissionpolicybindings".into(),
        "GET version".into(),
        "POST resourceslices".into(),
        "POST resourceslices".into(),
    ];
    want.extend((0..8).map(|_| "POST selfsubjectaccessreviews".to_string()));
    want.sort();
    assert_eq!(doctors, want);
    // The feature-gate probes were dry runs: nothing was stored.
    let stored: Vec<String> = node.api.slices().into_keys().collect();
    assert!(
        stored.iter().all(|n| !n.starts_with("gpu-dra-doctor")),
        "{stored:?}"
    );
}

#[tokio::test]
async fn a_deleted_device_class_fails_the_device_classes_check_with_exit_code_2() {
    let (node, _plugin) = healthy_node().await;
    assert!(node.api.delete_object(DEVICE_CLASSES, "mig.nvidia.com"));
    let run = doctor(&node, &[]);
    let found = run.only_bad("device-classes", "fail", 2);
    assert_eq!(found, "missing DeviceClass mig.nvidia.com");
    assert!(
        run.check("device-classes")["fix"]
            .as_str()
            .unwrap()
            .ends_with("(docs/troubleshooting.md#device-classes)")
    );
}

#[tokio::test]
async fn a_stopped_plugin_fails_the_plugin_socket_check_with_exit_code_2() {
    let (node, mut plugin) = healthy_node().await;
    plugin.signal(plugin_support::SIGKILL);
    plugin.wait_exit().await;
    let killed = doctor(&node, &[]);
    let found = killed.only_bad("plugin-socket", "fail", 2);
    assert!(found.contains("gpu.nvidia.com-reg.sock"), "{found}");
    // Stopped gracefully, it removes its sockets: none to call at all.
    let mut again = node.start().await;
    again.signal(plugin_support::SIGTERM);
    again.wait_exit().await;
    let stopped = doctor(&node, &[]);
    assert!(
        stopped
            .only_bad("plugin-socket", "fail", 2)
            .starts_with("no gpu.nvidia.com-*reg.sock")
    );
}

#[tokio::test]
async fn a_read_only_cdi_directory_fails_the_cdi_root_check_with_exit_code_2() {
    let (node, _plugin) = healthy_node().await;
    let Some(tmpfs) = plugin_support::disk::Tmpfs::mount(&node.cdi_root(), "1m") else {
        return;
    };
    tmpfs.set_read_only(true);
    let run = doctor(&node, &[]);
    let found = run.only_bad("cdi-root", "fail", 2);
    assert!(
        found.contains("not writable") && found.contains("Read-only file system"),
        "{found}"
    );
}

#[tokio::test]
async fn a_denied_plugin_verb_fails_the_rbac_check_naming_it() {
    let (node, _plugin) = healthy_node().await;
    node.api.deny_access("resourceclaims/status", "update");
    let run = doctor(&node, &[]);
    let found = run.only_bad("rbac", "fail", 2);
    assert!(
        found.starts_with("update resource.k8s.io/resourceclaims/status denied"),
        "{found}"
    );
}

#[test]
fn a_runtime_config_without_cdi_fails_and_an_unset_containerd_1_7_one_warns() {
    let node = bare_node();
    let config = node.root().join("containerd.toml");
    std::fs::write(
        &config,
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_cdi = false\n",
    )
    .unwrap();
    let off = doctor(&node, &["--quick"]);
    off.only_bad("container-runtime", "fail", 2);
    assert!(
        off.check("container-runtime")["found"]
            .as_str()
            .unwrap()
            .contains("enable_cdi = false")
    );
    std::fs::write(
        &config,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.10\"\n",
    )
    .unwrap();
    let unset = doctor(&node, &["--quick"]);
    unset.only_bad("container-runtime", "warn", 1);
}

#[test]
fn a_missing_registry_directory_fails_with_exit_code_2() {
    let node = Node::new();
    std::fs::create_dir_all(node.cdi_root()).unwrap();
    std::fs::create_dir_all(node.plugin_dir()).unwrap();
    let run = doctor(&node, &["--quick"]);
    run.only_bad("registry-dir", "fail", 2);
    let want = format!(
        "{}: missing (the kubelet watches it for plugins)",
        node.registry_dir().display()
    );
    assert_eq!(run.check("registry-dir")["found"], want);
}

#[test]
fn a_pending_mig_mode_change_warns_on_its_gpu_with_exit_code_1() {
    let node = bare_node();
    let file: PathBuf = node.root().join("a100.yaml");
    std::fs::write(
        &file,
        "nodeName: dgx-h100\ngpus:\n  - model: A100-SXM4-40GB\n    mig: disabled\n",
    )
    .unwrap();
    let sim = node.state_dir().join("sim");
    let backend =
        gpu_dra::hardware::sim::SimBackend::open(file.to_str().unwrap(), Some(&sim)).unwrap();
    use gpu_dra::hardware::GpuBackend;
    backend.set_mig_mode(0, true).unwrap();
    let run = doctor_on(&node, file.to_str().unwrap(), &["--quick"]);
    let found = run.only_bad("gpu-0", "warn", 1);
    assert!(
        found.ends_with("MIG off (pending on: reset needed)"),
        "{found}"
    );
}

#[test]
fn the_table_prints_one_line_per_check_with_the_fix_under_a_failure() {
    let node = Node::new();
    std::fs::create_dir_all(node.plugin_dir()).unwrap();
    std::fs::create_dir_all(node.registry_dir()).unwrap();
    let out = doctor_command(&node, PRESET)
        .arg("--quick")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let cdi = lines
        .iter()
        .position(|l| l.starts_with("fail   cdi-root"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        lines[cdi + 1]
            .trim_start()
            .starts_with("fix: Create the directory"),
        "{text}"
    );
    assert!(
        lines[cdi + 1].ends_with("(docs/troubleshooting.md#cdi-root)"),
        "{text}"
    );
    let checks = lines
        .iter()
        .filter(|l| !l.starts_with(' ') && !l.is_empty())
        .count()
        - 2;
    assert_eq!(
        lines.last(),
        Some(&format!("{} ok, 0 warn, 1 fail", checks - 1).as_str()),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_cdi_directory_without_write_permission_fails_even_for_root() {
    use std::os::unix::fs::PermissionsExt;
    let node = bare_node();
    std::fs::set_permissions(node.cdi_root(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let run = doctor(&node, &["--quick"]);
    run.only_bad("cdi-root", "fail", 2);
    let want = format!(
        "{}: not writable (mode 0555 has no write permission)",
        node.cdi_root().display()
    );
    assert_eq!(run.check("cdi-root")["found"], want);
}

/// A host's sysfs and `/dev/vfio` as the kernel lays them out, under a directory given to
/// doctor as `--host-root`: functions under `sys/devices/pci0000:00/`, linked from
/// `sys/bus/pci/devices/` and from their IOMMU group's `devices/`, each with a `driver` and an
/// `iommu_group` link.
struct HostTree {
    root: PathBuf,
}

impl HostTree {
    /// The IOMMU on, vfio-pci loaded, `/dev/vfio/vfio` present; no PCI function yet.
    fn new(root: PathBuf) -> HostTree {
        for dir in [
            "sys/kernel/iommu_groups",
            "sys/bus/pci/devices",
            "sys/devices/pci0000:00",
            "sys/module/vfio_pci",
            "dev/vfio",
        ] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        for driver in ["nvidia", "vfio-pci", "pcieport", "mlx5_core"] {
            let dir = root.join("sys/bus/pci/drivers").join(driver);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("bind"), "").unwrap();
            std::fs::write(dir.join("unbind"), "").unwrap();
        }
        std::fs::write(root.join("dev/vfio/vfio"), "").unwrap();
        HostTree { root }
    }

    /// A PCI function at `address` in IOMMU group `group`, bound to `driver`.
    fn function(&self, address: &str, vendor: &str, class: &str, driver: &str, group: u32) {
        use std::os::unix::fs::symlink;
        let dev = self.root.join("sys/devices/pci0000:00").join(address);
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(dev.join("class"), format!("{class}\n")).unwrap();
        symlink(
            format!("../../../bus/pci/drivers/{driver}"),
            dev.join("driver"),
        )
        .unwrap();
        symlink(
            format!("../../../kernel/iommu_groups/{group}"),
            dev.join("iommu_group"),
        )
        .unwrap();
        symlink(
            format!("../../../devices/pci0000:00/{address}"),
            self.root.join("sys/bus/pci/devices").join(address),
        )
        .unwrap();
        let members = self
            .root
            .join(format!("sys/kernel/iommu_groups/{group}/devices"));
        std::fs::create_dir_all(&members).unwrap();
        symlink(
            format!("../../../../devices/pci0000:00/{address}"),
            members.join(address),
        )
        .unwrap();
    }

    /// Two H100s: 0000:1b:00.0 alone in group 1, and 0000:5d:00.0 behind the bridge
    /// 0000:5c:00.0 in group 3.
    fn two_gpus(&self) {
        self.function("0000:5d:00.0", "0x10de", "0x030200", "nvidia", 3);
        self.function("0000:5c:00.0", "0x8086", "0x060400", "pcieport", 3);
        self.function("0000:1b:00.0", "0x10de", "0x030200", "vfio-pci", 1);
    }

    fn arg(&self) -> &str {
        self.root.to_str().unwrap()
    }
}

fn host_tree(node: &Node) -> HostTree {
    HostTree::new(node.root().join("host-root"))
}

const PASSTHROUGH_CHECKS: [&str; 3] = ["iommu", "vfio-modules", "vfio-device"];

#[test]
fn gpus_alone_or_behind_a_bridge_in_their_iommu_group_pass_every_passthrough_check() {
    let node = bare_node();
    let host = host_tree(&node);
    host.two_gpus();
    let run = doctor(
        &node,
        &["--quick", "--passthrough", "--host-root", host.arg()],
    );
    assert_eq!((run.code, run.not_ok()), (0, vec![]), "{:#?}", run.checks);
    let found = |name: &str| run.check(name)["found"].as_str().unwrap().to_string();
    let groups = format!("{}/sys/kernel/iommu_groups", host.arg());
    assert_eq!(found("iommu"), format!("on: 2 IOMMU groups in {groups}"));
    assert_eq!(
        found("vfio-modules"),
        format!("vfio-pci loaded ({}/sys/module/vfio_pci)", host.arg())
    );
    // Indexed by PCI address, as the gpu-vfio-<i> devices are.
    assert_eq!(
        (found("gpu-vfio-0"), found("gpu-vfio-1")),
        (
            "0000:1b:00.0 (driver vfio-pci): IOMMU group 1, alone".to_string(),
            "0000:5d:00.0 (driver nvidia): IOMMU group 3, with 0000:5c:00.0 (bridges or NVIDIA functions)".to_string()
        )
    );
    // Without --passthrough none of them runs.
    let plain = doctor(&node, &["--quick", "--host-root", host.arg()]);
    let names: Vec<&str> = plain
        .checks
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !PASSTHROUGH_CHECKS.contains(n) && !n.starts_with("gpu-vfio")),
        "{names:?}"
    );
}

#[test]
fn a_network_card_in_a_gpus_iommu_group_fails_that_gpus_check_naming_the_card() {
    let node = bare_node();
    let host = host_tree(&node);
    host.two_gpus();
    host.function("0000:5d:00.1", "0x15b3", "0x020000", "mlx5_core", 3);
    let run = doctor(
        &node,
        &["--quick", "--passthrough", "--host-root", host.arg()],
    );
    let found = run.only_bad("gpu-vfio-1", "fail", 2);
    assert_eq!(
        found,
        "0000:5d:00.0 (driver nvidia): IOMMU group 3 also holds 0000:5d:00.1 (vendor 0x15b3, class 0x020000, driver mlx5_core)"
    );
    let fix = run.check("gpu-vfio-1")["fix"].as_str().unwrap();
    assert!(
        fix.contains("ACS") && fix.ends_with("(docs/troubleshooting.md#gpu-vfio-index)"),
        "{fix}"
    );
}

#[test]
fn a_host_without_iommu_groups_fails_the_iommu_check_with_the_kernel_command_line_fix() {
    let node = bare_node();
    let host = host_tree(&node);
    host.two_gpus();
    std::fs::remove_dir_all(host.root.join("sys/kernel/iommu_groups")).unwrap();
    // As in the plugin's pod: the settings come from the plugin's environment.
    let mut command = doctor_command(&node, PRESET);
    let out = command
        .args(["--quick", "-o", "json"])
        .env("GPU_DRA_PASSTHROUGH", "true")
        .env("GPU_DRA_HOST_ROOT", host.arg())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = Run {
        code: out.status.code().unwrap(),
        checks: report["checks"].as_array().unwrap().clone(),
    };
    let found = run.only_bad("iommu", "fail", 2);
    assert_eq!(
        found,
        format!(
            "off: {}/sys/kernel/iommu_groups is missing or empty",
            host.arg()
        )
    );
    let fix = run.check("iommu")["fix"].as_str().unwrap();
    assert!(
        fix.contains("intel_iommu=on iommu=pt") && fix.contains("amd_iommu=on"),
        "{fix}"
    );
    // The GPUs' groups are not looked at with the IOMMU off.
    assert!(
        run.checks
            .iter()
            .all(|c| !c["name"].as_str().unwrap().starts_with("gpu-vfio")),
        "{:#?}",
        run.checks
    );
}

#[test]
fn without_vfio_pci_loaded_the_modules_and_api_device_checks_fail() {
    let node = bare_node();
    let host = host_tree(&node);
    host.two_gpus();
    std::fs::remove_dir_all(host.root.join("sys/module/vfio_pci")).unwrap();
    std::fs::remove_dir_all(host.root.join("sys/bus/pci/drivers/vfio-pci")).unwrap();
    std::fs::remove_file(host.root.join("dev/vfio/vfio")).unwrap();
    let run = doctor(
        &node,
        &["--quick", "--passthrough", "--host-root", host.arg()],
    );
    assert_eq!(
        (run.code, run.not_ok()),
        (
            2,
            vec![
                ("vfio-modules".to_string(), "fail".to_string()),
                ("vfio-device".to_string(), "fail".to_string()),
            ]
        ),
        "{:#?}",
        run.checks
    );
    let fix = run.check("vfio-modules")["fix"].as_str().unwrap();
    assert!(
        fix.contains("modprobe vfio-pci") && fix.contains("/etc/modules-load.d"),
        "{fix}"
    );
}

#[test]
fn asking_fabric_manager_writes_nothing_into_the_plugins_directories() {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("plugin");
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args([
            "doctor",
            "--gpu-backend",
            "sim",
            "--sim-node",
            "hgx-h100-passthrough",
        ])
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .args(["--fabric-manager", "-o", "json"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env_remove("GPU_DRA_SIM_STATE_DIR")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(names.contains(&"fabric-manager"), "{names:?}");
    // The simulated fmpm was linked elsewhere: the plugin's directory is still missing, and
    // a second run reports it the same way.
    assert!(
        !plugin_dir.exists(),
        "doctor created {}",
        plugin_dir.display()
    );
}
