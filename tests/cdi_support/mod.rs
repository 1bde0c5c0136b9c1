//! A fake GPU host in a temp dir, shared by the CDI integration tests. Device nodes are
//! symlinks to real character devices (`/dev/null` is 1:3, `/dev/zero` 1:5, …) so no test
//! needs mknod or root.
// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::PathBuf;

use gpu_dra::cdi::{
    ClaimDevice, ClaimNaming, DriverOptions, GpuDeviceRef, HostLayout, HostMode, Spec,
    build_claim_spec,
};
use tempfile::TempDir;

pub const UID: &str = "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b";
pub const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";

pub struct FakeHost {
    _tmp: TempDir,
    pub root: PathBuf,
    pub layout: HostLayout,
}

impl FakeHost {
    /// A node with GPUs 0 and 1, control nodes, MIG caps for gpu0/gi9/ci0 and a driver.
    pub fn standard() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let layout = HostLayout {
            dev_root: root.join("host"),
            proc_root: root.join("proc"),
            driver_root: root.join("driver"),
            host_driver_root: None,
        };
        let host = FakeHost {
            _tmp: tmp,
            root,
            layout,
        };
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
        host.file(
            &format!("{caps}/access"),
            "DeviceFileMinor: 84\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
            0o444,
        );
        host.file(
            &format!("{caps}/ci0/access"),
            "DeviceFileMinor: 85\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
            0o444,
        );
        for lib in [
            "libcuda.so.580.65.06",
            "libnvidia-ml.so.580.65.06",
            "vdpau/libvdpau_nvidia.so.580.65.06",
        ] {
            host.file(&format!("driver/{LIBDIR}/{lib}"), "", 0o644);
        }
        host.link(
            &format!("driver/{LIBDIR}/libcuda.so.1"),
            "libcuda.so.580.65.06",
        );
        host.link(&format!("driver/{LIBDIR}/libcuda.so"), "libcuda.so.1");
        host.link(
            &format!("driver/{LIBDIR}/libnvidia-ml.so.1"),
            "libnvidia-ml.so.580.65.06",
        );
        host.file("driver/usr/bin/nvidia-smi", "", 0o755);
        host.file("driver/usr/bin/nvidia-debugdump", "", 0o644); // not executable: skipped
        host.file(
            "driver/usr/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin",
            "",
            0o644,
        );
        host.file("driver/run/nvidia-persistenced/socket", "", 0o666);
        host.file("driver/etc/vulkan/icd.d/nvidia_icd.json", "{}", 0o644);
        // Merged /usr: libraries and firmware are also reachable through the absolute link
        // /lib -> /usr/lib, which must resolve inside the driver root and be found once.
        // Created last: writing through it from the test would land in the real /usr/lib.
        host.link("driver/lib", "/usr/lib");
        host
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn file(&self, rel: &str, content: &str, mode: u32) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let real_parent = fs::canonicalize(path.parent().unwrap()).unwrap();
        assert!(
            real_parent.starts_with(fs::canonicalize(&self.root).unwrap()),
            "{rel} escapes the fake host"
        );
        fs::write(&path, content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }

    pub fn link(&self, rel: &str, target: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, path).unwrap();
    }

    pub fn mode(&self, hook: Option<&str>) -> HostMode {
        HostMode::Real {
            layout: self.layout.clone(),
            driver: DriverOptions {
                cdi_hook_path: hook.map(PathBuf::from),
                driver_version: None,
            },
        }
    }
}

pub fn full(name: &str, minor: u32, uuid: &str) -> ClaimDevice {
    ClaimDevice {
        device_name: name.into(),
        share_id: None,
        gpu: GpuDeviceRef::Full {
            minor,
            uuid: uuid.into(),
        },
        env: vec![],
        mounts: vec![],
    }
}

pub fn mig() -> ClaimDevice {
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

pub fn build(mode: &HostMode, devices: &[ClaimDevice]) -> Result<Spec, String> {
    let gpus: Vec<GpuDeviceRef> = devices.iter().map(|d| d.gpu.clone()).collect();
    let facts = mode.facts(&gpus).map_err(|e| chain(&e))?;
    build_claim_spec(&ClaimNaming::default(), UID, devices, &facts).map_err(|e| chain(&e))
}

pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}
