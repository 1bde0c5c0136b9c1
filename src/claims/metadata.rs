//! Device metadata for workloads (Kubernetes KEP-5304): what each request of a prepared claim
//! got, as a file inside the claim's containers.
//!
//! For every request of a claim with devices on this node, prepare writes one file on the host,
//! `<plugin dir>/dra-device-metadata/<claim UID>_<request>.json`, and mounts it read only, through the claim's own CDI spec, at the path Kubernetes defines:
//! `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.nvidia.com-metadata.json`,
//! or `…/resourceclaimtemplates/<pod claim name>/<request>/…` for a claim made from a template
//! (annotation `resource.kubernetes.io/pod-claim-name`). `<request>` is the base request name
//! (`req` of `req/sub`). The file is a JSON stream of the same `DeviceMetadata` object once per
//! version, newest first, each followed by a newline: `metadata.resource.k8s.io/v1beta1`
//! (what Kubernetes 1.37 requires) and `v1alpha1` (what KubeVirt ≥ 1.8 reads). Each device
//! carries its driver, pool, name and published attributes, and always
//! `resource.kubernetes.io/pciBusID` (a MIG device: its GPU's), which is how KubeVirt finds the
//! PCI address. Unprepare removes the claim's files; start-up recovery removes the files of
//! claims the checkpoint does not hold.
//!
//! The host files are named by claim UID, not name: a claim deleted and re-created under the
//! same name while the old one is still prepared gets its own files. They sit side by side in
//! one directory, with no directory per claim or request: on ext4 every new inode costs a
//! prepare about 0.1 ms, so a request costs one (its file), not three.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::DeviceAttribute;

use crate::cdi::Mount;
use crate::fsutil;

/// The directory under the plugin directory that holds the host files.
pub const HOST_DIR: &str = "dra-device-metadata";
/// Where Kubernetes defines the files inside a container.
pub const CONTAINER_ROOT: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The claim annotation naming a template claim's `pod.spec.resourceClaims[].name`.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// The API group of the document.
pub const GROUP: &str = "metadata.resource.k8s.io";
/// The versions written, newest first (the order of the stream).
pub const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
/// The attribute KubeVirt reads the PCI address from.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The attribute KubeVirt reads an mdev's UUID from (unqualified: not standardised under
/// `resource.kubernetes.io` yet). KubeVirt takes it over `pciBusID` when both are there.
pub const MDEV_UUID: &str = "mdevUUID";

/// The metadata module's failures; each names the claim and the path.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// A file or directory could not be written or removed.
    #[error("device metadata of claim {claim}: {step} {path}")]
    Io {
        claim: String,
        step: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file could not be replaced.
    #[error("device metadata of claim {claim}: writing {path}")]
    Write {
        claim: String,
        path: PathBuf,
        #[source]
        source: fsutil::FsError,
    },
    /// A name would escape its directory or be ambiguous in a file name (empty, `.`, `..`,
    /// or containing `/` or `_`).
    #[error(
        "device metadata of claim {claim}: the {what} {value:?} cannot be part of a file name \
         (empty, `.`, `..`, or containing `/` or `_`)"
    )]
    BadName {
        claim: String,
        what: &'static str,
        value: String,
    },
}

/// One allocated device as the metadata file describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataDevice {
    /// The request it satisfies, as the allocation names it (`req` or `req/sub`).
    pub request: String,
    /// Pool.
    pub pool: String,
    /// Device name.
    pub name: String,
    /// Its published attributes, with `resource.kubernetes.io/pciBusID` added where the
    /// published device lacks it.
    pub attributes: BTreeMap<String, DeviceAttribute>,
}

/// One version's object of a metadata document, its fields in sorted key order
/// ([`MetadataWriter::document`]).
#[derive(serde::Serialize)]
struct Doc<'a> {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: &'static str,
    metadata: DocMeta<'a>,
    #[serde(rename = "podClaimName", skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a str>,
    requests: [DocRequest<'a>; 1],
}

#[derive(serde::Serialize)]
struct DocMeta<'a> {
    generation: i64,
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
}

#[derive(serde::Serialize)]
struct DocRequest<'a> {
    devices: &'a [DocDevice<'a>],
    name: &'a str,
}

#[derive(serde::Serialize)]
struct DocDevice<'a> {
    attributes: &'a BTreeMap<String, DeviceAttribute>,
    driver: &'a str,
    name: &'a str,
    pool: &'a str,
}

/// The claim a metadata file is about.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataClaim<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
    /// UID.
    pub uid: &'a str,
    /// The `resource.kubernetes.io/pod-claim-name` annotation of a template claim.
    pub pod_claim_name: Option<&'a str>,
}

/// Writes and removes the metadata files of this driver's claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataWriter {
    /// `<plugin dir>/dra-device-metadata`.
    root: PathBuf,
    /// The driver name (`gpu.nvidia.com`), in the documents and the container file name.
    driver: String,
}

/// The base request name: `req` of `req/sub`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

fn segment<'a>(claim: &str, what: &'static str, value: &'a str) -> Result<&'a str, MetadataError> {
    if value.is_empty() || value == "." || value == ".." || value.contains(['/', '_']) {
        return Err(MetadataError::BadName {
            claim: claim.to_string(),
            what,
            value: value.to_string(),
        });
    }
    Ok(value)
}

impl MetadataWriter {
    /// Files under `<plugin_dir>/dra-device-metadata`, documents naming `driver`.
    pub fn new(plugin_dir: &Path, driver: &str) -> Self {
        MetadataWriter {
            root: plugin_dir.join(HOST_DIR),
            driver: driver.to_string(),
        }
    }

    /// A writer keeping the files in `dir` instead (`--device-metadata-dir`): on a tmpfs a
    /// new file costs about a tenth of what ext4 charges for a fresh inode (18 against
    /// 176 µs measured on the bench machine), and the files, like the claims, never outlive
    /// a reboot.
    pub fn in_dir(dir: &Path, driver: &str) -> Self {
        MetadataWriter {
            root: dir.to_path_buf(),
            driver: driver.to_string(),
        }
    }

    /// The directory that holds every claim's files.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The host file of base request `request` of claim `uid`.
    pub fn host_file(&self, uid: &str, request: &str) -> PathBuf {
        self.root.join(format!("{uid}_{request}.json"))
    }

    /// The path inside a container of the file for `request` of `claim`.
    pub fn container_path(&self, claim: &MetadataClaim<'_>, request: &str) -> String {
        let request = base_request(request);
        match claim.pod_claim_name.filter(|n| !n.is_empty()) {
            Some(pod_claim) => format!(
                "{CONTAINER_ROOT}/resourceclaimtemplates/{pod_claim}/{request}/{}-metadata.json",
                self.driver
            ),
            None => format!(
                "{CONTAINER_ROOT}/resourceclaims/{}/{request}/{}-metadata.json",
                claim.name, self.driver
            ),
        }
    }

    /// The document for the devices of one request: the JSON stream, one object per version
    /// of [`VERSIONS`], each followed by a newline. `generation` is 1 for a first write. Pure.
    ///
    /// Serialised straight from borrowed fields, keys in sorted order: the same bytes as a
    /// `serde_json::Value` built and printed, without building one (a tree copy of every
    /// device's attributes for each version cost a fifth of a prepare's lifecycle work).
    pub fn document(
        &self,
        claim: &MetadataClaim<'_>,
        request: &str,
        devices: &[&MetadataDevice],
        generation: i64,
    ) -> String {
        let devices: Vec<DocDevice<'_>> = devices
            .iter()
            .map(|d| DocDevice {
                attributes: &d.attributes,
                driver: &self.driver,
                name: &d.name,
                pool: &d.pool,
            })
            .collect();
        let mut out = String::new();
        for version in VERSIONS {
            let object = Doc {
                api_version: format!("{GROUP}/{version}"),
                kind: "DeviceMetadata",
                metadata: DocMeta {
                    generation,
                    name: claim.name,
                    namespace: claim.namespace,
                    uid: claim.uid,
                },
                pod_claim_name: claim.pod_claim_name.filter(|n| !n.is_empty()),
                requests: [DocRequest {
                    devices: &devices,
                    name: request,
                }],
            };
            // Serialising borrowed strings, maps with string keys and integers cannot fail.
            if let Ok(text) = serde_json::to_string(&object) {
                out.push_str(&text);
            }
            out.push('\n');
        }
        out
    }

    /// Writes one file per request of `devices` (in first-seen order of base request names)
    /// and returns, per request, the base request name and the read-only bind mount that puts
    /// the file in the containers.
    ///
    /// Fails with [`MetadataError::BadName`] for a claim UID or request that is not a path
    /// segment, [`MetadataError::Io`] when a directory cannot be made and
    /// [`MetadataError::Write`] when a file cannot be written; files already written stay
    /// (the caller's undo removes the claim's directory).
    pub fn write(
        &self,
        claim: &MetadataClaim<'_>,
        devices: &[MetadataDevice],
    ) -> Result<Vec<(String, Mount)>, MetadataError> {
        let label = format!("{}/{} ({})", claim.namespace, claim.name, claim.uid);
        let uid = segment(&label, "claim UID", claim.uid)?;
        let mut requests: Vec<&str> = Vec::new();
        for d in devices {
            let base = segment(&label, "request name", base_request(&d.request))?;
            if !requests.contains(&base) {
                requests.push(base);
            }
        }
        make_root(&self.root).map_err(|source| MetadataError::Io {
            claim: label.clone(),
            step: "creating",
            path: self.root.clone(),
            source,
        })?;
        let mut mounts = Vec::with_capacity(requests.len());
        for base in requests {
            let of_request: Vec<&MetadataDevice> = devices
                .iter()
                .filter(|d| base_request(&d.request) == base)
                .collect();
            // The file's request keeps its full name (`req/sub`) when one subrequest served it.
            let full = of_request.first().map_or(base, |d| d.request.as_str());
            let text = self.document(claim, full, &of_request, 1);
            let path = self.host_file(uid, base);
            fsutil::replace_atomic(&path, text.as_bytes(), 0o644).map_err(|source| {
                MetadataError::Write {
                    claim: label.clone(),
                    path: path.clone(),
                    source,
                }
            })?;
            let mut mount = Mount::read_only_bind(
                path.to_string_lossy().into_owned(),
                self.container_path(claim, base),
            );
            mount.options = ["ro", "bind"].map(String::from).to_vec();
            mounts.push((base.to_string(), mount));
        }
        Ok(mounts)
    }

    /// Removes the files of claim `uid`'s base requests `requests` (as its record names
    /// them; `req/sub` is taken as `req`); `Ok(false)` when there were none. One `unlink` per
    /// request, no directory listed.
    ///
    /// Fails with [`MetadataError::BadName`] for a UID that is not a file-name part and
    /// [`MetadataError::Write`] when a file cannot be removed.
    pub fn remove<'r>(
        &self,
        uid: &str,
        requests: impl IntoIterator<Item = &'r str>,
    ) -> Result<bool, MetadataError> {
        let uid = segment(uid, "claim UID", uid)?;
        let mut removed = false;
        let mut seen: Vec<&str> = Vec::new();
        for request in requests {
            let base = base_request(request);
            if seen.contains(&base) || segment(uid, "request name", base).is_err() {
                continue;
            }
            seen.push(base);
            let path = self.host_file(uid, base);
            removed |= fsutil::remove_if_exists(&path).map_err(|source| MetadataError::Write {
                claim: uid.to_string(),
                path,
                source,
            })?;
        }
        Ok(removed)
    }

    /// Removes every file of claim `uid`, whatever its requests (a failed prepare that has
    /// no record to name them): lists the directory once.
    ///
    /// Fails as [`MetadataWriter::remove`] and [`MetadataWriter::files`].
    pub fn remove_all(&self, uid: &str) -> Result<bool, MetadataError> {
        let uid = segment(uid, "claim UID", uid)?;
        let requests: Vec<String> = self
            .files()?
            .into_iter()
            .filter(|(owner, _)| owner == uid)
            .map(|(_, request)| request)
            .collect();
        self.remove(uid, requests.iter().map(String::as_str))
    }

    /// Every file there is, as (claim UID, base request), sorted; a missing directory holds
    /// none. Start-up recovery removes those of claims no record holds.
    ///
    /// Fails with [`MetadataError::Io`] when the directory cannot be listed.
    pub fn files(&self) -> Result<Vec<(String, String)>, MetadataError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(MetadataError::Io {
                    claim: "(any)".to_string(),
                    step: "listing",
                    path: self.root.clone(),
                    source,
                });
            }
        };
        crate::cost::count(crate::cost::Cost::DirectoryList);
        let mut files: Vec<(String, String)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|name| {
                let stem = name.strip_suffix(".json")?;
                let (uid, request) = stem.rsplit_once('_')?;
                Some((uid.to_string(), request.to_string()))
            })
            .collect();
        files.sort();
        Ok(files)
    }
}

/// Creates `dir` (and its parents) with mode 0755 unless it exists: one `mkdir` that fails
/// with `EEXIST` on every prepare but the first. The runtime reads it as root; workloads see
/// only the mounted file.
fn make_root(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// The metadata devices of a claim's allocated devices, each with the UUID of its GPU: each
/// published device's attributes, with its GPU's `resource.kubernetes.io/pciBusID` from
/// `bus_ids` (GPU UUID → bus ID) where the device does not carry it (MIG devices in the
/// compact attribute set). A device no longer in `model` gets only its GPU's bus ID. Pure.
pub fn devices_from_model(
    model: &crate::devices::DeviceModel,
    bus_ids: &BTreeMap<String, String>,
    allocated: &[(&crate::allocation::AllocatedDevice, &str)],
) -> Vec<MetadataDevice> {
    allocated
        .iter()
        .map(|(a, gpu_uuid)| {
            let published = model.devices.iter().find(|d| d.name() == a.device);
            let mut attributes = published
                .and_then(|d| d.device.attributes.clone())
                .unwrap_or_default();
            if !attributes.contains_key(PCI_BUS_ID)
                && let Some(bus) = bus_ids.get(*gpu_uuid)
            {
                attributes.insert(
                    PCI_BUS_ID.to_string(),
                    DeviceAttribute {
                        string: Some(bus.clone()),
                        ..DeviceAttribute::default()
                    },
                );
            }
            MetadataDevice {
                request: a.request.clone(),
                pool: a.pool.clone(),
                name: a.device.clone(),
                attributes,
            }
        })
        .collect()
}

/// Makes a vGPU's metadata name the device its VM gets, as KubeVirt reads it: for a vdev
/// vGPU `resource.kubernetes.io/pciBusID` becomes its VF's address (not the parent GPU's,
/// which [`devices_from_model`] put there); an mdev vGPU gets `mdevUUID` and loses
/// `pciBusID`, so a consumer that knows no `mdevUUID` fails to find a device instead of
/// passing the whole parent GPU. Pure.
pub fn name_vgpu(
    attributes: &mut BTreeMap<String, DeviceAttribute>,
    vgpu: &crate::checkpoint::VgpuRecord,
) {
    let string = |value: &str| DeviceAttribute {
        string: Some(value.to_string()),
        ..DeviceAttribute::default()
    };
    if let Some(vf) = &vgpu.vf {
        attributes.insert(PCI_BUS_ID.to_string(), string(vf));
    }
    if let Some(uuid) = &vgpu.mdev_uuid {
        attributes.remove(PCI_BUS_ID);
        attributes.insert(MDEV_UUID.to_string(), string(uuid));
    }
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
mod tests;
