//! A fake kube-apiserver for the ComputeDomain controller on a real TCP port (plain HTTP, or
//! TLS with client certificates as kube-apiserver serves it): any resource, kept by
//! [`ObjectStore`](super::objstore::ObjectStore), and watches (`?watch=true`) streamed as
//! kube-apiserver does, one JSON event per line (`ADDED`, `MODIFIED`, `DELETED`) from the
//! resourceVersion asked for, until `timeoutSeconds`. Lists are paged when the client asks
//! (`limit`, `continue`), as kube-apiserver pages them. Every request is recorded with the code
//! it got. Writes can be made to take a set time ([`ObjServer::set_write_latency`], an etcd
//! write), as `tests/plugin_support`'s server does. Watches can be expired
//! ([`ObjServer::expire_watches`]) as kube-apiserver expires them after a compaction: every
//! open watch ends with an `ERROR` event of 410 `Expired`, and so does any new watch from an
//! older resourceVersion, until the client lists again.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};

use super::objstore::{Key, ObjectStore, PatchKind, Target, parse, query_pairs, selects, status};

/// One request as the server saw it, with the code it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Option<Value>,
    pub code: u16,
}

impl Recorded {
    /// A write: anything but GET.
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

struct Shared {
    store: Mutex<ObjectStore>,
    requests: Mutex<Vec<Recorded>>,
    write_latency_ns: AtomicU64,
    get_latency_ns: AtomicU64,
    watch_latency_ns: AtomicU64,
    /// Requests to answer with an error instead: (method, path, code, how many more times).
    faults: Mutex<Vec<(String, String, u16, usize)>>,
    /// Bumped by [`ObjServer::expire_watches`], with the resourceVersion below which watches
    /// are refused from then on.
    expired: tokio::sync::watch::Sender<(u64, u64)>,
}

/// The running server; dropping it stops it.
pub struct ObjServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tls: Option<super::tls::ClientPems>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Kept so the transport serves (it stops when this is dropped); never set to down.
    _down: tokio::sync::watch::Sender<bool>,
}

/// Resources whose writes keep their status (they have a status subresource).
const WITH_STATUS: &[&str] = &[
    "computedomains",
    "daemonsets",
    "nodes",
    "pods",
    "resourceclaims",
];

type Body = BoxBody<Bytes, Infallible>;

fn full(value: &Value) -> Body {
    Full::new(Bytes::from(value.to_string())).boxed()
}

impl ObjServer {
    /// A server on plain HTTP.
    pub fn start() -> ObjServer {
        Self::start_with(None)
    }

    /// A server on TLS requiring a client certificate its CA signed.
    pub fn start_tls() -> ObjServer {
        Self::start_with(Some(super::tls::Tls::generate("compute-domain-controller")))
    }

    fn start_with(tls: Option<super::tls::Tls>) -> ObjServer {
        let shared = Arc::new(Shared {
            store: Mutex::new(ObjectStore::new(WITH_STATUS)),
            requests: Mutex::new(Vec::new()),
            write_latency_ns: AtomicU64::new(0),
            get_latency_ns: AtomicU64::new(0),
            watch_latency_ns: AtomicU64::new(0),
            faults: Mutex::new(Vec::new()),
            expired: tokio::sync::watch::channel((0, 0)).0,
        });
        let listener = super::transport::listen();
        let addr = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (down, down_rx) = tokio::sync::watch::channel(false);
        let client = tls.as_ref().map(|t| t.client.clone());
        let acceptor = tls.map(|t| t.acceptor);
        let serving = shared.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let service = move || {
                let shared = serving.clone();
                hyper::service::service_fn(move |req| answer(shared.clone(), req))
            };
            runtime.block_on(super::transport::serve(
                listener,
                acceptor,
                service,
                Arc::default(),
                stopped,
                down_rx,
            ));
        });
        ObjServer {
            addr,
            shared,
            tls: client,
            stop: Some(stop),
            _down: down,
        }
    }

    /// Expires every watch, as kube-apiserver does when the history a watch needs was
    /// compacted away: open watches end with an `ERROR` event (410 `Expired`), and a watch
    /// from a resourceVersion older than the current one is refused the same way. A fresh
    /// list (whose resourceVersion is the current one) and a watch from it work again.
    pub fn expire_watches(&self) {
        let current = self
            .shared
            .store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .version;
        self.shared.expired.send_modify(|(generation, below)| {
            *generation += 1;
            *below = current;
        });
    }

    /// How many watches were refused or ended with 410 `Expired` so far.
    pub fn expired_watches(&self) -> usize {
        self.requests().iter().filter(|r| r.code == 410).count()
    }

    /// Every write (POST, PUT, PATCH, DELETE) from now on is answered `latency` after it
    /// arrived (an etcd write); concurrent writes wait side by side.
    pub fn set_write_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.shared.write_latency_ns.store(ns, Ordering::Relaxed);
    }

    /// Every GET but a watch from now on is answered `latency` after it arrived (a read from
    /// the API server's watch cache).
    pub fn set_get_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.shared.get_latency_ns.store(ns, Ordering::Relaxed);
    }

    /// Every watch event from now on reaches the watcher `latency` after the change was made,
    /// not at once: kube-apiserver answers a write when etcd committed it and delivers the
    /// event through etcd's watch and its own watch cache afterwards, so a client's cached
    /// copy trails its own writes.
    pub fn set_watch_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.shared.watch_latency_ns.store(ns, Ordering::Relaxed);
    }

    /// The next `times` requests `method path` are answered `code` (a Status of that code,
    /// as kube-apiserver answers a refused request), and not carried out.
    pub fn fail_next(&self, method: &str, path: &str, code: u16, times: usize) {
        self.shared.faults.lock().unwrap().push((
            method.to_string(),
            path.to_string(),
            code,
            times,
        ));
    }

    /// From now on a deletion with `propagationPolicy: Foreground` keeps the object (with
    /// `foregroundDeletion`) until [`ObjServer::finish_foreground_deletion`]: the test plays
    /// the garbage collector, which ends it once the dependents (a DaemonSet's pods) are gone.
    pub fn hold_foreground_deletions(&self) {
        self.lock().hold_foreground = true;
    }

    /// Ends the foreground deletion of the object at `path`, as the garbage collector does
    /// once its dependents are gone; `false` when no such object exists.
    pub fn finish_foreground_deletion(&self, path: &str) -> bool {
        self.lock().finish_foreground_deletion(&object_key(path))
    }

    /// Writes a kubeconfig for this server.
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = super::tls::kubeconfig(self.addr, self.tls.as_ref());
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// A client for this server (as the controller builds one from a kubeconfig).
    pub async fn client(&self, dir: &Path) -> kube::Client {
        let path = dir.join(format!("kubeconfig-{}", self.addr.port()));
        self.write_kubeconfig(&path);
        gpu_dra::k8s::connect(Some(&path)).await.expect("client")
    }

    /// Creates `object` in collection `path` (e.g. `/api/v1/nodes`) as a client would.
    pub fn create(&self, path: &str, object: Value) -> Value {
        let target = parse(path).expect("a collection path");
        let (code, body) = self.lock().create(&target, object);
        assert_eq!(code, 201, "{body}");
        body
    }

    /// Merge-patches the object at `path` (`…/<name>` or `…/<name>/status`).
    pub fn patch(&self, path: &str, patch: Value) -> (u16, Value) {
        let target = parse(path).expect("an object path");
        self.lock().update(&target, &patch, Some(PatchKind::Merge))
    }

    /// Deletes the object at `path` as `kubectl delete` does.
    pub fn delete(&self, path: &str) -> u16 {
        self.lock().delete(&object_key(path), None, false).0
    }

    /// The object at `path`, if it exists.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.lock().get(&object_key(path)).cloned()
    }

    /// Objects of collection `path` (one namespace, or all when the path has none) whose
    /// labels match `selector`.
    pub fn list(&self, path: &str, selector: &str) -> Vec<Value> {
        let t = parse(path).expect("a collection path");
        self.lock()
            .list(&t.prefix, &t.resource, t.namespace.as_deref(), selector)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ObjectStore> {
        self.shared.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The store key of the object at `path`.
fn object_key(path: &str) -> Key {
    let t = parse(path).expect("an object path");
    (
        t.prefix,
        t.resource,
        t.namespace.unwrap_or_default(),
        t.name.unwrap_or_default(),
    )
}

impl Drop for ObjServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn answer(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let method = parts.method.to_string();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(query_pairs).unwrap_or_default();
    let body: Option<Value> = serde_json::from_slice(&bytes).ok();
    let target = parse(&path);
    let patch_kind = match parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
    {
        Some("application/json-patch+json") => PatchKind::Json,
        _ => PatchKind::Merge,
    };
    let fault = {
        let mut faults = shared.faults.lock().unwrap();
        let found = faults
            .iter_mut()
            .find(|(m, p, _, left)| *m == method && *p == path && *left > 0);
        found.map(|(_, _, code, left)| {
            *left -= 1;
            *code
        })
    };
    if let Some(code) = fault {
        let (code, value) = status(
            code,
            "InjectedFault",
            &format!("injected {code} for {method} {path}"),
        );
        record(&shared, &method, &path, &query, &body, code);
        return Ok(Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(full(&value))
            .expect("response"));
    }
    let watch = method == "GET" && query.get("watch").is_some_and(|w| w == "true" || w == "1");
    if watch && let Some(target) = target.clone() {
        let from: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let below = shared.expired.borrow().1;
        if from != 0 && from < below {
            record(&shared, &method, &path, &query, &body, 410);
            return Ok(expired_response(from, below));
        }
        record(&shared, &method, &path, &query, &body, 200);
        return Ok(watch_response(&shared, target, &query, &path));
    }
    let (code, value) = match target {
        None if path == "/version" => (
            200,
            json!({"major": "1", "minor": "36", "gitVersion": "v1.36.0-fake", "platform": "linux/amd64"}),
        ),
        None => status(
            404,
            "NotFound",
            &format!("the server could not find {path}"),
        ),
        Some(t) => route(&shared, &method, &t, &query, body.as_ref(), patch_kind),
    };
    record(&shared, &method, &path, &query, &body, code);
    let ns = if method == "GET" {
        shared.get_latency_ns.load(Ordering::Relaxed)
    } else {
        shared.write_latency_ns.load(Ordering::Relaxed)
    };
    if ns > 0 {
        let until = arrived + Duration::from_nanos(ns);
        let _ = tokio::task::spawn_blocking(move || {
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        })
        .await;
    }
    Ok(Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(&value))
        .expect("response"))
}

fn record(
    shared: &Shared,
    method: &str,
    path: &str,
    query: &BTreeMap<String, String>,
    body: &Option<Value>,
    code: u16,
) {
    shared.requests.lock().unwrap().push(Recorded {
        method: method.to_string(),
        path: path.to_string(),
        query: query.clone(),
        body: body.clone(),
        code,
    });
}

fn route(
    shared: &Shared,
    method: &str,
    t: &Target,
    query: &BTreeMap<String, String>,
    body: Option<&Value>,
    patch_kind: PatchKind,
) -> (u16, Value) {
    let mut store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    let selector = query.get("labelSelector").map(String::as_str).unwrap_or("");
    let key = |name: &str| -> Key {
        (
            t.prefix.clone(),
            t.resource.clone(),
            t.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    };
    match (method, t.name.as_deref()) {
        ("GET", None) => {
            let items = store.list(&t.prefix, &t.resource, t.namespace.as_deref(), selector);
            list_page(items, query, store.version)
        }
        ("GET", Some(name)) => match store.get(&key(name)) {
            Some(o) => (200, o.clone()),
            None => {
                let (code, mut body) = status(
                    404,
                    "NotFound",
                    &format!("{} \"{name}\" not found", t.resource),
                );
                body["details"] = json!({"name": name, "kind": t.resource});
                (code, body)
            }
        },
        ("POST", None) => store.create(t, body.cloned().unwrap_or_default()),
        ("PUT", Some(_)) => store.update(t, body.unwrap_or(&Value::Null), None),
        ("PATCH", Some(_)) => store.update(t, body.unwrap_or(&Value::Null), Some(patch_kind)),
        ("DELETE", Some(name)) => {
            let uid = body.and_then(|b| b["preconditions"]["uid"].as_str().map(str::to_string));
            let foreground = body.is_some_and(|b| b["propagationPolicy"] == "Foreground");
            store.delete(&key(name), uid.as_deref(), foreground)
        }
        ("DELETE", None) => {
            let items = store.list(&t.prefix, &t.resource, t.namespace.as_deref(), selector);
            let mut deleted = Vec::new();
            for item in items {
                let name = item["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let (_, gone) = store.delete(&key(&name), None, false);
                deleted.push(gone);
            }
            (
                200,
                json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": deleted}),
            )
        }
        _ => status(
            405,
            "MethodNotAllowed",
            &format!("{method} is not supported here"),
        ),
    }
}

/// A list answer of `items`, one page when the client asks for pages (`limit`, then
/// `continue`) as kube-apiserver pages them: at most `limit` items, with a `continue` token
/// and `remainingItemCount` while more remain. The token is the offset of the next item,
/// tagged with the list's resourceVersion (pages are not a snapshot here: enough for clients
/// that list, not for tests that change the collection between pages). Without `limit`
/// (or with 0) every item in one answer.
fn list_page(items: Vec<Value>, query: &BTreeMap<String, String>, version: u64) -> (u16, Value) {
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|&l| l > 0);
    let token = query.get("continue").filter(|c| !c.is_empty());
    let (list_version, from) = match token {
        None => (version, 0),
        Some(token) => {
            let parsed = token
                .split_once('.')
                .and_then(|(v, o)| Some((v.parse::<u64>().ok()?, o.parse::<usize>().ok()?)));
            match parsed {
                Some(p) => p,
                None => {
                    return status(
                        400,
                        "BadRequest",
                        &format!("invalid continue token {token:?}"),
                    );
                }
            }
        }
    };
    let total = items.len();
    let end = limit.map_or(total, |l| from.saturating_add(l).min(total));
    let page: Vec<Value> = items
        .into_iter()
        .skip(from)
        .take(end.saturating_sub(from))
        .collect();
    let mut metadata = json!({"resourceVersion": list_version.to_string()});
    if end < total {
        metadata["continue"] = json!(format!("{list_version}.{end}"));
        metadata["remainingItemCount"] = json!(total - end);
    }
    (
        200,
        json!({"apiVersion": "v1", "kind": "List", "metadata": metadata, "items": page}),
    )
}

/// The watch: changes after `resourceVersion` to objects of the target's collection (and
/// namespace) matching the label selector, one JSON line each, then new ones as they happen
/// until `timeoutSeconds`.
fn watch_response(
    shared: &Arc<Shared>,
    t: Target,
    query: &BTreeMap<String, String>,
    path: &str,
) -> Response<Body> {
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let selector = query.get("labelSelector").cloned().unwrap_or_default();
    let timeout = Duration::from_secs(
        query
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    let matches = {
        let t = t.clone();
        move |key: &Key, object: &Value| {
            key.0 == t.prefix
                && key.1 == t.resource
                && t.namespace.as_ref().is_none_or(|n| *n == key.2)
                && selects(&selector, &object["metadata"]["labels"])
        }
    };
    let (backlog, mut live) = {
        let store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
        let backlog: Vec<(u64, String)> = store
            .log
            .iter()
            .filter(|c| c.version > from && matches(&c.key, &c.object))
            .map(|c| (c.version, line(c.kind, &c.object)))
            .collect();
        (backlog, store.changes.subscribe())
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1024);
    let mut expired = shared.expired.subscribe();
    expired.mark_unchanged();
    let recorder = Arc::clone(shared);
    let watched_path = path.to_string();
    let lag = Duration::from_nanos(shared.watch_latency_ns.load(Ordering::Relaxed));
    tokio::spawn(async move {
        let mut last = from;
        for (version, text) in backlog {
            last = version;
            if tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let change = tokio::select! {
                c = live.recv() => c,
                _ = tokio::time::sleep_until(deadline) => return,
                Ok(()) = expired.changed() => {
                    let below = expired.borrow_and_update().1;
                    // The watch that ended, recorded again with the code it got.
                    let watch = BTreeMap::from([("watch".to_string(), "true".to_string())]);
                    record(&recorder, "GET", &watched_path, &watch, &None, 410);
                    let _ = tx.send(Ok(Frame::data(Bytes::from(expired_line(last, below))))).await;
                    return;
                }
            };
            match change {
                Ok(c) if c.version > last && matches(&c.key, &c.object) => {
                    last = c.version;
                    if !lag.is_zero() {
                        tokio::time::sleep_until((c.at + lag).into()).await;
                    }
                    let text = line(c.kind, &c.object);
                    if tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                // Lagged or closed: end the watch; the client lists again.
                Err(_) => return,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .expect("response")
}

/// The `ERROR` event kube-apiserver sends for a watch whose history is gone.
fn expired_line(from: u64, current: u64) -> String {
    format!(
        "{}\n",
        json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {from} ({current})"),
            "reason": "Expired", "code": 410}})
    )
}

/// A watch refused at once: 200 with the one `ERROR` event, as kube-apiserver answers.
fn expired_response(from: u64, current: u64) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(full_text(expired_line(from, current)))
        .expect("response")
}

fn full_text(text: String) -> Body {
    Full::new(Bytes::from(text)).boxed()
}

fn line(kind: &str, object: &Value) -> String {
    format!("{}\n", json!({"type": kind, "object": object}))
}
