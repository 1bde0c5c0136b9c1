//! Where `gpu-dra explain` gets its inputs: files, a simulated node, the built-in
//! DeviceClasses, or a live cluster.

use std::path::Path;

use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::ListParams;
use serde::Deserialize;

use crate::devices::ModelOptions;
use crate::hardware::GpuBackend;
use crate::hardware::sim::SimBackend;
use crate::slices::{self, PoolOptions};

/// The project's DeviceClasses (`device-classes/`), built in so `explain` works anywhere.
const BUILTIN_CLASSES: [(&str, &str); 4] = [
    (
        "device-classes/gpu.nvidia.com.yaml",
        include_str!("../device-classes/gpu.nvidia.com.yaml"),
    ),
    (
        "device-classes/mig.nvidia.com.yaml",
        include_str!("../device-classes/mig.nvidia.com.yaml"),
    ),
    (
        "device-classes/vfio.gpu.nvidia.com.yaml",
        include_str!("../device-classes/vfio.gpu.nvidia.com.yaml"),
    ),
    (
        "device-classes/vgpu.gpu.nvidia.com.yaml",
        include_str!("../device-classes/vgpu.gpu.nvidia.com.yaml"),
    ),
];

/// Errors gathering explain inputs.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A built-in class does not parse (a build defect, caught by tests).
    #[error("built-in DeviceClass {file} is invalid: {detail}")]
    Builtin {
        /// File.
        file: &'static str,
        /// Parser message.
        detail: String,
    },
    /// The simulated node could not be built.
    #[error("building the simulated node")]
    Sim(#[source] crate::hardware::sim::SimError),
    /// The simulated node's inventory or slices failed.
    #[error("building the simulated node's slices: {detail}")]
    SimSlices {
        /// What failed.
        detail: String,
    },
    /// `--fabric-manager`: the simulated node's Fabric Manager lists no partitions.
    #[error("--fabric-manager: the simulated Fabric Manager's partition list")]
    FabricManager(#[source] crate::fabric_manager::FabricError),
    /// Listing from the API server failed.
    #[error("listing {what} from the API server")]
    Api {
        /// What was listed.
        what: &'static str,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server's list response, read as it arrived, is not a list object.
    #[error("listing {what} from the API server")]
    ApiList {
        /// What was listed.
        what: &'static str,
        /// What is wrong with it.
        #[source]
        source: crate::explain::stream::ShapeError,
    },
}

/// The built-in `gpu.nvidia.com`, `mig.nvidia.com` and `vfio.gpu.nvidia.com` DeviceClasses.
pub fn builtin_classes() -> Result<Vec<DeviceClass>, InputError> {
    BUILTIN_CLASSES
        .iter()
        .map(|(file, text)| {
            serde_yaml::from_str(text).map_err(|e| InputError::Builtin {
                file,
                detail: e.to_string(),
            })
        })
        .collect()
}

/// What a simulated node's slices are built with besides its node file: the verbs' sharing
/// and MIG-profile flags. The default is what `inventory --sim-node` prints without flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimSliceOptions {
    /// `--shared-gpus`.
    pub shared_gpus: crate::devices::SharedGpus,
    /// `--mig-profiles`.
    pub mig_profiles: crate::devices::MigProfileSet,
    /// How devices are grouped into slices (`--slice-layout`).
    pub slice_layout: crate::devices::SliceLayout,
    /// What MIG devices carry (`--mig-attributes`).
    pub mig_attributes: crate::devices::MigAttributes,
    /// Also the VFIO devices (`--passthrough`), from the simulated node's host tree at power
    /// on (every GPU on `nvidia`); the node must describe one (`passthrough:`).
    pub passthrough: bool,
    /// Fabric Manager partitions (`--fabric-manager`): full GPUs (and VFIO devices) carry
    /// `gpuModuleID` and `partition1/2/4/8` from the simulated FM's list, as the plugin
    /// publishes them; the node must be in shared NVSwitch mode (`nvswitch: true`,
    /// `fabricMode: 1`).
    pub fabric_manager: bool,
    /// `--vgpu-types`: the vGPU types the node's GPUs offer; off by default.
    pub vgpu_types: crate::devices::VgpuTypes,
    /// `--compatibility-groups`: compatibility groups on the counter consumptions of GPUs
    /// offering vGPU types.
    pub compatibility_groups: bool,
    /// `--partitionable-devices-type`: `partitionTypeAttribute` on slices holding
    /// dynamic-MIG devices.
    pub partitionable_devices_type: bool,
}

/// The slices a simulated node (preset or node file) publishes, as `inventory -o yaml` prints
/// them. Fails when the node cannot be built, `options.mig_profiles` names a profile none of
/// its GPUs has, `options.vgpu_types` does not pass [`crate::devices::vgpu_config::check`],
/// or `options.fabric_manager` is set on a node not in shared NVSwitch mode.
pub fn sim_slices(
    sim_node: &str,
    driver: &str,
    options: SimSliceOptions,
) -> Result<Vec<ResourceSlice>, InputError> {
    let scratch = match options.passthrough {
        true => Some(crate::fsutil::ScratchDir::new("sim-slices").map_err(|e| {
            InputError::SimSlices {
                detail: format!("a scratch directory for the simulated host tree: {e}"),
            }
        })?),
        false => None,
    };
    let sim =
        SimBackend::open(sim_node, scratch.as_ref().map(|d| d.path())).map_err(InputError::Sim)?;
    let policies = sim.mig_policies();
    let node_name = sim.node_name().to_string();
    // The list the plugin reads from the simulated FM at start (`fmpm -l`), built in-process.
    let fabric_partitions = match options.fabric_manager {
        true => Some(std::sync::Arc::new(
            crate::fabric_manager::sim::partitions(&sim).map_err(InputError::FabricManager)?,
        )),
        false => None,
    };
    let backend: Box<dyn GpuBackend> = match (options.passthrough, sim.host_root()) {
        (false, _) => Box::new(sim),
        (true, None) => {
            return Err(InputError::SimSlices {
                detail: format!(
                    "--passthrough: the simulated node {sim_node:?} simulates no host PCI tree; use a preset with one (hgx-h100-passthrough) or add a `passthrough:` section to its node file"
                ),
            });
        }
        (true, Some(root)) => {
            use crate::hardware::passthrough::{HostKernel, PassthroughBackend, PciHost};
            let pci = std::sync::Arc::new(PciHost::new(root, std::sync::Arc::new(HostKernel)));
            // As the plugin: without an IOMMU no VFIO device can work, and it refuses to start.
            pci.require_iommu().map_err(|e| InputError::SimSlices {
                detail: format!("--passthrough on {sim_node:?}: {e}"),
            })?;
            Box::new(PassthroughBackend::new(std::sync::Arc::new(sim), pci))
        }
    };
    let inventory = backend.inventory().map_err(|e| InputError::SimSlices {
        detail: e.to_string(),
    })?;
    crate::devices::profiles::check(&options.mig_profiles, &inventory).map_err(|e| {
        InputError::SimSlices {
            detail: e.to_string(),
        }
    })?;
    crate::devices::vgpu_config::check(
        &options.vgpu_types,
        &inventory,
        options.compatibility_groups,
    )
    .map_err(|e| InputError::SimSlices {
        detail: e.to_string(),
    })?;
    let model_options = ModelOptions {
        vgpu_types: options.vgpu_types,
        compatibility_groups: options.compatibility_groups,
        partitionable_devices_type: options.partitionable_devices_type,
        shared_gpus: options.shared_gpus,
        mig_profiles: options.mig_profiles,
        slice_layout: options.slice_layout,
        mig_attributes: options.mig_attributes,
        passthrough: options.passthrough,
        fabric_partitions,
        ..ModelOptions::with_policies(driver, &policies)
    };
    let model = crate::devices::build(&inventory, &model_options);
    slices::build(
        &model,
        &PoolOptions {
            driver_name: driver.to_string(),
            node_name,
            generation: 1,
        },
    )
    .map_err(|e| InputError::SimSlices {
        detail: e.to_string(),
    })
}

/// One item of a list, read as a ResourceSlice whatever it says it is; the caller checks
/// `api_version` and `kind`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceItem {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    metadata: ObjectMeta,
    spec: ResourceSliceSpec,
}

impl SliceItem {
    /// The slice, without what explain never reads (`managedFields`).
    fn into_slice(self) -> ResourceSlice {
        let mut metadata = self.metadata;
        metadata.managed_fields = None;
        ResourceSlice {
            metadata,
            spec: self.spec,
        }
    }
}

/// What the file says a list item is.
enum ItemKind {
    /// `kind: ResourceSlice` of a supported version.
    Slice,
    /// Neither `apiVersion` nor `kind`: an API server's typed list names them.
    Unnamed,
}

/// Explains `claims` over the ResourceSlices of a JSON list file (`kubectl get resourceslices
/// -o json`, or the API server's list saved with `kubectl get --raw`), reading it slice by
/// slice on a second thread and judging node by node ([`NodeScan`](crate::explain::NodeScan)):
/// memory holds a few nodes' slices, not the file. Slices sorted by node (as both write them)
/// take one read; other orders take a second.
///
/// Answers `None` when the file is not such a list (YAML, a single object, other kinds or API
/// versions, an item that is not a ResourceSlice, no slices): the caller reads it with
/// [`crate::explain::load_slices`], which takes every form and names what is wrong.
pub fn explain_slices_file<E: crate::alloc::SelectorEngine>(
    engine: &E,
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claims: &[ResourceClaim],
    path: &Path,
) -> Option<crate::explain::ExplainReport> {
    explain_slices_file_as(engine, classes, allocated, claims, path, Default::default())
}

/// [`explain_slices_file`] as a kube-scheduler whose allocator undoes a refused candidate
/// this way ([`crate::alloc::CounterRollback`]).
pub fn explain_slices_file_as<E: crate::alloc::SelectorEngine>(
    engine: &E,
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claims: &[ResourceClaim],
    path: &Path,
    counter_rollback: crate::alloc::CounterRollback,
) -> Option<crate::explain::ExplainReport> {
    use crate::explain::load::RESOURCE_VERSIONS;
    if !crate::explain::stream::is_json_object(path) {
        return None;
    }
    let mut scan = crate::explain::NodeScan::new(engine, classes, allocated, claims)
        .with_counter_rollback(counter_rollback);
    loop {
        let mut unnamed = false;
        let mut count = 0usize;
        let (read, head) = crate::explain::stream::read_file(path, |items| {
            for bytes in items {
                let item: SliceItem = serde_json::from_slice(&bytes).ok()?;
                let kind = match (item.api_version.as_deref(), item.kind.as_deref()) {
                    (Some(version), Some("ResourceSlice"))
                        if RESOURCE_VERSIONS.contains(&version) =>
                    {
                        ItemKind::Slice
                    }
                    (None, None) => ItemKind::Unnamed,
                    _ => return None,
                };
                unnamed |= matches!(kind, ItemKind::Unnamed);
                count += 1;
                scan.add(item.into_slice());
            }
            Some(())
        })
        .ok()?;
        read?;
        let head = head?;
        let typed = head.kind.as_deref() == Some("ResourceSliceList")
            && head
                .api_version
                .as_deref()
                .is_some_and(|v| RESOURCE_VERSIONS.contains(&v));
        if count == 0 || (unnamed && !typed) {
            return None;
        }
        if !scan.end_pass() {
            return Some(scan.report());
        }
    }
}

fn api_error(what: &'static str) -> impl Fn(kube::Error) -> InputError {
    move |e| InputError::Api {
        what,
        source: Box::new(e),
    }
}

/// The cluster's DeviceClasses.
pub async fn cluster_classes(client: &kube::Client) -> Result<Vec<DeviceClass>, InputError> {
    Ok(Api::<DeviceClass>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_error("DeviceClasses"))?
        .items)
}

/// One item of a JSON list of claims: what explain reads of it (the spec is skipped).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimItem {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<k8s_openapi::api::resource::v1::ResourceClaimStatus>,
}

/// A claim holding devices, kept with only what explain reads of it: name, namespace,
/// `status.allocation`. `None` for a claim that holds nothing.
fn held(
    metadata: ObjectMeta,
    status: Option<k8s_openapi::api::resource::v1::ResourceClaimStatus>,
) -> Option<ResourceClaim> {
    let allocation = status.and_then(|s| s.allocation)?;
    Some(ResourceClaim {
        metadata: ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
            allocation: Some(allocation),
            ..Default::default()
        }),
    })
}

/// The allocated claims of a JSON list file (`kubectl get resourceclaims -A -o json`, or the
/// API server's list), read as it streams in, each kept as only what it holds: 10,000 claims
/// cost a few MB, not the document trees of the whole file. `None` when `path` is not such a
/// file (YAML, a directory, other kinds, an item it cannot read): the caller reads it the
/// general way ([`crate::explain::load_allocated`]), which also reports what is wrong.
pub fn allocated_file(path: &Path) -> Option<Vec<ResourceClaim>> {
    use crate::explain::load::RESOURCE_VERSIONS;
    if path.is_dir() || !crate::explain::stream::is_json_object(path) {
        return None;
    }
    let mut allocated = Vec::new();
    let mut unnamed = false;
    let (read, head) = crate::explain::stream::read_file(path, |items| {
        for bytes in items {
            let item: ClaimItem = serde_json::from_slice(&bytes).ok()?;
            match (item.api_version.as_deref(), item.kind.as_deref()) {
                (Some(version), Some("ResourceClaim")) if RESOURCE_VERSIONS.contains(&version) => {}
                (None, None) => unnamed = true,
                _ => return None,
            }
            allocated.extend(held(item.metadata, item.status));
        }
        Some(())
    })
    .ok()?;
    read?;
    let head = head?;
    let typed = head.kind.as_deref() == Some("ResourceClaimList")
        && head
            .api_version
            .as_deref()
            .is_some_and(|v| RESOURCE_VERSIONS.contains(&v));
    if unnamed && !typed {
        return None;
    }
    Some(allocated)
}

/// The cluster's allocated ResourceClaims, read from the list response as it arrives and
/// kept with only what explain reads of them (name, namespace, `status.allocation`).
pub async fn cluster_allocated(client: &kube::Client) -> Result<Vec<ResourceClaim>, InputError> {
    let what = "ResourceClaims";
    let mut allocated = Vec::new();
    crate::explain::stream::read_list(
        client,
        what,
        Api::<ResourceClaim>::all(client.clone()).resource_url(),
        &ListParams::default(),
        |bytes| {
            let claim: ClaimItem = serde_json::from_slice(&bytes)
                .map_err(|e| api_error(what)(kube::Error::SerdeError(e)))?;
            allocated.extend(held(claim.metadata, claim.status));
            Ok::<(), InputError>(())
        },
    )
    .await?;
    Ok(allocated)
}

impl From<crate::explain::stream::ListError> for InputError {
    fn from(e: crate::explain::stream::ListError) -> Self {
        use crate::explain::stream::ListError;
        match e {
            ListError::Api { what, source } => InputError::Api { what, source },
            ListError::Shape { what, source } => InputError::ApiList { what, source },
        }
    }
}

/// Explains `claims` over the cluster's ResourceSlices (of `node` only, when given), read from
/// the list response as it arrives and judged node by node
/// ([`NodeScan`](crate::explain::NodeScan)): memory holds a few nodes' slices, not the
/// cluster's. The API server lists a node's slices together; when a second pass is needed
/// (slices that name no node listed after some that do, a pool spread over nodes), the slices
/// are listed again.
///
/// Fails when a list request fails or its answer is not a list of ResourceSlices.
pub async fn explain_cluster<E: crate::alloc::SelectorEngine>(
    engine: &E,
    client: &kube::Client,
    node: Option<&str>,
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claims: &[ResourceClaim],
) -> Result<crate::explain::ExplainReport, InputError> {
    explain_cluster_as(
        engine,
        client,
        node,
        classes,
        allocated,
        claims,
        Default::default(),
    )
    .await
}

/// [`explain_cluster`] as a kube-scheduler whose allocator undoes a refused candidate this
/// way ([`crate::alloc::CounterRollback`]).
///
/// # Errors
/// As [`explain_cluster`].
pub async fn explain_cluster_as<E: crate::alloc::SelectorEngine>(
    engine: &E,
    client: &kube::Client,
    node: Option<&str>,
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claims: &[ResourceClaim],
    counter_rollback: crate::alloc::CounterRollback,
) -> Result<crate::explain::ExplainReport, InputError> {
    let what = "ResourceSlices";
    let mut params = ListParams::default();
    if let Some(node) = node {
        params = params.fields(&format!("spec.nodeName={node}"));
    }
    let mut scan = crate::explain::NodeScan::new(engine, classes, allocated, claims)
        .with_counter_rollback(counter_rollback);
    loop {
        crate::explain::stream::read_list(
            client,
            what,
            Api::<ResourceSlice>::all(client.clone()).resource_url(),
            &params,
            |bytes| {
                let item: SliceItem = serde_json::from_slice(&bytes)
                    .map_err(|e| api_error(what)(kube::Error::SerdeError(e)))?;
                scan.add(item.into_slice());
                Ok::<(), InputError>(())
            },
        )
        .await?;
        if !scan.end_pass() {
            return Ok(scan.report());
        }
    }
}

/// Classes from `--classes` (file or directory), else the built-in ones.
pub fn classes(path: Option<&Path>) -> Result<Vec<DeviceClass>, String> {
    match path {
        Some(p) => crate::explain::load_classes(p).map_err(|e| crate::errors::error_chain(&e)),
        None => builtin_classes().map_err(|e| e.to_string()),
    }
}
