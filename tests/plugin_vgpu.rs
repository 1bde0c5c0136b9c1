//! vGPU through the real `gpu-dra kubelet-plugin --vgpu-types` binary on simulated vGPU
//! hosts whose sysfs the simulator keeps (SR-IOV on HGX H100, mdev on T4): the vGPU a claim
//! creates and its unprepare deletes, the CDI spec and device metadata a VM's container gets,
//! every refusal made before anything is touched, convergence after a crash at every step,
//! and vGPUs no claim names deleted at start.

mod plugin_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpu_dra::hardware::sim::sysfs::SimKernel;
use gpu_dra::hardware::vgpu::VgpuHost;
use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::claims::{self, claim_ref};
use plugin_support::{Node, Plugin};
use serde_json::{Value, json};

const H100: &str = "hgx-h100-vgpu";
const T4: &str = "t4-vgpu-mdev";
/// H100-4C's type ID in the simulator's (and NVIDIA's) table.
const H100_4C: u32 = 1056;

fn host_root(node: &Node) -> PathBuf {
    node.state_dir().join("sim/host-root")
}

fn gpu_address(gpu: u32) -> String {
    gpu_dra::hardware::sim::ids::pci_address(gpu).0
}

/// The simulated host's vGPU files, written through its kernel as the plugin writes them.
fn vgpu_host(node: &Node) -> VgpuHost {
    let root = host_root(node);
    VgpuHost::new(&root, Arc::new(SimKernel::new(&root)))
}

fn pci_device(node: &Node, address: &str) -> PathBuf {
    host_root(node).join("sys/bus/pci/devices").join(address)
}

/// The PCI address of VF `n` of GPU `gpu` (its `virtfn<n>` link).
fn vf_address(node: &Node, gpu: u32, n: u32) -> String {
    let link = std::fs::read_link(pci_device(node, &gpu_address(gpu)).join(format!("virtfn{n}")))
        .expect("the GPU's VFs are enabled");
    link.file_name().unwrap().to_string_lossy().into_owned()
}

/// `nvidia/current_vgpu_type` of a VF.
fn current_type(node: &Node, vf: &str) -> u32 {
    std::fs::read_to_string(pci_device(node, vf).join("nvidia/current_vgpu_type"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The IOMMU group of a PCI function or an mdev directory.
fn iommu_group(dir: &Path) -> String {
    std::fs::read_link(dir.join("iommu_group"))
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Every vGPU on the host: VFs holding a type, and mdevs.
fn vgpus(node: &Node) -> Vec<String> {
    vgpu_host(node)
        .scan()
        .unwrap()
        .gpus
        .iter()
        .flat_map(|g| g.instances.iter())
        .map(|i| {
            i.vf_address
                .clone()
                .or(i.mdev_uuid.clone())
                .unwrap_or_default()
        })
        .collect()
}

/// The plugin command offering `types` (`--vgpu-types`) on the simulated node's host tree
/// (named, so the NVML backend over the simulated library finds it too).
fn vgpu_command(node: &Node, types: &str) -> std::process::Command {
    let mut command = node.command();
    command
        .args(["--vgpu-types", types])
        .arg("--host-root")
        .arg(host_root(node));
    command
}

async fn start(node: &Node, types: &str, env: &[(&str, &str)]) -> Plugin {
    let mut plugin = node.spawn_command(vgpu_command(node, types), env);
    plugin.wait_registrable().await;
    plugin
}

/// The node's simulated state, created as the plugin would before it starts (so a test can
/// change the host first).
fn power_on(node: &Node, preset: &str) {
    gpu_dra::hardware::sim::SimBackend::open(preset, Some(&node.state_dir().join("sim"))).unwrap();
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

/// The CDI device named `name` in claim `uid`'s spec, and the spec.
fn cdi_device(node: &Node, uid: &str, name: &str) -> (Value, Value) {
    let spec: Value = serde_json::from_str(&node.spec(uid).expect("a CDI spec")).unwrap();
    let device = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {spec}"))
        .clone();
    (device, spec)
}

/// The container paths of a CDI device's device nodes, in order.
fn node_paths(device: &Value) -> Vec<String> {
    device["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect()
}

/// The attributes of the first device of claim `uid`'s request `gpu-0` in the newest
/// version of its metadata file.
fn metadata_attributes(node: &Node, uid: &str) -> Value {
    let text = std::fs::read_to_string(
        node.plugin_dir()
            .join(format!("dra-device-metadata/{uid}_gpu-0.json")),
    )
    .unwrap();
    let first: Value = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap();
    first["requests"][0]["devices"][0]["attributes"].clone()
}

/// The node as it must be when no claim is prepared: no vGPU on the host, no record, no spec.
fn assert_nothing_left(node: &Node, context: &str) {
    assert_eq!(Vec::<String>::new(), vgpus(node), "{context}: vGPUs left");
    node.snapshot().assert_converged(&[], context);
}

#[tokio::test]
async fn a_vdev_claim_creates_the_vgpu_on_a_free_vf_and_unprepare_deletes_it() {
    let node = Node::new().with_sim_node(H100);
    node.api
        .put_claim(claims::on_node("vm", "uid-vm", &["vgpu-0-4c-0"]));
    node.api
        .put_claim(claims::on_node("vm2", "uid-vm2", &["vgpu-0-4c-1"]));
    let plugin = start(&node, "H100-4C", &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let (vm, vm2) = (claim_ref("vm", "uid-vm"), claim_ref("vm2", "uid-vm2"));
    // Both in one call: one wave, so the second must not pick the VF the first picked.
    plugin_support::prepare_all(&mut kubelet, &[vm.clone(), vm2.clone()]).await;
    let (vf0, vf1) = (vf_address(&node, 0, 0), vf_address(&node, 0, 1));
    assert_eq!(
        (H100_4C, H100_4C),
        (current_type(&node, &vf0), current_type(&node, &vf1))
    );
    assert_eq!(vec![vf0.clone(), vf1.clone()], vgpus(&node));

    let (device, spec) = cdi_device(&node, "uid-vm", "uid-vm-vgpu-0-4c-0");
    let group = iommu_group(&pci_device(&node, &vf0));
    assert_eq!(
        vec![format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_string()],
        node_paths(&device)
    );
    assert!(host_root(&node).join(format!("dev/vfio/{group}")).exists());
    assert_eq!(
        json!(["NVIDIA_VISIBLE_DEVICES=void"]),
        device["containerEdits"]["env"]
    );
    assert!(
        spec.get("containerEdits").is_none(),
        "no NVIDIA edits in a VM's spec: {spec}"
    );
    let attributes = metadata_attributes(&node, "uid-vm");
    assert_eq!(
        json!({"string": vf0}),
        attributes["resource.kubernetes.io/pciBusID"],
        "KubeVirt's PCI path takes the VF, not the parent GPU: {attributes}"
    );
    assert_eq!(json!({"string": "vgpu"}), attributes["type"]);
    assert!(attributes.get("mdevUUID").is_none(), "{attributes}");

    plugin_support::unprepare_all(&mut kubelet, &[vm.clone(), vm2.clone()]).await;
    assert_nothing_left(&node, "after unprepare");
    // Unprepare again (the kubelet repeats calls): nothing to do, no error.
    plugin_support::unprepare_all(&mut kubelet, &[vm]).await;
}

#[tokio::test]
async fn an_mdev_claim_creates_the_mdev_and_its_metadata_names_its_uuid() {
    let node = Node::new().with_sim_node(T4);
    node.api
        .put_claim(claims::on_node("vm", "uid-vm", &["vgpu-1-4q-0"]));
    let plugin = start(&node, "T4-4Q", &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claim_ref("vm", "uid-vm");
    prepare_one(&mut kubelet, &claim).await.unwrap();
    let facts = vgpu_host(&node).scan().unwrap();
    let instance = facts.gpus[1]
        .instances
        .first()
        .expect("an mdev on GPU 1")
        .clone();
    let uuid = instance.mdev_uuid.clone().expect("an mdev");
    assert_eq!(facts.gpus[1].address, gpu_address(1));
    let mdev = host_root(&node).join("sys/bus/mdev/devices").join(&uuid);
    let group = iommu_group(&mdev);
    assert_eq!(instance.iommu_group.as_deref(), Some(group.as_str()));

    let (device, _) = cdi_device(&node, "uid-vm", "uid-vm-vgpu-1-4q-0");
    assert_eq!(
        vec![format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_string()],
        node_paths(&device)
    );
    let attributes = metadata_attributes(&node, "uid-vm");
    assert_eq!(json!({"string": uuid}), attributes["mdevUUID"]);
    assert!(
        attributes.get("resource.kubernetes.io/pciBusID").is_none(),
        "an mdev is no PCI function: {attributes}"
    );

    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(!mdev.exists(), "the mdev is removed");
    assert_nothing_left(&node, "after unprepare");
}

fn vgpu_device_config(fields: Value) -> Value {
    let mut config =
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VgpuDeviceConfig"});
    for (k, v) in fields.as_object().unwrap() {
        config[k] = v.clone();
    }
    config
}

#[tokio::test]
async fn a_vgpu_device_config_sets_an_mdevs_params_and_must_name_the_allocated_type() {
    let node = Node::new().with_sim_node(T4);
    node.api.put_claim(claims::on_node_with_config(
        "vm",
        "uid-vm",
        &["vgpu-1-4q-0"],
        vgpu_device_config(json!({
            "profile": "T4-4Q", "params": "frame_rate_limiter=0, disable_vnc=1"
        })),
    ));
    node.api.put_claim(claims::on_node_with_config(
        "wrong",
        "uid-wrong",
        &["vgpu-1-4q-1"],
        vgpu_device_config(json!({"profile": "T4-8Q"})),
    ));
    node.api.put_claim(claims::on_node_with_config(
        "bad-params",
        "uid-bad-params",
        &["vgpu-1-4q-1"],
        vgpu_device_config(json!({"params": "disable_vnc"})),
    ));
    let plugin = start(&node, "T4-4Q", &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;

    let claim = claim_ref("vm", "uid-vm");
    prepare_one(&mut kubelet, &claim).await.unwrap();
    let uuid = vgpus(&node).pop().expect("an mdev");
    let params = host_root(&node)
        .join("sys/bus/mdev/devices")
        .join(&uuid)
        .join("nvidia/vgpu_params");
    assert_eq!(
        "frame_rate_limiter=0,disable_vnc=1",
        std::fs::read_to_string(&params).unwrap().trim(),
        "written before the VM starts"
    );
    plugin_support::unprepare_all(&mut kubelet, std::slice::from_ref(&claim)).await;
    assert_nothing_left(&node, "after unprepare");

    assert_refused(
        &node,
        &mut kubelet,
        &claim_ref("wrong", "uid-wrong"),
        &[],
        &[
            "VgpuDeviceConfig profile \"T4-8Q\" does not match the allocated vGPU, which is T4-4Q (typeID",
            "set profile to \"T4-4Q\"",
        ],
    )
    .await;
    assert_refused(
        &node,
        &mut kubelet,
        &claim_ref("bad-params", "uid-bad-params"),
        &[],
        &["params: \"disable_vnc\" is not valid", "key=value pairs"],
    )
    .await;
}

#[tokio::test]
async fn a_vgpu_device_config_with_params_is_refused_on_an_sr_iov_vgpu_and_a_wrong_type_id_too() {
    let node = Node::new().with_sim_node(H100);
    node.api.put_claim(claims::on_node_with_config(
        "params",
        "uid-params",
        &["vgpu-0-4c-0"],
        vgpu_device_config(json!({"params": "disable_vnc=1"})),
    ));
    node.api.put_claim(claims::on_node_with_config(
        "type",
        "uid-type",
        &["vgpu-0-4c-0"],
        vgpu_device_config(json!({"typeID": 1057})),
    ));
    node.api.put_claim(claims::on_node_with_config(
        "right",
        "uid-right",
        &["vgpu-0-4c-0"],
        vgpu_device_config(json!({"profile": "NVIDIA H100-4C", "typeID": H100_4C})),
    ));
    let plugin = start(&node, "H100-4C", &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_refused(
        &node,
        &mut kubelet,
        &claim_ref("params", "uid-params"),
        &[],
        &["VgpuDeviceConfig params", "SR-IOV (vdev)", "remove params"],
    )
    .await;
    assert_refused(
        &node,
        &mut kubelet,
        &claim_ref("type", "uid-type"),
        &[],
        &[
            "VgpuDeviceConfig typeID 1057 does not match the allocated vGPU, which is H100-4C (typeID 1056)",
            "set typeID to 1056",
        ],
    )
    .await;
    let right = claim_ref("right", "uid-right");
    prepare_one(&mut kubelet, &right).await.unwrap();
    plugin_support::unprepare_all(&mut kubelet, &[right]).await;
    assert_nothing_left(&node, "after unprepare");
}

/// Prepares `claim` and expects a refusal whose message contains every one of `words`, with
/// nothing recorded or written and no vGPU created but those `made_by_hand`.
async fn assert_refused(
    node: &Node,
    kubelet: &mut KubeletClient,
    claim: &ClaimRef,
    made_by_hand: &[&str],
    words: &[&str],
) {
    let err = prepare_one(kubelet, claim).await.unwrap_err();
    for word in words {
        assert!(err.contains(word), "{word:?} missing in: {err}");
    }
    let context = format!("after refusing {words:?}");
    let snapshot = node.snapshot();
    assert!(snapshot.checkpoint.is_empty(), "{context}: {snapshot:?}");
    assert!(snapshot.cdi_files.is_empty(), "{context}: {snapshot:?}");
    assert!(
        snapshot.metadata_claims.is_empty(),
        "{context}: {snapshot:?}"
    );
    let ours: Vec<String> = vgpus(node)
        .into_iter()
        .filter(|v| !made_by_hand.contains(&v.as_str()))
        .collect();
    assert!(ours.is_empty(), "{context}: vGPUs created: {ours:?}");
}

#[tokio::test]
async fn each_refusal_names_its_cause_and_fix_and_touches_nothing() {
    let node = Node::new().with_sim_node(H100);
    node.api
        .put_claim(claims::on_node("vm", "uid-vm", &["vgpu-0-4c-0"]));
    let plugin = start(&node, "H100-4C", &[]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let claim = claim_ref("vm", "uid-vm");
    let host = vgpu_host(&node);
    let kernel = SimKernel::new(host_root(&node));
    use gpu_dra::hardware::passthrough::SysfsKernel;

    // VFs not enabled (sriov-manage -d, or a reboot without -e).
    let numvfs = pci_device(&node, &gpu_address(0)).join("sriov_numvfs");
    kernel.write(&numvfs, "0").unwrap();
    assert_refused(
        &node,
        &mut kubelet,
        &claim,
        &[],
        &["virtual functions disabled", "sriov-manage -e 0000:"],
    )
    .await;
    kernel.write(&numvfs, "32").unwrap();

    // The type is not creatable now: another type runs on the GPU (made by hand).
    let vf = vf_address(&node, 0, 5);
    host.create_vdev(&vf, 1058).unwrap(); // H100-10C
    assert_refused(
        &node,
        &mut kubelet,
        &claim,
        &[&vf],
        &[
            "vGPU type H100-4C cannot be created on GPU",
            &format!("it runs 1 × H100-10C ({vf})"),
        ],
    )
    .await;
    host.delete_vdev(&vf).unwrap();

    // A process holds the GPU.
    let proc = host_root(&node).join("proc/4242");
    std::fs::create_dir_all(proc.join("fd")).unwrap();
    std::fs::write(proc.join("comm"), "python3\n").unwrap();
    std::os::unix::fs::symlink("/dev/nvidia0", proc.join("fd/3")).unwrap();
    assert_refused(
        &node,
        &mut kubelet,
        &claim,
        &[],
        &["/dev/nvidia0", "4242 (python3)", "stop them first"],
    )
    .await;
    std::fs::remove_dir_all(host_root(&node).join("proc")).unwrap();

    // A MIG instance on the GPU (made behind the plugin's back).
    let sim =
        gpu_dra::hardware::sim::SimBackend::open_state_dir(&node.state_dir().join("sim")).unwrap();
    use gpu_dra::hardware::GpuBackend;
    let profile = sim.inventory().unwrap().gpus[0]
        .profile_by_name("1g.10gb")
        .unwrap()
        .id;
    sim.set_mig_mode(0, true).unwrap();
    let made = sim.create_mig_device(0, profile, 3).unwrap();
    assert_refused(
        &node,
        &mut kubelet,
        &claim,
        &[],
        &["MIG instances: 1g.10gb@3", "nvidia-smi mig -dci"],
    )
    .await;
    sim.destroy_mig_device(0, made.gi_id, made.ci_id).unwrap();

    // MIG mode still on, no instance: prepare switches it off, as for a full GPU.
    prepare_one(&mut kubelet, &claim).await.unwrap();
    assert!(!sim.inventory().unwrap().gpus[0].mig.current);
    assert_eq!(H100_4C, current_type(&node, &vf_address(&node, 0, 0)));
    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_nothing_left(&node, "after the last unprepare");
}

#[tokio::test]
async fn vgpus_no_claim_names_are_deleted_at_start_on_the_gpus_the_plugin_offers_vgpus_on() {
    let node = Node::new().with_sim_node(H100);
    power_on(&node, H100);
    let host = vgpu_host(&node);
    let (orphan, theirs) = (vf_address(&node, 0, 3), vf_address(&node, 1, 0));
    host.create_vdev(&orphan, H100_4C).unwrap();
    host.create_vdev(&theirs, H100_4C).unwrap();
    // The plugin offers vGPUs on GPU 0 only: GPU 1's vGPU is the administrator's.
    let _plugin = start(&node, "0=H100-4C", &[]).await;
    assert_eq!(0, current_type(&node, &orphan), "the orphan on GPU 0");
    assert_eq!(H100_4C, current_type(&node, &theirs), "GPU 1's vGPU");
}

/// A vGPU claim's prepare (and unprepare) crashed at `point`: after a restart and the
/// kubelet's retry, the node converges, and after the unprepare nothing is left.
async fn crash_and_recover(preset: &str, types: &str, device: &str, point: &str) {
    let node = Node::new().with_sim_node(preset);
    node.api
        .put_claim(claims::on_node("vm", "uid-vm", &[device]));
    let claim = claim_ref("vm", "uid-vm");
    let in_prepare =
        point.starts_with("prepare") || point.ends_with("-written") || point.ends_with("-created");
    if !in_prepare {
        let plugin = start(&node, types, &[]).await;
        let mut kubelet = plugin.register(DraApi::V1).await;
        prepare_one(&mut kubelet, &claim).await.unwrap();
        drop(plugin);
    }
    let mut plugin = start(&node, types, &[(gpu_dra::crashpoint::ENV, point)]).await;
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

    let plugin = start(&node, types, &[]).await;
    let recovered = node.snapshot();
    let prepared = recovered.checkpoint.contains_key("uid-vm");
    assert_eq!(
        usize::from(prepared),
        vgpus(&node).len(),
        "{point}: after recovery, one vGPU exactly while the claim is recorded ({recovered:?})"
    );
    if prepared {
        recovered.assert_converged(&["uid-vm"], point);
    } else {
        assert_nothing_left(&node, &format!("{point}: after recovery"));
    }
    let mut kubelet = plugin.register(DraApi::V1).await;
    if in_prepare {
        prepare_one(&mut kubelet, &claim)
            .await
            .unwrap_or_else(|e| panic!("{point}: retry: {e}"));
        assert_eq!(1, vgpus(&node).len(), "{point}: after the retry");
    }
    kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_nothing_left(&node, &format!("{point}: at the end"));
}

/// The lifecycle's crash points a vGPU claim passes (no MIG, no sharing), then `own`, in
/// the order a prepare and an unprepare pass them.
fn points(own_prepare: &[&'static str], own_unprepare: &[&'static str]) -> Vec<&'static str> {
    let mut out = vec!["prepare-intent-recorded"];
    out.extend_from_slice(own_prepare);
    out.extend([
        "prepare-vgpu-created",
        "prepare-metadata-written",
        "prepare-cdi-written",
        "prepare-completed",
        "unprepare-started",
        "unprepare-cdi-removed",
    ]);
    out.extend_from_slice(own_unprepare);
    out.push("unprepare-vgpu-deleted");
    out
}

#[tokio::test]
async fn a_crash_at_every_step_of_a_vdev_vgpu_converges_after_restart() {
    for point in points(&["vgpu-vdev-written"], &["vgpu-vdev-deleted"]) {
        crash_and_recover(H100, "H100-4C", "vgpu-0-4c-0", point).await;
    }
}

#[tokio::test]
async fn a_crash_at_every_step_of_an_mdev_vgpu_converges_after_restart() {
    for point in points(&["vgpu-mdev-created"], &["vgpu-mdev-removed"]) {
        crash_and_recover(T4, "T4-4Q", "vgpu-0-4q-0", point).await;
    }
}

#[test]
fn every_vgpu_crash_point_is_exercised() {
    let mut tested: Vec<&str> = points(&["vgpu-vdev-written"], &["vgpu-vdev-deleted"]);
    tested.extend(points(&["vgpu-mdev-created"], &["vgpu-mdev-removed"]));
    for point in gpu_dra::claims::vgpu::CRASH_POINTS {
        assert!(tested.contains(point), "{point} is not crashed at");
    }
}

/// The plugin's start-up log runs `doctor --vgpu`'s node checks on what its inventory just
/// read: VFs not enabled are a failed check in the first lines, with the fix, not news at the
/// first claim.
#[tokio::test]
async fn the_start_up_checks_say_when_the_vfs_are_not_enabled() {
    let node = Node::new().with_sim_node(H100);
    power_on(&node, H100);
    let kernel = SimKernel::new(host_root(&node));
    use gpu_dra::hardware::passthrough::SysfsKernel;
    kernel
        .write(
            &pci_device(&node, &gpu_address(0)).join("sriov_numvfs"),
            "0",
        )
        .unwrap();
    let plugin = start(&node, "H100-4C", &[]).await;
    plugin_support::eventually("the start-up checks' summary", || {
        plugin
            .log()
            .contains("doctor --quick at start")
            .then_some(())
    })
    .await;
    let log = plugin.log();
    let line = log
        .lines()
        .find(|l| l.contains("check failed") && l.contains("vgpu-vfs"))
        .unwrap_or_else(|| panic!("no failed vgpu-vfs check at start:\n{log}"));
    assert!(line.contains("sriov-manage -e ALL"), "{line}");
    assert!(
        !log.lines()
            .any(|l| l.contains("vgpu-manager") && l.contains("check")),
        "the vGPU manager is there: its check passes (logged at debug only):\n{log}"
    );
}
