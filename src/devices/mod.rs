//! The DRA device model, pure: hardware inventory → the devices and shared counters gpu-dra
//! publishes, compatible with NVIDIA's driver so existing claims and DeviceClasses work.
//!
//! # Names (stable, DNS labels)
//! * full GPU: `gpu-<minor>`
//! * MIG device: `gpu-<minor>-mig-<profile>-<start>`, the profile with dots removed and `+`
//!   written `-` (`1g.10gb` → `1g10gb`, `1g.10gb+me` → `1g10gb-me`) and `<start>` the first
//!   memory slice of its placement: `gpu-0-mig-3g40gb-4`. A MIG device keeps its name for
//!   as long as the placement exists, whether it was carved on demand or pre-created.
//! * counter set of a dynamic-MIG GPU: `gpu-<minor>-counter-set`.
//! * vGPU (`--vgpu-types`): `vgpu-<gpu index>-<slug>-<slot>`, `vgpu-0-4c-12` ([`vgpu`]).
//!
//! # MIG policies (per GPU)
//! * `disabled`: the full GPU (only while hardware MIG mode is off).
//! * `static`: the MIG devices that exist, as they are (the full GPU while MIG mode is off).
//! * `dynamic`: every profile at every placement as a partitionable device consuming the GPU's
//!   shared counters (`memory-slice-0..N-1` plus `memory`, `multiprocessors`, `copy-engines`,
//!   `decoders`, `encoders`, `jpeg-engines`, `ofa-engines`), and the full GPU consuming all of
//!   them. On Ampere, where switching MIG mode needs a GPU reset, only the side the current
//!   mode allows is published.
//!
//! # Sharing ([`SharedGpus`], KEP-5075 consumable capacity)
//! Off by default (output unchanged). When on, every full GPU and MIG device is published with
//! `allowMultipleAllocations: true` and a request policy on each capacity (`memory` in whole
//! MiB, `multiprocessors` in whole SMs, engines defaulting to nothing), so several claims can
//! hold shares of one device; [`share_limits`] turns a share into MPS client limits. Names,
//! attributes and counters are the same either way: a shared device's counters are consumed
//! once, by its first share (Kubernetes' rule).

mod attributes;
mod counters;
mod packing;
pub mod profiles;
mod share_limits;
mod sharing;
pub mod split;
pub mod vgpu;
pub mod vgpu_config;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{CounterSet, Device, DeviceAttribute};

use crate::hardware::{GpuInfo, MigPolicy, MigProfile, NodeInventory, Placement};

pub use attributes::{COMPACT_MIG_ATTRIBUTES, COMPACT_MIG_CAPACITIES, mib_quantity, semver_of};
pub use counters::counter_set_name;
pub use packing::placement_order;
pub use profiles::{MigProfileSet, MigProfilesError};
pub use share_limits::{ShareLimits, share_limits};
pub use sharing::{MAX_SHARES, MIN_SHARES, SharedGpus, SharingError};
pub use vgpu_config::{VgpuTypes, VgpuTypesError};

/// The default DRA driver name, shared with NVIDIA's driver.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.nvidia.com";

/// What a published device is in hardware terms: what prepare must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// A whole GPU.
    Gpu,
    /// A MIG device that exists (static policy).
    MigStatic {
        /// Its UUID.
        uuid: String,
        /// Profile driver id.
        profile_id: u32,
        /// Profile name.
        profile: String,
        /// GPU instance id.
        gi_id: u32,
        /// Compute instance id.
        ci_id: u32,
        /// Placement.
        placement: Placement,
    },
    /// A MIG placement carved on demand (dynamic policy).
    MigDynamic {
        /// Profile driver id.
        profile_id: u32,
        /// Profile name.
        profile: String,
        /// Placement to create the GPU instance at.
        placement: Placement,
    },
    /// A whole GPU handed to a VM through VFIO (`gpu-vfio-<i>`): prepare moves it from
    /// `nvidia` to `vfio-pci`.
    Vfio {
        /// PCI address, `0000:18:00.0`.
        address: String,
    },
    /// One instance slot of a vGPU type (`vgpu-<gpu index>-<slug>-<slot>`, `--vgpu-types`):
    /// prepare creates a vGPU of the type on the parent GPU (a free VF's `current_vgpu_type`,
    /// or an mdev through `create`); nothing on the host says which slot a vGPU fills.
    Vgpu {
        /// The type ID NVML reports, what `current_vgpu_type` and `nvidia-<id>` take.
        type_id: u32,
        /// The type's name without `NVIDIA `, `H100-4C`.
        type_name: String,
        /// How vGPUs are created on the parent GPU.
        framework: crate::hardware::vgpu::VgpuFramework,
        /// The parent GPU's PCI address (normalised, `0000:18:00.0`): the physical function
        /// whose VFs (vdev) or `mdev_supported_types` (mdev) hold the vGPU.
        parent_address: String,
        /// Which of the type's instance slots this device is (0-based).
        slot: u32,
    },
}

/// The `gpu_index` and `gpu_minor` of a VFIO device whose GPU NVML has not seen (on
/// `vfio-pci` since before this process started).
pub const UNKNOWN_GPU: u32 = u32::MAX;

/// One device as published, with its hardware coordinates.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedDevice {
    /// NVML index of the (parent) GPU.
    pub gpu_index: u32,
    /// Minor number of the (parent) GPU's device node.
    pub gpu_minor: u32,
    /// UUID of the (parent) GPU.
    pub gpu_uuid: String,
    /// What it is.
    pub kind: DeviceKind,
    /// The `resource.k8s.io/v1` device (its `name` is the device name).
    pub device: Device,
}

impl PublishedDevice {
    /// The device name.
    pub fn name(&self) -> &str {
        &self.device.name
    }
}

/// Everything a node publishes: devices in GPU order, and the counter sets they consume.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceModel {
    /// Devices, grouped by GPU in index order; within a GPU the full GPU first, then MIG
    /// devices by profile table order, each profile's dynamic placements in packing order
    /// ([`placement_order`]: the one that blocks larger profiles least first).
    pub devices: Vec<PublishedDevice>,
    /// One counter set per dynamic-MIG GPU and per GPU offering vGPU types, in GPU order;
    /// then those of passthrough GPUs without either.
    pub counter_sets: Vec<CounterSet>,
    /// Things a person should know (e.g. a GPU left out and why).
    pub warnings: Vec<String>,
    /// How the devices are ordered and grouped into slices ([`SliceLayout::Interleaved`] by
    /// default).
    pub slice_layout: SliceLayout,
    /// `spec.partitionTypeAttribute` of the slices holding dynamic-MIG devices
    /// (`--partitionable-devices-type`, Kubernetes 1.37 `DRAPartitionableDevicesType`): the
    /// fully qualified `profile` attribute, `gpu.nvidia.com/profile`; `None` (default) sets
    /// none.
    pub partition_type_attribute: Option<String>,
    /// Names of the MIG devices of the whole-GPU profile (`7g.80gb`) that the `gpus-first` and
    /// `interleaved` walks take with the whole GPUs rather than with the GPU's other MIG
    /// devices: under `--mig-profiles split`, where the GPUs offer different profiles, so
    /// that whole-GPU claims of either kind take the GPUs in [`split::whole_order`]. Empty
    /// otherwise.
    pub whole_gpu_mig: BTreeSet<String>,
}

/// How a node's devices are ordered and grouped into ResourceSlices (`--slice-layout`).
///
/// kube-scheduler (1.36 and later, with its default feature gates) walks a pool's slices in
/// name order, which is the order they are published in, and each slice's devices in
/// published order, taking the first device that fits: this order is the packing policy, and
/// the devices before the first free match are the walk every node evaluation pays for
/// (docs/device-model.md, "Packing order").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SliceLayout {
    /// Whole GPUs first, from the lowest index up; then the MIG devices that exist (static
    /// MIG), GPU by GPU; then each dynamic-MIG GPU's devices together, from the highest GPU
    /// index down: full-GPU and MIG claims fill the node from opposite ends, so neither walks
    /// past the other's busy GPUs, and a full-GPU request meets at most the node's whole GPUs
    /// before a free one. A MIG request first passes the whole GPUs that are not allocated
    /// (one selector evaluation each), and takes an existing instance before carving one.
    GpusFirst,
    /// The order of `gpus-first`, with whole GPUs and MIG devices alternating at the head:
    /// the first whole GPU, the first MIG device, the second whole GPU, the second MIG
    /// device, and so on until the whole GPUs run out, then the rest of the MIG devices.
    /// Each kind keeps its `gpus-first` order, so a request of one kind takes the same device
    /// as there, but neither passes every device of the other kind first: on an idle node a
    /// full-GPU request evaluates one device and a MIG request two, and on a node holding
    /// `k` claims either evaluates about `k` devices of the other kind (at most the node's
    /// whole GPUs) before a free one.
    #[default]
    Interleaved,
    /// Each GPU's devices together (the whole GPU, then its MIG devices), GPU after GPU, two
    /// H100s to a slice: short walks for MIG requests on idle nodes, but a full-GPU request
    /// walks every MIG device of each busy GPU before a free one.
    ByGpu,
    /// Whole GPUs together, then each MIG profile's devices of every GPU together (GPU order,
    /// then packing order): a one-profile request finds every candidate in one slice; a
    /// request for a larger profile walks every device of the smaller profiles first.
    ByProfile,
}

impl SliceLayout {
    /// Every layout, in the order `--help` and errors list them.
    pub const ALL: [SliceLayout; 4] = [
        SliceLayout::Interleaved,
        SliceLayout::GpusFirst,
        SliceLayout::ByGpu,
        SliceLayout::ByProfile,
    ];

    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            SliceLayout::Interleaved => "interleaved",
            SliceLayout::GpusFirst => "gpus-first",
            SliceLayout::ByGpu => "by-gpu",
            SliceLayout::ByProfile => "by-profile",
        }
    }
}

impl std::str::FromStr for SliceLayout {
    type Err = String;

    /// Parses a flag value; the error names the value and the valid ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Self::ALL
            .into_iter()
            .find(|layout| layout.name() == wanted)
            .ok_or_else(|| {
                let valid: Vec<&str> = Self::ALL.iter().map(|l| l.name()).collect();
                format!("slice layout {wanted:?} is not one of {}", valid.join(", "))
            })
    }
}

/// What each MIG device carries (`--mig-attributes`).
///
/// A node publishes up to 26 MIG devices per GPU with dynamic MIG, and every attribute and
/// capacity of each is bytes in every copy of the slice (API server, etcd, every watcher) and
/// work for the scheduler on every node it evaluates (docs/configuration.md, "What a node
/// publishes"). Full GPUs always carry every attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigAttributes {
    /// What identifies a MIG device and what claims select MIG devices by: `type`, `uuid`
    /// (when it exists), `profile`, `parentUUID`, `productName`, `cudaComputeCapability`,
    /// `resource.kubernetes.io/pcieRoot`; capacities `memory` and `multiprocessors`.
    #[default]
    Compact,
    /// Also every attribute of the parent GPU (`brand`, `architecture`, `driverVersion`,
    /// `cudaDriverVersion`, `resource.kubernetes.io/pciBusID`, `resource.kubernetes.io/numaNode`),
    /// `parentIndex`, `parentMinor`, and the engine capacities (`copyEngines`, `decoders`,
    /// `encoders`, `jpegEngines`, `ofaEngines`).
    Full,
}

impl MigAttributes {
    /// Every choice, in the order `--help` and errors list them.
    pub const ALL: [MigAttributes; 2] = [MigAttributes::Compact, MigAttributes::Full];

    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            MigAttributes::Compact => "compact",
            MigAttributes::Full => "full",
        }
    }
}

impl std::str::FromStr for MigAttributes {
    type Err = String;

    /// Parses a flag value; the error names the value and the valid ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Self::ALL
            .into_iter()
            .find(|choice| choice.name() == wanted)
            .ok_or_else(|| {
                let valid: Vec<&str> = Self::ALL.iter().map(|c| c.name()).collect();
                format!(
                    "MIG attributes {wanted:?} is not one of {}",
                    valid.join(", ")
                )
            })
    }
}

impl DeviceModel {
    /// The device named `name`, if published.
    pub fn device(&self, name: &str) -> Option<&PublishedDevice> {
        self.devices.iter().find(|d| d.device.name == name)
    }
}

/// How to publish: the driver name, each GPU's MIG policy, and whether devices are shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelOptions {
    /// DRA driver name (attribute domain).
    pub driver_name: String,
    /// Policy per GPU index; GPUs not listed use [`ModelOptions::default_policy`].
    pub policies: BTreeMap<u32, MigPolicy>,
    /// Policy for GPUs not in `policies`; `None` means: `static` if the GPU's MIG mode is
    /// on, `disabled` otherwise.
    pub default_policy: Option<MigPolicy>,
    /// Whether full GPUs and MIG devices are published shareable between claims
    /// (consumable capacity); [`SharedGpus::Off`] by default.
    pub shared_gpus: SharedGpus,
    /// Which MIG profiles dynamic-MIG GPUs publish (`--mig-profiles`); every profile by
    /// default. Check it against the node with [`profiles::check`].
    pub mig_profiles: MigProfileSet,
    /// How the devices are grouped into slices (`--slice-layout`); by GPU by default.
    pub slice_layout: SliceLayout,
    /// What MIG devices carry (`--mig-attributes`); compact by default.
    pub mig_attributes: MigAttributes,
    /// Publish a VFIO device `gpu-vfio-<i>` per GPU on the PCI bus (`--passthrough`), from
    /// the inventory's `passthrough` facts; off by default.
    pub passthrough: bool,
    /// Fabric Manager's partition list on an FM node (`--fabric-manager`): full GPUs then
    /// carry `gpuModuleID` and `partition1/2/4/8`; `None` (default) publishes neither.
    pub fabric_partitions: Option<std::sync::Arc<crate::fabric_manager::PartitionTable>>,
    /// Which vGPU types GPUs offer (`--vgpu-types`); off by default. Check it against the
    /// node with [`vgpu_config::check`].
    pub vgpu_types: VgpuTypes,
    /// Compatibility groups on every consumption of the counter set of a GPU offering vGPU
    /// types (`--compatibility-groups`, Kubernetes 1.37 `DRADeviceCompatibilityGroups`):
    /// such a GPU then also offers MIG devices and types that may not share it; off by
    /// default.
    pub compatibility_groups: bool,
    /// Set `partitionTypeAttribute` on the slices holding dynamic-MIG devices
    /// (`--partitionable-devices-type`, Kubernetes 1.37 `DRAPartitionableDevicesType`); off
    /// by default.
    pub partitionable_devices_type: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            driver_name: DEFAULT_DRIVER_NAME.to_string(),
            policies: BTreeMap::new(),
            default_policy: None,
            shared_gpus: SharedGpus::Off,
            mig_profiles: MigProfileSet::All,
            slice_layout: SliceLayout::default(),
            mig_attributes: MigAttributes::Compact,
            passthrough: false,
            fabric_partitions: None,
            vgpu_types: VgpuTypes::Off,
            compatibility_groups: false,
            partitionable_devices_type: false,
        }
    }
}

impl ModelOptions {
    /// Options for `driver_name` with one policy per GPU index (as a simulated node file
    /// gives them).
    pub fn with_policies(driver_name: &str, policies: &[MigPolicy]) -> ModelOptions {
        ModelOptions {
            driver_name: driver_name.to_string(),
            policies: (0u32..).zip(policies.iter().copied()).collect(),
            ..ModelOptions::default()
        }
    }

    /// The policy that applies to `gpu`.
    pub fn policy_for(&self, gpu: &GpuInfo) -> MigPolicy {
        if let Some(p) = self.policies.get(&gpu.index) {
            return *p;
        }
        self.default_policy.unwrap_or(if gpu.mig.current {
            MigPolicy::Static
        } else {
            MigPolicy::Disabled
        })
    }
}

/// Builds the device model of a node. Pure and deterministic: the same inventory and options
/// give the same model.
pub fn build(inventory: &NodeInventory, options: &ModelOptions) -> DeviceModel {
    let mut model = DeviceModel {
        slice_layout: options.slice_layout,
        partition_type_attribute: options
            .partitionable_devices_type
            .then(|| format!("{}/profile", options.driver_name)),
        ..DeviceModel::default()
    };
    // Counter sets of GPUs offering vGPU types: their consumptions get compatibility groups.
    let mut vgpu_sets = BTreeSet::new();
    let split_gpus: Vec<&GpuInfo> = match options.mig_profiles {
        MigProfileSet::Split => {
            let hidden = inventory.passthrough.iter().flat_map(|f| &f.hidden_gpus);
            inventory
                .gpus
                .iter()
                .chain(hidden)
                .filter(|g| g.mig.capable && options.policy_for(g) == MigPolicy::Dynamic)
                .collect()
        }
        _ => Vec::new(),
    };
    let split_plan =
        (options.mig_profiles == MigProfileSet::Split).then(|| split::plan(&split_gpus));
    for gpu in &inventory.gpus {
        let policy = options.policy_for(gpu);
        let common = attributes::common(inventory, gpu);
        // vGPU types are offered exactly where the full GPU is published: both need the GPU
        // out of MIG mode.
        let vgpu_types = vgpu::offer(gpu, options, &mut model.warnings);
        let not_in_mig_mode = |model: &mut DeviceModel| {
            if !vgpu_types.is_empty() {
                model.warnings.push(format!(
                    "GPU {} ({}) is in MIG mode: its vGPU types are not offered until MIG mode is off",
                    gpu.index, gpu.product_name
                ));
            }
        };
        let full = || {
            let mut device = attributes::full_gpu(&common, gpu);
            if let (Some(table), Some(attrs)) =
                (&options.fabric_partitions, device.attributes.as_mut())
            {
                attrs.extend(crate::fabric_manager::attributes(gpu.module_id, table));
            }
            PublishedDevice {
                gpu_index: gpu.index,
                gpu_minor: gpu.minor,
                gpu_uuid: gpu.uuid.clone(),
                kind: DeviceKind::Gpu,
                device,
            }
        };
        match policy {
            MigPolicy::Disabled if gpu.mig.current => {
                model.warnings.push(format!(
                    "GPU {} ({}) has MIG mode on but MIG policy \"disabled\": not published (turn MIG off, or use policy static or dynamic)",
                    gpu.index, gpu.uuid
                ));
                not_in_mig_mode(&mut model);
            }
            MigPolicy::Disabled => push_full_and_vgpus(
                &mut model,
                gpu,
                full(),
                &vgpu_types,
                options,
                &mut vgpu_sets,
            ),
            MigPolicy::Static => {
                if !gpu.mig.current {
                    push_full_and_vgpus(
                        &mut model,
                        gpu,
                        full(),
                        &vgpu_types,
                        options,
                        &mut vgpu_sets,
                    );
                } else {
                    not_in_mig_mode(&mut model);
                }
                for mig in &gpu.mig_devices {
                    let Some(profile) = gpu.profile_by_id(mig.profile_id) else {
                        model.warnings.push(format!(
                            "GPU {}: MIG device {} has unknown profile id {}; not published",
                            gpu.index, mig.uuid, mig.profile_id
                        ));
                        continue;
                    };
                    let mut name = mig_device_name(gpu.minor, &profile.name, mig.placement.start);
                    if mig.ci_id != 0 {
                        name.push_str(&format!("-ci{}", mig.ci_id));
                    }
                    model.devices.push(PublishedDevice {
                        gpu_index: gpu.index,
                        gpu_minor: gpu.minor,
                        gpu_uuid: gpu.uuid.clone(),
                        kind: DeviceKind::MigStatic {
                            uuid: mig.uuid.clone(),
                            profile_id: profile.id,
                            profile: profile.name.clone(),
                            gi_id: mig.gi_id,
                            ci_id: mig.ci_id,
                            placement: mig.placement,
                        },
                        device: attributes::mig(
                            &common,
                            gpu,
                            profile,
                            name,
                            Some(&mig.uuid),
                            options.mig_attributes,
                        ),
                    });
                }
            }
            MigPolicy::Dynamic => {
                if !gpu.mig.capable {
                    model.warnings.push(format!(
                        "GPU {} ({}) does not support MIG; published as a full GPU despite policy \"dynamic\"",
                        gpu.index, gpu.product_name
                    ));
                    push_full_and_vgpus(
                        &mut model,
                        gpu,
                        full(),
                        &vgpu_types,
                        options,
                        &mut vgpu_sets,
                    );
                    continue;
                }
                let mut set = counters::counter_set(gpu);
                let needs_reset = gpu.architecture.mig_toggle_needs_reset();
                let full_published = !needs_reset || !gpu.mig.current;
                let offers_vgpu = full_published && !vgpu_types.is_empty();
                if offers_vgpu {
                    counters::add_framebuffer(
                        &mut set,
                        gpu.vgpu.as_ref().map_or(0, vgpu::framebuffer_mib),
                    );
                } else {
                    not_in_mig_mode(&mut model);
                }
                if full_published {
                    let mut device = full();
                    device.device.consumes_counters =
                        Some(vec![counters::full_gpu_consumption(gpu, &set)]);
                    model.devices.push(device);
                }
                // Without compatibility groups nothing keeps MIG devices and vGPUs of one GPU
                // apart (they consume different counters), so a GPU offering vGPUs offers no
                // MIG devices.
                let mig_published = !offers_vgpu || options.compatibility_groups;
                if !mig_published && !gpu.mig_devices.is_empty() {
                    model.warnings.push(format!(
                        "GPU {} ({}) offers vGPU types without --compatibility-groups: its {} existing MIG devices are not published",
                        gpu.index,
                        gpu.product_name,
                        gpu.mig_devices.len()
                    ));
                }
                if (!needs_reset || gpu.mig.current) && mig_published {
                    let offered = gpu
                        .mig_profiles
                        .iter()
                        .filter(|p| options.mig_profiles.offers(&p.name));
                    // Under `split` a GPU publishes its share of the placements, and every
                    // MIG device that exists on it: a device a claim holds never vanishes.
                    let address = crate::hardware::passthrough::normalize_address(&gpu.pci_bus_id);
                    let share = split_plan
                        .as_ref()
                        .map(|plan| plan.get(&address).cloned().unwrap_or_default());
                    let publishes = |profile: &MigProfile, start: u32| match &share {
                        None => true,
                        Some(share) => {
                            share.iter().any(|(p, s)| *p == profile.name && *s == start)
                                || gpu.mig_devices.iter().any(|m| {
                                    m.profile_id == profile.id && m.placement.start == start
                                })
                        }
                    };
                    let before = model.devices.len();
                    let max_cs = gpu.mig_profiles.iter().map(|p| p.compute_slices).max();
                    // A GPU alone of its model publishes everything, as under `all`, and
                    // keeps `all`'s walk.
                    let shared_out = split_gpus
                        .iter()
                        .filter(|g| g.product_name == gpu.product_name)
                        .count()
                        > 1;
                    for profile in offered {
                        for &start in &profile.placement_starts {
                            if !publishes(profile, start) {
                                continue;
                            }
                            let device = dynamic_mig(&common, gpu, profile, start, options);
                            if shared_out && Some(profile.compute_slices) == max_cs {
                                model.whole_gpu_mig.insert(device.name().to_string());
                            }
                            model.devices.push(device);
                        }
                    }
                    if model.devices.len() == before && options.mig_profiles != MigProfileSet::All {
                        model.warnings.push(format!(
                            "GPU {} ({}) has none of the MIG profiles of --mig-profiles {}: no MIG device published",
                            gpu.index, gpu.product_name, options.mig_profiles
                        ));
                    }
                }
                if offers_vgpu {
                    model.devices.extend(vgpu::devices(
                        gpu,
                        &vgpu_types,
                        options.compatibility_groups,
                    ));
                    vgpu_sets.insert(set.name.clone());
                }
                model.counter_sets.push(set);
            }
        }
    }
    if options.passthrough
        && let Some(facts) = &inventory.passthrough
    {
        add_vfio_devices(&mut model, inventory, facts, options);
    }
    if options.compatibility_groups {
        vgpu::assign_groups(&mut model.devices, &vgpu_sets);
    }
    if options.shared_gpus.is_on() {
        for published in &mut model.devices {
            let Some(gpu) = inventory
                .gpus
                .iter()
                .find(|g| g.index == published.gpu_index)
            else {
                continue;
            };
            let (memory_mib, multiprocessors) = match &published.kind {
                DeviceKind::Gpu => (gpu.memory_mib, gpu.multiprocessors),
                DeviceKind::MigStatic { profile_id, .. }
                | DeviceKind::MigDynamic { profile_id, .. } => gpu
                    .profile_by_id(*profile_id)
                    .map_or((0, 0), |p| (p.memory_mib, p.multiprocessors)),
                // A VM gets the whole GPU (or its vGPU) or nothing.
                DeviceKind::Vfio { .. } | DeviceKind::Vgpu { .. } => continue,
            };
            sharing::make_shareable(
                &mut published.device,
                options.shared_gpus,
                memory_mib,
                multiprocessors,
            );
        }
    }
    packing::order(&mut model.devices, inventory);
    // `by-gpu` keeps each GPU's devices together, so it cannot move whole GPUs alone.
    if let Some(plan) = &split_plan
        && options.slice_layout != SliceLayout::ByGpu
    {
        let order = split::whole_order(&split_gpus, plan);
        let address_of: BTreeMap<u32, String> = inventory
            .gpus
            .iter()
            .map(|g| {
                let address = crate::hardware::passthrough::normalize_address(&g.pci_bus_id);
                (g.index, address)
            })
            .collect();
        let rank = |d: &PublishedDevice| -> Option<usize> {
            let address = match &d.kind {
                DeviceKind::Vfio { address, .. } => Some(address),
                DeviceKind::Gpu => address_of.get(&d.gpu_index),
                DeviceKind::MigDynamic { .. } if model.whole_gpu_mig.contains(d.name()) => {
                    address_of.get(&d.gpu_index)
                }
                _ => None,
            }?;
            order.iter().position(|a| a == address)
        };
        let mut devices = std::mem::take(&mut model.devices);
        packing::whole_order(&mut devices, &rank);
        model.devices = devices;
    }
    // Fabric Manager partitions come first where they apply (a stable order: whole GPUs of
    // equal standing keep the order above).
    if let Some(table) = &options.fabric_partitions
        && options.slice_layout != SliceLayout::ByGpu
    {
        let free: std::collections::BTreeSet<u32> = inventory
            .gpus
            .iter()
            .filter(|g| {
                g.mig_devices.is_empty()
                    && model
                        .devices
                        .iter()
                        .any(|d| d.gpu_index == g.index && matches!(d.kind, DeviceKind::Gpu))
            })
            .map(|g| g.module_id)
            .collect();
        let busy = table
            .partitions()
            .iter()
            .flat_map(|p| p.modules())
            .filter(|m| !free.contains(m))
            .collect();
        packing::fabric_order(&mut model.devices, table, &busy);
    }
    model
}

/// Publishes `full` and, when `gpu` offers `types`, its vGPU devices and a counter set with
/// only the framebuffer, which the full GPU consumes whole (a GPU without dynamic MIG).
fn push_full_and_vgpus(
    model: &mut DeviceModel,
    gpu: &GpuInfo,
    mut full: PublishedDevice,
    types: &[&crate::hardware::vgpu::VgpuType],
    options: &ModelOptions,
    vgpu_sets: &mut BTreeSet<String>,
) {
    if types.is_empty() {
        model.devices.push(full);
        return;
    }
    let set = counters::framebuffer_set(
        gpu.minor,
        gpu.vgpu.as_ref().map_or(0, vgpu::framebuffer_mib),
    );
    full.device.consumes_counters = Some(vec![counters::whole_set_consumption(gpu.minor, &set)]);
    model.devices.push(full);
    model
        .devices
        .extend(vgpu::devices(gpu, types, options.compatibility_groups));
    vgpu_sets.insert(set.name.clone());
    model.counter_sets.push(set);
}

/// The VFIO devices of a passthrough node, numbered by PCI address order as NVIDIA's driver
/// numbers them. A GPU NVML lists (or listed earlier, before it moved to `vfio-pci`) shares
/// its counter set with its VFIO device: the VFIO device consumes all of it, exactly as the
/// full GPU does, so the scheduler never hands out the VFIO device together with the full
/// GPU or a MIG device of the same GPU. A GPU without dynamic MIG gets a one-counter set for
/// this ([`counters::exclusive_set`]). A GPU with MIG devices it does not manage (static
/// policy, or MIG on without dynamic MIG) gets no VFIO device: it is partitioned for
/// containers. A GPU never seen by NVML is published bare (no counters, no parent facts):
/// NVML cannot publish its other devices either.
fn add_vfio_devices(
    model: &mut DeviceModel,
    inventory: &NodeInventory,
    facts: &crate::hardware::passthrough::PciHostFacts,
    options: &ModelOptions,
) {
    use crate::hardware::passthrough::normalize_address;
    for (i, pci) in facts.gpus.iter().enumerate() {
        let visible = inventory
            .gpus
            .iter()
            .find(|g| normalize_address(&g.pci_bus_id) == pci.address);
        let gpu = visible.or_else(|| facts.hidden(&pci.address));
        let policy = gpu.map(|g| options.policy_for(g));
        let dynamic = gpu.is_some_and(|g| g.mig.capable) && policy == Some(MigPolicy::Dynamic);
        if let Some(g) = gpu
            && !dynamic
            && (g.mig.current || !g.mig_devices.is_empty())
        {
            model.warnings.push(format!(
                "GPU {} ({}) has MIG on without dynamic MIG: no VFIO device published for it",
                g.index, pci.address
            ));
            continue;
        }
        // Its SR-IOV VFs (vGPU's virtual functions) are on: it cannot go to a VM whole
        // (prepare would refuse, PassthroughError::SriovVfs), so no VFIO device is offered.
        if pci.sriov_vfs > 0 {
            model.warnings.push(format!(
                "GPU {} has {} SR-IOV VFs enabled (vGPU): no VFIO device published for it; \
                 disable them (sriov-manage -d {}) to hand it to a VM whole",
                pci.address, pci.sriov_vfs, pci.address
            ));
            continue;
        }
        let mut device = attributes::vfio(format!("gpu-vfio-{i}"), pci, facts.iommufd, gpu);
        // On an FM node a VFIO device carries its GPU's module and partitions, as the full GPU
        // does, so claims of several VM GPUs match a partition (`gpu.nvidia.com/partitionN`)
        // and prepare activates it. A GPU NVML cannot see is found in FM's list by address.
        if let (Some(table), Some(attrs)) = (&options.fabric_partitions, device.attributes.as_mut())
            && let Some(module) = gpu
                .map(|g| g.module_id)
                .filter(|m| *m != 0)
                .or_else(|| table.module_by_pci_bus_id(&pci.address))
        {
            attrs.extend(crate::fabric_manager::attributes(module, table));
        }
        if let Some(g) = gpu {
            let set_name = counter_set_name(g.minor);
            let set = match model.counter_sets.iter().find(|s| s.name == set_name) {
                Some(set) => set.clone(),
                None => {
                    let set = if dynamic {
                        counters::counter_set(g)
                    } else {
                        counters::exclusive_set(g.minor)
                    };
                    model.counter_sets.push(set.clone());
                    set
                }
            };
            let whole = counters::whole_set_consumption(g.minor, &set);
            if visible.is_some()
                && let Some(full) = model
                    .devices
                    .iter_mut()
                    .find(|d| d.gpu_minor == g.minor && d.kind == DeviceKind::Gpu)
                && full.device.consumes_counters.is_none()
            {
                full.device.consumes_counters = Some(vec![whole.clone()]);
            }
            device.consumes_counters = Some(vec![whole]);
        }
        model.devices.push(PublishedDevice {
            gpu_index: visible.map_or(UNKNOWN_GPU, |g| g.index),
            gpu_minor: gpu.map_or(UNKNOWN_GPU, |g| g.minor),
            gpu_uuid: gpu.map_or_else(
                || crate::hardware::passthrough::uuid_v5_dns(&pci.address),
                |g| g.uuid.clone(),
            ),
            kind: DeviceKind::Vfio {
                address: pci.address.clone(),
            },
            device,
        });
    }
}

fn dynamic_mig(
    common: &BTreeMap<String, DeviceAttribute>,
    gpu: &GpuInfo,
    profile: &MigProfile,
    start: u32,
    options: &ModelOptions,
) -> PublishedDevice {
    let placement = Placement {
        start,
        size: profile.memory_slices,
    };
    let name = mig_device_name(gpu.minor, &profile.name, start);
    let mut device = attributes::mig(common, gpu, profile, name, None, options.mig_attributes);
    device.consumes_counters = Some(vec![counters::mig_consumption(gpu, profile, placement)]);
    PublishedDevice {
        gpu_index: gpu.index,
        gpu_minor: gpu.minor,
        gpu_uuid: gpu.uuid.clone(),
        kind: DeviceKind::MigDynamic {
            profile_id: profile.id,
            profile: profile.name.clone(),
            placement,
        },
        device,
    }
}

/// The device name of a MIG device: `gpu-<minor>-mig-<profile>-<start>` (see module docs).
pub fn mig_device_name(minor: u32, profile: &str, start: u32) -> String {
    let profile: String = profile
        .chars()
        .filter(|c| *c != '.')
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("gpu-{minor}-mig-{profile}-{start}")
}

/// The device name of a full GPU.
pub fn gpu_device_name(minor: u32) -> String {
    format!("gpu-{minor}")
}
