//! The fake API server's custom resources of group `resource.nvidia.com` (ComputeDomains,
//! ComputeDomainNodes, …): namespaced objects under
//! `/apis/resource.nvidia.com/<version>/namespaces/<ns>/<plural>[/<name>]`, listed per
//! namespace or cluster-wide (`/apis/resource.nvidia.com/<version>/<plural>`) with an
//! equality `labelSelector`, created (409 `AlreadyExists` for a taken name), replaced
//! (409 `Conflict` on a stale resourceVersion, uid and creationTimestamp kept) and deleted,
//! as kube-apiserver serves a CRD without a status subresource. Each object gets a uid, a
//! resourceVersion from the server's counter and a creationTimestamp one second after the
//! previous creation, so creation order is observable as in a real cluster.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::apiserver::{FakeApiServer, Recorded, status};

/// The API group served here.
pub const GROUP: &str = "resource.nvidia.com";

/// Stored custom objects by (plural, namespace, name).
#[derive(Default)]
pub struct CustomObjects {
    objects: BTreeMap<(String, String, String), Value>,
    created: u64,
}

fn matches_labels(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    selector
        .split(',')
        .filter(|t| !t.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => object["metadata"]["labels"][k.trim_end_matches('=')] == json!(v),
            None => false,
        })
}

impl CustomObjects {
    /// Answers a request for the group, or `None` for any other path.
    pub fn route(&mut self, r: &Recorded, next_version: &mut u64) -> Option<(u16, Value)> {
        let segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
        let answer = match (r.method.as_str(), segments.as_slice()) {
            ("GET", ["apis", GROUP, version, plural]) => {
                self.list(version, plural, None, r, *next_version)
            }
            ("GET", ["apis", GROUP, version, "namespaces", ns, plural]) => {
                self.list(version, plural, Some(ns), r, *next_version)
            }
            ("GET", ["apis", GROUP, _, "namespaces", ns, plural, name]) => {
                match self.objects.get(&key(plural, ns, name)) {
                    Some(o) => (200, o.clone()),
                    None => not_found(plural, name),
                }
            }
            ("POST", ["apis", GROUP, _, "namespaces", ns, plural]) => {
                self.create(plural, ns, r, next_version)
            }
            ("PUT", ["apis", GROUP, _, "namespaces", ns, plural, name]) => {
                self.replace(plural, ns, name, r, next_version)
            }
            ("DELETE", ["apis", GROUP, _, "namespaces", ns, plural, name]) => {
                match self.objects.remove(&key(plural, ns, name)) {
                    Some(o) => (200, o),
                    None => not_found(plural, name),
                }
            }
            _ => return None,
        };
        Some(answer)
    }

    fn list(
        &self,
        version: &str,
        plural: &str,
        ns: Option<&str>,
        r: &Recorded,
        rv: u64,
    ) -> (u16, Value) {
        let selector = r.query.get("labelSelector");
        let items: Vec<&Value> = self
            .objects
            .iter()
            .filter(|((p, n, _), o)| {
                p == plural && ns.is_none_or(|ns| ns == n) && matches_labels(o, selector)
            })
            .map(|(_, o)| o)
            .collect();
        (
            200,
            json!({"apiVersion": format!("{GROUP}/{version}"), "kind": "List",
                   "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
        )
    }

    fn create(&mut self, plural: &str, ns: &str, r: &Recorded, rv: &mut u64) -> (u16, Value) {
        let mut object = r.body.clone().unwrap_or_default();
        let Some(name) = object["metadata"]["name"].as_str().map(str::to_string) else {
            return status(422, "Invalid", "metadata.name: Required value");
        };
        let k = key(plural, ns, &name);
        if self.objects.contains_key(&k) {
            let message = format!("{plural}.{GROUP} \"{name}\" already exists");
            return status(409, "AlreadyExists", &message);
        }
        *rv += 1;
        self.created += 1;
        object["metadata"]["namespace"] = json!(ns);
        object["metadata"]["uid"] = json!(format!("{plural}-uid-{rv}"));
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        object["metadata"]["creationTimestamp"] = json!(timestamp(self.created));
        self.objects.insert(k, object.clone());
        (201, object)
    }

    fn replace(
        &mut self,
        plural: &str,
        ns: &str,
        name: &str,
        r: &Recorded,
        rv: &mut u64,
    ) -> (u16, Value) {
        let k = key(plural, ns, name);
        let Some(current) = self.objects.get(&k) else {
            return not_found(plural, name);
        };
        let mut object = r.body.clone().unwrap_or_default();
        if object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
            let message = format!(
                "Operation cannot be fulfilled on {plural}.{GROUP} \"{name}\": the object has been modified; please apply your changes to the latest version"
            );
            return status(409, "Conflict", &message);
        }
        *rv += 1;
        for field in ["uid", "creationTimestamp", "namespace"] {
            object["metadata"][field] = current["metadata"][field].clone();
        }
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.insert(k, object.clone());
        (200, object)
    }

    /// Stores (or replaces) `object` of `plural` as another writer would: a new
    /// resourceVersion, and a uid and creationTimestamp when it has none.
    pub fn put(&mut self, plural: &str, mut object: Value, rv: &mut u64) {
        let meta = &object["metadata"];
        let k = key(
            plural,
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
        );
        *rv += 1;
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("{plural}-uid-{rv}"));
        }
        if object["metadata"]["creationTimestamp"].is_null() {
            self.created += 1;
            object["metadata"]["creationTimestamp"] = json!(timestamp(self.created));
        }
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.insert(k, object);
    }

    /// Every stored object of `plural`, by namespace and name.
    pub fn all(&self, plural: &str) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((p, _, _), _)| p == plural)
            .map(|(_, o)| o.clone())
            .collect()
    }
}

fn key(plural: &str, ns: &str, name: &str) -> (String, String, String) {
    (plural.to_string(), ns.to_string(), name.to_string())
}

/// `2026-07-01T00:00:00Z` plus `seconds`.
fn timestamp(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, (seconds / 60) % 60, seconds % 60);
    format!("2026-07-01T{h:02}:{m:02}:{s:02}Z")
}

fn not_found(plural: &str, name: &str) -> (u16, Value) {
    let (code, mut body) = status(
        404,
        "NotFound",
        &format!("{plural}.{GROUP} \"{name}\" not found"),
    );
    body["details"] = json!({"name": name, "group": GROUP, "kind": plural});
    (code, body)
}

impl FakeApiServer {
    /// Every stored custom object of `plural` (e.g. `computedomainnodes`).
    pub fn custom_objects(&self, plural: &str) -> Vec<Value> {
        self.lock().crds.all(plural)
    }

    /// Stores (or replaces) a custom object of `plural` behind the clients' backs.
    pub fn put_custom_object(&self, plural: &str, object: Value) {
        let mut store = self.lock();
        let store = &mut *store;
        store.crds.put(plural, object, &mut store.objects.version);
    }
}
