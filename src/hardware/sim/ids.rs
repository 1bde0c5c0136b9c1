//! Stable identities for simulated hardware: UUIDs, PCI addresses, NUMA placement.
//!
//! Everything is derived from the node name and the GPU index with a fixed hash, so a
//! restarted plugin (or a second node with another name) sees the same (or different)
//! identities exactly as real hardware would.

/// 64-bit FNV-1a; fixed across Rust versions and platforms, unlike `DefaultHasher`.
fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(hash)
}

/// splitmix64's finaliser: FNV alone leaves similar inputs with similar high bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Formats 128 hashed bits as `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn uuid_from(prefix: &str, key: &str) -> String {
    let hi = fnv1a(0x5bd1_e995, key.as_bytes());
    let lo = fnv1a(0x27d4_eb2f_1656_67c5, key.as_bytes());
    format!(
        "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// The UUID of GPU `index` on node `node`.
pub fn gpu_uuid(node: &str, index: u32) -> String {
    uuid_from("GPU", &format!("{node}/gpu/{index}"))
}

/// The UUID of a MIG device; `serial` makes a re-created device differ from its predecessor,
/// as on real hardware.
pub fn mig_uuid(gpu_uuid: &str, gi: u32, ci: u32, serial: u64) -> String {
    uuid_from("MIG", &format!("{gpu_uuid}/gi/{gi}/ci/{ci}/{serial}"))
}

/// PCI buses of an HGX baseboard's GPUs (the DGX H100 layout), then further buses for larger
/// simulated nodes.
const BUSES: [u32; 16] = [
    0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb, 0x1b, 0x2d, 0x3d, 0x60, 0x9d, 0xae, 0xbd, 0xde,
];

/// PCI bus ID (`0000:18:00.0`) and PCIe root (`pci0000:18`) of GPU `index`: each GPU has
/// its own root bus, the root the NVML backend derives from a bus ID when sysfs has no such
/// NVIDIA device, so the simulated NVML library publishes the same `pcieRoot`.
pub fn pci_address(index: u32) -> (String, String) {
    let i = index as usize;
    let bus = BUSES[i % BUSES.len()];
    let domain = (i / BUSES.len()) as u32;
    let bus_id = format!("{domain:04x}:{bus:02x}:00.0");
    let root = crate::hardware::nvml::convert::pcie_root_from_bus_id(&bus_id);
    (bus_id, root)
}

/// NUMA node of GPU `index` when `count` GPUs are spread evenly over `numa_nodes` nodes.
pub fn numa_node(index: u32, count: u32, numa_nodes: u32) -> i64 {
    let per_node = count.div_ceil(numa_nodes.max(1)).max(1);
    i64::from(index / per_node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_stable_and_well_formed() {
        let a = gpu_uuid("dgx-h100", 0);
        assert_eq!(a, gpu_uuid("dgx-h100", 0));
        assert_ne!(a, gpu_uuid("dgx-h100", 1));
        assert_ne!(a, gpu_uuid("other", 0));
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [3, 8, 4, 4, 4, 12]);
        let m = mig_uuid(&a, 7, 0, 1);
        assert!(m.starts_with("MIG-"));
        assert_ne!(m, mig_uuid(&a, 7, 0, 2));
    }

    #[test]
    fn gpus_are_spread_over_numa_nodes() {
        let nodes: Vec<i64> = (0..8).map(|i| numa_node(i, 8, 2)).collect();
        assert_eq!(nodes, [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(
            pci_address(0),
            ("0000:18:00.0".to_string(), "pci0000:18".to_string())
        );
        assert_eq!(pci_address(16).0, "0001:18:00.0");
    }
}
