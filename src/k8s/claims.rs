//! Reading a ResourceClaim for prepare: the kubelet sends only namespace, name and UID, so the
//! plugin reads the claim and keeps what its allocation says about this driver on this node.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};
use serde::Deserialize;

use super::error::{ClaimRef, K8sError, Step};

/// Where an opaque config entry came from. Class entries come first: claim entries override.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigSource {
    /// From the DeviceClass (`FromClass`).
    FromClass,
    /// From the claim itself (`FromClaim`).
    FromClaim,
}

impl ConfigSource {
    fn parse(text: &str) -> Option<ConfigSource> {
        match text {
            "FromClass" => Some(ConfigSource::FromClass),
            "FromClaim" => Some(ConfigSource::FromClaim),
            _ => None,
        }
    }
}

/// One opaque config entry of this driver.
#[derive(Debug, Clone, PartialEq)]
pub struct OpaqueConfig {
    /// Class or claim.
    pub source: ConfigSource,
    /// The requests it applies to, as written (`req` or `req/subrequest`); empty = all.
    pub requests: Vec<String>,
    /// The raw `parameters` object, undecoded.
    pub parameters: serde_json::Value,
}

/// One device the allocation gives this driver on this node (shared with the lifecycle).
pub use crate::allocation::AllocatedDevice;

/// What prepare needs from a claim, without Kubernetes types.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatedClaim {
    /// The claim, with its verified UID.
    pub claim: ClaimRef,
    /// This driver's devices in this node's pool, in allocation order.
    pub devices: Vec<AllocatedDevice>,
    /// This driver's opaque config: class entries, then claim entries, each in list order (so
    /// a later entry overrides an earlier one).
    pub config: Vec<OpaqueConfig>,
    /// The DeviceClass of each request of the claim's spec: `req` for `exactly`, and
    /// `req/subrequest` for each alternative of `firstAvailable` (as results name them).
    pub classes: BTreeMap<String, String>,
    /// The pods the claim is reserved for now (`status.reservedFor` entries of resource
    /// `pods` in the core group), in list order: who will use its devices.
    pub reserved_pods: Vec<ReservedPod>,
    /// The claim's `resource.kubernetes.io/pod-claim-name` annotation: set on claims made
    /// from a ResourceClaimTemplate, to the pod's name for the claim.
    pub pod_claim_name: Option<String>,
}

/// A pod named in a claim's `status.reservedFor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedPod {
    /// Pod name (the claim's namespace).
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// Reads claims for one driver on one node.
#[derive(Clone)]
pub struct ClaimReader {
    client: Client,
    driver: String,
    pool: String,
}

impl ClaimReader {
    /// A reader keeping the results of `driver` in `pool` (the node name, which names the
    /// node's pool).
    pub fn new(client: Client, driver: impl Into<String>, pool: impl Into<String>) -> Self {
        ClaimReader {
            client,
            driver: driver.into(),
            pool: pool.into(),
        }
    }

    /// Reads claim `namespace/name` and checks it is the object the kubelet means (`uid`).
    ///
    /// One request, not retried: the kubelet calls prepare again on failure.
    ///
    /// Fails with [`K8sError::ClaimNotFound`] (deleted), [`K8sError::ClaimUidMismatch`]
    /// (deleted and re-created), [`K8sError::ClaimNotAllocated`], [`K8sError::ClaimNoResults`]
    /// (nothing for this driver here), [`K8sError::ClaimConfigSource`], or
    /// [`K8sError::Api`] / [`K8sError::Unreachable`] for [`Step::GetClaim`]; every one names
    /// `namespace/name (uid)`.
    pub async fn fetch(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<AllocatedClaim, K8sError> {
        let wanted = ClaimRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        };
        let api = Api::<ResourceClaim>::namespaced(self.client.clone(), namespace);
        let claim = get_claim(&api, name, &wanted).await?;
        allocated(&claim, wanted, &self.driver, &self.pool)
    }

    /// [`ClaimReader::fetch`] that also returns the claim as the server sent it, every field
    /// kept (known to this client's types or not), so a later write of its status can start
    /// from this read instead of reading it again
    /// ([`crate::k8s::ClaimStatusWriter::sync_from`]). The same one request, the same errors.
    pub async fn fetch_object(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(AllocatedClaim, DynamicObject), K8sError> {
        let wanted = ClaimRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        };
        let resource = ApiResource::erase::<ResourceClaim>(&());
        let api = Api::<LeanObject>::namespaced_with(self.client.clone(), namespace, &resource);
        let LeanObject(object) = get_claim(&api, name, &wanted).await?;
        let claim = match typed_claim(&object) {
            Ok(claim) => claim,
            Err(e) => {
                let step = Step::GetClaim {
                    claim: Box::new(wanted),
                };
                return Err(K8sError::from_kube(step, kube::Error::SerdeError(e)));
            }
        };
        let allocated = allocated(&claim, wanted, &self.driver, &self.pool)?;
        Ok((allocated, object))
    }
}

/// An object as the server sent it, read in one pass and without its `managedFields`: the
/// prepare's claim read and the claim-status writer's re-read both use it.
///
/// What it holds is what deserialising a [`DynamicObject`] gives, with
/// `metadata.managedFields` left out: nothing this plugin does reads them, and a status
/// write sends none (the server keeps the live ones). `DynamicObject`'s own reading goes
/// through serde's `flatten`, which buffers the whole object once before reading it again,
/// and parses every managed-fields entry's `fieldsV1` tree: on the prepare path that was
/// most of the claim read's JSON work.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LeanObject(pub(crate) DynamicObject);

impl kube::Resource for LeanObject {
    type DynamicType = ApiResource;
    type Scope = kube::core::DynamicResourceScope;

    fn group(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::group(dt)
    }

    fn version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::version(dt)
    }

    fn kind(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::kind(dt)
    }

    fn api_version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::api_version(dt)
    }

    fn plural(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        DynamicObject::plural(dt)
    }

    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> Deserialize<'de> for LeanObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(LeanObjectVisitor)
    }
}

struct LeanObjectVisitor;

impl<'de> serde::de::Visitor<'de> for LeanObjectVisitor {
    type Value = LeanObject;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<LeanObject, A::Error> {
        let mut api_version: Option<String> = None;
        let mut kind: Option<String> = None;
        let mut metadata = None;
        let mut data = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => api_version = Some(map.next_value()?),
                "kind" => kind = Some(map.next_value()?),
                "metadata" => metadata = Some(map.next_value::<LeanMeta>()?.0),
                _ => {
                    let value = map.next_value()?;
                    data.insert(key, value);
                }
            }
        }
        // As `DynamicObject` reads them: both type fields make its `types`; one alone is
        // dropped.
        let types = match (api_version, kind) {
            (Some(api_version), Some(kind)) => Some(kube::core::TypeMeta { api_version, kind }),
            _ => None,
        };
        Ok(LeanObject(DynamicObject {
            types,
            metadata: metadata.unwrap_or_default(),
            data: serde_json::Value::Object(data),
        }))
    }
}

/// `ObjectMeta` without `managedFields`, whose entries are skipped unparsed.
struct LeanMeta(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta);

impl<'de> Deserialize<'de> for LeanMeta {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = serde_json::Map<String, serde_json::Value>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("object metadata")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut fields = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "managedFields" {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    } else {
                        let value = map.next_value()?;
                        fields.insert(key, value);
                    }
                }
                Ok(fields)
            }
        }
        let fields = deserializer.deserialize_map(Fields)?;
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::deserialize(
            serde_json::Value::Object(fields),
        )
        .map(LeanMeta)
        .map_err(serde::de::Error::custom)
    }
}

/// The typed claim that `object` holds, read from its parts as they are: the spec and status
/// from the untyped data, of the metadata only what [`allocated`] reads (name, namespace,
/// UID, annotations). No copy of the whole object is made on the way (a round trip through
/// one `Value` tree cost a fifth of a prepare's JSON work).
///
/// Fails as deserialising a `ResourceClaim` does: a field of the wrong type (the error names
/// it).
fn typed_claim(object: &DynamicObject) -> serde_json::Result<ResourceClaim> {
    use k8s_openapi::api::resource::v1::{ResourceClaimSpec, ResourceClaimStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let spec = match object.data.get("spec") {
        Some(serde_json::Value::Null) | None => None,
        Some(spec) => Some(ResourceClaimSpec::deserialize(spec)?),
    };
    let status = match object.data.get("status") {
        Some(serde_json::Value::Null) | None => None,
        Some(status) => Some(ResourceClaimStatus::deserialize(status)?),
    };
    let meta = &object.metadata;
    Ok(ResourceClaim {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            annotations: meta.annotations.clone(),
            ..ObjectMeta::default()
        },
        spec,
        status,
    })
}

/// One GET of claim `name` through `api`: [`K8sError::ClaimNotFound`] when it does not
/// exist, [`K8sError::Api`] / [`K8sError::Unreachable`] for [`Step::GetClaim`] otherwise; both
/// name `wanted`.
async fn get_claim<K>(api: &Api<K>, name: &str, wanted: &ClaimRef) -> Result<K, K8sError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(found)) => Ok(found),
        Ok(None) => Err(K8sError::ClaimNotFound {
            claim: Box::new(wanted.clone()),
        }),
        Err(e) => {
            let step = Step::GetClaim {
                claim: Box::new(wanted.clone()),
            };
            Err(K8sError::from_kube(step, e))
        }
    }
}

/// The part of `claim` that belongs to `driver` in `pool`, checked against the claim the kubelet
/// named. Pure; the errors are those of [`ClaimReader::fetch`].
pub fn allocated(
    claim: &ResourceClaim,
    wanted: ClaimRef,
    driver: &str,
    pool: &str,
) -> Result<AllocatedClaim, K8sError> {
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != wanted.uid {
        return Err(K8sError::ClaimUidMismatch {
            claim: Box::new(wanted),
            found,
        });
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(K8sError::ClaimNotAllocated {
            claim: Box::new(wanted),
        });
    };
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let devices: Vec<AllocatedDevice> = results
        .iter()
        .filter(|r| r.driver == driver && r.pool == pool)
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            admin_access: r.admin_access.unwrap_or(false),
            share_id: r.share_id.clone(),
            consumed_capacity: r
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(k, q)| (k.clone(), q.0.clone()))
                .collect(),
        })
        .collect();
    if devices.is_empty() {
        let listed: Vec<String> = results
            .iter()
            .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device))
            .collect();
        return Err(K8sError::ClaimNoResults {
            claim: Box::new(wanted),
            driver: driver.to_string(),
            pool: pool.to_string(),
            allocated: if listed.is_empty() {
                "nothing".to_string()
            } else {
                listed.join(", ")
            },
        });
    }
    let entries = allocation
        .devices
        .as_ref()
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default();
    let mut config = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let Some(source) = ConfigSource::parse(&entry.source) else {
            return Err(K8sError::ClaimConfigSource {
                claim: Box::new(wanted),
                index,
                value: entry.source.clone(),
            });
        };
        config.push(OpaqueConfig {
            source,
            requests: entry.requests.clone().unwrap_or_default(),
            parameters: opaque.parameters.0.clone(),
        });
    }
    // Stable: list order is kept within each source.
    config.sort_by_key(|c| c.source);
    Ok(AllocatedClaim {
        claim: wanted,
        devices,
        config,
        classes: request_classes(claim),
        reserved_pods: reserved_pods(claim),
        pod_claim_name: claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("resource.kubernetes.io/pod-claim-name"))
            .filter(|n| !n.is_empty())
            .cloned(),
    })
}

/// The pods of `status.reservedFor`: entries of resource `pods` in the core API group
/// (other consumers, e.g. a controller's custom resource, are not pods and are skipped).
pub fn reserved_pods(claim: &ResourceClaim) -> Vec<ReservedPod> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| ReservedPod {
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
        .collect()
}

/// The DeviceClass of each request (and `firstAvailable` alternative) of a claim's spec.
pub fn request_classes(claim: &ResourceClaim) -> BTreeMap<String, String> {
    let mut classes = BTreeMap::new();
    let requests = claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_deref())
        .unwrap_or_default();
    for request in requests {
        if let Some(exactly) = &request.exactly {
            classes.insert(request.name.clone(), exactly.device_class_name.clone());
        }
        for sub in request.first_available.iter().flatten() {
            classes.insert(
                format!("{}/{}", request.name, sub.name),
                sub.device_class_name.clone(),
            );
        }
    }
    classes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim as kube-apiserver sends it: managed fields, labels, an owner, a field this
    /// client's types do not know, a template's annotation, a reservation, an opaque config
    /// and two results. The metadata the typed claim leaves out is here, so a change to
    /// [`allocated`] that starts reading it makes the two routes differ in the test below.
    fn served() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": "pod-gpu-abcde", "namespace": "team", "uid": "uid-1",
                "resourceVersion": "42", "generation": 3,
                "labels": {"team": "a"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "pod", "uid": "pod-uid"}],
                "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                "managedFields": [{"manager": "kube-scheduler", "operation": "Update",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                    "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}}}]
            }},
            "status": {
                "allocation": {"devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
                        {"request": "gpu", "driver": "other.example.com", "pool": "node-a", "device": "x-0"}
                    ],
                    "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {
                        "driver": "gpu.nvidia.com",
                        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}}}]
                }},
                "reservedFor": [{"resource": "pods", "name": "pod", "uid": "pod-uid"}],
                "aFieldFromANewerServer": true
            }
        })
    }

    fn wanted() -> ClaimRef {
        ClaimRef {
            namespace: "team".into(),
            name: "pod-gpu-abcde".into(),
            uid: "uid-1".into(),
        }
    }

    #[test]
    fn the_claim_read_from_its_parts_allocates_as_the_whole_claim_does() {
        let object: DynamicObject = serde_json::from_value(served()).unwrap();
        let whole: ResourceClaim = serde_json::from_value(served()).unwrap();
        let from_parts = typed_claim(&object).unwrap();
        let expected = allocated(&whole, wanted(), "gpu.nvidia.com", "node-a").unwrap();
        let got = allocated(&from_parts, wanted(), "gpu.nvidia.com", "node-a").unwrap();
        assert_eq!(got, expected);
        assert_eq!(got.devices.len(), 1);
        assert_eq!(got.config.len(), 1);
        assert_eq!(got.pod_claim_name.as_deref(), Some("gpu"));
        assert_eq!(got.reserved_pods.len(), 1);
        assert_eq!(from_parts.spec, whole.spec);
        assert_eq!(from_parts.status, whole.status);
    }

    /// The lean read gives what `DynamicObject`'s own does, less the managed fields: for the
    /// served claim, for an object with one type field of two (dropped by both), and for
    /// metadata of the wrong type (an error either way).
    #[test]
    fn the_lean_read_is_the_dynamic_object_without_managed_fields() {
        let text = serde_json::to_string(&served()).unwrap();
        let LeanObject(lean) = serde_json::from_str(&text).unwrap();
        let mut whole: DynamicObject = serde_json::from_str(&text).unwrap();
        assert!(whole.metadata.managed_fields.is_some());
        whole.metadata.managed_fields = None;
        assert_eq!(lean, whole);
        assert_eq!(lean.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            lean.data["status"]["aFieldFromANewerServer"],
            serde_json::json!(true)
        );

        let half =
            serde_json::json!({"kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": {}});
        let LeanObject(lean) = serde_json::from_value(half.clone()).unwrap();
        let whole: DynamicObject = serde_json::from_value(half).unwrap();
        assert_eq!(lean, whole);

        let bad = serde_json::json!({"metadata": {"name": 7}});
        assert!(serde_json::from_value::<LeanObject>(bad.clone()).is_err());
        assert!(serde_json::from_value::<DynamicObject>(bad).is_err());
    }

    #[test]
    fn a_claim_without_spec_or_status_reads_as_none_and_a_wrong_type_is_named() {
        let bare: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "n", "uid": "u"}, "status": null
        }))
        .unwrap();
        let typed = typed_claim(&bare).unwrap();
        assert!(typed.spec.is_none() && typed.status.is_none());

        let mut bad = served();
        bad["status"]["reservedFor"] = serde_json::json!("not a list");
        let object: DynamicObject = serde_json::from_value(bad).unwrap();
        let error = typed_claim(&object).unwrap_err().to_string();
        assert!(error.contains("invalid type"), "{error}");
    }
}
