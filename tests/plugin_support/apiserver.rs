//! A fake kube-apiserver on a real TCP port, for a plugin running as a separate process.
//!
//! It speaks HTTP/1.1 (hyper) on 127.0.0.1 — plain, or with [`FakeApiServer::start_tls`] over
//! TLS with client-certificate authentication as kube-apiserver does — and answers with the
//! JSON the API server would:
//! `/version`, the Node (with a UID), `resource.k8s.io/v1` ResourceSlices (list with field
//! selectors, get, create, update guarded by resourceVersion, delete with a UID precondition)
//! and ResourceClaims the test fills (their status subresource takes a `PUT` of
//! `status.devices`, validated as the API server's status strategy does), both kept in the
//! store the other fakes use (`tests/api_support/objstore.rs`), which assigns UIDs and
//! resourceVersions. Errors
//! are `Status` objects. Every request is recorded. Faults (outages, error statuses, hang-ups,
//! slow answers) are injected per request
//! ([`FakeApiServer::inject`], [`FakeApiServer::set_down`]). A GET and a write can be made to
//! take a set time ([`FakeApiServer::set_get_latency`], [`FakeApiServer::set_write_latency`]:
//! a read from the watch cache or etcd, an etcd write), as a real API server's do; the
//! server learns how long its own wake-up takes and sleeps that much less, so answers leave on
//! time in the median ([`FakeApiServer::served_get_latency_p50`] tells).
//!
//! The server runs on its own thread and runtime, so it outlives the test's runtime and works
//! from synchronous benchmarks too; dropping the handle stops it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::apicatalog::Catalog;
use super::apifaults::serve;
pub use super::apifaults::{Fault, Rule};
use super::objstore::{Key, ObjectStore, Target, fields_match};
pub use super::transport::ConnectionStats;
use super::transport::Connections;

pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
pub const NODE_UID: &str = "0b6c5e1e-node-uid";

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Option<Value>,
    /// The `Authorization` header, if the client sent one.
    pub authorization: Option<String>,
    /// When the server received it.
    pub at: Instant,
}

pub(super) struct Store {
    node: String,
    /// ResourceSlices and ResourceClaims; its resourceVersion counter is the whole server's.
    pub(super) objects: ObjectStore,
    pub(super) requests: Vec<Recorded>,
    /// Faults still to inject, first match wins.
    pub(super) faults: Vec<Rule>,
    /// Discovery, stored cluster-scoped objects and access reviews.
    catalog: Catalog,
    /// Custom resources of resource.nvidia.com (`apicrd.rs`).
    pub(super) crds: super::apicrd::CustomObjects,
    /// Node labels and the ComputeDomain objects.
    pub(super) domains: super::apidomains::Domains,
}

/// The running server. Cheap to share between threads.
pub struct FakeApiServer {
    addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    latency: Arc<Latency>,
    gets: Arc<GetsInFlight>,
    connections: Arc<Connections>,
    tls: Option<super::tls::ClientPems>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    down: tokio::sync::watch::Sender<bool>,
}

/// How long answers take at least, in nanoseconds.
#[derive(Default)]
pub(super) struct Latency {
    pub(super) get_ns: AtomicU64,
    pub(super) write_ns: AtomicU64,
    /// How much of a GET's and of a write's time the server spends on a CPU of this machine
    /// (kube-apiserver and etcd run beside the plugin on a harness node), in nanoseconds.
    pub(super) get_cpu_ns: AtomicU64,
    pub(super) write_cpu_ns: AtomicU64,
    /// How long after arrival each delayed GET was actually answered, in nanoseconds (the
    /// last [`Latency::KEPT`]).
    pub(super) served_gets_ns: Mutex<std::collections::VecDeque<u64>>,
    /// How much earlier than the deadline a delayed answer's sleep ends, learned from how late
    /// answers left: waking a sleeping thread and handing the answer back to the server's
    /// runtime take 50–100 µs on a VM, which would otherwise be added to every latency.
    pub(super) early_ns: AtomicU64,
}

impl Latency {
    pub(super) const KEPT: usize = 4096;
    /// The most a sleep ends early: the wake-up cost, never a share of the latency itself.
    const MAX_EARLY_NS: u64 = 150_000;

    /// When the sleep for an answer due `wait_ns` after `arrived` should end.
    pub(super) fn wake_at(&self, arrived: Instant, wait_ns: u64) -> Instant {
        let early = self.early_ns.load(Ordering::Relaxed).min(wait_ns / 2);
        arrived + Duration::from_nanos(wait_ns - early)
    }

    /// Learns from an answer due `wait_ns` after arrival that left `took` after it: a quarter
    /// of the error each time, so the median answer leaves on time.
    pub(super) fn learn(&self, took: Duration, wait_ns: u64) {
        let took = i128::try_from(took.as_nanos()).unwrap_or(i128::MAX);
        let error = took - i128::from(wait_ns);
        let early = i128::from(self.early_ns.load(Ordering::Relaxed)) + error / 4;
        let early = early.clamp(0, i128::from(Self::MAX_EARLY_NS));
        self.early_ns
            .store(u64::try_from(early).unwrap_or(0), Ordering::Relaxed);
    }

    pub(super) fn record_get(&self, took: Duration) {
        let mut kept = self
            .served_gets_ns
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if kept.len() == Self::KEPT {
            kept.pop_front();
        }
        kept.push_back(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }
}

/// `path` with the names a test chooses (namespaces, objects) replaced by placeholders, for
/// counting requests by kind: `/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`.
pub fn path_pattern(path: &str) -> String {
    let mut previous = "";
    let mut out = Vec::new();
    for segment in path.trim_matches('/').split('/') {
        out.push(match previous {
            "namespaces" => "{ns}",
            "resourceclaims" | "resourceslices" | "nodes" | "events" | "pods" => "{name}",
            _ => segment,
        });
        previous = segment;
    }
    format!("/{}", out.join("/"))
}

/// GETs being answered now, and the most there ever were at once.
#[derive(Default)]
pub(super) struct GetsInFlight {
    pub(super) now: std::sync::atomic::AtomicUsize,
    pub(super) peak: std::sync::atomic::AtomicUsize,
}

impl FakeApiServer {
    /// Starts a server that knows Node `node` and nothing else, on plain HTTP.
    pub fn start(node: &str) -> FakeApiServer {
        Self::start_with(node, None)
    }

    /// [`FakeApiServer::start`] over TLS, requiring a client certificate its CA signed (the
    /// kubeconfig it writes carries the CA and the client's certificate and key).
    pub fn start_tls(node: &str) -> FakeApiServer {
        Self::start_with(node, Some(super::tls::Tls::generate(node)))
    }

    fn start_with(node: &str, tls: Option<super::tls::Tls>) -> FakeApiServer {
        let store = Arc::new(Mutex::new(Store {
            node: node.to_string(),
            objects: ObjectStore::new(&["resourceclaims"]),
            requests: Vec::new(),
            faults: Vec::new(),
            catalog: Catalog::default(),
            crds: Default::default(),
            domains: Default::default(),
        }));
        let listener = super::transport::listen();
        let addr = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (down, down_rx) = tokio::sync::watch::channel(false);
        let shared = store.clone();
        let latency = Arc::new(Latency::default());
        let gets = Arc::new(GetsInFlight::default());
        let connections = Arc::new(Connections::default());
        let (times, in_flight, counted) = (latency.clone(), gets.clone(), connections.clone());
        let client = tls.as_ref().map(|t| t.client.clone());
        let acceptor = tls.map(|t| t.acceptor);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let meters = super::apifaults::Meters {
                latency: times,
                gets: in_flight,
                connections: counted,
            };
            runtime.block_on(serve(listener, acceptor, shared, meters, stopped, down_rx));
        });
        FakeApiServer {
            addr,
            store,
            latency,
            gets,
            connections,
            tls: client,
            stop: Some(stop),
            down,
        }
    }

    /// Connections accepted and TLS handshakes completed so far.
    pub fn connection_stats(&self) -> ConnectionStats {
        self.connections.stats()
    }

    /// GETs the server is answering now.
    pub fn gets_in_flight(&self) -> usize {
        self.gets.now.load(Ordering::SeqCst)
    }

    /// The most GETs the server was answering at one time so far.
    /// The median time after arrival at which the server let delayed GETs go (what the
    /// latency set with [`FakeApiServer::set_get_latency`] came to: the server learns how
    /// long waking up takes and ends its sleep that much early, so this is the set latency
    /// give or take a few µs), over the last 4,096 of them; `None` before any.
    pub fn served_get_latency_p50(&self) -> Option<Duration> {
        let kept = self
            .latency
            .served_gets_ns
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut sorted: Vec<u64> = kept.iter().copied().collect();
        sorted.sort_unstable();
        sorted
            .get(sorted.len() / 2)
            .map(|ns| Duration::from_nanos(*ns))
    }

    pub fn peak_concurrent_gets(&self) -> usize {
        self.gets.peak.load(Ordering::SeqCst)
    }

    /// Every GET from now on is answered `latency` after it arrived (zero: at once). The wait
    /// runs on a blocking thread with a precise sleep, so concurrent GETs wait side by side
    /// (as on a real API server) and sub-millisecond latencies are not rounded up to the
    /// runtime's millisecond timer.
    pub fn set_get_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency.get_ns.store(ns, Ordering::Relaxed);
    }

    /// Every write (POST, PUT, PATCH, DELETE) from now on is answered `latency` after it
    /// arrived, as [`FakeApiServer::set_get_latency`] does for GETs.
    pub fn set_write_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency.write_ns.store(ns, Ordering::Relaxed);
    }

    /// Of each GET's and each write's latency, the first `get` and `write` are spent busy on
    /// a CPU of this machine rather than asleep, as kube-apiserver and etcd spend CPU beside
    /// the plugin on a node that runs them both: concurrent requests then compete with each
    /// other and with the plugin for the machine's cores. Zero (the default): all asleep.
    pub fn set_server_cpu(&self, get: Duration, write: Duration) {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.latency.get_cpu_ns.store(ns(get), Ordering::Relaxed);
        self.latency
            .write_cpu_ns
            .store(ns(write), Ordering::Relaxed);
    }

    /// `http://127.0.0.1:<port>`, or `https://` over TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Writes a kubeconfig pointing at this server: plain HTTP without credentials, or over
    /// TLS with the server's CA and a client certificate and key.
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = super::tls::kubeconfig(self.addr, self.tls.as_ref());
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// Stores (or replaces) a ResourceClaim; its namespace and name come from its metadata.
    pub fn put_claim(&self, claim: Value) {
        let ns = claim["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = claim["metadata"]["name"].as_str().unwrap_or_default();
        let target = object(RESOURCE, CLAIMS, ns, name);
        self.lock().objects.seed(&target, claim);
    }

    /// The stored ResourceClaim `namespace/name`, if any.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Value> {
        let key = object(RESOURCE, CLAIMS, namespace, name).key();
        self.lock().objects.get(&key).cloned()
    }

    /// Deletes a stored ResourceClaim (its finalizers gone), as the API server would once
    /// nobody holds it any more.
    pub fn remove_claim(&self, namespace: &str, name: &str) {
        let key = object(RESOURCE, CLAIMS, namespace, name).key();
        self.lock().objects.remove(&key).expect("claim to remove");
    }

    /// Changes a stored claim behind the plugin's back (as another writer would), with a new
    /// resourceVersion.
    pub fn edit_claim(&self, namespace: &str, name: &str, edit: impl FnOnce(&mut Value)) {
        self.edit(&object(RESOURCE, CLAIMS, namespace, name), edit);
    }

    /// Stores (or replaces) a ResourceSlice as if a plugin had published it.
    pub fn put_slice(&self, slice: Value) {
        let name = slice["metadata"]["name"].as_str().unwrap_or_default();
        let target = object(RESOURCE, SLICE_RESOURCE, "", name);
        self.lock().objects.seed(&target, slice);
    }

    /// Deletes every stored ResourceSlice, as a kubelet does for its node when it starts.
    pub fn remove_slices(&self) {
        self.lock().objects.remove_all(RESOURCE, SLICE_RESOURCE);
    }

    /// The stored ResourceSlices by name.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.lock().objects.by_name(RESOURCE, SLICE_RESOURCE)
    }

    /// The stored slices once they form a complete pool (as many as each one's
    /// `resourceSliceCount` says), else `None`.
    pub fn complete_pool(&self) -> Option<Vec<Value>> {
        let slices: Vec<Value> = self.slices().into_values().collect();
        let count = json!(slices.len());
        let complete = !slices.is_empty()
            && slices
                .iter()
                .all(|s| s["spec"]["pool"]["resourceSliceCount"] == count);
        complete.then_some(slices)
    }

    /// The bodies of the Events created so far, in order.
    pub fn events(&self) -> Vec<Value> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .filter_map(|r| r.body.clone())
            .collect()
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Injects `fault` into the next `times` requests (`None`: every one) whose method is
    /// `method` (any when `None`) and whose path contains `path`. Rules are checked in the
    /// order added; the first that matches applies.
    pub fn inject(&self, method: Option<&str>, path: &str, fault: Fault, times: Option<usize>) {
        self.lock().faults.push(Rule {
            method: method.map(str::to_string),
            path: path.to_string(),
            fault,
            times,
        });
    }

    /// Stores (or replaces) a cluster-scoped object in `collection` (an
    /// [`apicatalog`](super::apicatalog) path such as `DEVICE_CLASSES`), listed by GET.
    pub fn put_object(&self, collection: &str, object: Value) {
        self.lock().catalog.put(collection, object);
    }

    /// Deletes object `name` from `collection`; whether it was there.
    pub fn delete_object(&self, collection: &str, name: &str) -> bool {
        self.lock().catalog.remove(collection, name)
    }

    /// SelfSubjectAccessReviews of `verb` on `resource` (`resource/subresource`) answer
    /// denied from now on; every other review is allowed.
    pub fn deny_access(&self, resource: &str, verb: &str) {
        self.lock().catalog.deny(resource, verb);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// An outage (`true`): the port is closed, so connections are refused, and open
    /// connections are cut. `false` listens again on the same port. Returns once the change
    /// is in effect (the server runs on its own thread).
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(self.addr).is_ok() == down {
            assert!(
                Instant::now() < deadline,
                "the fake API server did not go {}",
                if down { "down" } else { "up" }
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Changes a stored slice behind the plugin's back (as another writer would), with a new
    /// resourceVersion.
    pub fn edit_slice(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        self.edit(&object(RESOURCE, SLICE_RESOURCE, "", name), edit);
    }

    /// Edits the stored object at `target` in place, with a new resourceVersion; panics when
    /// there is none.
    fn edit(&self, target: &Target, edit: impl FnOnce(&mut Value)) {
        let mut store = self.lock();
        let mut current = store
            .objects
            .get(&target.key())
            .cloned()
            .unwrap_or_else(|| panic!("no {} {:?} to edit", target.resource, target.name));
        edit(&mut current);
        store.objects.seed(target, current);
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Store {
    pub(super) fn route(&mut self, r: &Recorded) -> (u16, Value) {
        if let Some(answer) = self.catalog.route(r) {
            return answer;
        }
        if let Some(answer) = self.crds.route(r, &mut self.objects.version) {
            return answer;
        }
        if let Some(answer) = self.domains.route(r, &self.node) {
            return answer;
        }
        let segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
        match (r.method.as_str(), segments.as_slice()) {
            ("GET", ["version"]) => (
                200,
                json!({"major": "1", "minor": "37", "gitVersion": "v1.37.0-fake",
                       "platform": "linux/amd64"}),
            ),
            ("GET", ["api", "v1", "nodes", name]) if *name == self.node => (
                200,
                json!({"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": name, "uid": NODE_UID, "resourceVersion": "1"}}),
            ),
            (
                "GET",
                [
                    "apis",
                    "resource.k8s.io",
                    "v1",
                    "namespaces",
                    ns,
                    "resourceclaims",
                    n,
                ],
            ) => match self.objects.get(&object(RESOURCE, CLAIMS, ns, n).key()) {
                Some(claim) => (200, claim.clone()),
                None => not_found("resourceclaims", n),
            },
            (
                "PUT",
                [
                    "apis",
                    "resource.k8s.io",
                    "v1",
                    "namespaces",
                    ns,
                    "resourceclaims",
                    n,
                    "status",
                ],
            ) => self.update_claim_status(ns, n, r),
            ("POST", ["api", "v1", "namespaces", ns, "events"]) => self.create_event(ns, r),
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => (200, self.list(r)),
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceclaims"]) => (
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                       "metadata": {"resourceVersion": self.objects.version.to_string()},
                       "items": self.objects.list(RESOURCE, CLAIMS, None, "")}),
            ),
            ("GET", ["api", "v1", "nodes"]) => (
                200,
                json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "1"},
                       "items": [{"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": self.node, "uid": NODE_UID, "resourceVersion": "1"}}]}),
            ),
            ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                match self.objects.get(&slice_key(name)) {
                    Some(slice) => (200, slice.clone()),
                    None => not_found("resourceslices", name),
                }
            }
            ("POST", ["apis", "resource.k8s.io", "v1", "resourceslices"]) => self.create(r),
            ("PUT", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                self.update(name, r)
            }
            ("DELETE", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                self.delete(name, r)
            }
            _ => status(
                404,
                "NotFound",
                &format!("the server could not find {}", r.path),
            ),
        }
    }

    fn list(&self, r: &Recorded) -> Value {
        let selector = r.query.get("fieldSelector").map_or("", String::as_str);
        let items: Vec<Value> = self
            .objects
            .list(RESOURCE, SLICE_RESOURCE, None, "")
            .into_iter()
            .filter(|s| fields_match(selector, s))
            .collect();
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
               "metadata": {"resourceVersion": self.objects.version.to_string()}, "items": items})
    }

    fn create(&mut self, r: &Recorded) -> (u16, Value) {
        let slice = r.body.clone().unwrap_or_default();
        let Some(name) = slice["metadata"]["name"].as_str().map(str::to_string) else {
            return status(422, "Invalid", "metadata.name: Required value");
        };
        if self.objects.get(&slice_key(&name)).is_some() {
            let message = format!("resourceslices.resource.k8s.io \"{name}\" already exists");
            return status(409, "AlreadyExists", &message);
        }
        // A dry run (`?dryRun=All`) is validated and answered, never stored.
        if r.query.contains_key("dryRun") {
            let mut answer = slice;
            answer["metadata"]["uid"] = json!(format!("dry-run-{name}"));
            return (201, answer);
        }
        self.objects
            .create(&object(RESOURCE, SLICE_RESOURCE, "", ""), slice)
    }

    fn update(&mut self, name: &str, r: &Recorded) -> (u16, Value) {
        let Some(current) = self.objects.get(&slice_key(name)) else {
            return not_found("resourceslices", name);
        };
        let slice = r.body.clone().unwrap_or_default();
        // A replace must name the version it read (the publisher always does).
        if slice["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
            let message = format!(
                "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{name}\": \
                 the object has been modified; please apply your changes to the latest version"
            );
            return status(409, "Conflict", &message);
        }
        self.objects
            .update(&object(RESOURCE, SLICE_RESOURCE, "", name), &slice, None)
    }

    fn delete(&mut self, name: &str, r: &Recorded) -> (u16, Value) {
        let uid = r
            .body
            .as_ref()
            .and_then(|b| b["preconditions"]["uid"].as_str());
        let (code, answer) = self.objects.delete(&slice_key(name), uid, false);
        match code {
            404 => not_found("resourceslices", name),
            _ => (code, answer),
        }
    }

    /// `PUT .../resourceclaims/<name>/status` as the API server's status strategy treats it:
    /// guarded by resourceVersion and UID, the spec and metadata kept, `status.allocation` and
    /// `status.reservedFor` unchangeable by a kubelet plugin (they need `resourceclaims/binding`,
    /// which it does not have), and every `status.devices` entry validated against the
    /// allocation (its driver/pool/device/shareID must be allocated, keys unique, at most 8
    /// conditions, `data` at most 10 KiB).
    fn update_claim_status(&mut self, ns: &str, name: &str, r: &Recorded) -> (u16, Value) {
        let target = object(RESOURCE, CLAIMS, ns, name);
        let Some(current) = self.objects.get(&target.key()) else {
            return not_found("resourceclaims", name);
        };
        let body = r.body.clone().unwrap_or_default();
        let conflict = |why: &str| {
            let message = format!(
                "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"{name}\": {why}"
            );
            status(409, "Conflict", &message)
        };
        let sent_version = &body["metadata"]["resourceVersion"];
        if !sent_version.is_null() && *sent_version != current["metadata"]["resourceVersion"] {
            return conflict(
                "the object has been modified; please apply your changes to the latest version",
            );
        }
        let sent_uid = &body["metadata"]["uid"];
        if !sent_uid.is_null() && *sent_uid != current["metadata"]["uid"] {
            return conflict("Precondition failed: UID in precondition");
        }
        let new_status = body["status"].clone();
        for field in ["allocation", "reservedFor"] {
            if new_status[field] != current["status"][field] {
                let message = format!(
                    "ResourceClaim.resource.k8s.io \"{name}\" is invalid: status: Forbidden: \
                     changing status.allocation or status.reservedFor requires \
                     resource=\"resourceclaims/binding\", verb=\"update\" permission"
                );
                return status(422, "Invalid", &message);
            }
        }
        if let Err(problem) = validate_device_statuses(&new_status) {
            let message = format!("ResourceClaim.resource.k8s.io \"{name}\" is invalid: {problem}");
            return status(422, "Invalid", &message);
        }
        let mut claim = current.clone();
        let devices_changed = new_status["devices"] != current["status"]["devices"];
        match new_status {
            Value::Null => claim["status"] = json!({}),
            other => claim["status"] = other,
        }
        if devices_changed && let Some(manager) = r.query.get("fieldManager") {
            own_status_devices(&mut claim, manager);
        }
        (200, self.objects.seed(&target, claim))
    }

    /// `POST .../events`: stored nowhere (tests read the recorded request), answered as the
    /// API server does, with a name made from `generateName`.
    fn create_event(&mut self, ns: &str, r: &Recorded) -> (u16, Value) {
        let mut event = r.body.clone().unwrap_or_default();
        if event["involvedObject"]["kind"].as_str().is_none() {
            return status(422, "Invalid", "involvedObject.kind: Required value");
        }
        if event["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| n != ns)
        {
            return status(
                422,
                "Invalid",
                "metadata.namespace: does not match the request",
            );
        }
        self.objects.version += 1;
        let version = self.objects.version.to_string();
        let prefix = event["metadata"]["generateName"]
            .as_str()
            .unwrap_or("event.");
        event["metadata"]["name"] = json!(format!("{prefix}{version}"));
        event["metadata"]["resourceVersion"] = json!(version);
        event["metadata"]["creationTimestamp"] = json!("2026-07-01T00:00:00Z");
        (201, event)
    }
}

/// The group-version path of `resource.k8s.io/v1`.
const RESOURCE: &str = "/apis/resource.k8s.io/v1";
const SLICE_RESOURCE: &str = "resourceslices";
const CLAIMS: &str = "resourceclaims";

/// The object `name` of `resource` under `prefix`, in `namespace` (`""`: cluster-scoped).
fn object(prefix: &str, resource: &str, namespace: &str, name: &str) -> Target {
    Target {
        prefix: prefix.to_string(),
        resource: resource.to_string(),
        namespace: Some(namespace.to_string()).filter(|n| !n.is_empty()),
        name: Some(name.to_string()).filter(|n| !n.is_empty()),
        subresource: None,
    }
}

fn slice_key(name: &str) -> Key {
    object(RESOURCE, SLICE_RESOURCE, "", name).key()
}

/// Records `manager` as the owner of the claim's `status.devices` entries in
/// `metadata.managedFields`, as the API server does for an update of the status subresource
/// (one `Update` entry per manager and subresource, its `fieldsV1` naming each entry by its
/// list-map keys), and drops the entry when no device is left.
fn own_status_devices(claim: &mut Value, manager: &str) {
    let entries: serde_json::Map<String, Value> = claim["status"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            let key = format!(
                "k:{{\"device\":{},\"driver\":{},\"pool\":{}}}",
                d["device"], d["driver"], d["pool"]
            );
            let fields = json!({".": {}, "f:conditions": {}, "f:data": {}, "f:device": {},
                                "f:driver": {}, "f:pool": {}});
            (key, fields)
        })
        .collect();
    let mut managed: Vec<Value> = claim["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    managed.retain(|m| !(m["manager"] == json!(manager) && m["subresource"] == json!("status")));
    if !entries.is_empty() {
        let mut devices = serde_json::Map::new();
        devices.insert(".".into(), json!({}));
        devices.extend(entries);
        managed.push(json!({
            "manager": manager, "operation": "Update", "apiVersion": "resource.k8s.io/v1",
            "time": "2026-11-28T10:00:01Z", "fieldsType": "FieldsV1", "subresource": "status",
            "fieldsV1": {"f:status": {"f:devices": Value::Object(devices)}}
        }));
    }
    claim["metadata"]["managedFields"] = Value::Array(managed);
}

fn validate_device_statuses(status: &Value) -> Result<(), String> {
    let allocated: Vec<(Value, Value, Value, Value)> = status["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let share = r.get("shareID").cloned().unwrap_or(Value::Null);
            (
                r["driver"].clone(),
                r["pool"].clone(),
                r["device"].clone(),
                share,
            )
        })
        .collect();
    let mut seen = Vec::new();
    for (i, d) in status["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let share = d.get("shareID").cloned().unwrap_or(Value::Null);
        let key = (
            d["driver"].clone(),
            d["pool"].clone(),
            d["device"].clone(),
            share,
        );
        if !allocated.contains(&key) {
            return Err(format!(
                "status.devices[{i}]: Invalid value: {key:?}: must be an allocated device in the claim"
            ));
        }
        if seen.contains(&key) {
            return Err(format!("status.devices[{i}]: Duplicate value: {key:?}"));
        }
        seen.push(key);
        let conditions = d["conditions"].as_array().cloned().unwrap_or_default();
        if conditions.len() > 8 {
            return Err(format!(
                "status.devices[{i}].conditions: Too many: must have at most 8 items"
            ));
        }
        // metav1 ValidateConditions: a known status, a reason and a transition time.
        for (j, c) in conditions.iter().enumerate() {
            let at = format!("status.devices[{i}].conditions[{j}]");
            if !["True", "False", "Unknown"].contains(&c["status"].as_str().unwrap_or_default()) {
                return Err(format!("{at}.status: Unsupported value: {}", c["status"]));
            }
            let reason = c["reason"].as_str().unwrap_or_default();
            if !reason.starts_with(|ch: char| ch.is_ascii_alphabetic()) {
                return Err(format!(
                    "{at}.reason: Required value or invalid: {reason:?}"
                ));
            }
            if c["lastTransitionTime"].as_str().is_none_or(str::is_empty) {
                return Err(format!("{at}.lastTransitionTime: Required value"));
            }
            if c["message"].as_str().is_some_and(|m| m.len() > 32768) {
                return Err(format!("{at}.message: Too long"));
            }
        }
        if !d["data"].is_null() && !d["data"].is_object() {
            return Err(format!(
                "status.devices[{i}].data: Invalid value: must be a JSON object"
            ));
        }
        let data = serde_json::to_vec(&d["data"]).unwrap_or_default().len();
        if data > 10 * 1024 {
            return Err(format!(
                "status.devices[{i}].data: Too long: may not be more than 10240 bytes"
            ));
        }
    }
    Ok(())
}

pub(super) fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// What the API server answers for a missing object: unlike its answer for a path it does not
/// serve (empty `details`), the Status names the object.
fn not_found(resource: &str, name: &str) -> (u16, Value) {
    let message = format!("{resource}.resource.k8s.io \"{name}\" not found");
    let (code, mut body) = status(404, "NotFound", &message);
    body["details"] = json!({"name": name, "group": "resource.k8s.io", "kind": resource});
    (code, body)
}
