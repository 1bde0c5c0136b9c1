//! Where `gpu-dra capacity` gets its objects: YAML or JSON files (single objects, `kind: List`
//! wrappers, multi-document YAML, or directories of them), or a live cluster.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::ListParams;

use super::CapacityInput;
use crate::explain::{self, ExplainError};

/// Reading or listing the inputs failed.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A file given with `--slices`, `--claims` or `--nodes` could not be used; the source
    /// names the file, the document and what is wrong with it.
    #[error("{flag}")]
    File {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: Box<ExplainError>,
    },
    /// Listing from the API server failed.
    #[error("listing {what} from the API server")]
    Api {
        what: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
}

/// Reads slices (required), claims and nodes from files. A JSON `List` of `v1` slices or
/// claims (`kubectl get … -o json`) takes a fast path that parses only the fields the view
/// reads; every other form is read in full.
///
/// Claims that are not allocated are skipped; a claims file without any is not an error.
/// Fails naming the flag, the file and the document when a file cannot be read or parsed,
/// holds an object of an unsupported API version or none of the kind expected.
pub fn from_files(
    slices: &Path,
    claims: Option<&Path>,
    nodes: Option<&Path>,
) -> Result<CapacityInput, InputError> {
    let file = |flag: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| InputError::File {
            flag,
            path,
            source: Box::new(source),
        }
    };
    Ok(CapacityInput {
        slices: match fast(slices, super::fast_json::slices) {
            Some(fast) => fast,
            None => explain::load_slices(slices).map_err(file("--slices", slices))?,
        },
        claims: match claims {
            Some(p) => match fast(p, super::fast_json::allocated_claims) {
                Some(fast) => fast,
                None => explain::load_allocated(p).map_err(file("--claims", p))?,
            },
            None => Vec::new(),
        },
        nodes: match nodes {
            Some(p) => explain::load_nodes(p).map_err(file("--nodes", p))?,
            None => Vec::new(),
        },
    })
}

/// A JSON `List` file read by the fast path; `None` (a directory, an unreadable file, another
/// form) sends the caller to the general path, which reports what is wrong.
fn fast<T>(path: &Path, parse: impl FnOnce(&[u8]) -> Option<Vec<T>>) -> Option<Vec<T>> {
    if !path.is_file() {
        return None;
    }
    parse(&std::fs::read(path).ok()?)
}

/// Lists the driver's ResourceSlices (of `node`, or all), every allocated ResourceClaim and,
/// with `with_nodes`, the Nodes (`node` only, when given) from the cluster.
pub async fn from_cluster(
    client: kube::Client,
    driver: &str,
    node: Option<&str>,
    with_nodes: bool,
) -> Result<CapacityInput, InputError> {
    let api_err = |what| {
        move |e| InputError::Api {
            what,
            source: Box::new(e),
        }
    };
    let mut selector = format!("spec.driver={driver}");
    if let Some(node) = node {
        selector.push_str(&format!(",spec.nodeName={node}"));
    }
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(api_err("ResourceSlices"))?
        .items;
    let claims = Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_err("ResourceClaims"))?
        .items
        .into_iter()
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .collect();
    let nodes = match (with_nodes, node) {
        (false, _) => Vec::new(),
        (true, Some(name)) => vec![
            Api::<Node>::all(client)
                .get(name)
                .await
                .map_err(api_err("Nodes"))?,
        ],
        (true, None) => {
            Api::<Node>::all(client)
                .list(&ListParams::default())
                .await
                .map_err(api_err("Nodes"))?
                .items
        }
    };
    Ok(CapacityInput {
        slices,
        claims,
        nodes,
    })
}
