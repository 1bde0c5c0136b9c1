//! VFIO passthrough on the host: the NVIDIA GPUs on the PCI bus, their IOMMU groups, and the
//! switch of a GPU between the `nvidia` and `vfio-pci` drivers, all through sysfs under a
//! host root (`--host-root`).
//!
//! NVML sees a GPU only while `nvidia` drives it, so everything here reads sysfs instead:
//! `<root>/sys/bus/pci/devices/<address>/{vendor,device,class,driver,driver_override,
//! iommu_group,numa_node,sriov_numvfs,vfio-dev/}`, `<root>/sys/kernel/iommu_groups/<group>/
//! devices/`, `<root>/sys/bus/pci/drivers/<driver>/{bind,unbind}`, and `<root>/dev/iommu`.
//! Writes go through a [`SysfsKernel`]: on a real host that is the kernel behind the files
//! ([`HostKernel`]: a plain write); on a simulated node it is the simulator's model of the
//! same files ([`crate::hardware::sim::sysfs`]), so this code runs unchanged on both.
//!
//! The switch follows the kernel's documented sequence: clear `driver_override`, unbind
//! from the current driver, write the wanted driver to `driver_override`, bind it. Every step
//! is idempotent (a device already unbound, or already on the wanted driver, is left as it
//! is), so a switch interrupted at any step is finished by running it again.

mod backend;
mod uuid5;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

pub use backend::PassthroughBackend;
pub use uuid5::{hyphenated, uuid_v5_dns};

/// The NVIDIA kernel driver's name in sysfs.
pub const NVIDIA_DRIVER: &str = "nvidia";
/// The VFIO PCI driver's name in sysfs.
pub const VFIO_DRIVER: &str = "vfio-pci";
/// NVIDIA's PCI vendor ID as sysfs prints it.
pub const NVIDIA_VENDOR: &str = "0x10de";

/// Errors of the passthrough layer; each names the device, the file or the group at fault
/// and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum PassthroughError {
    /// A sysfs file or directory could not be read or written.
    #[error("{step} {}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        step: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The IOMMU is off: no VFIO device can be handed to a VM.
    #[error(
        "the IOMMU is not enabled: {} is missing or empty; boot the host with intel_iommu=on iommu=pt (Intel) or amd_iommu=on (AMD) and enable VT-d / AMD-Vi in the firmware",
        groups.display()
    )]
    IommuOff {
        /// The IOMMU groups directory looked at.
        groups: PathBuf,
    },
    /// No NVIDIA GPU function with that address under the host root.
    #[error(
        "no NVIDIA GPU at PCI address {address} under {}",
        root.display()
    )]
    NoSuchGpu {
        /// The address looked for.
        address: String,
        /// The host root.
        root: PathBuf,
    },
    /// The GPU has no IOMMU group.
    #[error(
        "GPU {address} has no IOMMU group (no iommu_group link); the IOMMU does not cover it: check the firmware's VT-d / AMD-Vi settings"
    )]
    NoGroup {
        /// The GPU.
        address: String,
    },
    /// Another device shares the GPU's IOMMU group: a VM given the group would get it too,
    /// and the kernel refuses the group while that device has another driver.
    #[error(
        "GPU {address} shares IOMMU group {group} with {member} (class {class}, driver {driver}), which is neither a PCI bridge nor an NVIDIA function on nvidia or vfio-pci; put the GPU in a slot with its own group, or enable ACS on the switch above it"
    )]
    SharedGroup {
        /// The GPU.
        address: String,
        /// Its IOMMU group.
        group: String,
        /// The other device.
        member: String,
        /// Its PCI class.
        class: String,
        /// Its driver, or `none`.
        driver: String,
    },
    /// The GPU has SR-IOV virtual functions enabled; a physical function with VFs cannot
    /// be passed through whole.
    #[error(
        "GPU {address} has {vfs} SR-IOV virtual functions enabled; disable them first (echo 0 > /sys/bus/pci/devices/{address}/sriov_numvfs), or give the VFs to VMs instead"
    )]
    SriovVfs {
        /// The GPU.
        address: String,
        /// Enabled VFs.
        vfs: u32,
    },
    /// The GPU is on a driver the switch does not take it from.
    #[error(
        "GPU {address} is bound to {driver}, not {expected}; gpu-dra switches only between nvidia and vfio-pci"
    )]
    UnexpectedDriver {
        /// The GPU.
        address: String,
        /// The driver found.
        driver: String,
        /// The driver expected.
        expected: String,
    },
    /// The kernel did not bind the driver asked for.
    #[error("GPU {address}: after binding {wanted}, sysfs says the driver is {found}")]
    BindDidNotTake {
        /// The GPU.
        address: String,
        /// The driver asked for.
        wanted: String,
        /// What the `driver` link says.
        found: String,
    },
}

/// One PCI function of an IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciFunction {
    /// `0000:18:00.0`.
    pub address: String,
    /// `0x10de`.
    pub vendor: String,
    /// `0x030200`.
    pub class: String,
    /// The driver bound now, if any.
    pub driver: Option<String>,
}

impl PciFunction {
    /// Whether a VM may get this function along with a GPU of the same IOMMU group: a PCI
    /// bridge (class `0x0604`), or an NVIDIA function (the GPU's own audio or USB function,
    /// another GPU of the group) on `nvidia` or `vfio-pci`.
    pub fn may_share_group(&self) -> bool {
        let bridge = self.class.starts_with("0x0604");
        let nvidia = self.vendor == NVIDIA_VENDOR
            && matches!(self.driver.as_deref(), Some(NVIDIA_DRIVER | VFIO_DRIVER));
        bridge || nvidia
    }
}

/// An NVIDIA GPU physical function as sysfs shows it, whichever driver has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciGpu {
    /// PCI address, lower case, `0000:18:00.0`.
    pub address: String,
    /// Device ID as sysfs prints it, `0x2330`.
    pub device_id: String,
    /// The driver bound now (`nvidia`, `vfio-pci`), if any.
    pub driver: Option<String>,
    /// The IOMMU group, if the IOMMU covers the device.
    pub iommu_group: Option<String>,
    /// The PCIe root complex, `pci0000:15`, when the device link resolves to one.
    pub pcie_root: Option<String>,
    /// NUMA node; `None` when the platform reports none (`-1`).
    pub numa_node: Option<i64>,
    /// SR-IOV virtual functions enabled now.
    pub sriov_vfs: u32,
    /// The VFIO character device (`vfio0`) while `vfio-pci` drives the device and the kernel
    /// offers the iommufd interface.
    pub vfio_dev: Option<String>,
}

/// What the host offers for passthrough: the IOMMU and every NVIDIA GPU on the bus, in PCI
/// address order (the order that numbers `gpu-vfio-<i>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciHostFacts {
    /// `<root>/sys/kernel/iommu_groups` holds at least one group.
    pub iommu_enabled: bool,
    /// `<root>/dev/iommu` exists: the kernel offers iommufd.
    pub iommufd: bool,
    /// NVIDIA GPU physical functions, sorted by address.
    pub gpus: Vec<PciGpu>,
    /// NVML's last record of each GPU NVML does not list now (on `vfio-pci`), as this
    /// process last saw it; empty after a restart. It lets the VFIO device of such a GPU
    /// keep its parent's attributes and counters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden_gpus: Vec<super::GpuInfo>,
}

impl PciHostFacts {
    /// The GPU at `address`, if on the bus.
    pub fn gpu(&self, address: &str) -> Option<&PciGpu> {
        self.gpus.iter().find(|g| g.address == address)
    }

    /// NVML's last record of the hidden GPU at `address`, if this process saw it.
    pub fn hidden(&self, address: &str) -> Option<&super::GpuInfo> {
        self.hidden_gpus
            .iter()
            .find(|g| normalize_address(&g.pci_bus_id) == address)
    }
}

/// A PCI address as sysfs writes it: lower case, 4-digit domain (`00000000:18:00.0` and
/// `0000:18:00.0` are the same device).
pub fn normalize_address(address: &str) -> String {
    let lower = address.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// The side of sysfs writes that reacts to them: the kernel.
pub trait SysfsKernel: Send + Sync + std::fmt::Debug {
    /// Writes `value` to the sysfs attribute `path`, as `echo -n value > path` would, and
    /// returns once the kernel has acted on it.
    ///
    /// # Errors
    /// What the kernel answers (`ENODEV` for a driver that does not take the device,
    /// `EBUSY` for a device already bound, …).
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()>;
}

/// The real kernel: a plain write to the file.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostKernel;

impl SysfsKernel for HostKernel {
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.write_all(value.as_bytes())
    }
}

/// The host's PCI bus under a root directory, and the kernel that acts on its files.
#[derive(Debug)]
pub struct PciHost {
    root: PathBuf,
    kernel: Arc<dyn SysfsKernel>,
    /// Bumped by every driver switch: NVML's view of the node changes with it.
    switches: AtomicU64,
}

fn io(path: &Path, step: &'static str) -> impl FnOnce(std::io::Error) -> PassthroughError {
    let path = path.to_path_buf();
    move |source| PassthroughError::Io { path, step, source }
}

/// The file name a symlink points at (`…/drivers/nvidia` → `nvidia`), if the link exists.
fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

impl PciHost {
    /// The bus under `root` (`/` on a host, the chart's `/host-root`, or a simulated node's
    /// tree), written through `kernel`.
    pub fn new(root: impl Into<PathBuf>, kernel: Arc<dyn SysfsKernel>) -> PciHost {
        PciHost {
            root: root.into(),
            kernel,
            switches: AtomicU64::new(0),
        }
    }

    /// The host root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many driver switches this host has made (a generation for inventory polling).
    pub fn switch_count(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }

    fn devices(&self) -> PathBuf {
        self.root.join("sys/bus/pci/devices")
    }

    fn device(&self, address: &str) -> PathBuf {
        self.devices().join(address)
    }

    /// `<root>/sys/kernel/iommu_groups`.
    pub fn groups_dir(&self) -> PathBuf {
        self.root.join("sys/kernel/iommu_groups")
    }

    /// Whether the IOMMU is on: its groups directory holds at least one group.
    pub fn iommu_enabled(&self) -> bool {
        std::fs::read_dir(self.groups_dir()).is_ok_and(|mut d| d.next().is_some())
    }

    /// Fails with [`PassthroughError::IommuOff`] unless the IOMMU is on.
    pub fn require_iommu(&self) -> Result<(), PassthroughError> {
        if self.iommu_enabled() {
            Ok(())
        } else {
            Err(PassthroughError::IommuOff {
                groups: self.groups_dir(),
            })
        }
    }

    /// Every NVIDIA GPU physical function on the bus (vendor `0x10de`, class `0x0300xx` or
    /// `0x0302xx`, no `physfn` link), sorted by address, and the IOMMU's state. A host
    /// without a PCI bus directory has no GPUs.
    ///
    /// # Errors
    /// [`PassthroughError::Io`] when the devices directory exists but cannot be listed.
    pub fn scan(&self) -> Result<PciHostFacts, PassthroughError> {
        let dir = self.devices();
        let mut gpus = Vec::new();
        crate::cost::count(crate::cost::Cost::DirectoryList);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => Some(entries),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&dir, "listing")(e)),
        };
        for entry in entries.into_iter().flatten() {
            let entry = entry.map_err(io(&dir, "listing"))?;
            let address = entry.file_name().to_string_lossy().to_ascii_lowercase();
            if let Some(gpu) = self.read_gpu(&address) {
                gpus.push(gpu);
            }
        }
        gpus.sort_by(|a, b| a.address.cmp(&b.address));
        Ok(PciHostFacts {
            iommu_enabled: self.iommu_enabled(),
            iommufd: self.root.join("dev/iommu").exists(),
            gpus,
            hidden_gpus: Vec::new(),
        })
    }

    /// The GPU at `address` as sysfs shows it now; `None` when it is not an NVIDIA GPU
    /// physical function (or not there).
    pub fn read_gpu(&self, address: &str) -> Option<PciGpu> {
        let dev = self.device(address);
        let vendor = read_trimmed(&dev.join("vendor"))?;
        let class = read_trimmed(&dev.join("class"))?;
        let display = class.starts_with("0x0300") || class.starts_with("0x0302");
        if vendor != NVIDIA_VENDOR || !display || dev.join("physfn").exists() {
            return None;
        }
        let pcie_root = std::fs::read_link(&dev).ok().and_then(|target| {
            let mut parts = target.components().map(|c| c.as_os_str().to_string_lossy());
            parts.find(|p| p == "devices")?;
            parts.next().map(|p| p.into_owned())
        });
        let vfio_dev = std::fs::read_dir(dev.join("vfio-dev"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned());
        Some(PciGpu {
            address: address.to_string(),
            device_id: read_trimmed(&dev.join("device")).unwrap_or_default(),
            driver: link_name(&dev.join("driver")),
            iommu_group: link_name(&dev.join("iommu_group")),
            pcie_root,
            numa_node: read_trimmed(&dev.join("numa_node"))
                .and_then(|n| n.parse::<i64>().ok())
                .filter(|n| *n >= 0),
            sriov_vfs: read_trimmed(&dev.join("sriov_numvfs"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            vfio_dev,
        })
    }

    fn require_gpu(&self, address: &str) -> Result<PciGpu, PassthroughError> {
        self.read_gpu(address)
            .ok_or_else(|| PassthroughError::NoSuchGpu {
                address: address.to_string(),
                root: self.root.clone(),
            })
    }

    /// The PCI functions of IOMMU group `group`, sorted by address.
    ///
    /// # Errors
    /// [`PassthroughError::Io`] when the group cannot be listed.
    pub fn group_members(&self, group: &str) -> Result<Vec<PciFunction>, PassthroughError> {
        let dir = self.groups_dir().join(group).join("devices");
        let mut members = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io(&dir, "listing IOMMU group"))? {
            let entry = entry.map_err(io(&dir, "listing IOMMU group"))?;
            let address = entry.file_name().to_string_lossy().into_owned();
            let dev = self.device(&address);
            members.push(PciFunction {
                vendor: read_trimmed(&dev.join("vendor")).unwrap_or_default(),
                class: read_trimmed(&dev.join("class")).unwrap_or_default(),
                driver: link_name(&dev.join("driver")),
                address,
            });
        }
        members.sort_by(|a, b| a.address.cmp(&b.address));
        Ok(members)
    }

    /// Checks that GPU `address` can go to a VM whole, before anything is touched: the
    /// IOMMU is on, the GPU has a group, every other member of the group may go with it
    /// ([`PciFunction::may_share_group`]), and no SR-IOV VFs are enabled. Returns the GPU.
    ///
    /// # Errors
    /// The first of [`PassthroughError::IommuOff`], [`PassthroughError::NoSuchGpu`],
    /// [`PassthroughError::NoGroup`], [`PassthroughError::SharedGroup`],
    /// [`PassthroughError::SriovVfs`] that applies.
    pub fn check_passable(&self, address: &str) -> Result<PciGpu, PassthroughError> {
        self.require_iommu()?;
        let gpu = self.require_gpu(address)?;
        let Some(group) = gpu.iommu_group.clone() else {
            return Err(PassthroughError::NoGroup {
                address: address.to_string(),
            });
        };
        for member in self.group_members(&group)? {
            if member.address == gpu.address || member.may_share_group() {
                continue;
            }
            return Err(PassthroughError::SharedGroup {
                address: address.to_string(),
                group,
                class: member.class.clone(),
                driver: member.driver.clone().unwrap_or_else(|| "none".into()),
                member: member.address,
            });
        }
        if gpu.sriov_vfs > 0 {
            return Err(PassthroughError::SriovVfs {
                address: address.to_string(),
                vfs: gpu.sriov_vfs,
            });
        }
        Ok(gpu)
    }

    /// Processes that hold `/dev/nvidia<minor>` open, as `<pid> (<command>)`, read from
    /// `<root>/proc/*/fd`: the host's processes when the host's `/proc` is there. Unreadable
    /// processes (gone, or not ours to read) are skipped.
    pub fn holders(&self, minor: u32) -> Vec<String> {
        let node = format!("/dev/nvidia{minor}");
        let proc = self.root.join("proc");
        let Ok(entries) = std::fs::read_dir(&proc) else {
            return Vec::new();
        };
        let mut holders = Vec::new();
        for entry in entries.flatten() {
            let pid = entry.file_name().to_string_lossy().into_owned();
            if !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
                continue;
            };
            let holds = fds
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == Path::new(&node)));
            if holds {
                let comm = read_trimmed(&entry.path().join("comm")).unwrap_or_default();
                holders.push(format!("{pid} ({comm})"));
            }
        }
        holders.sort();
        holders
    }

    /// Moves GPU `address` to `driver` (`nvidia` or `vfio-pci`): clears `driver_override`,
    /// unbinds the current driver, writes `driver` to `driver_override`, binds it, and checks
    /// the `driver` link says so. Idempotent: a GPU already on `driver` is left alone, and a
    /// GPU on no driver (a switch interrupted after the unbind) is bound. `crash_prefix`
    /// names the crash points between the steps (`<prefix>-unbound`, `<prefix>-bound`).
    ///
    /// # Errors
    /// [`PassthroughError::UnexpectedDriver`] when another driver than `from` has it (nothing
    /// is touched); [`PassthroughError::Io`] for a write the kernel refused;
    /// [`PassthroughError::BindDidNotTake`] when the link does not show `driver` afterwards.
    pub fn switch(
        &self,
        address: &str,
        from: &str,
        driver: &str,
        crash_prefix: &str,
    ) -> Result<(), PassthroughError> {
        let gpu = self.require_gpu(address)?;
        match gpu.driver.as_deref() {
            Some(d) if d == driver => return Ok(()),
            Some(d) if d != from => {
                return Err(PassthroughError::UnexpectedDriver {
                    address: address.to_string(),
                    driver: d.to_string(),
                    expected: from.to_string(),
                });
            }
            _ => {}
        }
        let dev = self.device(address);
        self.switches.fetch_add(1, Ordering::Relaxed);
        if gpu.driver.is_some() {
            let path = dev.join("driver_override");
            crate::cost::count(crate::cost::Cost::SysfsWrite);
            self.kernel
                .write(&path, "\n")
                .map_err(io(&path, "clearing driver_override"))?;
            let path = dev.join("driver/unbind");
            crate::cost::count(crate::cost::Cost::SysfsWrite);
            self.kernel
                .write(&path, address)
                .map_err(io(&path, "unbinding the driver through"))?;
            crate::crashpoint::hit(&format!("{crash_prefix}-unbound"));
        }
        let path = dev.join("driver_override");
        crate::cost::count(crate::cost::Cost::SysfsWrite);
        self.kernel
            .write(&path, driver)
            .map_err(io(&path, "writing driver_override"))?;
        let path = self
            .root
            .join("sys/bus/pci/drivers")
            .join(driver)
            .join("bind");
        crate::cost::count(crate::cost::Cost::SysfsWrite);
        self.kernel
            .write(&path, address)
            .map_err(io(&path, "binding the driver through"))?;
        self.switches.fetch_add(1, Ordering::Relaxed);
        crate::crashpoint::hit(&format!("{crash_prefix}-bound"));
        let found = link_name(&dev.join("driver")).unwrap_or_else(|| "none".into());
        if found != driver {
            return Err(PassthroughError::BindDidNotTake {
                address: address.to_string(),
                wanted: driver.to_string(),
                found,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridge_and_nvidia_functions_may_share_a_group_and_a_nic_may_not() {
        let f = |vendor: &str, class: &str, driver: Option<&str>| PciFunction {
            address: "0000:00:00.0".into(),
            vendor: vendor.into(),
            class: class.into(),
            driver: driver.map(Into::into),
        };
        assert!(f("0x8086", "0x060400", Some("pcieport")).may_share_group());
        assert!(f(NVIDIA_VENDOR, "0x040300", Some(VFIO_DRIVER)).may_share_group());
        assert!(f(NVIDIA_VENDOR, "0x030200", Some(NVIDIA_DRIVER)).may_share_group());
        assert!(!f(NVIDIA_VENDOR, "0x040300", Some("snd_hda_intel")).may_share_group());
        assert!(!f("0x15b3", "0x020000", Some("mlx5_core")).may_share_group());
        assert!(!f("0x15b3", "0x020000", None).may_share_group());
    }
}
