//! The parts of the fake API server `gpu-dra doctor` reads besides slices and claims: API
//! discovery (`GET /apis`), cluster-scoped objects the test stores by collection path
//! (DeviceClasses, ValidatingAdmissionPolicies and their bindings), and
//! SelfSubjectAccessReviews answered from a deny list (everything else is allowed).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::apiserver::Recorded;

pub const DEVICE_CLASSES: &str = "/apis/resource.k8s.io/v1/deviceclasses";
pub const POLICIES: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
pub const POLICY_BINDINGS: &str =
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";
const REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

#[derive(Default)]
pub(super) struct Catalog {
    /// Collection path → name → object.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// `(resource[/subresource], verb)` pairs a review denies.
    denied: Vec<(String, String)>,
}

impl Catalog {
    pub(super) fn put(&mut self, collection: &str, object: Value) {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.objects
            .entry(collection.to_string())
            .or_default()
            .insert(name, object);
    }

    pub(super) fn remove(&mut self, collection: &str, name: &str) -> bool {
        self.objects
            .get_mut(collection)
            .is_some_and(|objects| objects.remove(name).is_some())
    }

    pub(super) fn deny(&mut self, resource: &str, verb: &str) {
        self.denied.push((resource.to_string(), verb.to_string()));
    }

    /// The answer to `r` if it is one of this catalog's requests.
    pub(super) fn route(&self, r: &Recorded) -> Option<(u16, Value)> {
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/apis") => Some((200, api_groups())),
            ("POST", REVIEWS) => Some((201, self.review(r.body.clone().unwrap_or_default()))),
            ("GET", path) if [DEVICE_CLASSES, POLICIES, POLICY_BINDINGS].contains(&path) => {
                let (group_version, kind) = match path {
                    DEVICE_CLASSES => ("resource.k8s.io/v1", "DeviceClassList"),
                    POLICIES => (
                        "admissionregistration.k8s.io/v1",
                        "ValidatingAdmissionPolicyList",
                    ),
                    _ => (
                        "admissionregistration.k8s.io/v1",
                        "ValidatingAdmissionPolicyBindingList",
                    ),
                };
                let items: Vec<&Value> = self
                    .objects
                    .get(path)
                    .into_iter()
                    .flat_map(|o| o.values())
                    .collect();
                Some((
                    200,
                    json!({"apiVersion": group_version, "kind": kind,
                           "metadata": {"resourceVersion": "1"}, "items": items}),
                ))
            }
            _ => None,
        }
    }

    fn review(&self, mut review: Value) -> Value {
        let attributes = &review["spec"]["resourceAttributes"];
        let resource = match attributes["subresource"].as_str() {
            Some(sub) if !sub.is_empty() => {
                format!(
                    "{}/{sub}",
                    attributes["resource"].as_str().unwrap_or_default()
                )
            }
            _ => attributes["resource"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
        let verb = attributes["verb"].as_str().unwrap_or_default().to_string();
        let denied = self.denied.contains(&(resource, verb));
        review["status"] = if denied {
            json!({"allowed": false, "reason": "no RBAC policy matched"})
        } else {
            json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"gpu-dra\""})
        };
        review
    }
}

/// `GET /apis` of a Kubernetes 1.37 server: `resource.k8s.io` serves v1 (and betas).
fn api_groups() -> Value {
    let group = |name: &str, versions: &[&str]| {
        let versions: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
            .collect();
        let preferred = versions[0].clone();
        json!({"name": name, "versions": versions, "preferredVersion": preferred})
    };
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        group("apps", &["v1"]),
        group("admissionregistration.k8s.io", &["v1"]),
        group("authorization.k8s.io", &["v1"]),
        group("resource.k8s.io", &["v1", "v1beta2", "v1beta1"]),
    ]})
}
