//! Attributes and capacity of published devices, named as NVIDIA's driver names them.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::MigAttributes;
use crate::hardware::{GpuInfo, MigProfile, NodeInventory};

/// Domain of the standard, driver-independent attributes.
const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

fn string(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

fn version(v: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v),
        ..Default::default()
    }
}

/// A capacity in its canonical Kubernetes form.
fn capacity(q: String) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(q),
        request_policy: None,
    }
}

/// MiB as a canonical binary quantity (`40960` → `40Gi`, `81559` → `81559Mi`).
pub fn mib_quantity(mib: u64) -> String {
    if mib > 0 && mib.is_multiple_of(1024 * 1024) {
        format!("{}Ti", mib / (1024 * 1024))
    } else if mib > 0 && mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// A version string as semantic version: `580.95.05` → `580.95.5`, `13.0` → `13.0.0`.
/// `None` when it is not made of one to three numbers.
pub fn semver_of(text: &str) -> Option<String> {
    let parts: Vec<&str> = text.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut nums = Vec::with_capacity(3);
    for p in &parts {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nums.push(p.parse::<u64>().ok()?);
    }
    nums.resize(3, 0);
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

/// Attributes every device of a GPU carries (computed once per GPU, cloned per device).
pub fn common(inventory: &NodeInventory, gpu: &GpuInfo) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".to_string(), string(&gpu.product_name));
    a.insert("brand".to_string(), string(&gpu.brand));
    a.insert(
        "architecture".to_string(),
        string(gpu.architecture.as_str()),
    );
    let (major, minor) = gpu.compute_capability;
    a.insert(
        "cudaComputeCapability".to_string(),
        version(format!("{major}.{minor}.0")),
    );
    if let Some(v) = semver_of(&inventory.driver_version) {
        a.insert("driverVersion".to_string(), version(v));
    }
    if let Some(v) = semver_of(&inventory.cuda_driver_version) {
        a.insert("cudaDriverVersion".to_string(), version(v));
    }
    a.insert(
        format!("{STANDARD_DOMAIN}/pciBusID"),
        string(&gpu.pci_bus_id),
    );
    a.insert(
        format!("{STANDARD_DOMAIN}/pcieRoot"),
        string(&gpu.pcie_root),
    );
    if let Some(numa) = gpu.numa_node {
        a.insert(format!("{STANDARD_DOMAIN}/numaNode"), int(numa));
    }
    a
}

/// The full-GPU device `gpu-<minor>`.
pub fn full_gpu(common: &BTreeMap<String, DeviceAttribute>, gpu: &GpuInfo) -> Device {
    let mut attributes = common.clone();
    attributes.insert("type".to_string(), string("gpu"));
    attributes.insert("uuid".to_string(), string(&gpu.uuid));
    attributes.insert("index".to_string(), int(i64::from(gpu.index)));
    attributes.insert("minor".to_string(), int(i64::from(gpu.minor)));
    let mut cap = BTreeMap::new();
    cap.insert("memory".to_string(), capacity(mib_quantity(gpu.memory_mib)));
    if gpu.multiprocessors > 0 {
        cap.insert(
            "multiprocessors".to_string(),
            capacity(gpu.multiprocessors.to_string()),
        );
    }
    Device {
        name: super::gpu_device_name(gpu.minor),
        attributes: Some(attributes),
        capacity: Some(cap),
        ..Default::default()
    }
}

/// Attribute names every MIG device keeps in [`MigAttributes::Compact`]: what identifies it and
/// what claims written for NVIDIA's driver select MIG devices by (profile, parent GPU, model,
/// compute capability, PCIe root for NIC alignment).
pub const COMPACT_MIG_ATTRIBUTES: [&str; 7] = [
    "type",
    "uuid",
    "profile",
    "parentUUID",
    "productName",
    "cudaComputeCapability",
    "resource.kubernetes.io/pcieRoot",
];

/// Capacity names every MIG device keeps in [`MigAttributes::Compact`].
pub const COMPACT_MIG_CAPACITIES: [&str; 2] = ["memory", "multiprocessors"];

/// A MIG device of `profile` named `name`; `uuid` when it exists. With
/// [`MigAttributes::Compact`] it carries only [`COMPACT_MIG_ATTRIBUTES`] and
/// [`COMPACT_MIG_CAPACITIES`]; with [`MigAttributes::Full`] every attribute of its GPU and every
/// engine capacity as well.
pub fn mig(
    common: &BTreeMap<String, DeviceAttribute>,
    gpu: &GpuInfo,
    profile: &MigProfile,
    name: String,
    uuid: Option<&str>,
    detail: MigAttributes,
) -> Device {
    let mut attributes = match detail {
        MigAttributes::Full => common.clone(),
        MigAttributes::Compact => common
            .iter()
            .filter(|(k, _)| COMPACT_MIG_ATTRIBUTES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    attributes.insert("type".to_string(), string("mig"));
    if let Some(uuid) = uuid {
        attributes.insert("uuid".to_string(), string(uuid));
    }
    attributes.insert("profile".to_string(), string(&profile.name));
    attributes.insert("parentUUID".to_string(), string(&gpu.uuid));
    if detail == MigAttributes::Full {
        attributes.insert("parentIndex".to_string(), int(i64::from(gpu.index)));
        attributes.insert("parentMinor".to_string(), int(i64::from(gpu.minor)));
    }
    let mut cap = BTreeMap::new();
    cap.insert(
        "memory".to_string(),
        capacity(mib_quantity(profile.memory_mib)),
    );
    cap.insert(
        "multiprocessors".to_string(),
        capacity(profile.multiprocessors.to_string()),
    );
    if detail == MigAttributes::Full {
        for (key, value) in [
            ("copyEngines", profile.copy_engines),
            ("decoders", profile.decoders),
            ("encoders", profile.encoders),
            ("jpegEngines", profile.jpeg_engines),
            ("ofaEngines", profile.ofa_engines),
        ] {
            cap.insert(key.to_string(), capacity(value.to_string()));
        }
    }
    Device {
        name,
        attributes: Some(attributes),
        capacity: Some(cap),
        ..Default::default()
    }
}

/// The VFIO device `gpu-vfio-<i>` of a GPU on the PCI bus, with NVIDIA's attributes: `type`
/// `vfio`, `uuid` (version-5 UUID of the PCI address), `deviceID`, `vendorID`,
/// `productName` (NVML's when NVML has seen the GPU, else the PCI device ID),
/// `iommuFDEnabled`, and the standard `pciBusID`, `pcieRoot`, `numaNode`; capacity
/// `addressableMemory` when NVML has seen the GPU.
pub fn vfio(
    name: String,
    pci: &crate::hardware::passthrough::PciGpu,
    iommufd: bool,
    gpu: Option<&GpuInfo>,
) -> Device {
    let mut a = BTreeMap::new();
    a.insert("type".to_string(), string("vfio"));
    a.insert(
        "uuid".to_string(),
        string(crate::hardware::passthrough::uuid_v5_dns(&pci.address)),
    );
    a.insert("deviceID".to_string(), string(&pci.device_id));
    a.insert(
        "vendorID".to_string(),
        string(crate::hardware::passthrough::NVIDIA_VENDOR),
    );
    a.insert(
        "productName".to_string(),
        string(gpu.map_or(pci.device_id.as_str(), |g| g.product_name.as_str())),
    );
    a.insert(
        "iommuFDEnabled".to_string(),
        DeviceAttribute {
            bool: Some(iommufd),
            ..Default::default()
        },
    );
    a.insert(format!("{STANDARD_DOMAIN}/pciBusID"), string(&pci.address));
    let root = pci
        .pcie_root
        .clone()
        .or_else(|| gpu.map(|g| g.pcie_root.clone()));
    if let Some(root) = root {
        a.insert(format!("{STANDARD_DOMAIN}/pcieRoot"), string(root));
    }
    if let Some(numa) = pci.numa_node.or_else(|| gpu.and_then(|g| g.numa_node)) {
        a.insert(format!("{STANDARD_DOMAIN}/numaNode"), int(numa));
    }
    let capacity = gpu.map(|g| {
        BTreeMap::from([(
            "addressableMemory".to_string(),
            capacity(mib_quantity(g.memory_mib)),
        )])
    });
    Device {
        name,
        attributes: Some(a),
        capacity,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_versions_take_canonical_forms() {
        assert_eq!(mib_quantity(40960), "40Gi");
        assert_eq!(mib_quantity(81559), "81559Mi");
        assert_eq!(mib_quantity(9984), "9984Mi");
        assert_eq!(mib_quantity(0), "0Mi");
        assert_eq!(semver_of("580.95.05").as_deref(), Some("580.95.5"));
        assert_eq!(semver_of("13.0").as_deref(), Some("13.0.0"));
        assert_eq!(semver_of("550").as_deref(), Some("550.0.0"));
        assert_eq!(semver_of("r580"), None);
        assert_eq!(semver_of("1.2.3.4"), None);
    }
}
