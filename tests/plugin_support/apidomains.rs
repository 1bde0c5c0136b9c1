//! The parts of the fake API server the compute-domain plugin talks to: the Node's labels
//! (GET, and a JSON merge PATCH as `kubectl label` and kube's `Patch::Merge` send it).
//! `ComputeDomainNode`s and `ComputeDomain`s live in the custom-object store (`apicrd.rs`);
//! [`FakeApiServer::put_domain_node`] and [`FakeApiServer::put_compute_domain`] put them there.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::apiserver::{FakeApiServer, NODE_UID, Recorded};

const GROUP_VERSION: &str = "resource.nvidia.com/v1beta1";

#[derive(Default)]
pub(super) struct Domains {
    /// The Node's labels.
    labels: BTreeMap<String, String>,
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
            _ => None,
        }
    }

    fn node(&self, node: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": node, "uid": NODE_UID, "labels": self.labels,
                            "resourceVersion": (1 + self.version).to_string()}})
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

    /// Stores (or replaces) a `ComputeDomainNode`, as an IMEX daemon writes it (in the
    /// custom-object store of `apicrd.rs`, which serves it).
    pub fn put_domain_node(&self, mut object: Value) {
        object["apiVersion"] = json!(GROUP_VERSION);
        object["kind"] = json!("ComputeDomainNode");
        self.put_custom_object("computedomainnodes", object);
    }

    /// Stores (or replaces) a `ComputeDomain` (in the custom-object store).
    pub fn put_compute_domain(&self, mut object: Value) {
        object["apiVersion"] = json!(GROUP_VERSION);
        object["kind"] = json!("ComputeDomain");
        self.put_custom_object("computedomains", object);
    }
}
