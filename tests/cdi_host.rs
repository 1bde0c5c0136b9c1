//! Discovery against a fake host in a temp dir: device nodes, MIG capability files,
//! `/proc/devices` and a driver root.

mod cdi_support;

use std::path::Path;

use cdi_support::{FakeHost, LIBDIR, UID, build, full, mig};
use gpu_dra::cdi::{DeviceNode, DiscoverError, DriverOptions, GpuDeviceRef, HostMode, Mount};

fn stat_node(path: &str, host: &Path, minor: i64) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        host_path: Some(host.to_string_lossy().into_owned()),
        major: Some(1),
        minor: Some(minor),
        file_mode: Some(0o666),
        permissions: Some("rwm".into()),
        ..DeviceNode::default()
    }
}

fn ro(host: &FakeHost, rel: &str, container: &str) -> Mount {
    Mount::read_only_bind(
        host.path(rel).to_string_lossy().into_owned(),
        container.into(),
    )
}

#[test]
fn full_gpu_spec_on_a_real_host_lists_nodes_driver_files_and_env() {
    let host = FakeHost::standard();
    let got = build(&host.mode(None), &[full("gpu-1", 1, "GPU-ccc")]).unwrap();
    let dev = |name: &str| host.path(&format!("host/dev/{name}"));
    let lib = |name: &str| format!("/{LIBDIR}/{name}");
    let want_common = gpu_dra::cdi::ContainerEdits {
        env: vec![
            format!("NVIDIA_CTK_LIBCUDA_DIR=/{LIBDIR}"),
            "NVIDIA_VISIBLE_DEVICES=void".into(),
        ],
        device_nodes: vec![
            stat_node("/dev/nvidiactl", &dev("nvidiactl"), 7),
            stat_node("/dev/nvidia-uvm", &dev("nvidia-uvm"), 8),
            stat_node("/dev/nvidia-uvm-tools", &dev("nvidia-uvm-tools"), 9),
        ],
        mounts: vec![
            ro(
                &host,
                &format!("driver{}", lib("libcuda.so.580.65.06")),
                &lib("libcuda.so.580.65.06"),
            ),
            ro(
                &host,
                &format!("driver{}", lib("libnvidia-ml.so.580.65.06")),
                &lib("libnvidia-ml.so.580.65.06"),
            ),
            ro(
                &host,
                &format!("driver{}", lib("vdpau/libvdpau_nvidia.so.580.65.06")),
                &lib("vdpau/libvdpau_nvidia.so.580.65.06"),
            ),
            ro(
                &host,
                "driver/usr/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin",
                "/usr/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin",
            ),
            ro(&host, "driver/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
            Mount {
                host_path: host
                    .path("driver/run/nvidia-persistenced/socket")
                    .to_string_lossy()
                    .into_owned(),
                container_path: "/run/nvidia-persistenced/socket".into(),
                kind: None,
                options: ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
                    .map(String::from)
                    .to_vec(),
            },
            ro(
                &host,
                "driver/etc/vulkan/icd.d/nvidia_icd.json",
                "/etc/vulkan/icd.d/nvidia_icd.json",
            ),
        ],
        ..Default::default()
    };
    assert_eq!(got.container_edits, want_common);
    let want_device = gpu_dra::cdi::ContainerEdits {
        env: vec!["DRA_GPU_UUID_GPU_1=GPU-ccc".into()],
        device_nodes: vec![stat_node("/dev/nvidia1", &dev("nvidia1"), 5)],
        ..Default::default()
    };
    assert_eq!(got.devices[0].container_edits, want_device);
    assert_eq!(
        (got.cdi_version.as_str(), got.devices[0].name.as_str()),
        ("0.5.0", &*format!("{UID}-gpu-1"))
    );
}

#[test]
fn mig_device_gets_parent_node_and_typed_caps_nodes_from_proc() {
    let host = FakeHost::standard();
    let got = build(&host.mode(None), &[mig()]).unwrap();
    let cap = |minor| DeviceNode {
        path: format!("/dev/nvidia-caps/nvidia-cap{minor}"),
        kind: Some("c".into()),
        major: Some(508),
        minor: Some(minor),
        file_mode: Some(292),
        ..DeviceNode::default()
    };
    let want = vec![
        stat_node("/dev/nvidia0", &host.path("host/dev/nvidia0"), 3),
        cap(84),
        cap(85),
    ];
    assert_eq!(got.devices[0].container_edits.device_nodes, want);
}

#[test]
fn hooks_recreate_host_library_links_and_refresh_the_ldcache() {
    let host = FakeHost::standard();
    let got = build(
        &host.mode(Some("/opt/hook/nvidia-cdi-hook")),
        &[full("gpu-0", 0, "GPU-aaa")],
    )
    .unwrap();
    let args: Vec<String> = got
        .container_edits
        .hooks
        .iter()
        .map(|h| h.args.join(" "))
        .collect();
    let want = vec![
        format!(
            "nvidia-cdi-hook create-symlinks --link libcuda.so.1::/{LIBDIR}/libcuda.so \
             --link libcuda.so.580.65.06::/{LIBDIR}/libcuda.so.1 \
             --link libnvidia-ml.so.580.65.06::/{LIBDIR}/libnvidia-ml.so.1"
        ),
        "nvidia-cdi-hook enable-cuda-compat --host-driver-version=580.65.06".to_string(),
        format!("nvidia-cdi-hook update-ldcache --folder /{LIBDIR} --folder /{LIBDIR}/vdpau"),
        "nvidia-cdi-hook disable-device-node-modification".to_string(),
    ];
    assert_eq!(args, want);
}

#[test]
fn missing_required_files_are_errors_naming_the_path() {
    let host = FakeHost::standard();
    let mut no_ci = mig();
    if let GpuDeviceRef::Mig { ci, .. } = &mut no_ci.gpu {
        *ci = 3;
    }
    let mut wrong_root = host.layout.clone();
    wrong_root.driver_root = host.path("nowhere");
    let wrong_root = HostMode::Real {
        layout: wrong_root,
        driver: DriverOptions::default(),
    };
    let cases = [
        (
            build(&host.mode(None), &[full("gpu-7", 7, "GPU-x")]),
            "host/dev/nvidia7".to_string(),
        ),
        (
            build(&host.mode(None), &[no_ci]),
            "gpu0/mig/gi9/ci3/access".to_string(),
        ),
        (
            build(&wrong_root, &[full("gpu-0", 0, "GPU-aaa")]),
            "no libcuda.so.*.* under driver root".to_string(),
        ),
    ];
    for (got, want) in cases {
        let err = got.unwrap_err();
        assert!(err.contains(&want), "want {want:?} in {err:?}");
    }
}

#[test]
fn a_regular_file_posing_as_a_gpu_node_is_rejected() {
    let host = FakeHost::standard();
    host.file("host/dev/nvidia2", "", 0o666);
    let err = build(&host.mode(None), &[full("gpu-2", 2, "GPU-x")]).unwrap_err();
    assert!(
        err.contains("is a regular file, not a device node"),
        "got {err}"
    );
}

#[test]
fn given_driver_version_must_match_the_installed_library() {
    let host = FakeHost::standard();
    let mode = HostMode::Real {
        layout: host.layout.clone(),
        driver: DriverOptions {
            cdi_hook_path: None,
            driver_version: Some("999.1".into()),
        },
    };
    let err = mode.facts(&[]).unwrap_err();
    assert!(
        matches!(err, DiscoverError::DriverFiles { .. }),
        "got {err:?}"
    );
}
