//! Checks for VFIO passthrough (`--passthrough`): the IOMMU, the vfio-pci module, the VFIO
//! API device, and each NVIDIA GPU's IOMMU group, read from the host's sysfs and `/dev` under
//! `--host-root`.
//!
//! The readers here are the doctor's own and read only: [`probe`] gathers the facts,
//! [`checks`] turns them into report lines. They follow the kernel's layout:
//!
//! ```text
//! <root>/sys/kernel/iommu_groups/<g>/devices/<addr>      one entry per group member
//! <root>/sys/bus/pci/devices/<addr>/{vendor,class,sriov_numvfs}
//! <root>/sys/bus/pci/devices/<addr>/{driver,iommu_group,physfn}   links
//! <root>/sys/module/vfio_pci, <root>/sys/bus/pci/drivers/vfio-pci
//! <root>/dev/vfio/vfio
//! ```

use std::path::{Path, PathBuf};

use super::report::Check;
use crate::hardware::passthrough::{HostKernel, NVIDIA_VENDOR, PciFunction, PciGpu, PciHost};

fn describe(m: &PciFunction) -> String {
    format!(
        "{} (vendor {}, class {}, driver {})",
        m.address,
        m.vendor,
        m.class,
        m.driver.as_deref().unwrap_or("none")
    )
}

/// One NVIDIA GPU physical function and its IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuGroup {
    /// The GPU, as the plugin's PCI reader sees it ([`PciHost::scan`]).
    pub gpu: PciGpu,
    /// The group's other members, sorted by address, or why they could not be listed.
    pub others: Result<Vec<PciFunction>, String>,
}

/// What the host shows for passthrough.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassthroughFacts {
    /// The host root the facts were read under.
    pub root: PathBuf,
    /// Whether `sys/bus/pci` exists there: without it doctor is not looking at a sysfs.
    pub sysfs: bool,
    /// How many IOMMU groups `sys/kernel/iommu_groups` holds (0: missing or empty).
    pub iommu_groups: usize,
    /// Where vfio-pci was found loaded (`sys/module/vfio_pci` or the driver's directory).
    pub vfio_pci: Option<PathBuf>,
    /// Whether `dev/vfio/vfio`, the VFIO API device, exists.
    pub vfio_api_device: bool,
    /// Every NVIDIA GPU physical function (vendor `0x10de`, class `0x0300xx` or `0x0302xx`,
    /// no `physfn` link), sorted by address: `gpu-vfio-<i>` is the `i`-th.
    pub gpus: Vec<GpuGroup>,
}

/// Reads the passthrough facts under `root` (the host's `/` as this process sees it), with
/// the plugin's own PCI reader ([`PciHost`]), so doctor judges exactly what prepare will. A
/// missing file or directory reads as absent; nothing is written.
pub fn probe(root: &Path) -> PassthroughFacts {
    let groups_dir = root.join("sys/kernel/iommu_groups");
    let iommu_groups = std::fs::read_dir(&groups_dir).map_or(0, |d| d.count());
    let vfio_pci = [
        root.join("sys/module/vfio_pci"),
        root.join("sys/bus/pci/drivers/vfio-pci"),
    ]
    .into_iter()
    .find(|p| p.is_dir());
    // Read only: the kernel side is never written to here.
    let pci = PciHost::new(root, std::sync::Arc::new(HostKernel));
    let gpus = pci
        .scan()
        .map(|facts| facts.gpus)
        .unwrap_or_default()
        .into_iter()
        .map(|gpu| {
            let others = match &gpu.iommu_group {
                None => Ok(Vec::new()),
                Some(group) => pci
                    .group_members(group)
                    .map(|members| {
                        members
                            .into_iter()
                            .filter(|m| m.address != gpu.address)
                            .collect()
                    })
                    .map_err(|e| crate::errors::error_chain(&e)),
            };
            GpuGroup { gpu, others }
        })
        .collect();
    PassthroughFacts {
        root: root.to_path_buf(),
        sysfs: root.join("sys/bus/pci").is_dir(),
        iommu_groups,
        vfio_pci,
        vfio_api_device: root.join("dev/vfio/vfio").exists(),
        gpus,
    }
}

/// `iommu`: the IOMMU is on (the kernel lists IOMMU groups). Without it no device can be
/// handed to a VM, and the plugin refuses to start with `--passthrough`.
pub fn check_iommu(facts: &PassthroughFacts) -> Check {
    const NAME: &str = "iommu";
    let dir = facts.root.join("sys/kernel/iommu_groups");
    if !facts.sysfs {
        return Check::fail(
            NAME,
            format!(
                "unknown: no sysfs under {} ({} is missing)",
                facts.root.display(),
                facts.root.join("sys/bus/pci").display()
            ),
            "Pass doctor the plugin's --host-root; in the plugin's pod the chart mounts the host's /sys at /host-root/sys when passthrough.enabled is set",
            NAME,
        );
    }
    if facts.iommu_groups > 0 {
        return Check::ok(
            NAME,
            format!(
                "on: {} IOMMU groups in {}",
                facts.iommu_groups,
                dir.display()
            ),
        );
    }
    Check::fail(
        NAME,
        format!("off: {} is missing or empty", dir.display()),
        "Turn the IOMMU on in the firmware (VT-d / AMD-Vi) and on the kernel command line (intel_iommu=on iommu=pt on Intel, amd_iommu=on on AMD), then reboot",
        NAME,
    )
}

/// `vfio-modules`: vfio-pci is loaded, so a GPU can be bound to it.
pub fn check_vfio_modules(facts: &PassthroughFacts) -> Check {
    const NAME: &str = "vfio-modules";
    match &facts.vfio_pci {
        Some(found) => Check::ok(NAME, format!("vfio-pci loaded ({})", found.display())),
        None => Check::fail(
            NAME,
            format!(
                "vfio-pci not loaded: neither {} nor {} exists",
                facts.root.join("sys/module/vfio_pci").display(),
                facts.root.join("sys/bus/pci/drivers/vfio-pci").display()
            ),
            "Load it on the node (modprobe vfio-pci) and at every boot (echo vfio-pci > /etc/modules-load.d/vfio-pci.conf)",
            NAME,
        ),
    }
}

/// `vfio-device`: the VFIO API device `/dev/vfio/vfio` is where the plugin looks, so claims
/// with `iommu.enableAPIDevice` (KubeVirt's) get it.
pub fn check_vfio_device(facts: &PassthroughFacts) -> Check {
    const NAME: &str = "vfio-device";
    let path = facts.root.join("dev/vfio/vfio");
    if facts.vfio_api_device {
        Check::ok(NAME, format!("{} present", path.display()))
    } else {
        Check::fail(
            NAME,
            format!("{} missing", path.display()),
            "Load vfio-pci (it creates /dev/vfio/vfio), and mount the host's /dev/vfio at <host-root>/dev/vfio in the plugin's pod (chart: passthrough.enabled)",
            NAME,
        )
    }
}

/// `gpu-vfio-<i>`: GPU `i` (by PCI address) can go to a VM whole: it has an IOMMU group whose
/// other members are PCI bridges or NVIDIA functions on nvidia or vfio-pci, it is on nvidia,
/// vfio-pci or no driver, and it has no SR-IOV VFs. A failure names the offending member.
pub fn check_gpu(index: usize, gpu: &GpuGroup) -> Check {
    let name = format!("gpu-vfio-{index}");
    const ANCHOR: &str = "gpu-vfio-index";
    let address = &gpu.gpu.address;
    let driver = gpu.gpu.driver.as_deref().unwrap_or("none");
    let Some(group) = &gpu.gpu.iommu_group else {
        return Check::fail(
            name,
            format!("{address} (driver {driver}): in no IOMMU group"),
            "Enable the IOMMU for this device's PCIe root (firmware VT-d / AMD-Vi settings), or move the GPU to a slot the IOMMU covers",
            ANCHOR,
        );
    };
    let others = match &gpu.others {
        Ok(o) => o,
        Err(why) => {
            return Check::warn(
                name,
                format!("{address}: IOMMU group {group} not readable: {why}"),
                "Mount the host's /sys at <host-root>/sys in the plugin's pod (chart: passthrough.enabled) and run doctor as root",
                ANCHOR,
            );
        }
    };
    let offenders: Vec<&PciFunction> = others.iter().filter(|m| !m.may_share_group()).collect();
    if !offenders.is_empty() {
        let names: Vec<String> = offenders.iter().map(|m| describe(m)).collect();
        let nvidia_only = offenders.iter().all(|m| m.vendor == NVIDIA_VENDOR);
        let fix = if nvidia_only {
            "Bind the GPU's other NVIDIA functions to vfio-pci (echo vfio-pci > <function>/driver_override, unbind, echo <address> > /sys/bus/pci/drivers/vfio-pci/bind) or to nvidia, so they go to the VM with it"
        } else {
            "Put the GPU in an IOMMU group of its own: another PCIe slot, or a switch/root port with ACS enabled in the firmware; until then this GPU's VFIO claims are refused"
        };
        return Check::fail(
            name,
            format!(
                "{address} (driver {driver}): IOMMU group {group} also holds {}",
                names.join(", ")
            ),
            fix,
            ANCHOR,
        );
    }
    if let Some(other) = gpu
        .gpu
        .driver
        .as_deref()
        .filter(|d| !matches!(*d, "nvidia" | "vfio-pci"))
    {
        return Check::fail(
            name,
            format!("{address}: bound to {other}, not nvidia or vfio-pci"),
            "Bind the GPU to nvidia (blacklist nouveau: echo 'blacklist nouveau' > /etc/modprobe.d/blacklist-nouveau.conf, then rebuild the initramfs and reboot); the plugin switches GPUs only between nvidia and vfio-pci",
            ANCHOR,
        );
    }
    if gpu.gpu.sriov_vfs > 0 {
        return Check::fail(
            name,
            format!(
                "{address} (driver {driver}): {} SR-IOV VFs enabled",
                gpu.gpu.sriov_vfs
            ),
            "Disable the VFs (echo 0 > /sys/bus/pci/devices/<address>/sriov_numvfs); a GPU with VFs cannot go to a VM whole",
            ANCHOR,
        );
    }
    let company = if others.is_empty() {
        "alone".to_string()
    } else {
        let names: Vec<&str> = others.iter().map(|m| m.address.as_str()).collect();
        format!("with {} (bridges or NVIDIA functions)", names.join(", "))
    };
    Check::ok(
        name,
        format!("{address} (driver {driver}): IOMMU group {group}, {company}"),
    )
}

/// Every passthrough check: `iommu`, `vfio-modules`, `vfio-device`, then with the IOMMU on one
/// `gpu-vfio-<i>` per NVIDIA GPU (or a `gpu-vfio` warning when the bus shows none).
pub fn checks(facts: &PassthroughFacts) -> Vec<Check> {
    let mut out = vec![
        check_iommu(facts),
        check_vfio_modules(facts),
        check_vfio_device(facts),
    ];
    if facts.iommu_groups == 0 || !facts.sysfs {
        return out;
    }
    if facts.gpus.is_empty() {
        out.push(Check::warn(
            "gpu-vfio",
            format!(
                "no NVIDIA GPU function (vendor 0x10de, class 0x0300xx/0x0302xx) in {}",
                facts.root.join("sys/bus/pci/devices").display()
            ),
            "Pass doctor the plugin's --host-root, where the host's /sys is mounted (chart: /host-root)",
            "gpu-vfio-index",
        ));
    }
    out.extend(
        facts
            .gpus
            .iter()
            .enumerate()
            .map(|(i, gpu)| check_gpu(i, gpu)),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn function(address: &str, vendor: &str, class: &str, driver: Option<&str>) -> PciFunction {
        PciFunction {
            address: address.into(),
            vendor: vendor.into(),
            class: class.into(),
            driver: driver.map(Into::into),
        }
    }

    fn gpu(others: Vec<PciFunction>) -> GpuGroup {
        GpuGroup {
            gpu: PciGpu {
                address: "0000:5d:00.0".into(),
                device_id: "0x2330".into(),
                driver: Some("nvidia".into()),
                iommu_group: Some("7".into()),
                pcie_root: None,
                numa_node: None,
                sriov_vfs: 0,
                vfio_dev: None,
            },
            others: Ok(others),
        }
    }

    #[test]
    fn an_nvidia_audio_function_on_its_own_driver_fails_with_the_rebind_fix() {
        let check = check_gpu(
            0,
            &gpu(vec![function(
                "0000:5d:00.1",
                NVIDIA_VENDOR,
                "0x040300",
                Some("snd_hda_intel"),
            )]),
        );
        assert_eq!(check.status, Status::Fail);
        assert!(
            check
                .fix
                .as_deref()
                .unwrap()
                .starts_with("Bind the GPU's other NVIDIA functions"),
            "{check:?}"
        );
    }

    #[test]
    fn sriov_vfs_fail_a_gpu_whose_group_is_fine() {
        let mut with_vfs = gpu(vec![]);
        with_vfs.gpu.sriov_vfs = 4;
        let check = check_gpu(3, &with_vfs);
        assert_eq!(
            (check.name.as_str(), check.status, check.found.as_str()),
            (
                "gpu-vfio-3",
                Status::Fail,
                "0000:5d:00.0 (driver nvidia): 4 SR-IOV VFs enabled"
            )
        );
    }

    #[test]
    fn a_gpu_on_nouveau_fails_naming_the_driver() {
        let mut nouveau = gpu(vec![]);
        nouveau.gpu.driver = Some("nouveau".into());
        let check = check_gpu(0, &nouveau);
        assert_eq!(
            (check.status, check.found.as_str()),
            (
                Status::Fail,
                "0000:5d:00.0: bound to nouveau, not nvidia or vfio-pci"
            )
        );
    }

    #[test]
    fn a_root_without_sysfs_says_so_instead_of_calling_the_iommu_off() {
        let dir = tempfile::tempdir().unwrap();
        let check = check_iommu(&probe(dir.path()));
        assert_eq!(check.status, Status::Fail);
        assert!(
            check.found.starts_with("unknown: no sysfs under")
                && check.fix.unwrap().contains("--host-root"),
            "{}",
            check.found
        );
    }

    #[test]
    fn with_the_iommu_off_only_the_three_host_checks_are_reported() {
        let facts = PassthroughFacts {
            root: "/h".into(),
            sysfs: true,
            iommu_groups: 0,
            vfio_pci: None,
            vfio_api_device: false,
            gpus: vec![gpu(vec![])],
        };
        let names: Vec<String> = checks(&facts).into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["iommu", "vfio-modules", "vfio-device"]);
    }
}
