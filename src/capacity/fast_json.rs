//! The fast path for large JSON inputs (`kubectl get resourceslices -o json`): a `List` of
//! `resource.k8s.io/v1` ResourceSlices or ResourceClaims is read straight from the bytes into
//! the model's [records](super::records), strings borrowed from the bytes. Every field the view
//! does not read is skipped unparsed, which is what makes it fast: a slice's device carries a
//! dozen attributes and a capacity map the view never looks at.
//!
//! The API server's own typed lists (`ResourceSliceList` of `resource.k8s.io/v1`, whose items
//! carry no `apiVersion` or `kind`), as `gpu-dra capacity --kubeconfig` receives them, take
//! the same path.
//!
//! Anything else (YAML, a single object, another kind or version, a field of the wrong
//! shape) answers `None`, and the caller takes the general path, which reads every form and
//! gives the detailed errors.

use serde::Deserialize;

use super::json_list;
use super::records::{
    ClaimRecord, ConsumerRecord, ResultRecord, SliceRecord, SliceSpecRecord, consumer_name,
};

const API_VERSION: &str = "resource.k8s.io/v1";

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, default)]
    name: Option<&'a str>,
    #[serde(borrow, default)]
    namespace: Option<&'a str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice<'a> {
    #[serde(borrow, default)]
    api_version: Option<&'a str>,
    #[serde(borrow, default)]
    kind: Option<&'a str>,
    #[serde(borrow)]
    metadata: Meta<'a>,
    #[serde(borrow)]
    spec: SliceSpecRecord<'a>,
}

impl<'a> Slice<'a> {
    fn into_record(self) -> SliceRecord<'a> {
        SliceRecord {
            name: self.metadata.name.unwrap_or_default(),
            spec: self.spec,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Claim<'a> {
    #[serde(borrow, default)]
    api_version: Option<&'a str>,
    #[serde(borrow, default)]
    kind: Option<&'a str>,
    #[serde(borrow)]
    metadata: Meta<'a>,
    #[serde(borrow, default)]
    status: Option<ClaimStatus<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimStatus<'a> {
    #[serde(borrow, default)]
    allocation: Option<Allocation<'a>>,
    #[serde(borrow, default)]
    reserved_for: Option<Vec<ConsumerRecord<'a>>>,
}

#[derive(Deserialize)]
struct Allocation<'a> {
    #[serde(borrow, default)]
    devices: Option<AllocatedDevices<'a>>,
}

#[derive(Deserialize)]
struct AllocatedDevices<'a> {
    #[serde(borrow, default)]
    results: Option<Vec<ResultRecord<'a>>>,
}

impl<'a> Claim<'a> {
    /// The claim as the model reads it; `None` when it is not allocated.
    fn into_record(self) -> Option<ClaimRecord<'a>> {
        let status = self.status?;
        let allocation = status.allocation?;
        Some(ClaimRecord {
            namespace: self.metadata.namespace.unwrap_or_default(),
            name: self.metadata.name.unwrap_or_default(),
            pods: status
                .reserved_for
                .into_iter()
                .flatten()
                .map(|r| consumer_name(r.api_group, r.resource, r.name))
                .collect(),
            results: allocation
                .devices
                .and_then(|d| d.results)
                .unwrap_or_default(),
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

/// Whether a list's items are `kind` objects of `resource.k8s.io/v1`: each says so itself
/// (`kubectl get -o json` writes a `List` of whole objects), or the list is the API server's
/// typed `<kind>List` of that version, whose items carry neither field.
fn all_of_kind<'a>(
    head: json_list::Head,
    kind: &str,
    mut items: impl Iterator<Item = (Option<&'a str>, Option<&'a str>)>,
) -> bool {
    let Some(list_kind) = head.kind.filter(|k| k.ends_with("List")) else {
        return false;
    };
    let typed =
        list_kind.strip_suffix("List") == Some(kind) && head.api_version == Some(API_VERSION);
    items.all(|item| match item {
        (Some(api_version), Some(item_kind)) => api_version == API_VERSION && item_kind == kind,
        (None, None) => typed,
        _ => false,
    })
}

/// The ResourceSlices of a JSON list of `resource.k8s.io/v1` ResourceSlices; `None` for
/// anything else (the general path decides).
pub(super) fn slices(bytes: &[u8]) -> Option<Vec<SliceRecord<'_>>> {
    if !json_object(bytes) {
        return None;
    }
    let (head, items) = json_list::parse::<Slice>(bytes)?;
    let fits = !items.is_empty()
        && all_of_kind(
            head,
            "ResourceSlice",
            items.iter().map(|s| (s.api_version, s.kind)),
        );
    fits.then(|| items.into_iter().map(Slice::into_record).collect())
}

/// One item of a ResourceSlice list, as the model's record; `None` when it does not take this
/// path (a field of the wrong shape, an escape in a string). Its kind is not checked: the
/// caller knows what the list holds.
pub(super) fn slice(item: &[u8]) -> Option<SliceRecord<'_>> {
    serde_json::from_slice::<Slice>(item)
        .ok()
        .map(Slice::into_record)
}

/// The allocated ResourceClaims of a JSON list of `resource.k8s.io/v1` ResourceClaims;
/// `None` for anything else.
pub(super) fn allocated_claims(bytes: &[u8]) -> Option<Vec<ClaimRecord<'_>>> {
    if !json_object(bytes) {
        return None;
    }
    let (head, items) = json_list::parse::<Claim>(bytes)?;
    let fits = all_of_kind(
        head,
        "ResourceClaim",
        items.iter().map(|c| (c.api_version, c.kind)),
    );
    fits.then(|| items.into_iter().filter_map(Claim::into_record).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::records::Attr;
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
                        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
                        "gpu.nvidia.com/uuid": {"string": "MIG-1"}
                    },
                    "capacity": {"memory": {"value": "10Gi"}},
                    "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}]
                }]
            }
        }]})
    }

    #[test]
    fn a_slice_list_keeps_what_the_view_reads_borrowed_and_nothing_else() {
        let bytes = serde_json::to_vec(&slice_list()).unwrap();
        let slices = slices(&bytes).expect("the fast path takes a v1 slice list");
        let slice = &slices[0];
        assert_eq!(slice.name, "n-gpu");
        assert_eq!((slice.spec.pool.name, slice.spec.pool.generation), ("n", 2));
        let device = &slice.spec.devices.as_ref().unwrap()[0];
        assert_eq!(device.name, "gpu-0-mig-1g10gb-0");
        let kept: Vec<(Attr, Option<&str>)> = device
            .attributes
            .0
            .iter()
            .map(|e| (e.attr, e.domain))
            .collect();
        assert_eq!(
            kept,
            [
                (Attr::Uuid, Some("gpu.nvidia.com")),
                (Attr::ParentMinor, None),
                (Attr::Profile, None),
                (Attr::Type, None)
            ]
        );
        let driver = "gpu.nvidia.com";
        assert_eq!(
            device.attribute(driver, Attr::ParentMinor).unwrap().int,
            Some(0)
        );
        assert_eq!(
            device.attribute(driver, Attr::Uuid).unwrap().string,
            Some("MIG-1")
        );
        assert!(device.attribute("other.com", Attr::Uuid).is_none());
        let consumed = &device.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(consumed.counter_set, "gpu-0");
        assert_eq!(consumed.counters.0[0].0, "memory-slice-0");
        assert_eq!(consumed.counters.0[0].1.value, "1");
        let set = &slice.spec.shared_counters.as_ref().unwrap()[0];
        assert_eq!((set.name, set.counters.0.len()), ("gpu-0", 1));
    }

    #[test]
    fn a_string_with_escapes_sends_the_file_to_the_general_path() {
        // Strings are borrowed from the bytes, which an escape makes impossible; Go's encoder
        // (kubectl) escapes `<`, `>` and `&`, none of which a name or counter holds.
        let text = serde_json::to_string(&slice_list())
            .unwrap()
            .replace("gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-\\u0030");
        assert!(slices(text.as_bytes()).is_none());
    }

    #[test]
    fn other_forms_are_left_to_the_general_path() {
        let mut older = slice_list();
        older["items"][0]["apiVersion"] = json!("resource.k8s.io/v1beta1");
        let single = slice_list()["items"][0].clone();
        let mut wrong_shape = slice_list();
        wrong_shape["items"][0]["spec"]["devices"][0]["consumesCounters"] = json!("lots");
        for value in [older, single, wrong_shape] {
            assert!(slices(&serde_json::to_vec(&value).unwrap()).is_none());
        }
        assert!(slices(b"kind: List\nitems: []\n").is_none());
    }

    #[test]
    fn a_slice_list_splits_for_two_cores_between_two_slices_not_two_devices() {
        let mut items = Vec::new();
        for n in 0..4 {
            let node = format!("node-{n}");
            for slice in
                crate::explain_inputs::sim_slices("dgx-h100", "gpu.nvidia.com", Default::default())
                    .unwrap()
            {
                let mut value = serde_json::to_value(slice).unwrap();
                value["apiVersion"] = json!(API_VERSION);
                value["kind"] = json!("ResourceSlice");
                value["spec"]["pool"]["name"] = json!(node);
                items.push(value);
            }
        }
        let text = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
        let bytes = text.as_bytes();
        // From inside a devices array, where `},{` separates devices first.
        let from = text.len() / 2 + text[text.len() / 2..].find(r#""devices":[{"#).unwrap() + 12;
        let comma = json_list::split_point::<Slice>(bytes, from).unwrap();
        assert!(
            text[from..comma].contains("},{"),
            "no device boundary was passed over"
        );
        assert!(
            text[comma + 1..]
                .starts_with(r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice""#),
            "{}",
            &text[comma..comma + 80]
        );
        let halves = json_list::parse_split::<Slice>(bytes, Some(comma)).unwrap();
        let whole = json_list::parse_split::<Slice>(bytes, None).unwrap();
        let names = |items: &[Slice]| -> Vec<String> {
            items
                .iter()
                .map(|s| format!("{}/{:?}", s.spec.pool.name, s.metadata.name))
                .collect()
        };
        assert_eq!(names(&halves.1), names(&whole.1));
        assert_eq!(halves.1.len(), 20);
    }

    #[test]
    fn the_api_servers_typed_list_is_taken_though_its_items_carry_no_kind() {
        let mut typed = slice_list();
        typed["kind"] = json!("ResourceSliceList");
        typed["apiVersion"] = json!("resource.k8s.io/v1");
        let item = typed["items"][0].as_object_mut().unwrap();
        item.remove("kind");
        item.remove("apiVersion");
        let bytes = serde_json::to_vec(&typed).unwrap();
        assert_eq!(slices(&bytes).unwrap()[0].name, "n-gpu");
        // Without the typed list's header, items without a kind are not known to be v1.
        for (kind, version) in [
            ("List", "v1"),
            ("ResourceSliceList", "resource.k8s.io/v1beta2"),
        ] {
            let mut other = typed.clone();
            other["kind"] = json!(kind);
            other["apiVersion"] = json!(version);
            assert!(slices(&serde_json::to_vec(&other).unwrap()).is_none());
        }
    }

    #[test]
    fn the_api_servers_claim_list_is_taken_though_its_items_carry_no_kind() {
        // GET /apis/resource.k8s.io/v1/resourceclaims, as the API server answers it.
        let typed = json!({"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1",
            "metadata": {"resourceVersion": "42"},
            "items": [{"metadata": {"name": "a", "namespace": "t", "uid": "u1"},
                       "spec": {"devices": {"requests": []}},
                       "status": {"allocation": {"devices": {"results": [
                           {"request": "r", "driver": "gpu.nvidia.com", "pool": "n",
                            "device": "gpu-0"}]}},
                                  "reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}]}}]});
        let bytes = serde_json::to_vec(&typed).unwrap();
        let claims = allocated_claims(&bytes).unwrap();
        assert_eq!(
            (claims[0].name, claims[0].results[0].device),
            ("a", "gpu-0")
        );
        assert_eq!(claims[0].pods, ["p"]);
    }

    #[test]
    fn only_allocated_claims_are_kept_with_results_and_reserved_pods() {
        let list = json!({"kind": "List", "items": [
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "a", "namespace": "t"}, "spec": {"devices": {"requests": []}},
             "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0",
                 "shareID": "s1", "consumedCapacity": {"memory": "10Gi"}}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"},
                                {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "v"}]}},
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "b", "namespace": "t"}, "spec": {}}
        ]});
        let bytes = serde_json::to_vec(&list).unwrap();
        let claims = allocated_claims(&bytes).unwrap();
        assert_eq!(claims.len(), 1);
        let claim = &claims[0];
        assert_eq!((claim.namespace, claim.name), ("t", "a"));
        assert_eq!(claim.pods, ["p", "jobs/j"]);
        let result = &claim.results[0];
        assert_eq!((result.device, result.share_id), ("gpu-0", Some("s1")));
        assert_eq!(result.consumed_capacity.0[0].0, "memory");
        assert_eq!(result.consumed_capacity.0[0].1, "10Gi");
    }
}
