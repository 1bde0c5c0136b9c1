//! `gpu-dra capacity`: the operator's view of a cluster's GPUs — per node, per GPU and per
//! MIG profile, what exists, who holds it (namespace, pod, claim) and what is still free.
//!
//! Pure: [`build`] turns ResourceSlices, allocated ResourceClaims and (optionally) Nodes into
//! a [`CapacityReport`]; [`render_table`] prints it for people, and the report serialises to
//! JSON or YAML as is. Where the objects come from (files or a live cluster) is in
//! [`inputs`].
//!
//! "Free" means what a new request could still get: a device is free when no claim holds it
//! and every shared counter it consumes (dynamic MIG memory slices and engines) still has
//! room after the devices that claims hold. A profile's free count is how many devices of
//! that profile could be allocated together, so seven free `1g.10gb+me` placements that all
//! need the GPU's single OFA engine count as one.
//!
//! vGPU types (`--vgpu-types`) are profiles named by their type (`H100-4C`), one device per
//! instance slot: a held slot is a vGPU in use, and a free count also heeds the framebuffer
//! the GPU's holders take and, where devices declare them, the compatibility groups of
//! Kubernetes 1.37 (a type NVML runs alone is not free beside another type held on the GPU).

mod blocked;
mod book;
mod counters;
mod fast_json;
mod gpus;
pub mod inputs;
mod json_list;
mod records;
mod render;
mod stream;
mod summary;

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::Serialize;

pub use render::{TableOptions, render_table};

/// The profile name under which full GPUs are counted.
pub const FULL_GPU: &str = "gpu";
/// The profile name of a GPU's VFIO device (`gpu-vfio-<i>`, a whole GPU for a VM).
pub const VFIO_GPU: &str = "vfio";

/// What [`build`] reads.
#[derive(Clone, Debug, Default)]
pub struct CapacityInput {
    /// ResourceSlices of any drivers; only `driver`'s are looked at.
    pub slices: Vec<ResourceSlice>,
    /// ResourceClaims; unallocated ones and results of other drivers are ignored.
    pub claims: Vec<ResourceClaim>,
    /// Nodes, for `pool_label`; may be empty without it.
    pub nodes: Vec<Node>,
}

/// How [`build`] groups and filters.
#[derive(Clone, Debug)]
pub struct CapacityOptions {
    /// The DRA driver whose devices are counted (`gpu.nvidia.com`).
    pub driver: String,
    /// Group nodes into pools by the value of this node label.
    pub pool_label: Option<String>,
    /// Only this node.
    pub node: Option<String>,
}

/// A slice or claim field that cannot be read. Each variant names the object, the field and
/// the value.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// A ResourceSlice field is not what the API allows.
    #[error("ResourceSlice {slice}: {field} is {value:?}: {problem}")]
    InvalidSlice {
        slice: String,
        field: String,
        value: String,
        problem: String,
    },
    /// `--node` names a node that publishes no devices of the driver.
    #[error("node {node:?} publishes no {driver} devices (nodes that do: {known})")]
    UnknownNode {
        node: String,
        driver: String,
        known: String,
    },
    /// Reading the input files or listing from the cluster failed.
    #[error(transparent)]
    Input(#[from] inputs::InputError),
}

/// The whole view. Serialises (camelCase) to the `-o json|yaml` output.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReport {
    pub driver: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_label: Option<String>,
    pub totals: Totals,
    /// Per profile across every node: full GPUs per model (`gpu`), MIG devices per profile.
    pub profiles: Vec<ProfileSummary>,
    /// Per value of `pool_label` (empty without it).
    pub pools: Vec<PoolSummary>,
    pub nodes: Vec<NodeCapacity>,
    /// Things that make the view less than exact: incomplete pools, claims naming devices
    /// no slice publishes.
    pub warnings: Vec<String>,
}

/// Cluster-wide counts.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub nodes: usize,
    pub gpus: usize,
    /// GPUs on which at least one device is held.
    pub busy_gpus: usize,
    /// Devices held by claims (a shared device once).
    pub allocated_devices: usize,
    pub claims: usize,
    pub namespaces: usize,
}

/// Capacity, allocated and free devices of one profile.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProfileSummary {
    /// MIG profile (`1g.10gb`), or [`FULL_GPU`] for whole GPUs.
    pub profile: String,
    /// Product names of the GPUs offering it.
    pub models: Vec<String>,
    /// How many could be allocated together on idle GPUs.
    pub capacity: usize,
    /// How many claims hold.
    pub allocated: usize,
    /// How many a new request could still get, together.
    pub free: usize,
}

/// One value of the pool label.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolSummary {
    /// The label's value, `<none>` for nodes without it.
    pub pool: String,
    pub nodes: usize,
    pub gpus: usize,
    pub busy_gpus: usize,
    pub profiles: Vec<ProfileSummary>,
}

/// One node's GPUs.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapacity {
    pub name: String,
    /// Its pool label's value, with `--pool-label`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub gpus: Vec<GpuCapacity>,
}

/// How a GPU is published.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum MigMode {
    /// The full GPU only.
    Off,
    /// MIG devices that exist (no shared counters).
    Static,
    /// Placements carved on demand, consuming the GPU's shared counters.
    Dynamic,
}

impl MigMode {
    /// `off`, `static` or `dynamic`.
    pub fn as_str(self) -> &'static str {
        match self {
            MigMode::Off => "off",
            MigMode::Static => "static",
            MigMode::Dynamic => "dynamic",
        }
    }
}

/// One physical GPU: its devices that claims hold and what is still free on it.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuCapacity {
    /// `gpu-<minor>`, the full GPU's device name.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// `productName`.
    pub model: String,
    pub mig: MigMode,
    /// With dynamic MIG: one character per memory slice, `.` free, otherwise the letter of
    /// the allocation in `allocated` that uses it (`A` the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    pub allocated: Vec<Allocation>,
    /// Per profile offered on this GPU, what a request could still get.
    pub free: Vec<FreeProfile>,
    /// With dynamic MIG: the memory slices no allocation uses, ascending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_memory_slices: Option<Vec<u32>>,
    /// With dynamic MIG: the MIG profiles that fit on this GPU when idle but no longer fit,
    /// each with the allocated devices in its way (fragmentation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<BlockedProfile>,
    /// Per vGPU type the GPU offers (`--vgpu-types`), in device-name order: its instance
    /// slots, how many claims hold and which, and how many a request could still get. Empty
    /// (and left out of JSON) on a GPU offering none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vgpu: Vec<VgpuTypeCapacity>,
}

/// One vGPU type on one GPU. An allocated vGPU device is a vGPU in use: the plugin creates it
/// when the claim is prepared and deletes it when it is unprepared.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VgpuTypeCapacity {
    /// The type as its devices' `profile` attribute names it, `H100-4C`.
    #[serde(rename = "type")]
    pub vgpu_type: String,
    /// Its devices (instance slots) on this GPU: the most the GPU holds of it alone.
    pub slots: usize,
    /// Slots claims hold.
    pub in_use: usize,
    /// How many more a request could get together: slots left, within the framebuffer the
    /// GPU's other holders leave and, with compatibility groups, beside the types they run.
    pub free: usize,
    /// `namespace/claim` of each claim holding one, sorted.
    pub claims: Vec<String>,
}

/// A MIG profile that no longer fits on a GPU, and the allocations that keep it out.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BlockedProfile {
    pub profile: String,
    /// Of the profile's placements, the one the fewest allocations block, then the one whose
    /// blockers hold the fewest slices (the lowest start among equals): releasing
    /// `blocked_by` makes room for it.
    pub placement: Placement,
    /// The allocated devices in the way, at least one, in allocation order.
    pub blocked_by: Vec<Blocker>,
}

/// An allocated device in the way of a placement.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    pub device: String,
    /// The placement's memory slices it holds.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<u32>,
    /// Without a shared slice: the other shared counters the placement needs and it holds
    /// (the single media engine).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<String>,
}

impl std::fmt::Display for BlockedProfile {
    /// `3g.40gb blocked by gpu-3-mig-1g10gb-5 at slice 5`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} blocked by ", self.profile)?;
        for (i, b) in self.blocked_by.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&b.device)?;
            match b.slices.as_slice() {
                [] => {}
                [one] => write!(f, " at slice {one}")?,
                many => write!(f, " at slices {}", render::slice_list(many))?,
            }
            if !b.counters.is_empty() {
                write!(f, " on {}", b.counters.join(", "))?;
            }
        }
        Ok(())
    }
}

/// A device some claims hold.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    pub device: String,
    /// MIG profile, [`FULL_GPU`] for the full GPU.
    pub profile: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Several when the device is shared (consumable capacity) or a claim is shared.
    pub holders: Vec<Holder>,
}

/// A MIG placement: first memory slice and how many.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placement {
    pub start: u32,
    /// Unknown for static MIG devices, which consume no counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
}

/// Who holds a device: a claim and the pods it is reserved for.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub namespace: String,
    pub claim: String,
    /// `status.reservedFor` pods; other consumers as `<resource>/<name>`.
    pub pods: Vec<String>,
    pub request: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Consumed capacity of a share, by capacity name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed: BTreeMap<String, String>,
}

/// What a request for one profile could still get on one GPU.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FreeProfile {
    pub profile: String,
    /// How many devices of the profile could be allocated together.
    pub count: usize,
    /// Placements (first memory slice) a greedy allocation of `count` would use.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub starts: Vec<u32>,
}

/// Builds the capacity view.
///
/// Pools are read at their newest generation; a pool with fewer slices than it announces
/// is counted with what is there and named in [`CapacityReport::warnings`]. Fails when a
/// counter quantity in a slice does not parse (naming the slice, field and value), or when
/// `options.node` publishes no devices of the driver.
pub fn build(
    input: &CapacityInput,
    options: &CapacityOptions,
) -> Result<CapacityReport, CapacityError> {
    let slices: Vec<records::SliceRecord> = input
        .slices
        .iter()
        .map(records::SliceRecord::from_api)
        .collect();
    let claims: Vec<records::ClaimRecord> = input
        .claims
        .iter()
        .filter_map(records::ClaimRecord::from_api)
        .collect();
    build_records(&slices, &claims, &input.nodes, options)
}

/// The files `gpu-dra capacity` reads offline.
#[derive(Clone, Copy, Debug)]
pub struct InputFiles<'p> {
    /// ResourceSlices (`--slices`): a file or a directory of them.
    pub slices: &'p Path,
    /// ResourceClaims (`--claims`); the allocated ones hold devices.
    pub claims: Option<&'p Path>,
    /// Nodes (`--nodes`), for `pool_label`.
    pub nodes: Option<&'p Path>,
}

/// Builds the capacity view from files, as [`build`] does from objects.
///
/// A JSON `List` of `resource.k8s.io/v1` slices (`kubectl get … -o json`, or the API server's
/// own list saved with `kubectl get --raw`) is read slice by slice on a second thread and
/// counted pool by pool, holding one pool's slices at a time, not the file. JSON lists of
/// claims are read by a fast path that parses only the fields the view reads, borrowing its
/// strings from the file's bytes. Every other form (YAML, single objects, directories, older
/// API versions) is read in full, as `explain` reads it. All give the same report.
///
/// Fails as [`build`] does, and with [`CapacityError::Input`] naming the flag, the file and
/// the document when a file cannot be read or parsed, holds an object of an unsupported API
/// version or none of the kind expected.
pub fn build_from_files(
    files: InputFiles<'_>,
    options: &CapacityOptions,
) -> Result<CapacityReport, CapacityError> {
    let claim_bytes = files.claims.and_then(inputs::read_json);
    let general_claims;
    let claims = match (
        files.claims,
        claim_bytes.as_deref().and_then(fast_json::allocated_claims),
    ) {
        (_, Some(records)) => records,
        (None, None) => Vec::new(),
        (Some(path), None) => {
            general_claims = inputs::load_allocated(path)?;
            general_claims
                .iter()
                .filter_map(records::ClaimRecord::from_api)
                .collect()
        }
    };
    let nodes = match files.nodes {
        Some(path) => inputs::load_nodes(path)?,
        None => Vec::new(),
    };
    if crate::explain::stream::is_json_object(files.slices) {
        let holders = gpus::holders(&claims, &options.driver);
        let mut pools = stream::PoolStream::new(options, &holders, stream::Source::File);
        let read = crate::explain::stream::read_file(files.slices, |items| {
            for item in items {
                pools.item(item)?;
            }
            Ok::<(), stream::Stop>(())
        });
        // Anything but a report (a form the stream does not take, an unreadable slice, a
        // file that is no list) is left to the whole-file reading below, which takes every
        // form and reports the first problem in pool order, as it always did.
        if let Ok((Ok(()), head)) = read
            && let Ok(report) = pools.finish(head.as_ref(), &nodes)
        {
            return Ok(report);
        }
    }
    let slice_bytes = inputs::read_json(files.slices);
    let general_slices;
    let slices = match slice_bytes.as_deref().and_then(fast_json::slices) {
        Some(records) => records,
        None => {
            general_slices = inputs::load_slices(files.slices)?;
            general_slices
                .iter()
                .map(records::SliceRecord::from_api)
                .collect()
        }
    };
    build_records(&slices, &claims, &nodes, options)
}

/// Builds the capacity view from a live cluster: every ResourceClaim, then the driver's
/// ResourceSlices (of `options.node` only, when set), then, with `options.pool_label`, the
/// Nodes (`options.node` only, when set).
///
/// The slices are read from the response as it arrives and counted pool by pool, holding one
/// pool's slices at a time: a 1,000-node cluster's slices are some 120 MB of JSON. When that
/// cannot give the report (a slice beyond its pool's count after the pool was counted, a
/// slice the model cannot read), the slices are listed again and read whole, which reports
/// the first problem in pool order. Claims take the same fast path as `kubectl get -o json`
/// files; a response the fast path does not take is read in full.
///
/// Fails as [`build`] does, with [`inputs::InputError::Api`] naming what was being listed
/// when a request fails, and with [`inputs::InputError::ApiResponse`] (or
/// [`inputs::InputError::ApiList`]) when a response is not a list of the objects asked for.
pub async fn build_from_cluster(
    client: kube::Client,
    options: &CapacityOptions,
) -> Result<CapacityReport, CapacityError> {
    let claims_body = inputs::list_claims(&client).await?;
    let general_claims: Vec<ResourceClaim>;
    let claims = match fast_json::allocated_claims(claims_body.as_bytes()) {
        Some(records) => records,
        None => {
            general_claims = inputs::decode_list("ResourceClaims", &claims_body)?;
            general_claims
                .iter()
                .filter_map(records::ClaimRecord::from_api)
                .collect()
        }
    };
    let holders = gpus::holders(&claims, &options.driver);
    let mut pools = stream::PoolStream::new(options, &holders, stream::Source::Api);
    let streamed = inputs::stream_slices(&client, options, |item| pools.item(item)).await?;
    let nodes = inputs::list_nodes(&client, options).await?;
    if let Some(head) = streamed
        && let Ok(report) = pools.finish(Some(&head), &nodes)
    {
        return Ok(report);
    }
    let slices_body = inputs::list_slices(&client, options).await?;
    let general_slices: Vec<ResourceSlice>;
    let slices = match fast_json::slices(slices_body.as_bytes()) {
        Some(records) => records,
        None => {
            general_slices = inputs::decode_list("ResourceSlices", &slices_body)?;
            general_slices
                .iter()
                .map(records::SliceRecord::from_api)
                .collect()
        }
    };
    build_records(&slices, &claims, &nodes, options)
}

/// The error for `--node` naming a node without GPUs of the driver.
fn unknown_node<'a>(
    node: &str,
    driver: &str,
    known: impl Iterator<Item = &'a str>,
) -> CapacityError {
    let mut known: Vec<&str> = known.collect();
    known.sort();
    known.dedup();
    CapacityError::UnknownNode {
        node: node.to_string(),
        driver: driver.to_string(),
        known: if known.is_empty() {
            "none".into()
        } else {
            known.join(", ")
        },
    }
}

fn build_records(
    slices: &[records::SliceRecord],
    claims: &[records::ClaimRecord],
    nodes: &[Node],
    options: &CapacityOptions,
) -> Result<CapacityReport, CapacityError> {
    let mut warnings = gpus::Warnings::default();
    let holders = gpus::holders(claims, &options.driver);
    let gpus = gpus::collect(slices, options, &holders, &mut warnings)?;
    if let Some(node) = &options.node
        && gpus.is_empty()
    {
        return Err(unknown_node(
            node,
            &options.driver,
            slices
                .iter()
                .filter(|s| s.spec.driver == options.driver)
                .filter_map(|s| s.spec.node_name),
        ));
    }
    let evaluated = gpus.into_iter().map(|g| g.evaluate()).collect();
    Ok(summary::assemble(
        evaluated,
        nodes,
        options,
        warnings.into_list(),
    ))
}
