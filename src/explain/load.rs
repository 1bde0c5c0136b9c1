//! Reading DeviceClasses, ResourceSlices and claims from YAML or JSON files: single or
//! multi-document, `kind: List` wrappers (as `kubectl get -o yaml` prints), or directories
//! of such files.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::ExplainError;

/// One object read from a file, with where it came from.
struct Document {
    path: PathBuf,
    index: usize,
    value: Value,
}

impl Document {
    fn field(&self, name: &str) -> &str {
        self.value.get(name).and_then(Value::as_str).unwrap_or("")
    }

    fn kind(&self) -> &str {
        self.field("kind")
    }

    fn name(&self) -> String {
        self.value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("<unnamed>")
            .to_string()
    }

    /// Decodes into a resource.k8s.io/v1 (or core v1) type. v1beta2 has the same shape as
    /// v1 and is accepted; older versions are not.
    fn decode<T: DeserializeOwned>(mut self, supported: &[&str]) -> Result<T, ExplainError> {
        let version = self.field("apiVersion").to_string();
        if !supported.contains(&version.as_str()) {
            return Err(ExplainError::Version {
                kind: self.kind().to_string(),
                path: self.path,
                document: self.index,
                api_version: version,
                supported: supported.join(", "),
            });
        }
        if let Some(map) = self.value.as_mapping_mut() {
            map.remove("apiVersion");
        }
        let kind = self.kind().to_string();
        let name = self.name();
        serde_yaml::from_value(self.value).map_err(|source| ExplainError::Decode {
            path: self.path,
            document: self.index,
            kind,
            name,
            source,
        })
    }
}

pub(crate) const RESOURCE_VERSIONS: [&str; 2] = ["resource.k8s.io/v1", "resource.k8s.io/v1beta2"];

fn files(path: &Path) -> Result<Vec<PathBuf>, ExplainError> {
    let read_error = |source| ExplainError::Read {
        path: path.to_path_buf(),
        source,
    };
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read_error)? {
        let file = entry.map_err(read_error)?.path();
        let wanted = file
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if wanted && file.is_file() {
            found.push(file);
        }
    }
    found.sort();
    Ok(found)
}

/// The items of a list. The API server's typed lists (`ResourceSliceList` of
/// `resource.k8s.io/v1`, as `kubectl get --raw` saves them) leave `kind` and `apiVersion` off
/// their items; those are the list's, without `List`. A plain `List` names them per item.
fn typed_items(list_kind: &str, api_version: Option<&Value>, items: Vec<Value>) -> Vec<Value> {
    let item_kind = list_kind.strip_suffix("List").filter(|k| !k.is_empty());
    let (Some(item_kind), Some(api_version)) = (item_kind, api_version) else {
        return items;
    };
    items
        .into_iter()
        .map(|mut item| {
            if let Some(map) = item.as_mapping_mut() {
                if !map.contains_key("kind") {
                    map.insert("kind".into(), Value::from(item_kind));
                }
                if !map.contains_key("apiVersion") {
                    map.insert("apiVersion".into(), api_version.clone());
                }
            }
            item
        })
        .collect()
}

fn documents(path: &Path) -> Result<Vec<Document>, ExplainError> {
    let mut out = Vec::new();
    for file in files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|source| ExplainError::Read {
            path: file.clone(),
            source,
        })?;
        for (i, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(document).map_err(|source| ExplainError::Parse {
                path: file.clone(),
                document: i + 1,
                source,
            })?;
            let items = value.get("items").and_then(Value::as_sequence).cloned();
            let list_kind = value
                .get("kind")
                .and_then(Value::as_str)
                .filter(|k| k.ends_with("List"));
            let values = match (list_kind, items) {
                (Some(list_kind), Some(items)) => {
                    typed_items(list_kind, value.get("apiVersion"), items)
                }
                _ if value.is_null() => Vec::new(),
                _ => vec![value],
            };
            out.extend(values.into_iter().map(|value| Document {
                path: file.clone(),
                index: i + 1,
                value,
            }));
        }
    }
    Ok(out)
}

fn load_kind<T: DeserializeOwned>(
    path: &Path,
    kind: &str,
    versions: &[&str],
) -> Result<Vec<T>, ExplainError> {
    let docs = documents(path)?;
    let mut seen: Vec<String> = docs.iter().map(|d| d.kind().to_string()).collect();
    seen.sort();
    seen.dedup();
    let objects = docs
        .into_iter()
        .filter(|d| d.kind() == kind)
        .map(|d| d.decode(versions))
        .collect::<Result<Vec<T>, _>>()?;
    if objects.is_empty() {
        return Err(ExplainError::Missing {
            path: path.to_path_buf(),
            kind: kind.to_string(),
            seen: if seen.is_empty() {
                "none".into()
            } else {
                seen.join(", ")
            },
        });
    }
    Ok(objects)
}

/// Loads every DeviceClass from a file or a directory of `.yaml`/`.yml`/`.json` files.
///
/// Other kinds are skipped. Fails when nothing can be read or parsed (naming the file and
/// the document), when an object is not resource.k8s.io/v1 (or v1beta2), or when no
/// DeviceClass is found.
pub fn load_classes(path: &Path) -> Result<Vec<DeviceClass>, ExplainError> {
    load_kind(path, "DeviceClass", &RESOURCE_VERSIONS)
}

/// Loads every ResourceSlice from a file or directory; fails as [`load_classes`] does.
pub fn load_slices(path: &Path) -> Result<Vec<ResourceSlice>, ExplainError> {
    load_kind(path, "ResourceSlice", &RESOURCE_VERSIONS)
}

/// Loads every Node (core `v1`) from a file or directory (`kubectl get nodes -o yaml`);
/// fails as [`load_classes`] does.
pub fn load_nodes(path: &Path) -> Result<Vec<k8s_openapi::api::core::v1::Node>, ExplainError> {
    load_kind(path, "Node", &["v1"])
}

/// Loads the ResourceClaims of a file or directory that are already allocated
/// (`status.allocation` set), to account for what they hold. Finding none is not an error.
pub fn load_allocated(path: &Path) -> Result<Vec<ResourceClaim>, ExplainError> {
    let claims: Vec<ResourceClaim> = documents(path)?
        .into_iter()
        .filter(|d| d.kind() == "ResourceClaim")
        .map(|d| d.decode(&RESOURCE_VERSIONS))
        .collect::<Result<_, _>>()?;
    Ok(claims
        .into_iter()
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .collect())
}

/// Loads the claims to explain from a file holding ResourceClaims, ResourceClaimTemplates
/// or one Pod (multi-document YAML or JSON).
///
/// With a Pod, its `spec.resourceClaims` are resolved against the claims and templates of
/// the same file; a template yields a claim named `<pod>-<entry>` in the Pod's namespace.
/// Without a Pod, every claim and every template of the file is returned, in file order.
/// Errors name the file and what is wrong: unreadable or malformed documents, unsupported
/// API versions, more than one Pod, references to objects the file does not contain.
pub fn load_claims(path: &Path) -> Result<Vec<ResourceClaim>, ExplainError> {
    let docs = documents(path)?;
    let mut claims: Vec<ResourceClaim> = Vec::new();
    let mut templates: Vec<ResourceClaimTemplate> = Vec::new();
    let mut pods: Vec<Pod> = Vec::new();
    let mut in_order: Vec<ResourceClaim> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for doc in docs {
        seen.push(doc.kind().to_string());
        match doc.kind() {
            "ResourceClaim" => {
                let claim: ResourceClaim = doc.decode(&RESOURCE_VERSIONS)?;
                in_order.push(claim.clone());
                claims.push(claim);
            }
            "ResourceClaimTemplate" => {
                let template: ResourceClaimTemplate = doc.decode(&RESOURCE_VERSIONS)?;
                in_order.push(from_template(&template, template_name(&template), None));
                templates.push(template);
            }
            "Pod" => pods.push(doc.decode(&["v1"])?),
            _ => {}
        }
    }
    if pods.len() > 1 {
        // Several Pods: their claims are explained together, in file order, as if every Pod
        // landed on this node (the question "do these fit here side by side?"); a claim two
        // Pods share by name is counted once.
        let mut all: Vec<ResourceClaim> = Vec::new();
        for pod in &pods {
            for claim in pod_claims(path, pod, &claims, &templates)? {
                if !all.iter().any(|c| c.metadata.name == claim.metadata.name) {
                    all.push(claim);
                }
            }
        }
        return Ok(all);
    }
    let Some(pod) = pods.pop() else {
        if in_order.is_empty() {
            seen.sort();
            seen.dedup();
            return Err(ExplainError::Missing {
                path: path.to_path_buf(),
                kind: "ResourceClaim, ResourceClaimTemplate or Pod".into(),
                seen: if seen.is_empty() {
                    "none".into()
                } else {
                    seen.join(", ")
                },
            });
        }
        return Ok(in_order);
    };
    pod_claims(path, &pod, &claims, &templates)
}

fn template_name(template: &ResourceClaimTemplate) -> String {
    template.metadata.name.clone().unwrap_or_default()
}

fn from_template(
    template: &ResourceClaimTemplate,
    name: String,
    pod: Option<&Pod>,
) -> ResourceClaim {
    let spec = template.spec.as_ref();
    let mut metadata = spec.and_then(|s| s.metadata.clone()).unwrap_or_default();
    metadata.name = Some(name);
    metadata.namespace = pod
        .and_then(|p| p.metadata.namespace.clone())
        .or_else(|| template.metadata.namespace.clone());
    ResourceClaim {
        metadata,
        spec: spec.and_then(|s| s.spec.clone()),
        status: None,
    }
}

fn pod_claims(
    path: &Path,
    pod: &Pod,
    claims: &[ResourceClaim],
    templates: &[ResourceClaimTemplate],
) -> Result<Vec<ResourceClaim>, ExplainError> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let entries = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default();
    if entries.is_empty() {
        return Err(ExplainError::PodWithoutClaims {
            path: path.to_path_buf(),
            pod: pod_name,
        });
    }
    let mut out = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let reference =
            |what: &'static str, name: &str, found: Vec<String>| ExplainError::Reference {
                path: path.to_path_buf(),
                entry: format!("Pod {pod_name}: spec.resourceClaims[{index}]"),
                what,
                name: name.to_string(),
                found: if found.is_empty() {
                    "none".into()
                } else {
                    found.join(", ")
                },
            };
        match (
            &entry.resource_claim_name,
            &entry.resource_claim_template_name,
        ) {
            (Some(name), _) => {
                let claim = claims
                    .iter()
                    .find(|c| c.metadata.name.as_deref() == Some(name))
                    .ok_or_else(|| {
                        let found = claims
                            .iter()
                            .filter_map(|c| c.metadata.name.clone())
                            .collect();
                        reference("ResourceClaim", name, found)
                    })?;
                out.push(claim.clone());
            }
            (None, Some(name)) => {
                let template = templates
                    .iter()
                    .find(|t| t.metadata.name.as_deref() == Some(name))
                    .ok_or_else(|| {
                        let found = templates.iter().map(template_name).collect();
                        reference("ResourceClaimTemplate", name, found)
                    })?;
                let claim_name = format!("{pod_name}-{}", entry.name);
                out.push(from_template(template, claim_name, Some(pod)));
            }
            (None, None) => {
                return Err(ExplainError::EmptyPodClaim {
                    path: path.to_path_buf(),
                    pod: pod_name,
                    index,
                });
            }
        }
    }
    Ok(out)
}
