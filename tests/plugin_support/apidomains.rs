//! The parts of the fake API server the compute-domain plugin talks to: the Node's labels
//! (GET, and a JSON merge PATCH as `kubectl label` and kube's `Patch::Merge` send it),
//! `ComputeDomainNode` objects (get by name, list by label selector) and `ComputeDomain`s
//! (list across namespaces), stored as the test puts them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::apiserver::{FakeApiServer, NODE_UID, Recorded, status};

const GROUP_VERSION: &str = "resource.nvidia.com/v1beta1";

#[derive(Default)]
pub(super) struct Domains {
    /// The Node's labels.
    labels: BTreeMap<String, String>,
    /// `ComputeDomainNode`s by (namespace, name).
    nodes: BTreeMap<(String, String), Value>,
    /// `ComputeDomain`s by (namespace, name).
    domains: BTreeMap<(String, String), Value>,
    version: u64,
}

impl Domains {
    /// The answer to `r` if it is one of these requests; `node` is the Node's name.
    pub(super) fn route(&mut self, r: &Recorded, node: &str) -> Option<(u16, Value)> {
        let segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
        match (r.method.as_str(), segments.as_slice()) {
            ("GET", ["api", "v1", "nodes", name]) if *name == node => Some((200, self.node(node))),
            ("PATCH", ["api", "v1", "nodes", name]) if *name == node => {
                let patch = r.body.clone().unwrap_or_default();
                for (key, value) in patch["metadata"]["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                {
                    match value.as_str() {
                        Some(v) => self.labels.insert(key.clone(), v.to_string()),
                        None => self.labels.remove(key),
                    };
                }
                self.version += 1;
                Some((200, self.node(node)))
            }
            (
                "GET",
                [
                    "apis",
                    "resource.nvidia.com",
                    "v1beta1",
                    "namespaces",
                    ns,
                    "computedomainnodes",
                    name,
                ],
            ) => Some(match self.nodes.get(&(ns.to_string(), name.to_string())) {
                Some(object) => (200, object.clone()),
                None => {
                    let message =
                        format!("computedomainnodes.resource.nvidia.com \"{name}\" not found");
                    let (code, mut body) = status(404, "NotFound", &message);
                    body["details"] = json!({"name": name, "group": "resource.nvidia.com",
                                                 "kind": "computedomainnodes"});
                    (code, body)
                }
            }),
            (
                "GET",
                [
                    "apis",
                    "resource.nvidia.com",
                    "v1beta1",
                    "namespaces",
                    ns,
                    "computedomainnodes",
                ],
            ) => {
                let selector = r.query.get("labelSelector").cloned().unwrap_or_default();
                let items: Vec<&Value> = self
                    .nodes
                    .iter()
                    .filter(|((n, _), _)| n == ns)
                    .map(|(_, o)| o)
                    .filter(|o| {
                        selector.split(',').filter(|t| !t.is_empty()).all(|term| {
                            let (k, v) = term.split_once('=').unwrap_or((term, ""));
                            o["metadata"]["labels"][k] == json!(v)
                        })
                    })
                    .collect();
                Some((200, self.list("ComputeDomainNodeList", items)))
            }
            ("GET", ["apis", "resource.nvidia.com", "v1beta1", "computedomains"]) => {
                let items: Vec<&Value> = self.domains.values().collect();
                Some((200, self.list("ComputeDomainList", items)))
            }
            _ => None,
        }
    }

    /// `object` as the server stores it (kind, apiVersion, a new resourceVersion), with its
    /// (namespace, name).
    fn stamped(&mut self, mut object: Value, kind: &str) -> ((String, String), Value) {
        self.version += 1;
        object["apiVersion"] = json!(GROUP_VERSION);
        object["kind"] = json!(kind);
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        let meta = &object["metadata"];
        let key = (
            meta["namespace"].as_str().unwrap_or_default().to_string(),
            meta["name"].as_str().unwrap_or_default().to_string(),
        );
        (key, object)
    }

    fn node(&self, node: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": node, "uid": NODE_UID, "labels": self.labels,
                            "resourceVersion": (1 + self.version).to_string()}})
    }

    fn list(&self, kind: &str, items: Vec<&Value>) -> Value {
        json!({"apiVersion": GROUP_VERSION, "kind": kind,
               "metadata": {"resourceVersion": (1 + self.version).to_string()}, "items": items})
    }
}

impl FakeApiServer {
    /// The Node's labels now.
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        self.lock().domains.labels.clone()
    }

    /// Sets (or, with `None`, removes) a label on the Node, as another writer would.
    pub fn set_node_label(&self, key: &str, value: Option<&str>) {
        let mut store = self.lock();
        match value {
            Some(v) => store.domains.labels.insert(key.into(), v.into()),
            None => store.domains.labels.remove(key),
        };
    }

    /// Stores (or replaces) a `ComputeDomainNode`, as an IMEX daemon writes it.
    pub fn put_domain_node(&self, object: Value) {
        let mut store = self.lock();
        let (key, object) = store.domains.stamped(object, "ComputeDomainNode");
        store.domains.nodes.insert(key, object);
    }

    /// Stores (or replaces) a `ComputeDomain`.
    pub fn put_compute_domain(&self, object: Value) {
        let mut store = self.lock();
        let (key, object) = store.domains.stamped(object, "ComputeDomain");
        store.domains.domains.insert(key, object);
    }
}
