//! A real CDI consumer: podman 4.3 with runc, reading the plugin's specs through the reference
//! `container-device-interface` library, as a kubelet's runtime would.
//!
//! * [`podman_or_skip`]: the test runs where podman and root are available, and must under
//!   `CI=true`;
//! * [`image`]: a busybox image made once per test run with `podman import` from a rootfs of
//!   `busybox-static` and its applet links (no registry);
//! * [`InstalledSpecs`]: the plugin's specs copied where podman 4.3 reads them (`/etc/cdi`;
//!   it has no setting for other directories) under a prefix unique to this process, removed
//!   on drop, also when the test fails;
//! * [`run`]: `podman run --device <CDI ID>…` with a script that reports what the container
//!   sees, parsed into [`Inside`].
#![allow(dead_code)]

mod inside;
pub mod rig;

pub use inside::{Inside, Node};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Where podman 4.3 reads CDI specs (with `/var/run/cdi`); the test's copies go here.
pub const CDI_DIR: &str = "/etc/cdi";
/// The image the containers run; rebuilt once per test run.
pub const IMAGE: &str = "localhost/gpu-dra-cdi-busybox:test";
/// File-name prefix of the specs test runs install, followed by the run's pid.
const PREFIX: &str = "gpu-dra-podman-test-";
const BUSYBOX: &str = "/bin/busybox";

/// Whether podman tests can run here. `None` (after printing the one-line reason) when podman
/// or root is missing outside CI.
///
/// # Panics
/// Under `CI=true` when they are missing: CI must run the test (`.ci/run` installs podman).
pub fn podman_or_skip() -> Option<()> {
    let missing = if Command::new("podman")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        Some("podman is not installed (apt-get install podman runc busybox-static)")
    } else if !is_root() {
        Some("podman needs root to create device nodes")
    } else if !Path::new(BUSYBOX).exists() {
        Some("busybox-static is not installed (apt-get install busybox-static)")
    } else {
        None
    };
    match missing {
        None => Some(()),
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but {reason}: .ci/run installs what the podman test needs")
        }
        Some(reason) => {
            eprintln!("skipped: {reason}");
            None
        }
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// The busybox image, imported on first use in this process.
///
/// # Panics
/// When the rootfs or the import fails, with podman's message.
pub fn image() -> &'static str {
    static IMPORTED: OnceLock<()> = OnceLock::new();
    IMPORTED.get_or_init(import_image);
    IMAGE
}

fn import_image() {
    assert!(
        is_static(Path::new(BUSYBOX)),
        "{BUSYBOX} is dynamically linked: install busybox-static, the image has no libc"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("rootfs");
    let bin = root.join("bin");
    for sub in ["bin", "tmp", "dev", "proc", "sys", "etc"] {
        std::fs::create_dir_all(root.join(sub)).expect("rootfs dir");
    }
    std::fs::copy(BUSYBOX, bin.join("busybox")).expect("copy busybox");
    let list = output(Command::new(BUSYBOX).arg("--list"));
    for applet in list.lines().filter(|a| !a.is_empty() && *a != "busybox") {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet link");
    }
    let tar = dir.path().join("rootfs.tar");
    output(
        Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    );
    // The previous run's image is replaced; remove it unless a running test still uses it.
    let old = Command::new("podman")
        .args(["image", "inspect", "--format", "{{.Id}}", IMAGE])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    output(
        Command::new("podman")
            .args(["import", "--quiet", "--change", "CMD=[\"sh\"]"])
            .arg(&tar)
            .arg(IMAGE),
    );
    if let Some(old) = old.filter(|id| !id.is_empty()) {
        let _ = Command::new("podman")
            .args(["rmi", &old])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether an ELF executable has no program interpreter (`PT_INTERP`), i.e. is static.
fn is_static(path: &Path) -> bool {
    let Ok(elf) = std::fs::read(path) else {
        return false;
    };
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    // 64-bit little-endian ELF: e_phoff at 0x20, e_phentsize at 0x36, e_phnum at 0x38.
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return false;
    }
    let (Some(phoff), Some(size), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    const PT_INTERP: u32 = 3;
    (0..usize::from(count)).all(|i| {
        let at = phoff as usize + i * usize::from(size);
        elf.get(at..at + 4)
            .is_some_and(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) != PT_INTERP)
    })
}

fn output(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The plugin's specs, copied into [`CDI_DIR`]; removed on drop.
pub struct InstalledSpecs {
    files: Vec<PathBuf>,
}

impl InstalledSpecs {
    /// Copies every `*.json` spec of `cdi_root` into [`CDI_DIR`] as
    /// `gpu-dra-podman-test-<pid>-<name>`. Files an earlier, killed run left behind (its pid
    /// no longer alive) are removed first.
    pub fn install(cdi_root: &Path) -> InstalledSpecs {
        std::fs::create_dir_all(CDI_DIR).expect("create /etc/cdi");
        remove_stale();
        let mut files = Vec::new();
        let guard_prefix = format!("{PREFIX}{}-", std::process::id());
        for entry in std::fs::read_dir(cdi_root).expect("read the plugin's CDI root") {
            let path = entry.expect("dir entry").path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if !name.ends_with(".json") {
                continue;
            }
            let target = Path::new(CDI_DIR).join(format!("{guard_prefix}{name}"));
            std::fs::copy(&path, &target).expect("copy the spec into /etc/cdi");
            files.push(target);
        }
        assert!(!files.is_empty(), "the plugin wrote no CDI spec");
        InstalledSpecs { files }
    }
}

impl Drop for InstalledSpecs {
    fn drop(&mut self) {
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}

fn remove_stale() {
    let Ok(entries) = std::fs::read_dir(CDI_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Runs a container given `cdi_ids` (exactly as the plugin returned them) and reports what
/// it sees: env, `/dev/nvidia*` nodes, mount points, and every file under `dirs` with the
/// contents of small regular files.
///
/// # Panics
/// When podman fails (e.g. an unresolvable CDI device), with its message.
pub fn run(cdi_ids: &[String], dirs: &[&str]) -> Inside {
    let mut command = Command::new("podman");
    command.args([
        "run",
        "--rm",
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "none",
    ]);
    for id in cdi_ids {
        command.args(["--device", id]);
    }
    command
        .arg(image())
        .args(["sh", "-c", &inside::script(dirs)])
        .stdin(Stdio::null());
    let out = command.output().expect("run podman");
    assert!(
        out.status.success(),
        "podman run --device {} failed ({}): {}",
        cdi_ids.join(" --device "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Inside::parse(&String::from_utf8_lossy(&out.stdout))
}
