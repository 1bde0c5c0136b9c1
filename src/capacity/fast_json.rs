//! The fast path for large JSON inputs (`kubectl get resourceslices -o json`): a `List` of
//! `resource.k8s.io/v1` ResourceSlices or ResourceClaims is read straight from the bytes into
//! narrow structs holding only what the capacity view reads (names, pools, counters, a few
//! attributes; results and `reservedFor`), then into the API types the model takes. Every
//! other field is skipped unparsed, which is what makes it fast: a slice's device carries a
//! dozen attributes and a capacity map the view never looks at.
//!
//! Anything else (YAML, a single object, another kind or version, a field of the wrong
//! shape) answers `None`, and the caller takes the general path, which reads every form and
//! gives the detailed errors.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::{IgnoredAny, MapAccess, Visitor};

const API_VERSION: &str = "resource.k8s.io/v1";

/// The device attributes the capacity view reads (by bare name; a `<domain>/` prefix is
/// kept as written).
const KEPT_ATTRIBUTES: [&str; 9] = [
    "type",
    "profile",
    "productName",
    "uuid",
    "parentUUID",
    "minor",
    "parentMinor",
    "index",
    "parentIndex",
];

#[derive(Deserialize)]
struct List<T> {
    kind: String,
    items: Vec<T>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
}

impl Meta {
    fn into_api(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            ..ObjectMeta::default()
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice {
    api_version: String,
    kind: String,
    metadata: Meta,
    spec: SliceSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceSpec {
    driver: String,
    node_name: Option<String>,
    pool: Pool,
    #[serde(default)]
    devices: Option<Vec<Device>>,
    #[serde(default)]
    shared_counters: Option<Vec<CounterSet>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pool {
    name: String,
    generation: i64,
    resource_slice_count: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    #[serde(default)]
    attributes: Attributes,
    #[serde(default)]
    consumes_counters: Option<Vec<Consumption>>,
}

#[derive(Deserialize)]
struct CounterSet {
    name: String,
    counters: BTreeMap<String, api::Counter>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Consumption {
    counter_set: String,
    counters: BTreeMap<String, api::Counter>,
}

/// The kept attributes; every other one is skipped without being parsed.
#[derive(Default)]
struct Attributes(Option<BTreeMap<String, api::DeviceAttribute>>);

impl<'de> Deserialize<'de> for Attributes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keep;
        impl<'de> Visitor<'de> for Keep {
            type Value = Attributes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of device attributes")
            }
            fn visit_unit<E>(self) -> Result<Attributes, E> {
                Ok(Attributes(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Attributes, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let bare = key.rsplit('/').next().unwrap_or(&key);
                    if KEPT_ATTRIBUTES.contains(&bare) {
                        kept.insert(key.into_owned(), map.next_value()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Attributes(Some(kept)))
            }
        }
        d.deserialize_any(Keep)
    }
}

impl Slice {
    fn into_api(self) -> api::ResourceSlice {
        let spec = self.spec;
        api::ResourceSlice {
            metadata: self.metadata.into_api(),
            spec: api::ResourceSliceSpec {
                driver: spec.driver,
                node_name: spec.node_name,
                pool: api::ResourcePool {
                    name: spec.pool.name,
                    generation: spec.pool.generation,
                    resource_slice_count: spec.pool.resource_slice_count,
                },
                devices: spec.devices.map(|ds| {
                    ds.into_iter()
                        .map(|d| api::Device {
                            name: d.name,
                            attributes: d.attributes.0,
                            consumes_counters: d.consumes_counters.map(|cs| {
                                cs.into_iter()
                                    .map(|c| api::DeviceCounterConsumption {
                                        counter_set: c.counter_set,
                                        counters: c.counters,
                                        ..api::DeviceCounterConsumption::default()
                                    })
                                    .collect()
                            }),
                            ..api::Device::default()
                        })
                        .collect()
                }),
                shared_counters: spec.shared_counters.map(|sets| {
                    sets.into_iter()
                        .map(|s| api::CounterSet {
                            name: s.name,
                            counters: s.counters,
                        })
                        .collect()
                }),
                ..api::ResourceSliceSpec::default()
            },
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Claim {
    api_version: String,
    kind: String,
    metadata: Meta,
    #[serde(default)]
    status: Option<ClaimStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimStatus {
    #[serde(default)]
    allocation: Option<Allocation>,
    #[serde(default)]
    reserved_for: Option<Vec<api::ResourceClaimConsumerReference>>,
}

#[derive(Deserialize)]
struct Allocation {
    #[serde(default)]
    devices: Option<AllocatedDevices>,
}

#[derive(Deserialize)]
struct AllocatedDevices {
    #[serde(default)]
    results: Option<Vec<AllocResult>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AllocResult {
    request: String,
    driver: String,
    pool: String,
    device: String,
    #[serde(default)]
    admin_access: Option<bool>,
    #[serde(default, rename = "shareID")]
    share_id: Option<String>,
    #[serde(default)]
    consumed_capacity: Option<BTreeMap<String, Quantity>>,
}

impl Claim {
    /// The claim as the model reads it; `None` when it is not allocated.
    fn into_api(self) -> Option<api::ResourceClaim> {
        let status = self.status?;
        let allocation = status.allocation?;
        let results = allocation.devices.and_then(|d| d.results).map(|rs| {
            rs.into_iter()
                .map(|r| api::DeviceRequestAllocationResult {
                    request: r.request,
                    driver: r.driver,
                    pool: r.pool,
                    device: r.device,
                    admin_access: r.admin_access,
                    share_id: r.share_id,
                    consumed_capacity: r.consumed_capacity,
                    ..api::DeviceRequestAllocationResult::default()
                })
                .collect()
        });
        Some(api::ResourceClaim {
            metadata: self.metadata.into_api(),
            spec: None,
            status: Some(api::ResourceClaimStatus {
                allocation: Some(api::AllocationResult {
                    devices: Some(api::DeviceAllocationResult {
                        results,
                        ..api::DeviceAllocationResult::default()
                    }),
                    ..api::AllocationResult::default()
                }),
                reserved_for: status.reserved_for,
                ..api::ResourceClaimStatus::default()
            }),
        })
    }
}

/// Whether `bytes` look like one JSON object (the only form the fast path takes).
fn json_object(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{')
}

/// The ResourceSlices of a JSON `List` of `resource.k8s.io/v1` ResourceSlices; `None` for
/// anything else (the general path decides).
pub(super) fn slices(bytes: &[u8]) -> Option<Vec<api::ResourceSlice>> {
    if !json_object(bytes) {
        return None;
    }
    let list: List<Slice> = serde_json::from_slice(bytes).ok()?;
    let fits = list.kind.ends_with("List")
        && !list.items.is_empty()
        && list
            .items
            .iter()
            .all(|s| s.kind == "ResourceSlice" && s.api_version == API_VERSION);
    fits.then(|| list.items.into_iter().map(Slice::into_api).collect())
}

/// The allocated ResourceClaims of a JSON `List` of `resource.k8s.io/v1` ResourceClaims;
/// `None` for anything else.
pub(super) fn allocated_claims(bytes: &[u8]) -> Option<Vec<api::ResourceClaim>> {
    if !json_object(bytes) {
        return None;
    }
    let list: List<Claim> = serde_json::from_slice(bytes).ok()?;
    let fits = list.kind.ends_with("List")
        && list
            .items
            .iter()
            .all(|c| c.kind == "ResourceClaim" && c.api_version == API_VERSION);
    fits.then(|| list.items.into_iter().filter_map(Claim::into_api).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice_list() -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "List", "items": [{
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "n-gpu", "uid": "x", "labels": {"a": "b"}},
            "spec": {
                "driver": "gpu.nvidia.com", "nodeName": "n",
                "pool": {"name": "n", "generation": 2, "resourceSliceCount": 1},
                "sharedCounters": [{"name": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}],
                "devices": [{
                    "name": "gpu-0-mig-1g10gb-0",
                    "attributes": {
                        "type": {"string": "mig"}, "profile": {"string": "1g.10gb"},
                        "parentMinor": {"int": 0}, "driverVersion": {"version": "580.0.0"},
                        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"}
                    },
                    "capacity": {"memory": {"value": "10Gi"}},
                    "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}]
                }]
            }
        }]})
    }

    #[test]
    fn a_slice_list_keeps_what_the_view_reads_and_nothing_else() {
        let bytes = serde_json::to_vec(&slice_list()).unwrap();
        let fast = slices(&bytes).expect("the fast path takes a v1 slice list");
        let full: api::ResourceSlice =
            serde_json::from_value(slice_list()["items"][0].clone()).unwrap();
        let device = &fast[0].spec.devices.as_ref().unwrap()[0];
        let want = &full.spec.devices.as_ref().unwrap()[0];
        assert_eq!(device.consumes_counters, want.consumes_counters);
        let kept: Vec<&String> = device.attributes.as_ref().unwrap().keys().collect();
        assert_eq!(kept, ["parentMinor", "profile", "type"]);
        assert_eq!(fast[0].spec.shared_counters, full.spec.shared_counters);
        assert_eq!(fast[0].spec.pool, full.spec.pool);
        assert_eq!(fast[0].metadata.name, full.metadata.name);
    }

    #[test]
    fn other_forms_are_left_to_the_general_path() {
        let mut older = slice_list();
        older["items"][0]["apiVersion"] = json!("resource.k8s.io/v1beta1");
        let single = slice_list()["items"][0].clone();
        for value in [older, single] {
            assert!(slices(&serde_json::to_vec(&value).unwrap()).is_none());
        }
        assert!(slices(b"kind: List\nitems: []\n").is_none());
    }

    #[test]
    fn only_allocated_claims_are_kept_with_results_and_reserved_pods() {
        let list = json!({"kind": "List", "items": [
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "a", "namespace": "t"}, "spec": {"devices": {"requests": []}},
             "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0",
                 "shareID": "s1", "consumedCapacity": {"memory": "10Gi"}}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}},
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "b", "namespace": "t"}, "spec": {}}
        ]});
        let claims = allocated_claims(&serde_json::to_vec(&list).unwrap()).unwrap();
        assert_eq!(claims.len(), 1);
        let status = claims[0].status.as_ref().unwrap();
        let result = &status
            .allocation
            .as_ref()
            .unwrap()
            .devices
            .as_ref()
            .unwrap()
            .results
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            (result.device.as_str(), result.share_id.as_deref()),
            ("gpu-0", Some("s1"))
        );
        assert_eq!(
            result.consumed_capacity.as_ref().unwrap()["memory"],
            Quantity("10Gi".into())
        );
        assert_eq!(status.reserved_for.as_ref().unwrap()[0].name, "p");
    }
}
