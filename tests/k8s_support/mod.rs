//! A fake Kubernetes API server at the HTTP layer, for the `k8s_*` tests: a `tower-test` mock
//! service behind a real `kube::Client`, recording every request for the tests to compare and
//! answering from the store the TCP fake of `tests/cd_support` uses too
//! (`tests/api_support/objstore.rs`: resourceVersion, uid, conflicts, the status subresource,
//! UID preconditions, Status errors), with field and label selectors on lists, injected
//! faults, and fields dropped on write as by a feature gate that is off.
#![allow(dead_code)] // each test file uses a different part

pub mod fixtures;
// Each support module stands alone, so a test takes only what it uses; one that takes two
// compiles the store twice, as two unrelated types it never mixes.
#[allow(clippy::duplicate_mod)]
#[path = "../api_support/objstore.rs"]
mod objstore;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

pub use objstore::status;
use objstore::{ObjectStore, Target, fields_match, parse, query_pairs};

pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Option<Value>,
}

impl Recorded {
    /// `METHOD path` — enough to compare request sequences.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// What the next matching request gets instead of a normal answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// An error Status with this code, reason and message.
    Status(u16, &'static str, String),
    /// The connection fails (API server down).
    Disconnect,
    /// This code and body, whatever was asked (a misbehaving server or proxy).
    Json(u16, Value),
}

/// A fault: the first request with `method` about object `name` gets `answer`. A request is
/// about the name in its body (POST) or the last segment of its path (`resourceslices` for a
/// list).
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: &'static str,
    pub name: String,
    pub answer: Answer,
}

impl Fault {
    pub fn new(method: &'static str, name: &str, answer: Answer) -> Fault {
        Fault {
            method,
            name: name.to_string(),
            answer,
        }
    }
}

struct State {
    store: ObjectStore,
    /// Documents at paths that are no object (`/version`, `/apis`), answered to a GET as
    /// they are.
    documents: BTreeMap<String, Value>,
    faults: VecDeque<Fault>,
    requests: Vec<Recorded>,
    /// Keys removed (at any depth) from every object written, as a kube-apiserver with a
    /// feature gate off drops that feature's fields.
    dropped_on_write: Vec<String>,
}

/// Resources with a status subresource among those the plugin's clients write.
const WITH_STATUS: &[&str] = &["resourceclaims", "nodes"];

/// The field manager the store stamps on every write (`managedFields`).
const MANAGER: &str = "gpu-dra";

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A server holding `objects` (keyed by their API path) and a client talking to it.
    pub fn start(objects: Vec<(String, Value)>) -> (FakeApi, Client) {
        let mut store = ObjectStore::new(WITH_STATUS);
        store.managed_by = Some(MANAGER.to_string());
        let fake = FakeApi {
            state: Arc::new(Mutex::new(State {
                store,
                documents: BTreeMap::new(),
                faults: VecDeque::new(),
                requests: Vec::new(),
                dropped_on_write: Vec::new(),
            })),
        };
        for (path, object) in objects {
            fake.insert(&path, object);
        }
        let client = fake.client();
        (fake, client)
    }

    /// Another client of the same server (a restarted plugin).
    pub fn client(&self) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = self.clone();
        tokio::spawn(async move {
            while let Some((request, reply)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.expect("request body");
                let recorded = Recorded {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_string(),
                    query: parts.uri.query().map(query_pairs).unwrap_or_default(),
                    body: serde_json::from_slice(&bytes).ok(),
                };
                match server.serve(recorded) {
                    Some((code, value)) => reply.send_response(
                        Response::builder()
                            .status(code)
                            .header("content-type", "application/json")
                            .body(Body::from(serde_json::to_vec(&value).expect("json")))
                            .expect("response"),
                    ),
                    None => reply.send_error("connection refused (fake API server down)"),
                }
            }
        });
        Client::new(service, "default")
    }

    /// Stores an object as the server would have (its uid kept or one assigned, a
    /// resourceVersion); at a path that names no object (`/version`, `/apis`), a document
    /// served as it is.
    pub fn insert(&self, path: &str, object: Value) {
        let mut state = self.state.lock().expect("state");
        match parse(path).filter(|t| t.name.is_some()) {
            Some(target) => {
                state.store.seed(&target, object);
            }
            None => {
                state.documents.insert(path.to_string(), object);
            }
        }
    }

    /// From now on, drops `keys` (at any depth) from every object written, as kube-apiserver
    /// does with the fields of a feature whose gate is off (`allowMultipleAllocations`
    /// without `DRAConsumableCapacity`, counters without `DRAPartitionableDevices`).
    pub fn drop_fields_on_write(&self, keys: &[&str]) {
        self.state.lock().expect("state").dropped_on_write =
            keys.iter().map(|k| k.to_string()).collect();
    }

    pub fn fail(&self, fault: Fault) {
        self.state.lock().expect("state").faults.push_back(fault);
    }

    /// The requests received since the last call.
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.state.lock().expect("state").requests)
    }

    /// The stored ResourceSlices by name.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        let (prefix, resource) = slices_collection();
        self.state
            .lock()
            .expect("state")
            .store
            .by_name(&prefix, &resource)
    }

    /// The stored object at `path`, if any.
    pub fn object(&self, path: &str) -> Option<Value> {
        let key = object_target(path).key();
        self.state.lock().expect("state").store.get(&key).cloned()
    }

    /// Deletes every stored ResourceSlice, as the kubelet does when it starts.
    pub fn remove_slices(&self) {
        let (prefix, resource) = slices_collection();
        self.state
            .lock()
            .expect("state")
            .store
            .remove_all(&prefix, &resource);
    }

    fn serve(&self, request: Recorded) -> Option<(u16, Value)> {
        let mut state = self.state.lock().expect("state");
        state.requests.push(request.clone());
        let name = match request.method.as_str() {
            "POST" => request
                .body
                .as_ref()
                .and_then(|b| b["metadata"]["name"].as_str())
                .unwrap_or_default(),
            _ => request.path.rsplit('/').next().unwrap_or_default(),
        }
        .to_string();
        let fault = state
            .faults
            .iter()
            .position(|f| f.method == request.method && f.name == name);
        if let Some(i) = fault.and_then(|i| state.faults.remove(i)) {
            return match i.answer {
                Answer::Status(code, reason, message) => Some(status(code, reason, &message)),
                Answer::Disconnect => None,
                Answer::Json(code, body) => Some((code, body)),
            };
        }
        Some(state.answer(&request))
    }
}

/// The target of a path that names one object; panics otherwise (a test's own mistake).
fn object_target(path: &str) -> Target {
    match parse(path) {
        Some(t) if t.name.is_some() => t,
        _ => panic!("{path} names no object"),
    }
}

/// `(prefix, resource)` of the ResourceSlices.
fn slices_collection() -> (String, String) {
    let t = parse(SLICES).expect("the slices' path");
    (t.prefix, t.resource)
}

/// Removes every key of `keys` from `value`, at any depth.
fn drop_keys(value: &mut Value, keys: &[String]) {
    match value {
        Value::Object(map) => {
            map.retain(|k, _| !keys.contains(k));
            map.values_mut().for_each(|v| drop_keys(v, keys));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| drop_keys(v, keys)),
        _ => {}
    }
}

impl State {
    fn answer(&mut self, r: &Recorded) -> (u16, Value) {
        if let Some(document) = self.documents.get(&r.path).filter(|_| r.method == "GET") {
            return (200, document.clone());
        }
        let Some(target) = parse(&r.path) else {
            return status(
                404,
                "NotFound",
                &format!("the server could not find {}", r.path),
            );
        };
        let mut body = r.body.clone().unwrap_or_default();
        match (r.method.as_str(), &target.name) {
            ("GET", Some(name)) => match self.store.get(&target.key()) {
                Some(o) => (200, o.clone()),
                None => status(404, "NotFound", &format!("\"{name}\" not found")),
            },
            ("GET", None) => {
                let labels = r.query.get("labelSelector").map_or("", String::as_str);
                let fields = r.query.get("fieldSelector").map_or("", String::as_str);
                let namespace = target.namespace.as_deref();
                let items: Vec<Value> = self
                    .store
                    .list(&target.prefix, &target.resource, namespace, labels)
                    .into_iter()
                    .filter(|o| fields_match(fields, o))
                    .collect();
                let version = self.store.version.to_string();
                let list = json!({"apiVersion": "v1", "kind": "List",
                                  "metadata": {"resourceVersion": version}, "items": items});
                (200, list)
            }
            ("POST", None) => {
                drop_keys(&mut body, &self.dropped_on_write);
                self.store.create(&target, body)
            }
            ("PUT", Some(_)) => {
                drop_keys(&mut body, &self.dropped_on_write);
                self.store.update(&target, &body, None)
            }
            ("DELETE", Some(_)) => {
                let uid = body["preconditions"]["uid"].as_str();
                self.store.delete(&target.key(), uid, false)
            }
            _ => status(405, "MethodNotAllowed", "unsupported"),
        }
    }
}
