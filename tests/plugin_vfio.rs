//! VFIO passthrough through the real `gpu-dra kubelet-plugin --passthrough` binary on a
//! simulated HGX H100 whose host tree (sysfs, /dev/vfio, /proc) the simulator keeps: the
//! driver switch, the CDI spec and device metadata a VM's container gets, every refusal made
//! before anything is touched, and convergence after a crash at every step of the switch.

mod plugin_support;

use std::path::PathBuf;

use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::DraApi;
use gpu_dra::kubelet::client::KubeletClient;
use plugin_support::claims::{self, claim_ref};
use plugin_support::{Node, Plugin};
use serde_json::{Value, json};

const PRESET: &str = "hgx-h100-passthrough";

/// Every MIG profile on every GPU (`--mig-profiles all`), for the test that carves a 1g.10gb on
/// GPU 0 once a VM gave it back: the default `split` gives GPU 0 the one-slice variants.
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

fn address(gpu: u32) -> String {
    gpu_dra::hardware::sim::ids::pci_address(gpu).0
}

fn host_root(node: &Node) -> PathBuf {
    node.state_dir().join("sim/host-root")
}

/// The driver sysfs says GPU `gpu` is bound to (`none` when unbound).
fn driver(node: &Node, gpu: u32) -> String {
    std::fs::read_link(
        host_root(node)
            .join("sys/bus/pci/devices")
            .join(address(gpu))
            .join("driver"),
    )
    .ok()
    .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    .unwrap_or_else(|| "none".into())
}

fn sim_state(node: &Node) -> Value {
    let text = std::fs::read_to_string(node.state_dir().join("sim/sim-gpu-state.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Whether persistence mode of GPU slot `gpu` is on in the simulated state.
fn persistence_on(node: &Node, gpu: usize) -> bool {
    sim_state(node)["state"]["gpus"][gpu]
        .get("persistenceOff")
        .and_then(Value::as_bool)
        != Some(true)
}

/// A claim of `devices` on this node, with `config` as its opaque `VfioDeviceConfig` for
/// every request when given.
fn vfio_claim(name: &str, uid: &str, devices: &[&str], config: Option<Value>) -> Value {
    match config {
        Some(parameters) => claims::on_node_with_config(name, uid, devices, parameters),
        None => claims::on_node(name, uid, devices),
    }
}

/// The container paths of a CDI device's device nodes, in order.
fn node_paths(device: &Value) -> Vec<&str> {
    device["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect()
}

fn vfio_config(backend: &str, api_device: bool) -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": backend, "enableAPIDevice": api_device}
    })
}

async fn start(node: &Node, env: &[(&str, &str)]) -> Plugin {
    let mut plugin = node.spawn_command(passthrough_command(node), env);
    plugin.wait_registrable().await;
    plugin
}

/// The plugin's command with `--passthrough` on the simulated node's host tree (named, so the
/// NVML backend over the simulated library finds it too).
fn passthrough_command(node: &Node) -> std::process::Command {
    let mut command = node.command();
    command
        .arg("--passthrough")
        .arg("--host-root")
        .arg(host_root(node));
    command
}

async fn prepare_one(kubelet: &mut KubeletClient, claim: &ClaimRef) -> Result<Vec<String>, String> {
    let got = kubelet
        .prepare(std::slice::from_ref(claim))
        .await
        .expect("prepare call");
    match got.get(&claim.uid).expect("a result for the claim") {
        Ok(devices) => Ok(devices
            .iter()
            .flat_map(|d| d.cdi_device_ids.clone())
            .collect()),
        Err(e) => Err(e.clone()),
    }
}

/// The node as it must be when no claim holds GPU `gpu`: on nvidia, no VFIO node, persistence
/// on, no record, no spec.
fn assert_given_back(node: &Node, gpu: u32, context: &str) {
    assert_eq!("nvidia", driver(node, gpu), "{context}: driver");
    let group = gpu + 1;
    assert!(
        !host_root(node).join(format!("dev/vfio/{group}")).exists(),
        "{context}: /dev/vfio/{group} left behind"
    );
    assert!(persistence_on(node, gpu as usize), "{context}: persistence");
    let snapshot = node.snapshot();
    snapshot.assert_converged(&[], context);
}

#[tokio::test]
async fn a_vfio_claim_moves_the_gpu_to_vfio_pci_and_unprepare_gives_it_back() {
    let node = Node::new().with_sim_node(PRESET);
    node.api.put_claim(vfio_claim(
        "vm",
        "uid-vm",
        &["gpu-vfio-0"],
        Some(vfio_config("LegacyOnly", true)),
    ));
    let plugin = start(&node, &[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claim_ref("vm", "uid-vm");
    let ids = prepare_one(&mut kubelet, &claim).await.unwrap();
    assert_eq!(
        vec![
            "k8s.gpu.nvidia.com/claim=uid-vm-gpu-vfio-0".to_string(),
            "k8s.gpu.nvidia.com/claim=uid-vm-metadata-gpu-0".to_string()
        ],
        ids
    );
    assert_eq!("vfio-pci", driver(&node, 0));
    assert!(host_root(&node).join("dev/vfio/1").exists());
    assert!(
        !persistence_on(&node, 0),
        "persistence off while on vfio-pci: {} {:?}",
        sim_state(&node)["state"]["gpus"][0],
        node.snapshot().checkpoint
    );

    let spec: Value = serde_json::from_str(&node.spec("uid-vm").unwrap()).unwrap();
    let device = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "uid-vm-gpu-vfio-0")
        .expect("the VFIO device in the spec");
    assert_eq!(vec!["/dev/vfio/1", "/dev/vfio/vfio"], node_paths(device));
    // The simulated host's nodes carry type and numbers: the runtime creates them.
    let numbers: Vec<(&str, i64, i64)> = device["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["type"].as_str().unwrap(),
                n["major"].as_i64().unwrap(),
                n["minor"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(vec![("c", 511, 0), ("c", 10, 196)], numbers);
    assert_eq!(
        json!(["NVIDIA_VISIBLE_DEVICES=void"]),
        device["containerEdits"]["env"]
    );
    assert!(
        spec.get("containerEdits").is_none(),
        "no NVIDIA edits in a VM's spec: {spec}"
    );

    let metadata = std::fs::read_to_string(
        node.plugin_dir()
            .join("dra-device-metadata/uid-vm_gpu-0.json"),
    )
    .unwrap();
    let first: Value = serde_json::Deserializer::from_str(&metadata)
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap();
    let attributes = &first["requests"][0]["devices"][0]["attributes"];
    assert_eq!(
        json!({"string": address(0)}),
        attributes["resource.kubernetes.io/pciBusID"]
    );
    assert_eq!(
        json!({"string": "vfio"}),
        attributes["type"],
        "{attributes}"
    );

    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_given_back(&node, 0, "after unprepare");

    // The GPU is NVIDIA's again: MIG carving works on it.
    node.api
        .put_claim(claims::on_node("mig", "uid-mig", &["gpu-0-mig-1g10gb-0"]));
    let mig = claim_ref("mig", "uid-mig");
    prepare_one(&mut kubelet, &mig).await.unwrap();
    assert_eq!(1, node.snapshot().instances.len());
    kubelet.unprepare(std::slice::from_ref(&mig)).await.unwrap();
}

#[tokio::test]
async fn with_iommufd_the_vm_gets_the_vfio_device_cdev_and_dev_iommu() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dgx-h100.yaml");
    std::fs::write(
        &file,
        "nodeName: dgx-h100\ngpus:\n  - model: H100-SXM5-80GB\n    count: 2\n    mig: disabled\npassthrough:\n  iommufd: true\n",
    )
    .unwrap();
    let node = Node::new().with_sim_node(file.display().to_string());
    node.api.put_claim(vfio_claim(
        "vm",
        "uid-vm",
        &["gpu-vfio-1"],
        Some(vfio_config("PreferIommuFD", true)),
    ));
    let plugin = start(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claim_ref("vm", "uid-vm");
    prepare_one(&mut kubelet, &claim).await.unwrap();
    let spec: Value = serde_json::from_str(&node.spec("uid-vm").unwrap()).unwrap();
    assert_eq!(
        vec!["/dev/vfio/devices/vfio1", "/dev/iommu"],
        node_paths(&spec["devices"][0])
    );
    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_given_back(&node, 1, "after unprepare");
}

/// Prepares `claim` and expects a refusal whose message contains every one of `words`,
/// with GPU `gpu` left exactly as it was.
async fn assert_refused(
    node: &Node,
    kubelet: &mut KubeletClient,
    claim: &ClaimRef,
    gpu: u32,
    words: &[&str],
) {
    let err = prepare_one(kubelet, claim).await.unwrap_err();
    for word in words {
        assert!(err.contains(word), "{word:?} missing in: {err}");
    }
    assert_given_back(node, gpu, &format!("after refusing {words:?}"));
}

#[tokio::test]
async fn a_gpu_sharing_its_iommu_group_with_a_nic_is_refused_and_another_gpu_is_not() {
    let node = Node::new().with_sim_node("hgx-h100-passthrough-shared-group");
    node.api
        .put_claim(vfio_claim("vm0", "uid-vm0", &["gpu-vfio-0"], None));
    node.api
        .put_claim(vfio_claim("vm1", "uid-vm1", &["gpu-vfio-1"], None));
    let plugin = start(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_refused(
        &node,
        &mut kubelet,
        &claim_ref("vm0", "uid-vm0"),
        0,
        &["IOMMU group 1", "0000:80:00.1", "mlx5_core", "ACS"],
    )
    .await;
    let vm1 = claim_ref("vm1", "uid-vm1");
    prepare_one(&mut kubelet, &vm1).await.unwrap();
    assert_eq!("vfio-pci", driver(&node, 1));
    kubelet.unprepare(std::slice::from_ref(&vm1)).await.unwrap();
}

#[tokio::test]
async fn sriov_vfs_mig_instances_and_processes_holding_the_gpu_are_each_refused_by_name() {
    let node = Node::new().with_sim_node(PRESET);
    node.api
        .put_claim(vfio_claim("vm", "uid-vm", &["gpu-vfio-0"], None));
    let plugin = start(&node, &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claim_ref("vm", "uid-vm");
    let gpu0 = host_root(&node)
        .join("sys/bus/pci/devices")
        .join(address(0));

    std::fs::write(gpu0.join("sriov_numvfs"), "2\n").unwrap();
    assert_refused(
        &node,
        &mut kubelet,
        &claim,
        0,
        &["2 SR-IOV virtual functions", "sriov_numvfs"],
    )
    .await;
    std::fs::write(gpu0.join("sriov_numvfs"), "0\n").unwrap();

    let proc = host_root(&node).join("proc/4242");
    std::fs::create_dir_all(proc.join("fd")).unwrap();
    std::fs::write(proc.join("comm"), "python3\n").unwrap();
    std::os::unix::fs::symlink("/dev/nvidia0", proc.join("fd/3")).unwrap();
    assert_refused(
        &node,
        &mut kubelet,
        &claim,
        0,
        &["/dev/nvidia0", "4242 (python3)"],
    )
    .await;
    std::fs::remove_dir_all(host_root(&node).join("proc")).unwrap();
    // nvidia-persistenced holds it too, and lets go when persistence mode goes off: no refusal.
    let daemon = host_root(&node).join("proc/77");
    std::fs::create_dir_all(daemon.join("fd")).unwrap();
    std::fs::write(daemon.join("comm"), "nvidia-persistenced\n").unwrap();
    std::os::unix::fs::symlink("/dev/nvidia0", daemon.join("fd/5")).unwrap();
    prepare_one(&mut kubelet, &claim).await.unwrap();
    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    std::fs::remove_dir_all(host_root(&node).join("proc")).unwrap();

    // A MIG instance nobody's claim holds (made behind the plugin's back).
    let sim =
        gpu_dra::hardware::sim::SimBackend::open_state_dir(&node.state_dir().join("sim")).unwrap();
    use gpu_dra::hardware::GpuBackend;
    let profile = sim.inventory().unwrap().gpus[0]
        .profile_by_name("1g.10gb")
        .unwrap()
        .id;
    // (The prepare above switched MIG off on this dynamic-MIG GPU, as a full GPU's does.)
    sim.set_mig_mode(0, true).unwrap();
    let made = sim.create_mig_device(0, profile, 3).unwrap();
    let err = prepare_one(&mut kubelet, &claim).await.unwrap_err();
    assert!(err.contains("MIG instances: 1g.10gb@3"), "{err}");
    assert_eq!("nvidia", driver(&node, 0));
    sim.destroy_mig_device(0, made.gi_id, made.ci_id).unwrap();

    prepare_one(&mut kubelet, &claim).await.unwrap();
    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_given_back(&node, 0, "after the last unprepare");
}

#[tokio::test]
async fn the_plugin_refuses_to_start_with_passthrough_when_the_iommu_is_off() {
    let node = Node::new().with_sim_node("hgx-h100-passthrough-iommu-off");
    let mut plugin = node.spawn_command(passthrough_command(&node), &[]);
    let status = plugin.wait_exit().await;
    assert!(!status.success());
    let log = plugin.log();
    assert!(log.contains("the IOMMU is not enabled"), "{log}");
    assert!(log.contains("intel_iommu=on"), "{log}");
}

#[tokio::test]
async fn a_gpu_left_on_vfio_pci_by_no_claim_is_given_back_at_start() {
    let node = Node::new().with_sim_node(PRESET);
    node.api
        .put_claim(vfio_claim("vm", "uid-vm", &["gpu-vfio-3"], None));
    let mut plugin = start(&node, &[(gpu_dra::crashpoint::ENV, "prepare-vfio-bound")]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert!(kubelet.prepare(&[claim_ref("vm", "uid-vm")]).await.is_err());
    plugin.wait_exit().await;
    assert_eq!("vfio-pci", driver(&node, 3));
    // The checkpoint is lost with it (a node rebuilt from an image, a deleted state dir).
    std::fs::remove_file(node.state_dir().join(gpu_dra::checkpoint::CHECKPOINT_FILE)).unwrap();
    let _plugin = start(&node, &[]).await;
    assert_eq!("nvidia", driver(&node, 3));
    assert!(!host_root(&node).join("dev/vfio/4").exists());
}

/// Crashes the plugin at `point` during a VFIO claim's prepare (or unprepare), restarts it,
/// lets the kubelet retry, and checks the GPU converges.
async fn crash_and_recover(point: &str) {
    let node = Node::new().with_sim_node(PRESET);
    node.api.put_claim(vfio_claim(
        "vm",
        "uid-vm",
        &["gpu-vfio-2"],
        Some(vfio_config("LegacyOnly", true)),
    ));
    let claim = claim_ref("vm", "uid-vm");
    let in_prepare = point.starts_with("prepare");
    if !in_prepare {
        let plugin = start(&node, &[]).await;
        let mut kubelet = plugin.register(DraApi::V1).await;
        prepare_one(&mut kubelet, &claim).await.unwrap();
        drop(plugin);
    }
    let mut plugin = start(&node, &[(gpu_dra::crashpoint::ENV, point)]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let answer = if in_prepare {
        kubelet
            .prepare(std::slice::from_ref(&claim))
            .await
            .map(drop)
    } else {
        kubelet
            .unprepare(std::slice::from_ref(&claim))
            .await
            .map(drop)
    };
    assert!(
        answer.is_err(),
        "{point}: the call must die with the plugin"
    );
    let status = plugin.wait_exit().await;
    assert!(!status.success(), "{point}: {}", plugin.log());

    let plugin = start(&node, &[]).await;
    let recovered = node.snapshot();
    let prepared = recovered.checkpoint.contains_key("uid-vm");
    assert_eq!(
        if prepared { "vfio-pci" } else { "nvidia" },
        driver(&node, 2),
        "{point}: after recovery (claim recorded: {prepared})"
    );
    let mut kubelet = plugin.register(DraApi::V1).await;
    if in_prepare {
        prepare_one(&mut kubelet, &claim)
            .await
            .unwrap_or_else(|e| panic!("{point}: retry: {e}"));
        assert_eq!("vfio-pci", driver(&node, 2), "{point}: after the retry");
    }
    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_given_back(&node, 2, &format!("{point}: at the end"));
}

#[tokio::test]
async fn a_crash_at_every_step_of_the_driver_switch_converges_after_restart() {
    for point in gpu_dra::crashpoint::VFIO_POINTS {
        crash_and_recover(point).await;
    }
}

#[tokio::test]
async fn while_the_gpu_is_on_vfio_pci_its_full_gpu_and_mig_devices_are_not_published() {
    let node = Node::new().with_sim_node(PRESET);
    node.api
        .put_claim(vfio_claim("vm", "uid-vm", &["gpu-vfio-0"], None));
    let plugin = start(&node, &[]).await;
    let names = || -> Vec<String> {
        node.api
            .complete_pool()
            .unwrap_or_default()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    };
    plugin_support::eventually("gpu-vfio-0 published", || {
        names().contains(&"gpu-vfio-0".to_string()).then_some(())
    })
    .await;
    assert!(names().contains(&"gpu-0".to_string()));
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claim_ref("vm", "uid-vm");
    prepare_one(&mut kubelet, &claim).await.unwrap();
    // A complete pool without gpu-0 (a pool whose slice count changed is briefly incomplete,
    // and shows no devices then).
    let now = plugin_support::eventually("gpu-0 unpublished", || {
        let now = names();
        (!now.is_empty() && !now.contains(&"gpu-0".to_string())).then_some(now)
    })
    .await;
    assert!(now.contains(&"gpu-vfio-0".to_string()), "{now:?}");
    assert!(!now.iter().any(|n| n.starts_with("gpu-0-mig")), "{now:?}");

    // A restart while the VM holds it: NVML has never seen the GPU in this process, so its
    // VFIO device is published bare (no counters, no NVML facts) and nothing else of it.
    drop(kubelet);
    drop(plugin);
    node.api.remove_slices();
    let plugin = start(&node, &[]).await;
    plugin_support::eventually("gpu-vfio-0 republished after the restart", || {
        names().contains(&"gpu-vfio-0".to_string()).then_some(())
    })
    .await;
    let now = names();
    assert!(!now.contains(&"gpu-0".to_string()), "{now:?}");
    assert!(now.contains(&"gpu-1".to_string()), "{now:?}");
    assert_eq!("vfio-pci", driver(&node, 0));
    let mut kubelet = plugin.register(DraApi::V1).await;
    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    plugin_support::eventually("gpu-0 republished", || {
        names().contains(&"gpu-0".to_string()).then_some(())
    })
    .await;
    assert_given_back(&node, 0, "after the unprepare by the restarted plugin");
}

/// Fabric Manager on the same node (`--fabric-manager`): the VFIO devices carry their GPUs'
/// module and partitions, a VM claim of GPUs 0 and 2 (modules 1 and 3) activates partition 3
/// before the GPUs move to vfio-pci and deactivates it after they are back, and a claim of
/// GPUs that make no partition is refused before anything moves.
#[tokio::test]
async fn a_vm_claim_of_two_gpus_activates_their_fabric_manager_partition() {
    use gpu_dra::fabric_manager::sim;
    let node = Node::new().with_sim_node(PRESET);
    node.api.put_claim(vfio_claim(
        "vm2",
        "uid-vm2",
        &["gpu-vfio-0", "gpu-vfio-2"],
        None,
    ));
    node.api.put_claim(vfio_claim(
        "odd",
        "uid-odd",
        &["gpu-vfio-0", "gpu-vfio-1"],
        None,
    ));
    let mut command = passthrough_command(&node);
    command.arg("--fabric-manager");
    let mut plugin = node.spawn_command(command, &[]);
    plugin.wait_registrable().await;
    let vfio0 = plugin_support::eventually("gpu-vfio-0 published", || {
        node.api
            .complete_pool()?
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == "gpu-vfio-0")
    })
    .await;
    assert_eq!(json!({"int": 1}), vfio0["attributes"]["gpuModuleID"]);
    assert_eq!(json!({"int": 3}), vfio0["attributes"]["partition2"]);
    let mut kubelet = plugin.register(DraApi::V1).await;

    let err = prepare_one(&mut kubelet, &claim_ref("odd", "uid-odd"))
        .await
        .unwrap_err();
    assert!(err.contains("partition"), "{err}");
    assert_eq!(
        ("nvidia".to_string(), "nvidia".to_string()),
        (driver(&node, 0), driver(&node, 1))
    );
    assert!(sim::active(&node.state_dir().join("sim")).is_empty());

    let vm = claim_ref("vm2", "uid-vm2");
    prepare_one(&mut kubelet, &vm).await.unwrap();
    assert_eq!(
        std::collections::BTreeSet::from([3]),
        sim::active(&node.state_dir().join("sim"))
    );
    assert_eq!(
        ("vfio-pci".to_string(), "vfio-pci".to_string()),
        (driver(&node, 0), driver(&node, 2))
    );
    kubelet.unprepare(std::slice::from_ref(&vm)).await.unwrap();
    assert!(sim::active(&node.state_dir().join("sim")).is_empty());
    assert_given_back(&node, 0, "GPU 0 after unprepare");
    assert_given_back(&node, 2, "GPU 2 after unprepare");
}
