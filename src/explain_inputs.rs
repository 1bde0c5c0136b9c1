//! Where `gpu-dra explain` gets its inputs: files, a simulated node, the built-in
//! DeviceClasses, or a live cluster.

use std::path::Path;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::ListParams;

use crate::devices::ModelOptions;
use crate::hardware::GpuBackend;
use crate::hardware::sim::SimBackend;
use crate::slices::{self, PoolOptions};

/// The project's DeviceClasses (`device-classes/`), built in so `explain` works anywhere.
const BUILTIN_CLASSES: [(&str, &str); 2] = [
    (
        "device-classes/gpu.nvidia.com.yaml",
        include_str!("../device-classes/gpu.nvidia.com.yaml"),
    ),
    (
        "device-classes/mig.nvidia.com.yaml",
        include_str!("../device-classes/mig.nvidia.com.yaml"),
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
    /// Listing from the API server failed.
    #[error("listing {what} from the API server")]
    Api {
        /// What was listed.
        what: &'static str,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
}

/// The built-in `gpu.nvidia.com` and `mig.nvidia.com` DeviceClasses.
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
}

/// The slices a simulated node (preset or node file) publishes, as `inventory -o yaml` prints
/// them. Fails when the node cannot be built or `options.mig_profiles` names a profile none of
/// its GPUs has.
pub fn sim_slices(
    sim_node: &str,
    driver: &str,
    options: SimSliceOptions,
) -> Result<Vec<ResourceSlice>, InputError> {
    let sim = SimBackend::open(sim_node, None).map_err(InputError::Sim)?;
    let inventory = sim.inventory().map_err(|e| InputError::SimSlices {
        detail: e.to_string(),
    })?;
    crate::devices::profiles::check(&options.mig_profiles, &inventory).map_err(|e| {
        InputError::SimSlices {
            detail: e.to_string(),
        }
    })?;
    let model_options = ModelOptions {
        shared_gpus: options.shared_gpus,
        mig_profiles: options.mig_profiles,
        slice_layout: options.slice_layout,
        mig_attributes: options.mig_attributes,
        ..ModelOptions::with_policies(driver, &sim.mig_policies())
    };
    let model = crate::devices::build(&inventory, &model_options);
    slices::build(
        &model,
        &PoolOptions {
            driver_name: driver.to_string(),
            node_name: sim.node_name().to_string(),
            generation: 1,
        },
    )
    .map_err(|e| InputError::SimSlices {
        detail: e.to_string(),
    })
}

/// What a live cluster holds: DeviceClasses, ResourceSlices (of `node`, or all) and the claims
/// that are already allocated.
pub struct ClusterState {
    /// DeviceClasses.
    pub classes: Vec<DeviceClass>,
    /// ResourceSlices.
    pub slices: Vec<ResourceSlice>,
    /// Allocated ResourceClaims.
    pub allocated: Vec<ResourceClaim>,
}

/// Lists the cluster's classes, slices and allocated claims.
pub async fn cluster_state(
    client: kube::Client,
    node: Option<&str>,
) -> Result<ClusterState, InputError> {
    let api_err = |what| {
        move |e| InputError::Api {
            what,
            source: Box::new(e),
        }
    };
    let classes = Api::<DeviceClass>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err("DeviceClasses"))?
        .items;
    let mut params = ListParams::default();
    if let Some(node) = node {
        params = params.fields(&format!("spec.nodeName={node}"));
    }
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&params)
        .await
        .map_err(api_err("ResourceSlices"))?
        .items;
    let allocated = Api::<ResourceClaim>::all(client)
        .list(&ListParams::default())
        .await
        .map_err(api_err("ResourceClaims"))?
        .items
        .into_iter()
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .collect();
    Ok(ClusterState {
        classes,
        slices,
        allocated,
    })
}

/// Classes from `--classes` (file or directory), else the built-in ones.
pub fn classes(path: Option<&Path>) -> Result<Vec<DeviceClass>, String> {
    match path {
        Some(p) => crate::explain::load_classes(p).map_err(|e| crate::errors::error_chain(&e)),
        None => builtin_classes().map_err(|e| e.to_string()),
    }
}
