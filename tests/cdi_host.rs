//! Discovery against a fake host in a temp dir, and schema validation of every kind of spec
//! the driver produces. Device nodes are symlinks to real character devices (`/dev/null`
//! is 1:3, `/dev/zero` 1:5, …) so no test needs mknod or root.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use gpu_dra::cdi::{
    ClaimDevice, ClaimNaming, DeviceNode, DiscoverError, DriverOptions, GpuDeviceRef, HostLayout,
    HostMode, Mount, SimulatedHost, Spec, build_claim_spec,
};
use tempfile::TempDir;

const UID: &str = "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b";
const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";

struct FakeHost {
    _tmp: TempDir,
    root: PathBuf,
    layout: HostLayout,
}

impl FakeHost {
    /// A node with GPUs 0 and 1, control nodes, MIG caps for gpu0/gi9/ci0 and a driver.
    fn standard() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let layout = HostLayout {
            dev_root: root.join("host"),
            proc_root: root.join("proc"),
            driver_root: root.join("driver"),
            host_driver_root: None,
        };
        let host = FakeHost { _tmp: tmp, root, layout };
        for (name, real) in [
            ("nvidia0", "/dev/null"),
            ("nvidia1", "/dev/zero"),
            ("nvidiactl", "/dev/full"),
            ("nvidia-uvm", "/dev/random"),
            ("nvidia-uvm-tools", "/dev/urandom"),
        ] {
            host.link(&format!("host/dev/{name}"), real);
        }
        host.file(
            "proc/devices",
            "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n",
            0o444,
        );
        host.file("proc/sys/kernel/osrelease", "6.8.0-test\n", 0o444);
        let caps = "proc/driver/nvidia/capabilities/gpu0/mig/gi9";
        host.file(&format!("{caps}/access"), "DeviceFileMinor: 84\nDeviceFileMode: 292\nDeviceFileModify: 1\n", 0o444);
        host.file(&format!("{caps}/ci0/access"), "DeviceFileMinor: 85\nDeviceFileMode: 292\nDeviceFileModify: 1\n", 0o444);
        for lib in ["libcuda.so.580.65.06", "libnvidia-ml.so.580.65.06", "vdpau/libvdpau_nvidia.so.580.65.06"] {
            host.file(&format!("driver/{LIBDIR}/{lib}"), "", 0o644);
        }
        host.link(&format!("driver/{LIBDIR}/libcuda.so.1"), "libcuda.so.580.65.06");
        host.link(&format!("driver/{LIBDIR}/libcuda.so"), "libcuda.so.1");
        host.link(&format!("driver/{LIBDIR}/libnvidia-ml.so.1"), "libnvidia-ml.so.580.65.06");
        host.file("driver/usr/bin/nvidia-smi", "", 0o755);
        host.file("driver/usr/bin/nvidia-debugdump", "", 0o644); // not executable: skipped
        host.file("driver/usr/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin", "", 0o644);
        host.file("driver/run/nvidia-persistenced/socket", "", 0o666);
        host.file("driver/etc/vulkan/icd.d/nvidia_icd.json", "{}", 0o644);
        // Merged /usr: libraries and firmware are also reachable through the absolute link
        // /lib -> /usr/lib, which must resolve inside the driver root and be found once.
        // Created last: writing through it from the test would land in the real /usr/lib.
        host.link("driver/lib", "/usr/lib");
        host
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn file(&self, rel: &str, content: &str, mode: u32) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let real_parent = fs::canonicalize(path.parent().unwrap()).unwrap();
        assert!(real_parent.starts_with(fs::canonicalize(&self.root).unwrap()), "{rel} escapes the fake host");
        fs::write(&path, content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn link(&self, rel: &str, target: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, path).unwrap();
    }

    fn mode(&self, hook: Option<&str>) -> HostMode {
        HostMode::Real {
            layout: self.layout.clone(),
            driver: DriverOptions {
                cdi_hook_path: hook.map(PathBuf::from),
                driver_version: None,
            },
        }
    }
}

fn full(name: &str, minor: u32, uuid: &str) -> ClaimDevice {
    ClaimDevice {
        device_name: name.into(),
        share_id: None,
        gpu: GpuDeviceRef::Full { minor, uuid: uuid.into() },
        env: vec![],
        mounts: vec![],
    }
}

fn mig() -> ClaimDevice {
    ClaimDevice {
        device_name: "gpu-0-mig-1g10gb-19-0".into(),
        share_id: None,
        gpu: GpuDeviceRef::Mig {
            parent_minor: 0,
            parent_uuid: "GPU-aaa".into(),
            gi: 9,
            ci: 0,
            uuid: "MIG-bbb".into(),
        },
        env: vec![],
        mounts: vec![],
    }
}

fn build(mode: &HostMode, devices: &[ClaimDevice]) -> Result<Spec, String> {
    let gpus: Vec<GpuDeviceRef> = devices.iter().map(|d| d.gpu.clone()).collect();
    let facts = mode.facts(&gpus).map_err(|e| chain(&e))?;
    build_claim_spec(&ClaimNaming::default(), UID, devices, &facts).map_err(|e| chain(&e))
}

fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

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
    Mount::read_only_bind(host.path(rel).to_string_lossy().into_owned(), container.into())
}

#[test]
fn full_gpu_spec_on_a_real_host_lists_nodes_driver_files_and_env() {
    let host = FakeHost::standard();
    let got = build(&host.mode(None), &[full("gpu-1", 1, "GPU-ccc")]).unwrap();
    let dev = |name: &str| host.path(&format!("host/dev/{name}"));
    let lib = |name: &str| format!("/{LIBDIR}/{name}");
    let want_common = gpu_dra::cdi::ContainerEdits {
        env: vec![format!("NVIDIA_CTK_LIBCUDA_DIR=/{LIBDIR}"), "NVIDIA_VISIBLE_DEVICES=void".into()],
        device_nodes: vec![
            stat_node("/dev/nvidiactl", &dev("nvidiactl"), 7),
            stat_node("/dev/nvidia-uvm", &dev("nvidia-uvm"), 8),
            stat_node("/dev/nvidia-uvm-tools", &dev("nvidia-uvm-tools"), 9),
        ],
        mounts: vec![
            ro(&host, &format!("driver{}", lib("libcuda.so.580.65.06")), &lib("libcuda.so.580.65.06")),
            ro(&host, &format!("driver{}", lib("libnvidia-ml.so.580.65.06")), &lib("libnvidia-ml.so.580.65.06")),
            ro(&host, &format!("driver{}", lib("vdpau/libvdpau_nvidia.so.580.65.06")), &lib("vdpau/libvdpau_nvidia.so.580.65.06")),
            ro(&host, "driver/usr/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin", "/usr/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin"),
            ro(&host, "driver/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
            Mount {
                host_path: host.path("driver/run/nvidia-persistenced/socket").to_string_lossy().into_owned(),
                container_path: "/run/nvidia-persistenced/socket".into(),
                kind: None,
                options: ["nosuid", "nodev", "rbind", "rprivate", "noexec"].map(String::from).to_vec(),
            },
            ro(&host, "driver/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/icd.d/nvidia_icd.json"),
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
    assert_eq!((got.cdi_version.as_str(), got.devices[0].name.as_str()), ("0.5.0", &*format!("{UID}-gpu-1")));
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
    let want = vec![stat_node("/dev/nvidia0", &host.path("host/dev/nvidia0"), 3), cap(84), cap(85)];
    assert_eq!(got.devices[0].container_edits.device_nodes, want);
}

#[test]
fn hooks_recreate_host_library_links_and_refresh_the_ldcache() {
    let host = FakeHost::standard();
    let got = build(&host.mode(Some("/opt/hook/nvidia-cdi-hook")), &[full("gpu-0", 0, "GPU-aaa")]).unwrap();
    let args: Vec<String> = got.container_edits.hooks.iter().map(|h| h.args.join(" ")).collect();
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
    let wrong_root = HostMode::Real { layout: wrong_root, driver: DriverOptions::default() };
    let cases = [
        (build(&host.mode(None), &[full("gpu-7", 7, "GPU-x")]), "host/dev/nvidia7".to_string()),
        (build(&host.mode(None), &[no_ci]), "gpu0/mig/gi9/ci3/access".to_string()),
        (build(&wrong_root, &[full("gpu-0", 0, "GPU-aaa")]), "no libcuda.so.*.* under driver root".to_string()),
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
    assert!(err.contains("is a regular file, not a device node"), "got {err}");
}

#[test]
fn given_driver_version_must_match_the_installed_library() {
    let host = FakeHost::standard();
    let mode = HostMode::Real {
        layout: host.layout.clone(),
        driver: DriverOptions { cdi_hook_path: None, driver_version: Some("999.1".into()) },
    };
    let err = mode.facts(&[]).unwrap_err();
    assert!(matches!(err, DiscoverError::DriverFiles { .. }), "got {err:?}");
}

// ---- schema validation of everything we emit ----

fn schema_validator() -> jsonschema::Validator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi-schema");
    let schema_text = fs::read_to_string(dir.join("schema.json")).unwrap().replace("defs.json#", "#");
    let mut schema: serde_json::Value = serde_json::from_str(&schema_text).unwrap();
    let defs: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("defs.json")).unwrap()).unwrap();
    schema["definitions"] = defs["definitions"].clone();
    jsonschema::validator_for(&schema).unwrap()
}

fn assert_valid(what: &str, spec: &Spec) {
    let validator = schema_validator();
    let instance = serde_json::to_value(spec).unwrap();
    let errors: Vec<String> = validator.iter_errors(&instance).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert_eq!(errors, Vec::<String>::new(), "{what}");
}

#[test]
fn schema_rejects_what_it_should_so_validation_is_meaningful() {
    let validator = schema_validator();
    let missing_devices = serde_json::json!({"cdiVersion": "0.3.0", "kind": "a/b"});
    let bad_node = serde_json::json!({"cdiVersion": "0.3.0", "kind": "a/b",
        "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"hostPath": "/x"}]}}]});
    let got = (validator.is_valid(&missing_devices), validator.is_valid(&bad_node));
    assert_eq!(got, (false, false));
}

#[test]
fn every_kind_of_spec_we_produce_validates_against_the_official_schema() {
    let host = FakeHost::standard();
    let hook = host.mode(Some("/opt/hook/nvidia-cdi-hook"));
    let mut mps = full("gpu-1", 1, "GPU-ccc");
    mps.share_id = Some("share-1".into());
    mps.env = vec![("CUDA_MPS_PIPE_DIRECTORY".into(), "/tmp/nvidia-mps".into())];
    mps.mounts = vec![Mount {
        host_path: "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/x/pipe".into(),
        container_path: "/tmp/nvidia-mps".into(),
        kind: None,
        options: vec!["rw".into(), "nosuid".into(), "nodev".into(), "bind".into()],
    }];
    let sim = HostMode::Simulated(SimulatedHost {
        common_nodes: SimulatedHost::standard_control_nodes(510),
        device_nodes: BTreeMap::from([
            ("GPU-aaa".to_string(), vec![SimulatedHost::char_node("/dev/nvidia0", 195, 0)]),
            ("MIG-bbb".to_string(), vec![SimulatedHost::char_node("/dev/nvidia0", 195, 0)]),
        ]),
    });
    let cases = [
        ("full GPU", build(&hook, &[full("gpu-0", 0, "GPU-aaa")])),
        ("MIG", build(&hook, &[mig()])),
        ("multiple devices", build(&hook, &[full("gpu-0", 0, "GPU-aaa"), full("gpu-1", 1, "GPU-ccc"), mig()])),
        ("MPS share", build(&hook, &[mps])),
        ("simulated node", build(&sim, &[full("gpu-0", 0, "GPU-aaa"), mig()])),
    ];
    for (what, spec) in cases {
        assert_valid(what, &spec.unwrap());
    }
}
