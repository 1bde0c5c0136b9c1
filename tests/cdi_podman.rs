//! The plugin's CDI specs through a real container runtime: claims prepared over the real
//! binary's gRPC socket (as the kubelet prepares them), their specs read by podman 4.3 + runc
//! through the reference CDI library, and the container asked what it got — env, device
//! nodes (type, major/minor, mode), mounts and what their sources hold, and that a container
//! given one request of a claim sees nothing of the others.
//!
//! Needs podman, runc, busybox-static and root; elsewhere each test skips with one line, and
//! under `CI=true` a missing tool fails it (`.ci/run` installs them).

mod plugin_support;
mod podman_support;

use gpu_dra::plugin::simhost::SIM_CAPS_MAJOR;
use plugin_support::claims::{self, DRIVER, NODE};
use plugin_support::sharing::{
    as_share, daemon_dirs, daemon_pid, mps_config, smi_state, with_config,
};
use podman_support::rig::{Rig, cdi_ids, gpu_nodes};
use serde_json::json;

/// A full GPU: its own node, its UUID, the control nodes, nothing else.
#[tokio::test]
async fn a_full_gpu_container_gets_its_node_and_uuid() {
    let Some(mut rig) = Rig::start(&[]).await else {
        return;
    };
    let uid = rig.uid("full");
    let devices = rig.prepare(claims::on_node("full", &uid, &["gpu-1"])).await;
    let uuid = rig.published_uuid("gpu-1");
    let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&uuid]);
    assert_eq!(gpu_nodes(&inside), vec!["/dev/nvidia1"]);
    let gpu = &inside.nvidia_nodes["/dev/nvidia1"];
    assert_eq!((gpu.major, gpu.minor, gpu.mode), (195, 1, 0o666));
    for control in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
        assert!(
            inside.nvidia_nodes.contains_key(control),
            "{control}: {inside:#?}"
        );
    }
    rig.unprepare("full", &uid).await;
}

/// MIG: the parent's node plus the two capability nodes of its GPU and compute instance.
fn assert_mig_nodes(inside: &podman_support::Inside, parent_minor: u32) {
    let parent = format!("/dev/nvidia{parent_minor}");
    assert_eq!(gpu_nodes(inside), vec![parent.clone()]);
    assert_eq!(inside.nvidia_nodes[&parent].major, 195);
    let caps: Vec<_> = inside
        .nvidia_nodes
        .iter()
        .filter(|(path, _)| path.starts_with("/dev/nvidia-caps/nvidia-cap"))
        .collect();
    assert_eq!(caps.len(), 2, "GI and CI capability nodes: {caps:#?}");
    assert!(caps.iter().all(|(_, n)| n.major == SIM_CAPS_MAJOR));
}

#[tokio::test]
async fn a_static_mig_container_gets_the_parent_and_capability_nodes() {
    let Some(mut rig) = Rig::start(&[]).await else {
        return;
    };
    let uid = rig.uid("static-mig");
    let device = "gpu-0-mig-2g10gb-2";
    let devices = rig
        .prepare(claims::on_node("static-mig", &uid, &[device]))
        .await;
    let uuid = rig.published_uuid(device);
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&uuid]);
    assert_mig_nodes(&inside, 0);
    rig.unprepare("static-mig", &uid).await;
}

#[tokio::test]
async fn a_dynamic_mig_container_gets_the_device_carved_for_it() {
    let Some(mut rig) = Rig::start(&[]).await else {
        return;
    };
    let uid = rig.uid("dynamic-mig");
    let before = rig.node.snapshot().hardware_mig_uuids();
    let devices = rig
        .prepare(claims::on_node(
            "dynamic-mig",
            &uid,
            &["gpu-2-mig-3g40gb-4"],
        ))
        .await;
    let carved: Vec<String> = rig
        .node
        .snapshot()
        .hardware_mig_uuids()
        .into_iter()
        .filter(|u| !before.contains(u))
        .collect();
    assert_eq!(carved.len(), 1, "one MIG device carved: {carved:?}");
    let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&carved[0]]);
    assert_mig_nodes(&inside, 2);
    rig.unprepare("dynamic-mig", &uid).await;
}

/// The daemon's pipe directory as the container sees it: the control socket and the pid
/// file of the daemon the plugin started.
fn assert_sees_daemon(rig: &Rig, inside: &podman_support::Inside) {
    let dirs = daemon_dirs(&rig.node);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let pid = daemon_pid(&rig.node, &dirs[0]).expect("daemon pid file");
    assert_eq!(inside.env["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/nvidia-mps");
    assert_eq!(inside.files["/tmp/nvidia-mps/control"], "socket");
    assert_eq!(
        inside.contents["/tmp/nvidia-mps/nvidia-cuda-mps-control.pid"].trim(),
        pid.to_string()
    );
    assert!(inside.mount_points.iter().any(|m| m == "/dev/shm"));
}

#[tokio::test]
async fn an_mps_container_on_a_full_gpu_sees_the_daemon_and_its_limits() {
    let Some(mut rig) = Rig::start(&[]).await else {
        return;
    };
    let uid = rig.uid("mps");
    let claim = with_config(
        claims::on_node("mps", &uid, &["gpu-3"]),
        &[],
        mps_config("GpuConfig", 50, "10Gi"),
    );
    let devices = rig.prepare(claim).await;
    let uuid = rig.published_uuid("gpu-3");
    let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&uuid]);
    assert_sees_daemon(&rig, &inside);
    assert_eq!(inside.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
    assert_eq!(inside.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=10240M");
    assert_eq!(gpu_nodes(&inside), vec!["/dev/nvidia3"]);
    rig.unprepare("mps", &uid).await;
}

#[tokio::test]
async fn an_mps_container_on_a_mig_device_sees_that_devices_daemon() {
    let Some(mut rig) = Rig::start(&[]).await else {
        return;
    };
    let uid = rig.uid("mig-mps");
    let device = "gpu-0-mig-3g20gb-4";
    let claim = with_config(
        claims::on_node("mig-mps", &uid, &[device]),
        &[],
        mps_config("MigDeviceConfig", 30, "8Gi"),
    );
    let devices = rig.prepare(claim).await;
    let uuid = rig.published_uuid(device);
    let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&uuid]);
    assert_sees_daemon(&rig, &inside);
    assert_eq!(inside.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    assert_mig_nodes(&inside, 0);
    rig.unprepare("mig-mps", &uid).await;
}

#[tokio::test]
async fn a_time_sliced_container_gets_its_gpu_while_the_interval_is_set() {
    let Some(mut rig) = Rig::start(&[]).await else {
        return;
    };
    let uid = rig.uid("ts");
    let config = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
    let devices = rig
        .prepare(with_config(
            claims::on_node("ts", &uid, &["gpu-4"]),
            &[],
            config,
        ))
        .await;
    let uuid = rig.published_uuid("gpu-4");
    assert_eq!(smi_state(&rig.node, &uuid), ("DEFAULT".to_string(), 3));
    let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&uuid]);
    assert_eq!(gpu_nodes(&inside), vec!["/dev/nvidia4"]);
    assert!(!inside.env.contains_key("CUDA_MPS_PIPE_DIRECTORY"));
    rig.unprepare("ts", &uid).await;
}

#[tokio::test]
async fn consumable_capacity_shares_each_see_their_own_limits_and_one_daemon() {
    let Some(mut rig) = Rig::start(&[("GPU_DRA_SHARED_GPUS", "4")]).await else {
        return;
    };
    let uuid = rig.published_uuid("gpu-5");
    let mut seen = Vec::new();
    let mut uids = Vec::new();
    for (name, share, memory, sms, want_pct, want_mem) in [
        ("share-a", "aaaa1111", "40Gi", "66", "50", "0=40960M"),
        ("share-b", "bbbb2222", "20Gi", "33", "25", "0=20480M"),
    ] {
        let uid = rig.uid(name);
        let claim = as_share(
            claims::on_node(name, &uid, &["gpu-5"]),
            0,
            share,
            json!({"memory": memory, "multiprocessors": sms}),
        );
        let devices = rig.prepare(claim).await;
        assert_eq!(devices[0].share_id.as_deref(), Some(share));
        let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&uuid]);
        let own = format!("DRA_GPU_UUID_GPU_5_{}", share.to_uppercase());
        assert_eq!(inside.env.get(&own), Some(&uuid), "{:#?}", inside.env);
        assert_eq!(inside.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], want_pct);
        assert_eq!(inside.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], want_mem);
        assert_sees_daemon(&rig, &inside);
        seen.push(inside.contents["/tmp/nvidia-mps/nvidia-cuda-mps-control.pid"].clone());
        uids.push((name, uid));
    }
    assert_eq!(seen[0], seen[1], "both shares use the one daemon of gpu-5");
    for (name, uid) in uids {
        rig.unprepare(name, &uid).await;
    }
}

#[tokio::test]
async fn a_container_naming_one_request_of_two_sees_only_that_device() {
    let Some(mut rig) = Rig::start(&[]).await else {
        return;
    };
    let uid = rig.uid("two");
    let claim = claims::allocated(
        "two",
        &uid,
        &[(DRIVER, NODE, "gpu-6"), (DRIVER, NODE, "gpu-7")],
    );
    let devices = rig.prepare(claim).await;
    let (six, seven) = (rig.published_uuid("gpu-6"), rig.published_uuid("gpu-7"));

    let first = rig.run_and_check(&uid, &cdi_ids(&devices, Some("gpu-0")), &[&six]);
    assert_eq!(gpu_nodes(&first), vec!["/dev/nvidia6"]);
    let second = rig.run_and_check(&uid, &cdi_ids(&devices, Some("gpu-1")), &[&seven]);
    assert_eq!(gpu_nodes(&second), vec!["/dev/nvidia7"]);
    for (inside, other) in [(&first, &seven), (&second, &six)] {
        let everything = format!("{:?}", inside.env);
        assert!(
            !everything.contains(other.as_str()),
            "a container given one request reads the other's UUID {other}: {everything}"
        );
    }
    let both = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[&six, &seven]);
    assert_eq!(gpu_nodes(&both), vec!["/dev/nvidia6", "/dev/nvidia7"]);
    rig.unprepare("two", &uid).await;
}

/// A VM's GPU (VFIO passthrough): the runtime creates the VFIO group node and the VFIO API
/// device from the spec, the container sees no NVIDIA node and no NVIDIA library, and the
/// request's device metadata file names the GPU's PCI address (what KubeVirt reads).
#[tokio::test]
async fn a_vfio_container_gets_the_group_node_the_api_device_and_the_pci_address() {
    let Some(mut rig) = Rig::start_passthrough().await else {
        return;
    };
    let uid = rig.uid("vm");
    let claim = with_config(
        claims::on_node("vm", &uid, &["gpu-vfio-1"]),
        &["gpu-0"],
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
               "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": true}}),
    );
    let devices = rig.prepare(claim).await;
    let inside = rig.run_and_check(&uid, &cdi_ids(&devices, None), &[]);
    let nodes: Vec<(&str, u32, u32)> = inside
        .nvidia_nodes
        .iter()
        .map(|(path, n)| (path.as_str(), n.major, n.minor))
        .collect();
    assert_eq!(
        vec![("/dev/vfio/2", 511, 1), ("/dev/vfio/vfio", 10, 196)],
        nodes
    );
    let metadata = inside
        .contents
        .iter()
        .find(|(path, _)| path.ends_with("/gpu-0/gpu.nvidia.com-metadata.json"))
        .map(|(_, text)| text.clone())
        .unwrap_or_else(|| panic!("no metadata file: {:?}", inside.contents.keys()));
    let bus = gpu_dra::hardware::sim::ids::pci_address(1).0;
    assert!(
        metadata.contains(&format!(
            "\"resource.kubernetes.io/pciBusID\":{{\"string\":\"{bus}\"}}"
        )),
        "{metadata}"
    );
    rig.unprepare("vm", &uid).await;
}
