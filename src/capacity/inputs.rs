//! Where `gpu-dra capacity` gets its objects: YAML or JSON files (single objects, `kind: List`
//! wrappers, multi-document YAML, or directories of them), or a live cluster.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::ListParams;

use crate::explain::stream::{ListError, ListHead};
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
    /// The API server's list response is not a list of the objects asked for.
    #[error("reading the API server's list of {what}")]
    ApiResponse {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The API server's list response, read as it arrived, is not a list object.
    #[error("reading the API server's list of {what}")]
    ApiList {
        what: &'static str,
        #[source]
        source: crate::explain::stream::ShapeError,
    },
}

fn file_error(flag: &'static str, path: &Path) -> impl FnOnce(ExplainError) -> InputError {
    let path = path.to_path_buf();
    move |source| InputError::File {
        flag,
        path,
        source: Box::new(source),
    }
}

/// The bytes of a file that may be a JSON `List` (its first non-blank byte is `{`), for the
/// fast path; `None` (a directory, an unreadable file, another form) sends the caller to the
/// general path, which reports what is wrong.
pub(super) fn read_json(path: &Path) -> Option<Vec<u8>> {
    if !path.is_file() {
        return None;
    }
    let bytes = read_two_halves(path).ok()?;
    bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{')
        .then_some(bytes)
}

/// A file's bytes, its two halves read at once on two threads when it is large (copying a
/// 200 MB file out of the page cache is a tenth of a second on one core).
fn read_two_halves(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    if len < 4 << 20 {
        return std::fs::read(path);
    }
    let mut bytes = vec![0u8; len];
    let (first, second) = bytes.split_at_mut(len / 2);
    let read_in_halves = std::thread::scope(|scope| -> std::io::Result<bool> {
        let Ok(worker) = std::thread::Builder::new()
            .name("capacity-read".into())
            .spawn_scoped(scope, || file.read_exact_at(second, (len / 2) as u64))
        else {
            return Ok(false);
        };
        file.read_exact_at(first, 0)?;
        worker
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the reading thread panicked")))?;
        Ok(true)
    })?;
    if !read_in_halves {
        return std::fs::read(path);
    }
    // A file that grew while it was read is read again whole.
    if file.metadata()?.len() != len as u64 {
        return std::fs::read(path);
    }
    Ok(bytes)
}

/// Every ResourceSlice of a file or directory (`--slices`), any supported API version.
pub(super) fn load_slices(path: &Path) -> Result<Vec<ResourceSlice>, InputError> {
    explain::load_slices(path).map_err(file_error("--slices", path))
}

/// The allocated ResourceClaims of a file or directory (`--claims`).
pub(super) fn load_allocated(path: &Path) -> Result<Vec<ResourceClaim>, InputError> {
    explain::load_allocated(path).map_err(file_error("--claims", path))
}

/// The Nodes of a file or directory (`--nodes`).
pub(super) fn load_nodes(path: &Path) -> Result<Vec<Node>, InputError> {
    explain::load_nodes(path).map_err(file_error("--nodes", path))
}

fn api_error(what: &'static str) -> impl FnOnce(kube::Error) -> InputError {
    move |e| InputError::Api {
        what,
        source: Box::new(e),
    }
}

/// The field selector of the driver's slices, of `options.node` only when set.
fn slice_params(options: &super::CapacityOptions) -> ListParams {
    let mut selector = format!("spec.driver={}", options.driver);
    if let Some(node) = &options.node {
        selector.push_str(&format!(",spec.nodeName={node}"));
    }
    ListParams::default().fields(&selector)
}

/// Every ResourceClaim, as the API server's list response.
pub(super) async fn list_claims(client: &kube::Client) -> Result<String, InputError> {
    list_body(
        client,
        Api::<ResourceClaim>::all(client.clone()).resource_url(),
        &ListParams::default(),
    )
    .await
    .map_err(api_error("ResourceClaims"))
}

/// The driver's ResourceSlices (of `options.node`, when set), as the API server's list
/// response, whole.
pub(super) async fn list_slices(
    client: &kube::Client,
    options: &super::CapacityOptions,
) -> Result<String, InputError> {
    list_body(
        client,
        Api::<ResourceSlice>::all(client.clone()).resource_url(),
        &slice_params(options),
    )
    .await
    .map_err(api_error("ResourceSlices"))
}

/// Lists the driver's ResourceSlices (of `options.node`, when set), handing each to `item` as
/// the response arrives; answers the list's head, or `None` when `item` stopped the list or
/// the response is not a list object (the caller then lists the slices again, whole, to
/// report on them). Fails when the request fails.
pub(super) async fn stream_slices<S>(
    client: &kube::Client,
    options: &super::CapacityOptions,
    item: impl FnMut(Vec<u8>) -> Result<(), S>,
) -> Result<Option<ListHead>, InputError> {
    enum Interrupt<S> {
        List(ListError),
        Item(S),
    }
    impl<S> From<ListError> for Interrupt<S> {
        fn from(e: ListError) -> Self {
            Interrupt::List(e)
        }
    }
    let mut item = item;
    let read = crate::explain::stream::read_list(
        client,
        "ResourceSlices",
        Api::<ResourceSlice>::all(client.clone()).resource_url(),
        &slice_params(options),
        |bytes| item(bytes).map_err(Interrupt::Item),
    )
    .await;
    match read {
        Ok(head) => Ok(Some(head)),
        Err(Interrupt::List(ListError::Api { what, source })) => {
            Err(InputError::Api { what, source })
        }
        Err(Interrupt::List(ListError::Shape { .. }) | Interrupt::Item(_)) => Ok(None),
    }
}

/// With `options.pool_label`, the Nodes (`options.node` only, when set); else none.
pub(super) async fn list_nodes(
    client: &kube::Client,
    options: &super::CapacityOptions,
) -> Result<Vec<Node>, InputError> {
    if options.pool_label.is_none() {
        return Ok(Vec::new());
    }
    let api = Api::<Node>::all(client.clone());
    match &options.node {
        Some(name) => Ok(vec![api.get(name).await.map_err(api_error("Nodes"))?]),
        None => Ok(api
            .list(&ListParams::default())
            .await
            .map_err(api_error("Nodes"))?
            .items),
    }
}

/// The body of a list request, as the API server sent it (the request `Api::list` makes).
async fn list_body(
    client: &kube::Client,
    url: &str,
    params: &ListParams,
) -> Result<String, kube::Error> {
    let mut request = kube::core::Request::new(url)
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("list");
    client.request_text(request).await
}

/// A list response the fast path did not take, read in full; fails naming what was listed.
pub(super) fn decode_list<K: serde::de::DeserializeOwned + Clone>(
    what: &'static str,
    body: &str,
) -> Result<Vec<K>, InputError> {
    serde_json::from_str::<kube::core::ObjectList<K>>(body)
        .map(|list| list.items)
        .map_err(|source| InputError::ApiResponse { what, source })
}
