//! Pure conversions from NVML's raw values to gpu-dra's vocabulary. Kept apart from the FFI so
//! they are tested without a GPU.

use crate::hardware::Architecture;

/// Architecture from the CUDA compute capability (NVML's architecture enum lags new chips;
/// the compute capability does not).
pub fn architecture_from_cc(major: u32, minor: u32) -> Architecture {
    match (major, minor) {
        (7, 5) => Architecture::Turing,
        (7, _) => Architecture::Volta,
        (8, 9) => Architecture::AdaLovelace,
        (8, _) => Architecture::Ampere,
        (9, _) => Architecture::Hopper,
        (10.., _) => Architecture::Blackwell,
        _ => Architecture::Pascal,
    }
}

/// CUDA driver version from NVML's integer form (`13000` → `13.0`, `12040` → `12.4`).
pub fn cuda_version(raw: i32) -> String {
    let raw = raw.max(0);
    format!("{}.{}", raw / 1000, (raw % 1000) / 10)
}

/// PCI bus ID in the 4-digit-domain form Kubernetes uses (`00000000:18:00.0` →
/// `0000:18:00.0`), lower-case.
pub fn pci_bus_id(raw: &str) -> String {
    let lower = raw.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// PCIe root complex of a bus ID as sysfs names it (`0000:18:00.0` → `pci0000:18`): the
/// root bus of the device's domain and bus. The kernel's topology may place the root higher;
/// the real backend prefers what sysfs reports when it can read it.
pub fn pcie_root_from_bus_id(bus_id: &str) -> String {
    let mut parts = bus_id.split(':');
    let domain = parts.next().unwrap_or("0000");
    let bus = parts.next().unwrap_or("00");
    format!("pci{domain}:{bus}")
}

/// CUDA cores per streaming multiprocessor for a compute capability (the CUDA samples'
/// `_ConvertSMVer2Cores` table): GA100 has 64, later chips 128.
pub fn cores_per_sm(major: u32, minor: u32) -> u32 {
    match (major, minor) {
        (8, 0) | (7, _) | (6, 0) => 64,
        _ => 128,
    }
}

/// NVML brand name as NVIDIA's driver publishes it.
pub fn brand_name(brand: &nvml_wrapper::enum_wrappers::device::Brand) -> String {
    use nvml_wrapper::enum_wrappers::device::Brand;
    match brand {
        Brand::GeForce | Brand::GeForceRTX => "GeForce",
        Brand::Quadro | Brand::QuadroRTX => "Quadro",
        Brand::Tesla => "Tesla",
        Brand::Titan | Brand::TitanRTX => "Titan",
        Brand::NvidiaRTX => "NvidiaRTX",
        Brand::Unknown => "Unknown",
        _ => "Nvidia",
    }
    .to_string()
}

/// Derives a GPU-instance profile name the way NVIDIA's tools do: `<G>g.<GB>gb` with
/// GB = round(ceil(mem / total × 8) / 8 × ceil(total / 1 GiB)), plus a suffix for the profile
/// variant (`+me`, `+me.all`, `+gfx`, `-me`).
pub fn profile_name(
    profile_index: u32,
    slice_count: u32,
    memory_mib: u64,
    total_mib: u64,
) -> String {
    let total = total_mib.max(1) as f64;
    let eighths = ((memory_mib as f64) / total * 8.0).ceil();
    let gb = (eighths / 8.0 * (total / 1024.0).ceil()).round() as u64;
    let suffix = match profile_index {
        7 | 8 => "+me",
        15 | 16 => "+me.all",
        10 | 11 | 12 | 17 => "+gfx",
        13 | 14 => "-me",
        _ => "",
    };
    format!("{slice_count}g.{gb}gb{suffix}")
}

/// The compute-instance profile index whose slice count equals a GPU instance's: the default
/// compute instance that takes the whole GI (what `nvidia-smi mig -cgi … -C` creates).
pub fn default_ci_profile_index(gi_compute_slices: u32) -> Option<u32> {
    Some(match gi_compute_slices {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::catalog;

    #[test]
    fn derived_profile_names_match_every_table_row() {
        for model in catalog::models().unwrap() {
            for p in &model.profiles {
                let got = profile_name(p.index, p.compute_slices, p.memory_mib, model.memory_mib);
                assert_eq!(got, p.name, "{} profile index {}", model.key, p.index);
            }
        }
    }

    #[test]
    fn raw_values_convert_to_published_forms() {
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(pci_bus_id("00000000:18:00.0"), "0000:18:00.0");
        assert_eq!(pci_bus_id("0000:AB:00.0"), "0000:ab:00.0");
        assert_eq!(pcie_root_from_bus_id("0000:18:00.0"), "pci0000:18");
        assert_eq!(architecture_from_cc(9, 0), Architecture::Hopper);
        assert_eq!(architecture_from_cc(8, 9), Architecture::AdaLovelace);
        assert_eq!(architecture_from_cc(8, 0), Architecture::Ampere);
        assert_eq!(architecture_from_cc(10, 0), Architecture::Blackwell);
        assert_eq!(default_ci_profile_index(3), Some(2));
        assert_eq!(default_ci_profile_index(5), None);
        assert_eq!(cores_per_sm(8, 0), 64);
        assert_eq!(cores_per_sm(9, 0), 128);
    }
}
