//! Built-in simulated nodes. Each preset is an ordinary node file, so users can start from
//! `gpu-dra inventory --print-preset <name>` and edit it.

/// A built-in node description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The name `--sim-node` takes.
    pub name: &'static str,
    /// One line for listings.
    pub summary: &'static str,
    /// The node file.
    pub yaml: &'static str,
}

/// Every preset, in the order listings show them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "mixed",
        summary: "1 × A100-40GB pre-partitioned 2×1g.5gb+2g.10gb+3g.20gb, 1 × H100 dynamic MIG, 1 × L4",
        yaml: "\
nodeName: mixed
gpus:
  - model: A100-SXM4-40GB
    mig: static
    migDevices: [1g.5gb, 1g.5gb, 2g.10gb, 3g.20gb]
  - model: H100-SXM5-80GB
    mig: dynamic
  - model: L4
",
    },
    Preset {
        name: "dgx-a100",
        summary: "8 × A100-SXM4-40GB, GPUs 0–3 MIG half-balanced (2×1g.5gb+2g.10gb+3g.20gb), GPUs 4–7 MIG off",
        yaml: "\
nodeName: dgx-a100
gpus:
  - model: A100-SXM4-40GB
    count: 4
    mig: static
    migDevices: [1g.5gb, 1g.5gb, 2g.10gb, 3g.20gb]
  - model: A100-SXM4-40GB
    count: 4
    mig: disabled
",
    },
    Preset {
        name: "dgx-a100-80",
        summary: "8 × A100-SXM4-80GB with MIG enabled, dynamic MIG",
        yaml: "\
nodeName: dgx-a100-80
gpus:
  - model: A100-SXM4-80GB
    count: 8
    mig: dynamic
",
    },
    Preset {
        name: "dgx-h100",
        summary: "8 × H100 80GB HBM3, dynamic MIG",
        yaml: "\
nodeName: dgx-h100
gpus:
  - model: H100-SXM5-80GB
    count: 8
    mig: dynamic
",
    },
    Preset {
        name: "dgx-h200",
        summary: "8 × H200 141GB, dynamic MIG",
        yaml: "\
nodeName: dgx-h200
gpus:
  - model: H200-SXM-141GB
    count: 8
    mig: dynamic
",
    },
    Preset {
        name: "dgx-b200",
        summary: "8 × B200, dynamic MIG (B200 memory and SM figures are estimates)",
        yaml: "\
nodeName: dgx-b200
gpus:
  - model: B200
    count: 8
    mig: dynamic
",
    },
    Preset {
        name: "gb200-nvl72-node",
        summary: "4 × GB200, one compute tray of a GB200 NVL72 rack: all GPUs in NVLink clique 1 (fabric Completed), MIG off",
        yaml: "\
nodeName: gb200-nvl72-node
numaNodes: 2
gpus:
  - model: GB200
    count: 4
    fabric:
      clusterUuid: 6d9c2f5e-3b1a-4e7d-8c0f-2a4b6c8d0e1f
      cliqueId: 1
      state: Completed
",
    },
    Preset {
        name: "hgx-h100-16",
        summary: "16 × H100 80GB HBM3, dynamic MIG (more than 8 GPUs: counter sets span slices)",
        yaml: "\
nodeName: hgx-h100-16
numaNodes: 4
gpus:
  - model: H100-SXM5-80GB
    count: 16
    mig: dynamic
",
    },
    Preset {
        name: "hgx-h100-fm",
        summary: "8 × H100 80GB HBM3 on an NVSwitch baseboard (module IDs 1–8), Fabric Manager in shared NVSwitch mode (FABRIC_MODE=1), MIG off",
        yaml: "\
nodeName: hgx-h100-fm
nvswitch: true
fabricMode: 1
gpus:
  - model: H100-SXM5-80GB
    count: 8
    mig: disabled
",
    },
    Preset {
        name: "a30-x4",
        summary: "4 × A30 24GB, dynamic MIG",
        yaml: "\
nodeName: a30-x4
numaNodes: 1
gpus:
  - model: A30-24GB
    count: 4
    mig: dynamic
",
    },
    Preset {
        name: "l4-x4",
        summary: "4 × L4 (no MIG)",
        yaml: "\
nodeName: l4-x4
numaNodes: 1
gpus:
  - model: L4
    count: 4
",
    },
    Preset {
        name: "rtx4090",
        summary: "1 × GeForce RTX 4090 workstation (no MIG)",
        yaml: "\
nodeName: rtx4090
numaNodes: 1
gpus:
  - model: RTX-4090
",
    },
    Preset {
        name: "hgx-h100-passthrough",
        summary: "8 × H100 80GB HBM3 on NVSwitch, dynamic MIG, IOMMU on with one group per GPU, Fabric Manager in shared mode: VFIO passthrough (--passthrough, --fabric-manager)",
        yaml: "\
nodeName: hgx-h100-passthrough
gpus:
  - model: H100-SXM5-80GB
    count: 8
    mig: dynamic
nvswitch: true
fabricMode: 1
passthrough:
  iommu: true
",
    },
    Preset {
        name: "hgx-h100-passthrough-shared-group",
        summary: "hgx-h100-passthrough, but GPU 0 shares its IOMMU group with a network card (VFIO refused for it)",
        yaml: "\
nodeName: hgx-h100-passthrough-shared-group
gpus:
  - model: H100-SXM5-80GB
    count: 8
    mig: dynamic
passthrough:
  iommu: true
  sharedGroup: [0]
",
    },
    Preset {
        name: "hgx-h100-passthrough-iommu-off",
        summary: "hgx-h100-passthrough with the IOMMU off (--passthrough refuses to start)",
        yaml: "\
nodeName: hgx-h100-passthrough-iommu-off
gpus:
  - model: H100-SXM5-80GB
    count: 8
    mig: dynamic
passthrough:
  iommu: false
",
    },
    Preset {
        name: "hgx-h100-vgpu",
        summary: "8 × H100 80GB HBM3 on NVSwitch, dynamic MIG, IOMMU on, NVIDIA vGPU on SR-IOV (32 VFs per GPU enabled, one vGPU type per GPU): vGPUs for VMs",
        yaml: "\
nodeName: hgx-h100-vgpu
gpus:
  - model: H100-SXM5-80GB
    count: 8
    mig: dynamic
    vgpu:
      framework: vdev
      heterogeneous: false
nvswitch: true
passthrough:
  iommu: true
",
    },
    Preset {
        name: "l40s-vgpu",
        summary: "4 × L40S, IOMMU on, NVIDIA vGPU on SR-IOV (32 VFs per GPU enabled) in heterogeneous mode: Q types of different sizes share a GPU, the B types run alone",
        yaml: "\
nodeName: l40s-vgpu
gpus:
  - model: L40S
    count: 4
    vgpu:
      framework: vdev
      heterogeneous: true
passthrough:
  iommu: true
",
    },
    Preset {
        name: "t4-vgpu-mdev",
        summary: "4 × Tesla T4, IOMMU on, NVIDIA vGPU on mediated devices (mdev_supported_types, one vGPU type per GPU)",
        yaml: "\
nodeName: t4-vgpu-mdev
gpus:
  - model: T4
    count: 4
    vgpu:
      framework: mdev
passthrough:
  iommu: true
",
    },
];

/// The preset named `name`, if any.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// Comma-separated preset names, for error messages.
pub fn preset_names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}
