//! `gpu-dra explain`: why a set of claims does or does not fit a node, or which nodes of a
//! cluster it fits, per request and per device, in a form people read and in JSON/YAML.
//!
//! The allocator does the deciding; this module picks which nodes to look at closely,
//! groups identical reasons so a node with hundreds of devices stays readable, and loads
//! the inputs from files. Exit codes are the CLI's business: see [`ExplainReport::fits`]
//! and [`ExplainReport::input_error`].

pub(crate) mod load;
mod render;
mod scan;
pub mod stream;

use std::path::PathBuf;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::Serialize;

use crate::alloc::{Allocator, CounterRollback, Detail, Node, Outcome, SelectorEngine};

pub use load::{load_allocated, load_claims, load_classes, load_nodes, load_slices};
pub use scan::NodeScan;

/// How many of the closest non-fitting nodes get a full explanation.
pub const NEAR_MISSES: usize = 3;

/// Everything explain looks at.
#[derive(Clone, Debug, Default)]
pub struct ExplainInput {
    pub classes: Vec<DeviceClass>,
    /// Slices of one node, or of many (a cluster).
    pub slices: Vec<ResourceSlice>,
    /// Claims already allocated: what they hold is not available.
    pub allocated: Vec<ResourceClaim>,
    /// The claims to explain; they must fit together on one node, as a Pod's claims do.
    pub claims: Vec<ResourceClaim>,
}

/// Reading the inputs failed. Each variant names the file and, where it applies, the
/// document (1-based) and object.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: document {document} is not valid YAML or JSON")]
    Parse {
        path: PathBuf,
        document: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "{path}: document {document}: {kind} {name} does not match the resource.k8s.io/v1 schema"
    )]
    Decode {
        path: PathBuf,
        document: usize,
        kind: String,
        name: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "{path}: document {document}: {kind} has apiVersion {api_version:?}; supported: {supported}"
    )]
    Version {
        path: PathBuf,
        document: usize,
        kind: String,
        api_version: String,
        supported: String,
    },
    #[error("{path}: no {kind} found (kinds present: {seen})")]
    Missing {
        path: PathBuf,
        kind: String,
        seen: String,
    },
    #[error("{path}: Pod {pod} has no spec.resourceClaims")]
    PodWithoutClaims { path: PathBuf, pod: String },
    #[error(
        "{path}: Pod {pod}: spec.resourceClaims[{index}] sets neither resourceClaimName nor resourceClaimTemplateName"
    )]
    EmptyPodClaim {
        path: PathBuf,
        pod: String,
        index: usize,
    },
    #[error(
        "{path}: {entry} refers to {what} {name:?}, which the file does not contain (it has: {found})"
    )]
    Reference {
        path: PathBuf,
        /// `Pod <name>: spec.resourceClaims[<index>]`.
        entry: String,
        what: &'static str,
        name: String,
        found: String,
    },
}

/// The answer of [`explain`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExplainReport {
    /// `<namespace>/<name>` of each claim explained.
    pub claims: Vec<String>,
    pub fits: bool,
    /// Bad input (unknown class, count 0, …): nothing was allocated.
    pub error: Option<String>,
    pub nodes_checked: usize,
    pub fitting_nodes: Vec<String>,
    /// The allocation on the first fitting node (by name).
    pub chosen: Option<Outcome>,
    /// Full explanations for the closest nodes that do not fit.
    pub near_misses: Vec<Outcome>,
    /// What else the reader should know: with [`CounterRollback::Leaked`], that the claims
    /// would fit were refused devices' counters released.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Devices the allocated claims hold that no slice explain read publishes
    /// (`<claim>: <driver>/<pool>/<device>`), left out of the verdict: a device of another
    /// node or pool, one that was renamed or gone, or a typo in a hand-written file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpublished_allocations: Vec<String>,
}

impl ExplainReport {
    fn failed(claims: Vec<String>, error: String) -> Self {
        Self {
            claims,
            fits: false,
            error: Some(error),
            nodes_checked: 0,
            fitting_nodes: Vec::new(),
            chosen: None,
            near_misses: Vec::new(),
            note: None,
            unpublished_allocations: Vec::new(),
        }
    }

    /// True when the claims fit together on at least one node.
    pub fn fits(&self) -> bool {
        self.fits
    }

    /// The bad-input message, if the claims could not be checked at all.
    pub fn input_error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The report in machine form: the allocation when the claims fit, the reasons when not.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }

    /// [`ExplainReport::to_json`] as YAML text.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(&self.to_json()).unwrap_or_else(|e| format!("error: {e}\n"))
    }

    /// The report for people: per node and request, usable devices and grouped reasons.
    pub fn render_human(&self) -> String {
        render::render(self)
    }
}

/// What the allocated claims hold that no slice of `input` publishes, as
/// `<claim>: <driver>/<pool>/<device>`, in claim order.
fn unpublished_allocations(input: &ExplainInput) -> Vec<String> {
    let published: std::collections::HashSet<(&str, &str, &str)> = input
        .slices
        .iter()
        .flat_map(|slice| {
            let spec = &slice.spec;
            spec.devices.iter().flatten().map(move |d| {
                (
                    spec.driver.as_str(),
                    spec.pool.name.as_str(),
                    d.name.as_str(),
                )
            })
        })
        .collect();
    input
        .allocated
        .iter()
        .flat_map(|claim| {
            crate::alloc::allocation_results(claim)
                .iter()
                .filter(|r| {
                    !published.contains(&(r.driver.as_str(), r.pool.as_str(), r.device.as_str()))
                })
                .map(move |r| {
                    format!(
                        "{}: {}/{}/{}",
                        crate::alloc::claim_display(claim),
                        r.driver,
                        r.pool,
                        r.device
                    )
                })
        })
        .collect()
}

/// Explains whether `input.claims` fit, allocating them together as the scheduler would.
///
/// One node: the full explanation for it. Several nodes: every node is tried cheaply; if
/// one fits, the allocation on the first fitting node is reported, otherwise the
/// [`NEAR_MISSES`] nodes that got furthest are explained in full. Bad input ends up in
/// [`ExplainReport::error`] rather than failing the call.
pub fn explain<E: SelectorEngine>(engine: &E, input: &ExplainInput) -> ExplainReport {
    explain_as(engine, input, CounterRollback::default())
}

/// [`explain`] as a kube-scheduler whose allocator undoes a candidate refused after its
/// counters were reserved this way ([`CounterRollback`]).
pub fn explain_as<E: SelectorEngine>(
    engine: &E,
    input: &ExplainInput,
    counter_rollback: CounterRollback,
) -> ExplainReport {
    let names: Vec<String> = input
        .claims
        .iter()
        .map(crate::alloc::claim_display)
        .collect();
    if input.claims.is_empty() {
        return ExplainReport::failed(names, "no claims to explain".into());
    }
    let allocator = match Allocator::new(engine, &input.classes, &input.slices, &input.allocated) {
        Ok(a) => a.with_counter_rollback(counter_rollback),
        Err(e) => return ExplainReport::failed(names, e.to_string()),
    };
    let prepared = match allocator.prepare(&input.claims) {
        Ok(p) => p,
        Err(e) => return ExplainReport::failed(names, e.to_string()),
    };
    let mut nodes: Vec<Node> = allocator
        .node_names()
        .into_iter()
        .map(Node::named)
        .collect();
    if nodes.is_empty() {
        // Only slices reachable from every node (or none at all): any node will do.
        nodes.push(Node::named(""));
    }
    let mut report = ExplainReport {
        claims: names,
        fits: false,
        error: None,
        nodes_checked: nodes.len(),
        fitting_nodes: Vec::new(),
        chosen: None,
        near_misses: Vec::new(),
        note: None,
        unpublished_allocations: unpublished_allocations(input),
    };
    decide(&allocator, &prepared, &nodes, &mut report);
    if let Some(error) = config_error(input, &report) {
        // Placed, but refused at prepare: bad input, as the plugin would answer the kubelet.
        report.fits = false;
        report.error = Some(error);
        return report;
    }
    report.note = fabric_note(input, &report);
    if counter_rollback == CounterRollback::Leaked && !report.fits {
        // Would a scheduler that releases a refused device's counters place them? Same
        // allocator (the device views it built are kept), every node tried cheaply.
        let released = allocator.with_counter_rollback(CounterRollback::Released);
        let fitting: Vec<&str> = nodes
            .iter()
            .filter(|node| released.allocate(&prepared, node, Detail::Brief).fits())
            .map(|node| &*node.name)
            .collect();
        if !fitting.is_empty() {
            report.note = Some(format!(
                "fits on {} when the counters of a device a constraint refused are released (kube-scheduler with kubernetes#140431, or its 1.36 backport #140663): this refusal is the older scheduler's counter leak; docs/fabric-manager.md",
                fitting.join(", ")
            ));
        }
    }
    report
}

/// The device of allocation result `r` in the slices explain read.
fn published<'i>(
    input: &'i ExplainInput,
    r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
) -> Option<&'i k8s_openapi::api::resource::v1::Device> {
    input
        .slices
        .iter()
        .filter(|s| s.spec.driver == r.driver && s.spec.pool.name == r.pool)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == r.device)
}

/// The first claim whose opaque config the plugin's prepare would refuse on the devices the
/// claims got (a field, value or kind that does not apply: `opaque::resolve` and its VFIO
/// and vGPU forms, as prepare runs them), as the message explain reports; `None` when every
/// claim's config is good or nothing fits. The DeviceClass's config of each `exactly`
/// request comes first, as the API server copies it into the allocation.
fn config_error(input: &ExplainInput, report: &ExplainReport) -> Option<String> {
    use crate::opaque::{self, Entry, Target, TargetKind};
    let chosen = report.chosen.as_ref()?;
    for ((name, claim), allocation) in report
        .claims
        .iter()
        .zip(&input.claims)
        .zip(chosen.allocations.iter().flatten())
    {
        let results: Vec<_> = allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .collect();
        for driver in results
            .iter()
            .map(|r| r.driver.as_str())
            .collect::<std::collections::BTreeSet<_>>()
        {
            let targets: Vec<Target> = results
                .iter()
                .filter(|r| r.driver == driver)
                .map(|r| {
                    let device = published(input, r);
                    let attribute = |key: &str| -> Option<String> {
                        device?.attributes.as_ref()?.get(key)?.string.clone()
                    };
                    Target {
                        device: r.device.clone(),
                        request: r.request.clone(),
                        kind: match attribute("type").as_deref() {
                            Some("mig") => TargetKind::Mig,
                            Some("vfio") => TargetKind::Vfio,
                            Some("vgpu") => TargetKind::Vgpu,
                            _ => TargetKind::FullGpu,
                        },
                        uuid: attribute("uuid"),
                        memory_bytes: device
                            .and_then(|d| d.capacity.as_ref()?.get("memory"))
                            .and_then(|q| q.value.0.parse::<crate::quantity::Quantity>().ok())
                            .and_then(|q| q.as_i64().ok())
                            .and_then(|v| u64::try_from(v).ok())
                            .unwrap_or(0),
                    }
                })
                .collect();
            let spec = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
            let mut entries = Vec::new();
            for request in spec.iter().flat_map(|d| d.requests.iter().flatten()) {
                let Some(class) = request.exactly.as_ref().map(|e| &e.device_class_name) else {
                    continue;
                };
                let class = input
                    .classes
                    .iter()
                    .find(|c| c.metadata.name.as_deref() == Some(class.as_str()));
                let configs = class.and_then(|c| c.spec.as_ref()?.config.as_ref());
                for config in configs.into_iter().flatten() {
                    if let Some(o) = config.opaque.as_ref().filter(|o| o.driver == driver) {
                        entries.push(Entry {
                            from_class: true,
                            requests: vec![request.name.clone()],
                            parameters: o.parameters.0.clone(),
                        });
                    }
                }
            }
            for config in spec.into_iter().flat_map(|d| d.config.iter().flatten()) {
                if let Some(o) = config.opaque.as_ref().filter(|o| o.driver == driver) {
                    entries.push(Entry {
                        from_class: false,
                        requests: config.requests.clone().unwrap_or_default(),
                        parameters: o.parameters.0.clone(),
                    });
                }
            }
            if entries.is_empty() {
                continue;
            }
            let refused = opaque::resolve(&targets, &entries)
                .err()
                .or_else(|| opaque::resolve_vfio(&targets, &entries).err())
                .or_else(|| opaque::resolve_vgpu(&targets, &entries).err());
            if let Some(e) = refused {
                return Some(format!(
                    "claim {name} would be placed on node {}, but the plugin's prepare refuses its config: {}",
                    report
                        .fitting_nodes
                        .first()
                        .map(String::as_str)
                        .unwrap_or_default(),
                    crate::errors::error_chain(&e)
                ));
            }
        }
    }
    None
}

/// When a claim that fits gets several GPUs of a Fabric Manager node (devices carrying
/// `gpuModuleID`) that are not one FM partition, the plugin's prepare will refuse it: FM
/// activates partitions, not arbitrary sets of GPUs. The scheduler cannot know; `explain`
/// can, from the `partitionN` attributes the devices carry: N GPUs are one partition exactly
/// when they share their `partitionN` value. A note names the claim, its GPUs and the
/// constraint that makes the scheduler choose a partition.
fn fabric_note(input: &ExplainInput, report: &ExplainReport) -> Option<String> {
    use crate::fabric_manager::partitions::MODULE_ATTRIBUTE;
    let chosen = report.chosen.as_ref()?;
    let attribute = |device: &k8s_openapi::api::resource::v1::Device, name: &str| {
        device.attributes.as_ref()?.get(name)?.int
    };
    let mut notes = Vec::new();
    for (claim, allocation) in report
        .claims
        .iter()
        .zip(chosen.allocations.iter().flatten())
    {
        let results = allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten());
        let gpus: Vec<&k8s_openapi::api::resource::v1::Device> = results
            .filter_map(|r| published(input, r))
            .filter(|d| attribute(d, MODULE_ATTRIBUTE).is_some())
            .collect();
        if gpus.len() < 2 {
            continue;
        }
        let size = gpus.len();
        let key = format!("partition{size}");
        let values: std::collections::BTreeSet<Option<i64>> =
            gpus.iter().map(|d| attribute(d, &key)).collect();
        if values.len() == 1 && values.iter().all(Option::is_some) {
            continue;
        }
        let names: Vec<String> = gpus
            .iter()
            .map(|d| {
                let module = attribute(d, MODULE_ATTRIBUTE).unwrap_or_default();
                format!("{} (module {module})", d.name)
            })
            .collect();
        let sizes: std::collections::BTreeSet<usize> = gpus
            .iter()
            .flat_map(|d| d.attributes.iter().flat_map(|a| a.keys()))
            .filter_map(|k| k.strip_prefix("partition")?.parse().ok())
            .collect();
        let ask = if sizes.contains(&size) {
            format!(
                "ask with `matchAttribute: gpu.nvidia.com/{key}` so the scheduler picks a partition"
            )
        } else {
            let sizes: Vec<String> = sizes.iter().map(usize::to_string).collect();
            format!(
                "no partition has {size} GPUs (sizes {}): ask for one of those sizes with `matchAttribute: gpu.nvidia.com/partitionN`",
                sizes.join(", ")
            )
        };
        notes.push(format!(
            "claim {claim} gets {size} GPUs of a Fabric Manager node that are not one partition ({}): the plugin's prepare will refuse it; {ask} (docs/fabric-manager.md)",
            names.join(", ")
        ));
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// Fills `report`'s outcome: on one node, the full explanation; on several, every node tried
/// cheaply, the first fitting one explained, or, when none fits, the [`NEAR_MISSES`] that got
/// furthest explained in full.
fn decide<'a, E: SelectorEngine>(
    allocator: &Allocator<'a, E>,
    prepared: &crate::alloc::Prepared<'a, E>,
    nodes: &[Node],
    report: &mut ExplainReport,
) {
    if let [node] = nodes {
        let outcome = allocator.allocate(prepared, node, Detail::Full);
        report.fits = outcome.fits();
        if report.fits {
            report.fitting_nodes.push(node.name.clone());
            report.chosen = Some(outcome);
        } else {
            report.near_misses.push(outcome);
        }
        return;
    }
    let mut misses: Vec<(usize, Outcome)> = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let outcome = allocator.allocate(prepared, node, Detail::Brief);
        if outcome.fits() {
            report.fitting_nodes.push(node.name.clone());
            report.chosen.get_or_insert(outcome);
        } else if report.fitting_nodes.is_empty() {
            misses.push((i, outcome));
        }
    }
    report.fits = !report.fitting_nodes.is_empty();
    if !report.fits {
        // Furthest progress first; an aborted search is as interesting as a near fit.
        misses.sort_by_key(|(i, o)| (std::cmp::Reverse(o.progress.placed), o.abort.is_none(), *i));
        report.near_misses = misses
            .iter()
            .take(NEAR_MISSES)
            .map(|(i, _)| allocator.allocate(prepared, &nodes[*i], Detail::Full))
            .collect();
    }
}
