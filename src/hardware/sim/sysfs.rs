//! The simulated node's host tree for VFIO passthrough: the sysfs files and `/dev/vfio`
//! nodes the production code ([`crate::hardware::passthrough`]) reads and writes, and
//! [`SimKernel`], the simulator's stand-in for the kernel that acts on those writes.
//!
//! The tree lives in `<state dir>/host-root` (the plugin's default `--host-root` with the sim
//! backend) and is shared, like the rest of the state, by every process using the node:
//!
//! ```text
//! sys/devices/<pcie root>/<addr>/{vendor,device,class,numa_node,sriov_numvfs,
//!                                 driver_override,modalias,driver -> bus/pci/drivers/<d>,
//!                                 iommu_group -> kernel/iommu_groups/<g>, vfio-dev/vfioN}
//! sys/bus/pci/devices/<addr> -> ../../../devices/<pcie root>/<addr>
//! sys/bus/pci/drivers/{nvidia,vfio-pci,mlx5_core}/{bind,unbind}
//! sys/kernel/iommu_groups/<g>/devices/<addr> -> ../../../../devices/<pcie root>/<addr>
//! sys/module/{nvidia,vfio,vfio_pci}/
//! dev/vfio/vfio, dev/vfio/<g> (while vfio-pci drives a member), dev/iommu (iommufd),
//! dev/vfio/devices/vfioN
//! ```
//!
//! GPUs with a `vgpu:` section also get their SR-IOV virtual functions or mdev types
//! ([`super::vgpu`], which also answers writes to them); the tree is then built even without
//! a `passthrough:` section (the IOMMU on).
//!
//! GPU `i` sits in IOMMU group `i + 1` at its simulated PCI address; a GPU listed in
//! `passthrough.sharedGroup` shares its group with a network card (`0x15b3`, class
//! `0x020000`, on `mlx5_core`). The simulated NVML stops listing a GPU whose `driver` link
//! does not name `nvidia`, as the real one does.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::SimError;
use crate::hardware::passthrough::{NVIDIA_DRIVER, SysfsKernel, VFIO_DRIVER};

/// `passthrough:` of a node file: the host's IOMMU as the simulated tree shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PassthroughSpec {
    /// The IOMMU is on (`sys/kernel/iommu_groups` populated); default true.
    #[serde(default = "yes")]
    pub iommu: bool,
    /// The kernel offers iommufd (`dev/iommu`, `vfio-dev/vfioN`); default false.
    #[serde(default)]
    pub iommufd: bool,
    /// GPU indices whose IOMMU group also holds a network card.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_group: Vec<u32>,
}

fn yes() -> bool {
    true
}

/// The directory of the host tree in a state directory.
pub fn host_root(state_dir: &Path) -> PathBuf {
    state_dir.join("host-root")
}

/// Written last when the tree is built: a tree with it is never rebuilt (the drivers bound
/// in it are the node's state).
const BUILT: &str = ".sim-host-tree";

/// The network card's address in a shared group.
fn nic_address(gpu: u32) -> String {
    format!("0000:{:02x}:00.1", 0x80 + gpu)
}

pub(super) fn fs_err(path: &Path, step: &'static str) -> impl FnOnce(std::io::Error) -> SimError {
    let path = path.to_path_buf();
    move |source| SimError::StateIo { path, step, source }
}

pub(super) fn write(path: &Path, text: &str) -> Result<(), SimError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fs_err(parent, "creating"))?;
    }
    std::fs::write(path, text).map_err(fs_err(path, "writing"))
}

pub(super) fn link(target: &str, at: &Path) -> Result<(), SimError> {
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent).map_err(fs_err(parent, "creating"))?;
    }
    match std::os::unix::fs::symlink(target, at) {
        Err(e) if e.kind() != ErrorKind::AlreadyExists => Err(fs_err(at, "linking")(e)),
        _ => Ok(()),
    }
}

/// One PCI function to lay out.
pub(super) struct Function<'a> {
    pub(super) address: String,
    pub(super) root: &'a str,
    pub(super) vendor: &'a str,
    pub(super) device: &'a str,
    pub(super) class: &'a str,
    pub(super) driver: &'a str,
    pub(super) numa: i64,
    pub(super) group: Option<u32>,
    /// For an SR-IOV virtual function, its physical function's address (`physfn`).
    pub(super) physfn: Option<&'a str>,
}

pub(super) fn lay_out(sys: &Path, f: &Function<'_>) -> Result<(), SimError> {
    let dir = sys.join("devices").join(f.root).join(&f.address);
    write(&dir.join("vendor"), &format!("{}\n", f.vendor))?;
    write(&dir.join("device"), &format!("{}\n", f.device))?;
    write(&dir.join("class"), &format!("{}\n", f.class))?;
    write(&dir.join("numa_node"), &format!("{}\n", f.numa))?;
    write(&dir.join("driver_override"), "(null)\n")?;
    let vendor = f.vendor.trim_start_matches("0x").to_ascii_uppercase();
    let device = f.device.trim_start_matches("0x").to_ascii_uppercase();
    write(
        &dir.join("modalias"),
        &format!("pci:v0000{vendor}d0000{device}sv*sd*bc03sc02i00\n"),
    )?;
    match f.physfn {
        Some(pf) => link(&format!("../{pf}"), &dir.join("physfn"))?,
        None if f.vendor == crate::hardware::passthrough::NVIDIA_VENDOR => {
            write(&dir.join("sriov_numvfs"), "0\n")?;
        }
        None => {}
    }
    link(
        &format!("../../../bus/pci/drivers/{}", f.driver),
        &dir.join("driver"),
    )?;
    link(
        &format!("../../../devices/{}/{}", f.root, f.address),
        &sys.join("bus/pci/devices").join(&f.address),
    )?;
    if let Some(group) = f.group {
        link(
            &format!("../../../kernel/iommu_groups/{group}"),
            &dir.join("iommu_group"),
        )?;
        link(
            &format!("../../../../devices/{}/{}", f.root, f.address),
            &sys.join(format!("kernel/iommu_groups/{group}/devices/{}", f.address)),
        )?;
    }
    Ok(())
}

/// One simulated GPU's place on the bus.
pub(super) struct BusGpu<'a> {
    /// `0000:18:00.0`.
    pub address: &'a str,
    /// `pci0000:18`.
    pub pcie_root: &'a str,
    /// `0x2330`.
    pub device_id: String,
    /// NUMA node.
    pub numa: i64,
    /// Its vGPU host, when the node file gives it one ([`super::vgpu`]).
    pub vgpu: Option<&'a super::vgpu::PlannedVgpu>,
}

/// Builds the host tree under `root` unless it was built before.
pub(super) fn build(
    root: &Path,
    spec: &PassthroughSpec,
    gpus: &[BusGpu<'_>],
) -> Result<(), SimError> {
    if root.join(BUILT).exists() {
        return Ok(());
    }
    let sys = root.join("sys");
    for driver in [NVIDIA_DRIVER, VFIO_DRIVER, "mlx5_core"] {
        for file in ["bind", "unbind"] {
            write(&sys.join("bus/pci/drivers").join(driver).join(file), "")?;
        }
    }
    for module in ["nvidia", "vfio", "vfio_pci"] {
        std::fs::create_dir_all(sys.join("module").join(module))
            .map_err(fs_err(&sys, "creating"))?;
    }
    std::fs::create_dir_all(sys.join("kernel/iommu_groups")).map_err(fs_err(&sys, "creating"))?;
    write(&root.join("dev/vfio/vfio"), "")?;
    if spec.iommufd {
        write(&root.join("dev/iommu"), "")?;
    }
    for (i, gpu) in gpus.iter().enumerate() {
        let group = spec.iommu.then_some(i as u32 + 1);
        lay_out(
            &sys,
            &Function {
                address: gpu.address.to_string(),
                root: gpu.pcie_root,
                vendor: crate::hardware::passthrough::NVIDIA_VENDOR,
                device: &gpu.device_id,
                class: "0x030200",
                driver: NVIDIA_DRIVER,
                numa: gpu.numa,
                group,
                physfn: None,
            },
        )?;
        if spec.shared_group.contains(&(i as u32)) {
            lay_out(
                &sys,
                &Function {
                    address: nic_address(i as u32),
                    root: gpu.pcie_root,
                    vendor: "0x15b3",
                    device: "0x101d",
                    class: "0x020000",
                    driver: "mlx5_core",
                    numa: gpu.numa,
                    group,
                    physfn: None,
                },
            )?;
        }
    }
    super::vgpu::build(root, spec.iommu, gpus)?;
    write(&root.join(BUILT), "")
}

/// The driver GPU `address` is bound to in the tree under `root`, if any.
pub(super) fn driver_of(root: &Path, address: &str) -> Option<String> {
    std::fs::read_link(
        root.join("sys/bus/pci/devices")
            .join(address)
            .join("driver"),
    )
    .ok()?
    .file_name()
    .map(|n| n.to_string_lossy().into_owned())
}

/// The simulator's kernel: acts on writes to the tree's `bind`, `unbind`,
/// `driver_override` and `sriov_numvfs` files as Linux does, with its error codes, and on the
/// vGPU files (`current_vgpu_type`, mdev `create` and `remove`) as NVIDIA's driver does.
#[derive(Debug, Clone)]
pub struct SimKernel {
    root: PathBuf,
}

impl SimKernel {
    /// The kernel of the tree under `root`.
    pub fn new(root: impl Into<PathBuf>) -> SimKernel {
        SimKernel { root: root.into() }
    }

    fn device(&self, address: &str) -> PathBuf {
        self.root.join("sys/bus/pci/devices").join(address)
    }

    fn bind(&self, driver: &str, address: &str) -> std::io::Result<()> {
        let dev = self.device(address);
        if !dev.exists() {
            return Err(ErrorKind::NotFound.into());
        }
        if dev.join("driver").symlink_metadata().is_ok() {
            return Err(std::io::Error::from_raw_os_error(16)); // EBUSY
        }
        let over = std::fs::read_to_string(dev.join("driver_override"))?;
        let over = over.trim();
        let vendor = std::fs::read_to_string(dev.join("vendor"))?;
        let matches = match over {
            "" | "(null)" => driver == NVIDIA_DRIVER && vendor.trim() == "0x10de",
            wanted => wanted == driver,
        };
        if !matches {
            return Err(std::io::Error::from_raw_os_error(19)); // ENODEV
        }
        std::os::unix::fs::symlink(
            format!("../../../bus/pci/drivers/{driver}"),
            dev.join("driver"),
        )?;
        if driver == VFIO_DRIVER {
            self.vfio_nodes(address, true)?;
        }
        Ok(())
    }

    fn unbind(&self, driver: &str, address: &str) -> std::io::Result<()> {
        let dev = self.device(address);
        let bound = std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
        if bound.as_deref() != Some(driver) {
            return Err(std::io::Error::from_raw_os_error(19)); // ENODEV
        }
        std::fs::remove_file(dev.join("driver"))?;
        if driver == VFIO_DRIVER {
            self.vfio_nodes(address, false)?;
        }
        Ok(())
    }

    /// `/dev/vfio/<group>` while any member of the group is on vfio-pci, and the device's
    /// `vfio-dev/vfioN` with its `/dev/vfio/devices/vfioN` when the kernel has iommufd.
    fn vfio_nodes(&self, address: &str, bound: bool) -> std::io::Result<()> {
        let dev = self.device(address);
        let Some(group) = std::fs::read_link(dev.join("iommu_group"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
        else {
            return Ok(());
        };
        let node = self.root.join("dev/vfio").join(&group);
        let number: u32 = group.parse().unwrap_or(0);
        let cdev = format!("vfio{}", number.saturating_sub(1));
        let iommufd = self.root.join("dev/iommu").exists();
        if bound {
            std::fs::create_dir_all(self.root.join("dev/vfio"))?;
            std::fs::write(&node, "")?;
            if iommufd {
                std::fs::create_dir_all(dev.join("vfio-dev").join(&cdev))?;
                std::fs::create_dir_all(self.root.join("dev/vfio/devices"))?;
                std::fs::write(self.root.join("dev/vfio/devices").join(&cdev), "")?;
            }
        } else {
            let members = self
                .root
                .join("sys/kernel/iommu_groups")
                .join(&group)
                .join("devices");
            let still = std::fs::read_dir(members)?.flatten().any(|m| {
                std::fs::read_link(m.path().join("driver"))
                    .is_ok_and(|t| t.file_name().is_some_and(|n| n == VFIO_DRIVER))
            });
            if !still {
                let _ = std::fs::remove_file(&node);
            }
            let _ = std::fs::remove_dir_all(dev.join("vfio-dev"));
            let _ = std::fs::remove_file(self.root.join("dev/vfio/devices").join(&cdev));
        }
        Ok(())
    }
}

impl SysfsKernel for SimKernel {
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = path
            .parent()
            .ok_or_else(|| std::io::Error::from(ErrorKind::NotFound))?
            .canonicalize()?;
        let value = value.trim();
        if let Some(result) = super::vgpu::kernel_write(&self.root, &parent, &name, value) {
            return result;
        }
        match name.as_str() {
            "bind" | "unbind" => {
                let driver = parent
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if name == "bind" {
                    self.bind(&driver, value)
                } else {
                    self.unbind(&driver, value)
                }
            }
            "driver_override" => std::fs::write(
                parent.join(name),
                if value.is_empty() {
                    "(null)\n".to_string()
                } else {
                    format!("{value}\n")
                },
            ),
            _ => std::fs::write(parent.join(name), format!("{value}\n")),
        }
    }
}
