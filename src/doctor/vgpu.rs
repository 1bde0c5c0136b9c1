//! Checks for NVIDIA vGPU (`doctor --vgpu`, implied by `--vgpu-types`): the vGPU manager,
//! the host side of each GPU's vGPUs (SR-IOV virtual functions, or mdev types), the types
//! `--vgpu-types` configures, and with `--compatibility-groups` the cluster's
//! `DRADeviceCompatibilityGroups` gate.
//!
//! The facts are the plugin's own: NVML's [`GpuVgpu`](crate::hardware::vgpu::GpuVgpu) on
//! each GPU of the inventory, and the host's sysfs under `--host-root` read by the plugin's
//! [`VgpuHost`] ([`probe`]); the `check_*` functions judge them without I/O. [`probe_gate`]
//! asks the API server with one dry-run create, as the `feature-gates` probes do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Client;
use kube::api::{Api, PostParams};

use super::report::Check;
use crate::devices::vgpu_config::{self, VgpuTypes, index_ranges};
use crate::hardware::passthrough::{HostKernel, normalize_address};
use crate::hardware::vgpu::{GpuVgpuHost, VgpuFramework, VgpuHost, VgpuHostFacts};
use crate::hardware::{GpuInfo, NodeInventory};

/// The fix for virtual functions that are not enabled.
pub const SRIOV_FIX: &str = "Enable the GPUs' virtual functions as root on the node: /usr/lib/nvidia/sriov-manage -e ALL (again after every boot, e.g. from a systemd unit before the plugin starts); the plugin creates each vdev vGPU on a free VF";

/// What the plugin runs with, as far as vGPU goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VgpuSettings {
    /// `--vgpu-types`.
    pub types: VgpuTypes,
    /// `--compatibility-groups`.
    pub compatibility_groups: bool,
}

/// Where the doctor reads the host's vGPU files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuDoctor {
    /// The plugin's vGPU settings.
    pub settings: VgpuSettings,
    /// `--host-root` (a simulated node: its tree, `<state dir>/sim/host-root`).
    pub root: PathBuf,
    /// A simulated node (preset or node file) whose tree is built at power-on in a scratch
    /// directory when `root` does not exist yet (no plugin has run with its state
    /// directory); `None` on real hosts.
    pub power_on: Option<String>,
}

/// The host's vGPU files as read, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuHostRead {
    /// The root they were read under, as the report names it.
    pub root: String,
    /// What [`VgpuHost::scan`] found, or why it failed.
    pub facts: Result<VgpuHostFacts, String>,
}

/// Reads the host's vGPU files under `doctor.root` with the plugin's reader (nothing is
/// written); for a simulated node without a tree yet, a fresh tree at power-on.
pub fn probe(doctor: &VgpuDoctor) -> VgpuHostRead {
    let scan = |root: &Path| {
        VgpuHost::new(root, Arc::new(HostKernel))
            .scan()
            .map_err(|e| crate::errors::error_chain(&e))
    };
    let root = doctor.root.display().to_string();
    match &doctor.power_on {
        Some(sim_node) if !doctor.root.exists() => {
            let fresh = || -> Result<VgpuHostFacts, String> {
                let scratch = crate::fsutil::ScratchDir::new("doctor-vgpu")
                    .map_err(|e| format!("a scratch directory for the simulated host: {e}"))?;
                let sim = crate::hardware::sim::SimBackend::open(sim_node, Some(scratch.path()))
                    .map_err(|e| crate::errors::error_chain(&e))?;
                match sim.host_root() {
                    Some(tree) => scan(tree),
                    None => Err(format!(
                        "the simulated node {sim_node:?} simulates no host tree (no `vgpu:` or `passthrough:` section)"
                    )),
                }
            };
            VgpuHostRead {
                root: format!("{root} (not there yet: the simulated node at power-on)"),
                facts: fresh(),
            }
        }
        _ => VgpuHostRead {
            facts: scan(&doctor.root),
            root,
        },
    }
}

/// The GPUs `types` applies to: those it lists by index, or every GPU.
fn in_scope<'i>(types: &VgpuTypes, inventory: &'i NodeInventory) -> Vec<&'i GpuInfo> {
    inventory
        .gpus
        .iter()
        .filter(|g| match types {
            VgpuTypes::PerGpu(map) => map.contains_key(&g.index),
            VgpuTypes::Off | VgpuTypes::Every(_) => true,
        })
        .collect()
}

fn gpu_label(gpu: &GpuInfo) -> String {
    format!("GPU {} ({})", gpu.index, gpu.product_name)
}

fn indices(gpus: &[&GpuInfo]) -> String {
    index_ranges(&gpus.iter().map(|g| g.index).collect::<Vec<_>>())
}

/// `vgpu-manager`: NVML reports vGPU support on the GPUs the types are for (the vGPU
/// manager, NVIDIA's vGPU host driver, is installed and loaded). With a list for every GPU,
/// GPUs without vGPU are named but pass when another GPU has it: they offer no types.
pub fn check_manager(settings: &VgpuSettings, inventory: &Result<NodeInventory, String>) -> Check {
    const NAME: &str = "vgpu-manager";
    const FIX: &str = "Install NVIDIA's vGPU host driver (the vGPU manager) on the node instead of the ordinary data-center driver, and reboot or reload it: NVML reports vGPU types only with it";
    let Ok(inventory) = inventory else {
        return Check::warn(
            NAME,
            "not checked: NVML did not load",
            "Fix the nvml check first",
            NAME,
        );
    };
    let scope = in_scope(&settings.types, inventory);
    let (with, without): (Vec<&GpuInfo>, Vec<&GpuInfo>) =
        scope.iter().copied().partition(|g| g.vgpu.is_some());
    let missing: Vec<String> = without.iter().map(|g| gpu_label(g)).collect();
    if with.is_empty() || (!missing.is_empty() && matches!(settings.types, VgpuTypes::PerGpu(_))) {
        let found = match scope.is_empty() {
            true => "no GPU".to_string(),
            false => format!("no vGPU support reported by {}", missing.join(", ")),
        };
        return Check::fail(NAME, found, FIX, NAME);
    }
    let mut modes: Vec<String> = Vec::new();
    for g in &with {
        let v = g.vgpu.as_ref().map(|v| (v.framework, v.heterogeneous));
        let text = match v {
            Some((f, h)) => format!(
                "{}, heterogeneous {}",
                f.as_str(),
                if h { "on" } else { "off" }
            ),
            None => continue,
        };
        if !modes.contains(&text) {
            modes.push(text);
        }
    }
    let mut found = format!(
        "vGPU manager present: GPU {} report vGPU ({})",
        indices(&with),
        modes.join("; ")
    );
    if !missing.is_empty() {
        found.push_str(&format!(
            "; {} report none and offer no vGPU types",
            missing.join(", ")
        ));
    }
    Check::ok(NAME, found)
}

/// The host's side of one GPU, or what is wrong with it.
fn gpu_host<'f>(facts: &'f VgpuHostFacts, gpu: &GpuInfo) -> Option<&'f GpuVgpuHost> {
    facts.gpu(&normalize_address(&gpu.pci_bus_id))
}

/// The GPUs in scope that report vGPU with `framework`.
fn of_framework<'i>(
    settings: &VgpuSettings,
    inventory: &'i NodeInventory,
    framework: VgpuFramework,
) -> Vec<&'i GpuInfo> {
    in_scope(&settings.types, inventory)
        .into_iter()
        .filter(|g| g.vgpu.as_ref().is_some_and(|v| v.framework == framework))
        .collect()
}

/// `vgpu-vfs`: every vdev (SR-IOV) GPU the types are for has its virtual functions enabled,
/// each in an IOMMU group of its own (what a VM gets the vGPU through). `None` when no such
/// GPU reports vGPU.
pub fn check_vfs(
    settings: &VgpuSettings,
    inventory: &Result<NodeInventory, String>,
    host: &VgpuHostRead,
) -> Option<Check> {
    const NAME: &str = "vgpu-vfs";
    let gpus = of_framework(settings, inventory.as_ref().ok()?, VgpuFramework::Vdev);
    if gpus.is_empty() {
        return None;
    }
    let facts = match &host.facts {
        Ok(f) => f,
        Err(why) => return Some(unreadable(NAME, host, why)),
    };
    let (mut disabled, mut ungrouped, mut absent, mut fine) = (vec![], vec![], vec![], vec![]);
    for gpu in &gpus {
        match gpu_host(facts, gpu) {
            None => absent.push(format!("{} at {}", gpu_label(gpu), gpu.pci_bus_id)),
            Some(h) if h.vfs.is_empty() => disabled.push((gpu.index, h.total_vfs)),
            Some(h) => {
                let lone: Vec<&str> = h
                    .vfs
                    .iter()
                    .filter(|vf| vf.iommu_group.is_none())
                    .map(|vf| vf.address.as_str())
                    .collect();
                match lone.first() {
                    Some(first) => ungrouped.push(format!(
                        "{}: {} of {} VFs in no IOMMU group (first {first})",
                        gpu_label(gpu),
                        lone.len(),
                        h.vfs.len()
                    )),
                    None => fine.push((gpu.index, h.vfs.len(), h.total_vfs)),
                }
            }
        }
    }
    if !absent.is_empty() {
        return Some(Check::fail(
            NAME,
            format!(
                "not under {}/sys/bus/pci/devices: {}",
                host.root,
                absent.join(", ")
            ),
            "Pass doctor the plugin's --host-root, where the host's /sys is mounted (chart: /host-root)",
            NAME,
        ));
    }
    if !disabled.is_empty() {
        // GPUs with the same number of VFs together: `GPU 0-7: 0 of 32 VFs enabled`.
        let mut by_total: Vec<(u32, Vec<u32>)> = Vec::new();
        for (index, total) in &disabled {
            match by_total.iter_mut().find(|(t, _)| t == total) {
                Some((_, gpus)) => gpus.push(*index),
                None => by_total.push((*total, vec![*index])),
            }
        }
        let parts: Vec<String> = by_total
            .iter()
            .map(|(total, gpus)| format!("GPU {}: 0 of {total} VFs enabled", index_ranges(gpus)))
            .collect();
        return Some(Check::fail(
            NAME,
            format!("SR-IOV VFs not enabled: {}", parts.join("; ")),
            SRIOV_FIX,
            NAME,
        ));
    }
    if !ungrouped.is_empty() {
        return Some(Check::fail(
            NAME,
            ungrouped.join("; "),
            "Turn the IOMMU on (kernel command line intel_iommu=on iommu=pt, or amd_iommu=on) and reboot: a VM gets its vGPU through the VF's IOMMU group",
            NAME,
        ));
    }
    let same = fine
        .windows(2)
        .all(|w| (w[0].1, w[0].2) == (w[1].1, w[1].2));
    let found = match (same, fine.first()) {
        (true, Some((_, enabled, total))) => format!(
            "GPU {}: {enabled} of {total} VFs enabled each, each in its own IOMMU group",
            indices(&gpus)
        ),
        _ => fine
            .iter()
            .map(|(i, enabled, total)| format!("GPU {i}: {enabled} of {total} VFs enabled"))
            .collect::<Vec<_>>()
            .join("; "),
    };
    Some(Check::ok(NAME, found))
}

/// `vgpu-mdev`: every mdev GPU the types are for shows its `mdev_supported_types` (the
/// vGPU manager creates them). `None` when no such GPU reports vGPU.
pub fn check_mdev(
    settings: &VgpuSettings,
    inventory: &Result<NodeInventory, String>,
    host: &VgpuHostRead,
) -> Option<Check> {
    const NAME: &str = "vgpu-mdev";
    let gpus = of_framework(settings, inventory.as_ref().ok()?, VgpuFramework::Mdev);
    if gpus.is_empty() {
        return None;
    }
    let facts = match &host.facts {
        Ok(f) => f,
        Err(why) => return Some(unreadable(NAME, host, why)),
    };
    let missing: Vec<String> = gpus
        .iter()
        .filter(|g| gpu_host(facts, g).is_none_or(|h| h.mdev_types.is_empty()))
        .map(|g| format!("{} ({})", gpu_label(g), g.pci_bus_id))
        .collect();
    if !missing.is_empty() {
        return Some(Check::fail(
            NAME,
            format!(
                "no mdev_supported_types under {}/sys/bus/pci/devices for {}",
                host.root,
                missing.join(", ")
            ),
            "Load the vGPU manager's kernel modules (nvidia-vgpu-vfio, and start nvidia-vgpu-mgr), which create each GPU's mdev_supported_types; or pass doctor the plugin's --host-root (chart: /host-root)",
            NAME,
        ));
    }
    let types = gpus
        .iter()
        .filter_map(|g| gpu_host(facts, g))
        .map(|h| h.mdev_types.len())
        .max()
        .unwrap_or(0);
    Some(Check::ok(
        NAME,
        format!(
            "GPU {}: mdev_supported_types present ({types} types)",
            indices(&gpus)
        ),
    ))
}

fn unreadable(name: &str, host: &VgpuHostRead, why: &str) -> Check {
    Check::fail(
        name,
        format!("cannot read the vGPU files under {}: {why}", host.root),
        "Pass doctor the plugin's --host-root, where the host's /sys is mounted (chart: /host-root)",
        name,
    )
}

/// `vgpu-types`: `--vgpu-types` passes the plugin's own start-up check
/// ([`vgpu_config::check`]) against the node's GPUs: every type exists on the GPUs it is
/// listed for, and types that cannot share a GPU are not listed together without
/// compatibility groups. A warning when no types are configured.
pub fn check_types(settings: &VgpuSettings, inventory: &Result<NodeInventory, String>) -> Check {
    const NAME: &str = "vgpu-types";
    let Ok(inventory) = inventory else {
        return Check::warn(
            NAME,
            "not checked: NVML did not load",
            "Fix the nvml check first",
            NAME,
        );
    };
    if !settings.types.is_on() {
        let first = inventory
            .gpus
            .iter()
            .filter_map(|g| g.vgpu.as_ref())
            .flat_map(|v| &v.supported)
            .find(|t| t.mig_profile.is_none())
            .map(|t| t.short_name().to_string())
            .unwrap_or_else(|| "H100-4C".into());
        return Check::warn(
            NAME,
            "no --vgpu-types: the plugin publishes no vGPU devices",
            &format!(
                "Set the types the GPUs offer with --vgpu-types (chart vgpu.types), e.g. {first}; gpu-dra inventory lists each GPU's types"
            ),
            NAME,
        );
    }
    if let Err(e) = vgpu_config::check(&settings.types, inventory, settings.compatibility_groups) {
        return Check::fail(
            NAME,
            e.to_string(),
            "Correct --vgpu-types (chart vgpu.types) as the message says: the plugin refuses to start with this value",
            NAME,
        );
    }
    let mut lists: Vec<(String, Vec<u32>)> = Vec::new();
    for gpu in &inventory.gpus {
        let offered = vgpu_config::types_for(&settings.types, gpu).unwrap_or_default();
        if offered.is_empty() {
            continue;
        }
        let names: Vec<&str> = offered.iter().map(|t| t.short_name()).collect();
        let names = names.join(",");
        match lists.iter_mut().find(|(n, _)| *n == names) {
            Some((_, gpus)) => gpus.push(gpu.index),
            None => lists.push((names, vec![gpu.index])),
        }
    }
    let parts: Vec<String> = lists
        .iter()
        .map(|(names, gpus)| format!("{names} on GPU {}", index_ranges(gpus)))
        .collect();
    Check::ok(
        NAME,
        format!(
            "{}{}",
            parts.join("; "),
            if settings.compatibility_groups {
                " (with compatibility groups)"
            } else {
                ""
            }
        ),
    )
}

/// The node-local vGPU checks: `vgpu-manager`, `vgpu-vfs` and `vgpu-mdev` (for the GPUs of
/// each framework), `vgpu-types`. They start no process and call nobody.
pub fn checks(
    settings: &VgpuSettings,
    inventory: &Result<NodeInventory, String>,
    host: &VgpuHostRead,
) -> Vec<Check> {
    let mut out = vec![check_manager(settings, inventory)];
    out.extend(check_vfs(settings, inventory, host));
    out.extend(check_mdev(settings, inventory, host));
    out.push(check_types(settings, inventory));
    out
}

/// What a dry-run create showed of the `DRADeviceCompatibilityGroups` gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupsGate {
    /// The API server kept a consumption's `compatibilityGroups`.
    On,
    /// It dropped them (the gate is off on kube-apiserver).
    Off,
    /// It dropped the whole consumption: `DRAPartitionableDevices` is off, and with it every
    /// counter the plugin publishes.
    CountersOff,
    /// The dry run failed.
    Unknown(String),
}

/// One dry-run create (nothing is stored) of a device consuming a counter set with a
/// compatibility group; a field the answer lacks was dropped because its gate is off.
pub async fn probe_gate(client: &Client, driver: &str, node: &str) -> GroupsGate {
    let slice: ResourceSlice = match serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("gpu-dra-doctor-{node}-groups")},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": format!("gpu-dra-doctor-{node}"), "generation": 0, "resourceSliceCount": 1},
            "devices": [{
                "name": "doctor-probe",
                "consumesCounters": [{
                    "counterSet": "doctor-probe",
                    "counters": {"memory": {"value": "1Gi"}},
                    "compatibilityGroups": ["doctor-probe"],
                }],
            }],
        },
    })) {
        Ok(s) => s,
        Err(e) => return GroupsGate::Unknown(format!("building the probe: {e}")),
    };
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match Api::<ResourceSlice>::all(client.clone())
        .create(&dry, &slice)
        .await
    {
        Ok(got) => {
            let device = got.spec.devices.unwrap_or_default().into_iter().next();
            let consumption = device
                .and_then(|d| d.consumes_counters)
                .unwrap_or_default()
                .into_iter()
                .next();
            match consumption {
                None => GroupsGate::CountersOff,
                Some(c)
                    if c.compatibility_groups
                        .as_ref()
                        .is_some_and(|g| !g.is_empty()) =>
                {
                    GroupsGate::On
                }
                Some(_) => GroupsGate::Off,
            }
        }
        Err(e) => GroupsGate::Unknown(format!(
            "dry-run create of a device with compatibility groups: {}",
            crate::errors::error_chain(&e)
        )),
    }
}

/// `vgpu-compatibility-groups` (with `--compatibility-groups`): the API server keeps
/// compatibility groups. Off is a failure: the API server drops the groups from the plugin's
/// slices, and a scheduler without the gate skips pools whose slices carry them.
pub fn check_gate(gate: &GroupsGate) -> Check {
    const NAME: &str = "vgpu-compatibility-groups";
    const FIX: &str = "Enable DRADeviceCompatibilityGroups on kube-apiserver and kube-scheduler (--feature-gates=DRADeviceCompatibilityGroups=true, Kubernetes 1.37 or later), or turn --compatibility-groups off (chart vgpu.compatibilityGroups=false)";
    match gate {
        GroupsGate::On => Check::ok(
            NAME,
            "DRADeviceCompatibilityGroups on: the API server keeps compatibilityGroups (kube-scheduler needs the gate too; its flags are not visible from here)",
        ),
        GroupsGate::Off => Check::fail(
            NAME,
            "DRADeviceCompatibilityGroups off: the API server dropped compatibilityGroups from a dry-run device, so the plugin's slices lose them and the scheduler may put vGPU types that cannot share a GPU (or vGPUs and MIG) together; a scheduler without the gate skips pools that carry groups",
            FIX,
            NAME,
        ),
        GroupsGate::CountersOff => Check::fail(
            NAME,
            "DRAPartitionableDevices off: the API server dropped the device's counters, so nothing keeps vGPUs, full GPUs and MIG devices of one GPU apart",
            "Enable DRAPartitionableDevices and DRADeviceCompatibilityGroups on kube-apiserver and kube-scheduler, or leave vGPU off (chart vgpu.types empty)",
            NAME,
        ),
        GroupsGate::Unknown(why) => Check::warn(NAME, format!("unknown: {why}"), FIX, NAME),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;
    use crate::hardware::GpuBackend;
    use crate::hardware::sim::SimBackend;

    fn settings(types: &str) -> VgpuSettings {
        VgpuSettings {
            types: types.parse().unwrap(),
            compatibility_groups: false,
        }
    }

    /// A simulated node's inventory and its host tree at power-on.
    fn node(sim_node: &str) -> (Result<NodeInventory, String>, VgpuHostRead) {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimBackend::open(sim_node, Some(dir.path())).unwrap();
        let root = sim.host_root().unwrap().to_path_buf();
        let inventory = sim.inventory().map_err(|e| e.to_string());
        let host = probe(&VgpuDoctor {
            settings: VgpuSettings::default(),
            root,
            power_on: None,
        });
        (inventory, host)
    }

    #[test]
    fn a_vdev_node_with_its_vfs_enabled_passes_every_node_check() {
        let (inventory, host) = node("hgx-h100-vgpu");
        let got: Vec<(String, Status)> = checks(&settings("H100-4C"), &inventory, &host)
            .into_iter()
            .map(|c| (c.name, c.status))
            .collect();
        assert_eq!(
            got,
            [
                ("vgpu-manager".to_string(), Status::Ok),
                ("vgpu-vfs".to_string(), Status::Ok),
                ("vgpu-types".to_string(), Status::Ok),
            ]
        );
    }

    #[test]
    fn an_mdev_node_gets_the_mdev_check_instead_of_the_vf_check() {
        let (inventory, host) = node("t4-vgpu-mdev");
        let got: Vec<(String, Status)> = checks(&settings("T4-4Q"), &inventory, &host)
            .into_iter()
            .map(|c| (c.name, c.status))
            .collect();
        assert_eq!(
            got,
            [
                ("vgpu-manager".to_string(), Status::Ok),
                ("vgpu-mdev".to_string(), Status::Ok),
                ("vgpu-types".to_string(), Status::Ok),
            ]
        );
    }

    #[test]
    fn disabled_vfs_fail_naming_sriov_manage() {
        let (inventory, mut host) = node("hgx-h100-vgpu");
        if let Ok(facts) = &mut host.facts {
            facts.gpus[2].vfs.clear();
        }
        let c = check_vfs(&settings(""), &inventory, &host).unwrap();
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.found,
            "SR-IOV VFs not enabled: GPU 2: 0 of 32 VFs enabled"
        );
        assert!(
            c.fix
                .unwrap()
                .contains("/usr/lib/nvidia/sriov-manage -e ALL")
        );
    }

    #[test]
    fn a_gpu_without_vgpu_fails_the_manager_check_when_listed_by_index() {
        let (mut inventory, _) = node("l40s-vgpu");
        inventory.as_mut().unwrap().gpus[1].vgpu = None;
        let c = check_manager(&settings("0-1=L40S-12Q"), &inventory);
        assert_eq!(
            (c.status, c.found.as_str()),
            (
                Status::Fail,
                "no vGPU support reported by GPU 1 (NVIDIA L40S)"
            )
        );
        assert!(c.fix.unwrap().contains("vGPU host driver"));
        let every = check_manager(&settings("L40S-12Q"), &inventory);
        assert_eq!(every.status, Status::Ok, "{}", every.found);
        assert!(
            every.found.contains("GPU 1 (NVIDIA L40S) report none"),
            "{}",
            every.found
        );
    }

    #[test]
    fn an_unknown_type_fails_naming_the_valid_ones_and_no_types_warns() {
        let (inventory, _) = node("hgx-h100-vgpu");
        let c = check_types(&settings("H100-99C"), &inventory);
        assert_eq!(c.status, Status::Fail);
        assert!(c.found.contains("H100-4C, H100-5C"), "{}", c.found);
        let none = check_types(&settings(""), &inventory);
        assert_eq!(none.status, Status::Warn);
        assert!(none.fix.unwrap().contains("e.g. H100-4C"));
    }

    #[test]
    fn the_gate_off_or_the_counters_dropped_fail_and_a_failed_probe_warns() {
        let status = |g: GroupsGate| check_gate(&g).status;
        assert_eq!(status(GroupsGate::On), Status::Ok);
        assert_eq!(status(GroupsGate::Off), Status::Fail);
        assert_eq!(status(GroupsGate::CountersOff), Status::Fail);
        assert_eq!(status(GroupsGate::Unknown("x".into())), Status::Warn);
        let fix = check_gate(&GroupsGate::Off).fix.unwrap();
        assert!(fix.contains("kube-apiserver and kube-scheduler"), "{fix}");
        assert!(fix.contains("--compatibility-groups off"), "{fix}");
    }
}
