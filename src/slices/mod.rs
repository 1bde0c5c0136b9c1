//! ResourceSlices, pure: a [`DeviceModel`] → the `resource.k8s.io/v1` ResourceSlice objects
//! of one node's pool, within every API limit.
//!
//! Layout (Kubernetes ≥ 1.35): counter sets go in device-less slices, at most 8 per slice;
//! devices go in slices of at most 128 (64 when any of them consumes counters). Devices are
//! ordered and grouped as the model's [`SliceLayout`] says — interleaved (default: the order of
//! GPUs first with whole GPUs and MIG devices alternating at its head), GPUs first (every whole
//! GPU, then each GPU's MIG devices from the last GPU down), by GPU, or by profile (whole GPUs,
//! then each MIG profile of every GPU) — and groups fill slices in order, a group split only
//! when it alone exceeds a slice. Counter-set slices come first, then device slices; slice `i`
//! is named `<node>-<driver>-<i>`, `i` zero-padded to two digits (more past 100 slices) so that
//! names sort in slice order (the order kube-scheduler ≥ 1.36 walks them in). Every slice
//! carries the pool's generation and the total slice count; with the model's
//! `partition_type_attribute` set, the device slices holding dynamic-MIG devices carry it as
//! `partitionTypeAttribute`. Output is deterministic: the same model gives byte-identical YAML.

mod limits;
mod policy;

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::devices::{DeviceKind, DeviceModel, PublishedDevice, SliceLayout};

pub use limits::{
    MAX_ATTRIBUTES_AND_CAPACITIES, MAX_COUNTER_SETS_PER_SLICE, MAX_COUNTERS_PER_SET,
    MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE_WITH_COUNTERS,
};
pub use policy::MAX_VALID_VALUES;

/// Errors building slices: the model breaks an API limit the API server would reject.
#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    /// A device, attribute or counter breaks a ResourceSlice limit.
    #[error("{object}: {field} {problem}")]
    Limit {
        /// The device or counter set at fault.
        object: String,
        /// The field.
        field: String,
        /// What is wrong, with the limit.
        problem: String,
    },
}

/// Which node's pool the slices describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOptions {
    /// DRA driver name.
    pub driver_name: String,
    /// Node name; also the pool name.
    pub node_name: String,
    /// Pool generation (bumped by the publisher whenever the pool's content changes).
    pub generation: i64,
}

/// A slice holds either counter sets or devices, never both (Kubernetes ≥ 1.35); and its
/// `partitionTypeAttribute`.
type SliceContent = (Option<Vec<CounterSet>>, Option<Vec<Device>>, Option<String>);

/// Builds the slices of one node's pool.
///
/// Fails with [`SliceError::Limit`] naming the device or counter set, the field and the limit
/// when the model cannot be published as it is.
pub fn build(model: &DeviceModel, options: &PoolOptions) -> Result<Vec<ResourceSlice>, SliceError> {
    limits::check_model(model)?;
    let mut specs: Vec<SliceContent> = Vec::new();
    for chunk in model.counter_sets.chunks(MAX_COUNTER_SETS_PER_SLICE) {
        specs.push((Some(chunk.to_vec()), None, None));
    }
    for (group, dynamic_mig) in pack_devices(model) {
        let partition_type = model
            .partition_type_attribute
            .clone()
            .filter(|_| dynamic_mig);
        specs.push((None, Some(group), partition_type));
    }
    let count = specs.len();
    Ok(specs
        .into_iter()
        .enumerate()
        .map(
            |(i, (shared_counters, devices, partition_type_attribute))| ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(slice_name(
                        &options.node_name,
                        &options.driver_name,
                        i,
                        count,
                    )),
                    ..Default::default()
                },
                spec: ResourceSliceSpec {
                    driver: options.driver_name.clone(),
                    node_name: Some(options.node_name.clone()),
                    pool: ResourcePool {
                        name: options.node_name.clone(),
                        generation: options.generation,
                        resource_slice_count: count as i64,
                    },
                    shared_counters,
                    devices,
                    partition_type_attribute,
                    ..Default::default()
                },
            },
        )
        .collect())
}

/// Which group a device belongs to; groups are ordered by it.
type GroupKey<'d> = (u32, u32, &'d str);

/// The group a device belongs to under `layout`, and the order of the groups:
/// - `gpus-first` (and `interleaved` before its head is merged, see [`interleave`]): every
///   whole GPU (and VFIO device) in one group first, then one group per GPU's MIG instances
///   that exist (static MIG: nothing to carve) in GPU order, then one group per dynamic-MIG
///   GPU's MIG devices and vGPUs (created on demand alike, and fill the node from the other
///   end than whole GPUs alike), from the highest GPU index down;
/// - `by-gpu`: one group per GPU, in index order;
/// - `by-profile`: whole GPUs first, then MIG profiles from the smallest placement up, by
///   name within a size (`1g.10gb` before `1g.10gb+me`, `1g.20gb` before `2g.20gb`), then
///   one group per vGPU type, by name.
///
/// Under `--mig-profiles split`, `gpus-first` and `interleaved` take the MIG devices of the
/// whole-GPU profile ([`DeviceModel::whole_gpu_mig`]) with the whole GPUs, after them and in
/// the model's order, so a `7g.80gb` claim takes GPUs in the order full-GPU claims do.
fn group_of<'d>(model: &DeviceModel, d: &'d PublishedDevice) -> GroupKey<'d> {
    let layout = model.slice_layout;
    match (layout, &d.kind) {
        (
            SliceLayout::GpusFirst | SliceLayout::Interleaved,
            DeviceKind::Gpu | DeviceKind::Vfio { .. },
        ) => (0, 0, ""),
        (SliceLayout::GpusFirst | SliceLayout::Interleaved, DeviceKind::MigDynamic { .. })
            if model.whole_gpu_mig.contains(d.name()) =>
        {
            (0, 1, "")
        }
        (SliceLayout::GpusFirst | SliceLayout::Interleaved, DeviceKind::MigStatic { .. }) => {
            (1, d.gpu_index, "")
        }
        (
            SliceLayout::GpusFirst | SliceLayout::Interleaved,
            DeviceKind::MigDynamic { .. } | DeviceKind::Vgpu { .. },
        ) => (2, u32::MAX - d.gpu_index, ""),
        (SliceLayout::ByGpu, _) => (d.gpu_index, 0, ""),
        (SliceLayout::ByProfile, DeviceKind::Gpu | DeviceKind::Vfio { .. }) => (0, 0, ""),
        (
            SliceLayout::ByProfile,
            DeviceKind::MigStatic {
                profile, placement, ..
            }
            | DeviceKind::MigDynamic {
                profile, placement, ..
            },
        ) => (1, placement.size, profile.as_str()),
        (SliceLayout::ByProfile, DeviceKind::Vgpu { type_name, .. }) => (2, 0, type_name.as_str()),
    }
}

/// Devices in groups (see [`group_of`]; the model's order is by GPU, so by GPU it is kept,
/// and otherwise a stable sort keeps GPU order and packing order within a group), groups
/// packed into slices in order without splitting one unless it alone exceeds a slice.
///
/// Each slice comes with whether it holds a dynamic-MIG device.
fn pack_devices(model: &DeviceModel) -> Vec<(Vec<Device>, bool)> {
    let layout = model.slice_layout;
    let mut keyed: Vec<(GroupKey, &PublishedDevice)> = model
        .devices
        .iter()
        .map(|d| (group_of(model, d), d))
        .collect();
    if layout != SliceLayout::ByGpu {
        keyed.sort_by_key(|(key, _)| *key);
    }
    if layout == SliceLayout::Interleaved {
        keyed = interleave(keyed);
    }
    let mut groups: Vec<Vec<&PublishedDevice>> = Vec::new();
    let mut last_group = None;
    for (group, d) in keyed {
        if last_group != Some(group) {
            groups.push(Vec::new());
            last_group = Some(group);
        }
        if let Some(g) = groups.last_mut() {
            g.push(d);
        }
    }
    let limit = |counts: bool| {
        if counts {
            MAX_DEVICES_PER_SLICE_WITH_COUNTERS
        } else {
            MAX_DEVICES_PER_SLICE
        }
    };
    let mut slices: Vec<(Vec<Device>, bool)> = Vec::new();
    let mut current: Vec<Device> = Vec::new();
    let mut current_mig = false;
    let mut current_counts = false;
    for group in groups {
        let group_counts = group
            .iter()
            .any(|d| limits::uses_counters_or_taints(&d.device));
        let together = current.len() + group.len();
        if !current.is_empty() && together > limit(current_counts || group_counts) {
            slices.push((std::mem::take(&mut current), current_mig));
            current_counts = false;
            current_mig = false;
        }
        current_counts |= group_counts;
        for d in group {
            if current.len() == limit(current_counts) {
                slices.push((std::mem::take(&mut current), current_mig));
                current_mig = false;
            }
            current.push(d.device.clone());
            current_mig |= matches!(d.kind, DeviceKind::MigDynamic { .. });
        }
    }
    if !current.is_empty() {
        slices.push((current, current_mig));
    }
    slices
}

/// `interleaved`: the `gpus-first` order, whose whole GPUs (and VFIO devices, and under
/// `split` the whole-GPU profile's MIG devices) come first, with those merged one for one
/// with the MIG devices that follow them, in their order: `W0 M0 W1 M1 …` until either runs
/// out, then the rest. The merged head takes the first whole GPU's group key, so it is one
/// group; what is left of each MIG group keeps its own. Each kind's own order is unchanged.
/// A node without whole GPUs keeps the `gpus-first` order.
fn interleave<'d>(
    mut keyed: Vec<(GroupKey<'d>, &'d PublishedDevice)>,
) -> Vec<(GroupKey<'d>, &'d PublishedDevice)> {
    let whole = keyed.iter().take_while(|(key, _)| key.0 == 0).count();
    let Some(&(head, _)) = keyed.first().filter(|_| whole > 0) else {
        return keyed;
    };
    let mut mig = keyed.split_off(whole).into_iter();
    let mut merged = Vec::with_capacity(whole + mig.len());
    for (_, w) in keyed {
        merged.push((head, w));
        merged.extend(mig.next().map(|(_, m)| (head, m)));
    }
    merged.extend(mig);
    merged
}

/// `<node>-<driver>-<i>` for slice `index` of `count`; with a node name so long that this
/// would pass the 253-character object-name limit, the node part is cut (at a label boundary
/// character) to fit.
///
/// The index is zero-padded to two digits, or to the width of the pool's last index past 100
/// slices, so the names sort in publish order: kube-scheduler ≥ 1.36 walks a pool's slices
/// sorted by name, and `-10` would sort before `-2`. Two digits at least, whatever the count,
/// so that a pool whose slice count crosses ten (a GPU going to VFIO and back) keeps its
/// names instead of renaming every slice each time.
pub fn slice_name(node: &str, driver: &str, index: usize, count: usize) -> String {
    let width = count.saturating_sub(1).to_string().len().max(2);
    let suffix = format!("-{driver}-{index:0width$}");
    let room = 253usize.saturating_sub(suffix.len());
    let mut node_part = &node[..node.len().min(room)];
    node_part = node_part.trim_end_matches(['-', '.']);
    format!("{node_part}{suffix}")
}
