//! A fake Kubernetes API server at the HTTP layer, for the `k8s_*` tests: a `tower-test` mock
//! service behind a real `kube::Client`, answering from an in-memory store the way the API
//! server does (resourceVersion, uid, conflicts, field selectors, Status errors) and recording
//! every request for the tests to compare.
#![allow(dead_code)] // each test file uses a different part

pub mod fixtures;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

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

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    next_version: u64,
    faults: VecDeque<Fault>,
    requests: Vec<Recorded>,
    /// Keys removed (at any depth) from every object written, as a kube-apiserver with a
    /// feature gate off drops that feature's fields.
    dropped_on_write: Vec<String>,
}

/// The fake server; dropping the client ends it.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A server holding `objects` (keyed by their API path) and a client talking to it.
    pub fn start(objects: Vec<(String, Value)>) -> (FakeApi, Client) {
        let fake = FakeApi {
            state: Arc::new(Mutex::new(State {
                next_version: 100,
                ..Default::default()
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
                    query: parts
                        .uri
                        .query()
                        .map(|q| {
                            url_decode_pairs(q)
                                .into_iter()
                                .filter(|(k, _)| !k.is_empty())
                                .collect()
                        })
                        .unwrap_or_default(),
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

    /// Stores an object as the server would have (uid, resourceVersion).
    pub fn insert(&self, path: &str, mut object: Value) {
        let mut state = self.state.lock().expect("state");
        state.next_version += 1;
        let meta = &mut object["metadata"];
        if meta.get("uid").is_none() {
            meta["uid"] = json!(format!("uid-{}", state.next_version));
        }
        meta["resourceVersion"] = json!(state.next_version.to_string());
        state.objects.insert(path.to_string(), object);
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
        let state = self.state.lock().expect("state");
        state
            .objects
            .iter()
            .filter_map(|(path, o)| Some((path.strip_prefix(SLICES)?.strip_prefix('/')?, o)))
            .map(|(name, o)| (name.to_string(), o.clone()))
            .collect()
    }

    /// The stored object at `path`, if any.
    pub fn object(&self, path: &str) -> Option<Value> {
        self.state.lock().expect("state").objects.get(path).cloned()
    }

    /// Deletes every stored ResourceSlice, as the kubelet does when it starts.
    pub fn remove_slices(&self) {
        let mut state = self.state.lock().expect("state");
        state
            .objects
            .retain(|path, _| !path.starts_with(&format!("{SLICES}/")));
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
        let path = r.path.as_str();
        match r.method.as_str() {
            "GET" if path == SLICES => (200, self.list(r)),
            "GET" => match self.objects.get(path) {
                Some(o) => (200, o.clone()),
                None => match self.collection(path) {
                    Some(list) => (200, list),
                    None => not_found(path),
                },
            },
            "POST" => {
                let mut object = r.body.clone().unwrap_or_default();
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                let key = format!("{path}/{name}");
                if self.objects.contains_key(&key) {
                    return status(409, "AlreadyExists", &format!("{name} already exists"));
                }
                self.next_version += 1;
                object["metadata"]["uid"] = json!(format!("uid-{}", self.next_version));
                drop_keys(&mut object, &self.dropped_on_write);
                self.stamp(&mut object);
                self.objects.insert(key, object.clone());
                (201, object)
            }
            "PUT" if path.ends_with("/status") => self.replace_status(r),
            "PUT" => {
                let Some(current) = self.objects.get(path).cloned() else {
                    return not_found(path);
                };
                let mut object = r.body.clone().unwrap_or_default();
                if object["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return status(409, "Conflict", "the object has been modified");
                }
                object["metadata"]["uid"] = current["metadata"]["uid"].clone();
                drop_keys(&mut object, &self.dropped_on_write);
                self.stamp(&mut object);
                self.objects.insert(path.to_string(), object.clone());
                (200, object)
            }
            "DELETE" => {
                let Some(current) = self.objects.get(path).cloned() else {
                    return not_found(path);
                };
                let wanted_uid = &r.body.as_ref().map(|b| b["preconditions"]["uid"].clone());
                if let Some(Value::String(uid)) = wanted_uid
                    && current["metadata"]["uid"] != json!(uid)
                {
                    return status(409, "Conflict", "Precondition failed: UID mismatch");
                }
                self.objects.remove(path);
                (200, current)
            }
            _ => status(405, "MethodNotAllowed", "unsupported"),
        }
    }

    /// A status subresource `PUT`: guarded by resourceVersion, only `status` taken from the
    /// body (the API server's status strategies keep spec and metadata).
    fn replace_status(&mut self, r: &Recorded) -> (u16, Value) {
        let path = r.path.trim_end_matches("/status");
        let Some(mut current) = self.objects.get(path).cloned() else {
            return not_found(path);
        };
        let body = r.body.clone().unwrap_or_default();
        if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
            return status(409, "Conflict", "the object has been modified");
        }
        current["status"] = body["status"].clone();
        self.stamp(&mut current);
        self.objects.insert(path.to_string(), current.clone());
        (200, current)
    }

    /// A list of stored objects under a collection path: `/apis/g/v/<plural>` lists every
    /// object of that plural, in any namespace (`/apis/g/v/namespaces/*/<plural>/*`).
    fn collection(&self, path: &str) -> Option<Value> {
        let (group_version, plural) = path.rsplit_once('/')?;
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(p, _)| {
                let Some(rest) = p.strip_prefix(group_version) else {
                    return false;
                };
                let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
                matches!(parts.as_slice(), [pl, _] if *pl == plural)
                    || matches!(parts.as_slice(), ["namespaces", _, pl, _] if *pl == plural)
            })
            .map(|(_, o)| o.clone())
            .collect();
        if items.is_empty() {
            return None;
        }
        Some(json!({"apiVersion": "v1", "kind": "List",
                    "metadata": {"resourceVersion": self.next_version.to_string()}, "items": items}))
    }

    /// Server-set metadata, as the API server adds it to every write.
    fn stamp(&mut self, object: &mut Value) {
        self.next_version += 1;
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(self.next_version.to_string());
        meta["creationTimestamp"] = json!("2026-07-01T00:00:00Z");
        meta["managedFields"] = json!([{"manager": "gpu-dra", "operation": "Update"}]);
    }

    fn list(&self, r: &Recorded) -> Value {
        let selector = r.query.get("fieldSelector").cloned().unwrap_or_default();
        let wanted: Vec<(&str, &str)> = selector
            .split(',')
            .filter_map(|term| term.split_once('='))
            .collect();
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(path, _)| path.starts_with(&format!("{SLICES}/")))
            .map(|(_, o)| o.clone())
            .filter(|o| {
                wanted.iter().all(|(field, value)| match *field {
                    "spec.nodeName" => o["spec"]["nodeName"] == json!(value),
                    "spec.driver" => o["spec"]["driver"] == json!(value),
                    _ => false,
                })
            })
            .collect();
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
               "metadata": {"resourceVersion": self.next_version.to_string()}, "items": items})
    }
}

pub fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn not_found(path: &str) -> (u16, Value) {
    let name = path.rsplit('/').next().unwrap_or_default();
    status(404, "NotFound", &format!("\"{name}\" not found"))
}

/// `a=b&c=d%3De` → pairs, percent-decoded.
fn url_decode_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
