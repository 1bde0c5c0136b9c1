//! The fake API servers' store: any resource under `/api/v1` or `/apis/<group>/<version>`,
//! namespaced or not, kept as JSON and answered the way kube-apiserver does for the requests
//! the ComputeDomain controller and daemons and the plugin's API clients make (the TCP server
//! of `tests/cd_support` and the in-process one of `tests/k8s_support` both keep their
//! objects here): get, list (label selectors, every namespace
//! or one), create (names from `generateName`, 409 `AlreadyExists`), replace and merge patch
//! (409 `Conflict` on a stale `metadata.resourceVersion`), JSON patch (RFC 6902 `test`, `add`,
//! `remove`, `replace`; a failed `test` is 422 as kube-apiserver answers it), the `status`
//! subresource of the resources that have one (a write to the main resource keeps the status;
//! a status write keeps the rest), delete (with a UID precondition; an object with finalizers
//! only gets a `deletionTimestamp` and goes when the last finalizer is removed; with
//! `propagationPolicy: Foreground` it gets the `foregroundDeletion` finalizer, which the
//! garbage collector removes once the dependents are gone: tests play that part) and delete
//! of a collection. A finalizer added to an object being deleted is refused (422), as
//! kube-apiserver refuses it. Every change is kept in a log with its resourceVersion, for
//! watches.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// `(prefix, resource, namespace, name)`: prefix `/api/v1` or `/apis/<group>/<version>`,
/// namespace `""` for cluster-scoped objects.
pub type Key = (String, String, String, String);

/// What a request addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub prefix: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    /// The store's key of the object the target names (`""` for a missing namespace or name).
    pub fn key(&self) -> Key {
        (
            self.prefix.clone(),
            self.resource.clone(),
            self.namespace.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }
}

/// A URL's query string as pairs, percent- and `+`-decoded, as the fake servers read it: a
/// key without `=` has an empty value, a pair with an empty key is left out, and a later
/// repeat of a key wins.
pub fn query_pairs(query: &str) -> std::collections::BTreeMap<String, String> {
    query
        .split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .filter(|(k, _)| !k.is_empty())
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

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` paths.
pub fn parse(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (format!("/api/{version}"), rest),
        ["apis", group, version, rest @ ..] => (format!("/apis/{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (resource, rest) = rest.split_first()?;
    Some(Target {
        prefix,
        resource: resource.to_string(),
        namespace,
        name: rest.first().map(|s| s.to_string()),
        subresource: rest.get(1).map(|s| s.to_string()),
    })
}

/// One change, as a watch reports it.
#[derive(Debug, Clone)]
pub struct Change {
    pub version: u64,
    /// When the change was made (a watch may deliver it later, as kube-apiserver's watch
    /// cache does).
    pub at: std::time::Instant,
    pub key: Key,
    pub kind: &'static str,
    pub object: Value,
}

pub struct ObjectStore {
    /// Whether a foreground deletion waits for [`ObjectStore::finish_foreground_deletion`]
    /// (a test playing the garbage collector and the pods it waits for); otherwise it ends at
    /// once, as it does for an object without dependents.
    pub hold_foreground: bool,
    objects: BTreeMap<Key, Value>,
    pub version: u64,
    pub log: Vec<Change>,
    with_status: BTreeSet<String>,
    next_uid: u64,
    pub changes: tokio::sync::broadcast::Sender<Change>,
    /// When set, every write stamps `metadata.managedFields` with one `Update` entry of this
    /// manager, as kube-apiserver records the writer (clients must not mistake that
    /// server-set field for a change of theirs).
    pub managed_by: Option<String>,
}

pub fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Whether `object` has every `field=value` of a field selector (`spec.nodeName=a,b.c=d`); a
/// field the object lacks never matches.
pub fn fields_match(selector: &str, object: &Value) -> bool {
    selector
        .split(',')
        .filter(|t| !t.is_empty())
        .all(|term| match term.split_once('=') {
            Some((field, value)) => {
                let found = field.split('.').try_fold(object, |o, part| o.get(part));
                found.and_then(Value::as_str) == Some(value)
            }
            None => false,
        })
}

/// `a=b,c!=d,e,!f` against `labels`.
pub fn selects(selector: &str, labels: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let term = term.trim();
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k.trim_end_matches('=')].as_str() == Some(v.trim_start_matches('='))
        } else if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else {
            labels.get(term).is_some()
        }
    })
}

/// How a PATCH body applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
}

/// The finalizer kube-apiserver puts on an object deleted with `propagationPolicy:
/// Foreground`; the garbage collector removes it once the dependents are gone.
pub const FOREGROUND_DELETION: &str = "foregroundDeletion";

/// RFC 6901 pointer `/a/b/0` into (parent pointer, last token), tokens unescaped.
fn split_pointer(pointer: &str) -> Option<(Vec<String>, String)> {
    let mut tokens: Vec<String> = pointer
        .strip_prefix('/')?
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let last = tokens.pop()?;
    Some((tokens, last))
}

fn walk<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |at, t| match at {
        Value::Object(map) => map.get_mut(t),
        Value::Array(items) => t.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

/// RFC 6902 JSON patch with the operations controllers send (`test`, `add`, `remove`,
/// `replace`), applied as kube-apiserver's library does: a `test` of a missing member
/// passes only for `null`. `Err` names the failed operation.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops.as_array().ok_or("a JSON patch is an array")?;
    for op in ops {
        let kind = op["op"].as_str().unwrap_or_default();
        let path = op["path"].as_str().unwrap_or_default();
        let (parent, last) = split_pointer(path).ok_or(format!("bad path {path}"))?;
        let at = walk(target, &parent).ok_or(format!("missing path: {path}"))?;
        let failed = |why: &str| format!("{kind} operation does not apply: {why}: {path}");
        match kind {
            "test" => {
                let current = match at {
                    Value::Object(map) => map.get(&last).cloned(),
                    Value::Array(items) => last
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| items.get(i).cloned()),
                    _ => None,
                };
                let want = &op["value"];
                let ok = match current {
                    None => want.is_null(),
                    Some(v) => v == *want,
                };
                if !ok {
                    return Err(format!("testing value {path} failed"));
                }
            }
            "add" | "replace" => {
                let value = op["value"].clone();
                match at {
                    Value::Object(map) => {
                        if kind == "replace" && !map.contains_key(&last) {
                            return Err(failed("missing path"));
                        }
                        map.insert(last, value);
                    }
                    Value::Array(items) => {
                        let i = if last == "-" {
                            items.len()
                        } else {
                            last.parse::<usize>().map_err(|_| failed("bad index"))?
                        };
                        match kind {
                            "add" if i <= items.len() => items.insert(i, value),
                            "replace" if i < items.len() => items[i] = value,
                            _ => return Err(failed("index out of range")),
                        }
                    }
                    _ => return Err(failed("not a container")),
                }
            }
            "remove" => match at {
                Value::Object(map) => {
                    map.remove(&last).ok_or(failed("missing path"))?;
                }
                Value::Array(items) => {
                    let i = last.parse::<usize>().map_err(|_| failed("bad index"))?;
                    if i >= items.len() {
                        return Err(failed("index out of range"));
                    }
                    items.remove(i);
                }
                _ => return Err(failed("not a container")),
            },
            other => return Err(format!("operation {other} is not supported here")),
        }
    }
    Ok(())
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().expect("object");
    for (k, v) in patch {
        if v.is_null() {
            map.remove(k);
        } else {
            merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

impl ObjectStore {
    /// A store whose `with_status` resources (plurals) have a status subresource.
    pub fn new(with_status: &[&str]) -> Self {
        ObjectStore {
            hold_foreground: false,
            objects: BTreeMap::new(),
            version: 1000,
            log: Vec::new(),
            with_status: with_status.iter().map(|s| s.to_string()).collect(),
            next_uid: 0,
            changes: tokio::sync::broadcast::channel(1 << 16).0,
            managed_by: None,
        }
    }

    /// Stores `object` at `target` as if it had been created earlier: name and namespace
    /// from the path, its own `metadata.uid` kept (one is assigned when it has none), a new
    /// resourceVersion. Replaces whatever was there.
    pub fn seed(&mut self, target: &Target, mut object: Value) -> Value {
        let key = target.key();
        object["metadata"]["name"] = json!(key.3);
        if !key.2.is_empty() {
            object["metadata"]["namespace"] = json!(key.2);
        }
        if object["metadata"]["uid"].is_null() {
            self.next_uid += 1;
            object["metadata"]["uid"] =
                json!(format!("00000000-0000-4000-8000-{:012x}", self.next_uid));
        }
        if object["metadata"]["creationTimestamp"].is_null() {
            object["metadata"]["creationTimestamp"] = json!(now());
        }
        self.bump(&mut object);
        let kind = match self.objects.insert(key.clone(), object.clone()) {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        self.record(key, kind, object.clone());
        object
    }

    fn record(&mut self, key: Key, kind: &'static str, object: Value) {
        let change = Change {
            version: self.version,
            at: std::time::Instant::now(),
            key,
            kind,
            object,
        };
        self.log.push(change.clone());
        let _ = self.changes.send(change);
    }

    fn bump(&mut self, object: &mut Value) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        if let Some(manager) = &self.managed_by {
            object["metadata"]["managedFields"] =
                json!([{"manager": manager, "operation": "Update"}]);
        }
    }

    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of `prefix/resource` in `namespace` (every one when `None`) whose labels
    /// match `selector`.
    pub fn list(
        &self,
        prefix: &str,
        resource: &str,
        namespace: Option<&str>,
        selector: &str,
    ) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((p, r, ns, _), o)| {
                p == prefix
                    && r == resource
                    && namespace.is_none_or(|n| n == ns)
                    && selects(selector, &o["metadata"]["labels"])
            })
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Creates `object` at `target` (namespace from the path).
    pub fn create(&mut self, target: &Target, mut object: Value) -> (u16, Value) {
        let namespace = target.namespace.clone().unwrap_or_default();
        let name = match (
            object["metadata"]["name"].as_str(),
            object["metadata"]["generateName"].as_str(),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) => {
                self.next_uid += 1;
                format!("{prefix}{:05x}", self.next_uid)
            }
            _ => {
                return status(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                );
            }
        };
        let key: Key = (
            target.prefix.clone(),
            target.resource.clone(),
            namespace.clone(),
            name.clone(),
        );
        if self.objects.contains_key(&key) {
            let message = format!("{} \"{name}\" already exists", target.resource);
            let (code, mut body) = status(409, "AlreadyExists", &message);
            body["details"] = json!({"name": name, "kind": target.resource});
            return (code, body);
        }
        self.next_uid += 1;
        object["metadata"]["name"] = json!(name);
        if !namespace.is_empty() {
            object["metadata"]["namespace"] = json!(namespace);
        }
        object["metadata"]["uid"] =
            json!(format!("00000000-0000-4000-8000-{:012x}", self.next_uid));
        object["metadata"]["creationTimestamp"] = json!(now());
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("deletionTimestamp");
        }
        self.bump(&mut object);
        self.objects.insert(key.clone(), object.clone());
        self.record(key, "ADDED", object.clone());
        (201, object)
    }

    /// A PUT (`patch == None`) or PATCH of `target`, of its status subresource when the
    /// target names it.
    pub fn update(
        &mut self,
        target: &Target,
        body: &Value,
        patch: Option<PatchKind>,
    ) -> (u16, Value) {
        let key = target.key();
        let Some(current) = self.objects.get(&key).cloned() else {
            let message = format!("{} \"{}\" not found", target.resource, key.3);
            let (code, mut body) = status(404, "NotFound", &message);
            body["details"] = json!({"name": key.3, "kind": target.resource});
            return (code, body);
        };
        let sent = &body["metadata"]["resourceVersion"];
        if !sent.is_null() && *sent != current["metadata"]["resourceVersion"] {
            let message = format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                target.resource, key.3
            );
            return status(409, "Conflict", &message);
        }
        let mut next = match patch {
            Some(PatchKind::Merge) => {
                let mut next = current.clone();
                merge_patch(&mut next, body);
                next
            }
            Some(PatchKind::Json) => {
                let mut next = current.clone();
                if let Err(why) = json_patch(&mut next, body) {
                    return status(422, "Invalid", &why);
                }
                next
            }
            None => body.clone(),
        };
        let status_write = target.subresource.as_deref() == Some("status");
        if status_write {
            let new_status = next["status"].clone();
            next = current.clone();
            next["status"] = new_status;
        } else {
            if self.with_status.contains(&target.resource) {
                match current.get("status") {
                    Some(s) => next["status"] = s.clone(),
                    None => {
                        if let Some(o) = next.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "name",
                "namespace",
            ] {
                match current["metadata"].get(field) {
                    Some(v) => next["metadata"][field] = v.clone(),
                    None => {
                        if let Some(m) = next["metadata"].as_object_mut() {
                            m.remove(field);
                        }
                    }
                }
            }
        }
        let deleting = !current["metadata"]["deletionTimestamp"].is_null();
        let finalizers = |o: &Value| -> Vec<Value> {
            o["metadata"]["finalizers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        let added: Vec<Value> = finalizers(&next)
            .into_iter()
            .filter(|f| !finalizers(&current).contains(f))
            .collect();
        if deleting && !added.is_empty() {
            let message = format!(
                "{} \"{}\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be \
                 added if the object is being deleted, found new finalizers {}",
                target.resource,
                key.3,
                Value::Array(added)
            );
            return status(422, "Invalid", &message);
        }
        let finalizers_left = next["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        self.bump(&mut next);
        if deleting && !finalizers_left {
            self.objects.remove(&key);
            self.record(key, "DELETED", next.clone());
            return (200, next);
        }
        self.objects.insert(key.clone(), next.clone());
        self.record(key, "MODIFIED", next.clone());
        (200, next)
    }

    /// Removes `key` outright, finalizers or not (a test playing whoever removes them);
    /// what was there.
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut gone = self.objects.remove(key)?;
        self.bump(&mut gone);
        self.record(key.clone(), "DELETED", gone.clone());
        Some(gone)
    }

    /// Every object of `prefix/resource` (cluster-scoped or in any namespace), by name.
    pub fn by_name(&self, prefix: &str, resource: &str) -> BTreeMap<String, Value> {
        self.list(prefix, resource, None, "")
            .into_iter()
            .map(|o| (o["metadata"]["name"].as_str().unwrap_or_default().into(), o))
            .collect()
    }

    /// Removes every object of `prefix/resource` outright ([`ObjectStore::remove`]), as the
    /// kubelet deletes a node's ResourceSlices when it starts.
    pub fn remove_all(&mut self, prefix: &str, resource: &str) {
        let keys: Vec<Key> = self
            .objects
            .keys()
            .filter(|(p, r, _, _)| p == prefix && r == resource)
            .cloned()
            .collect();
        for key in keys {
            self.remove(&key);
        }
    }

    /// What the garbage collector does once the dependents of an object deleted in the
    /// foreground are gone: removes [`FOREGROUND_DELETION`] (the object goes with its last
    /// finalizer). `false` when there is no such object.
    pub fn finish_foreground_deletion(&mut self, key: &Key) -> bool {
        let Some(current) = self.objects.get(key) else {
            return false;
        };
        let finalizers: Vec<Value> = current["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != FOREGROUND_DELETION)
            .collect();
        let target = Target {
            prefix: key.0.clone(),
            resource: key.1.clone(),
            namespace: Some(key.2.clone()).filter(|n| !n.is_empty()),
            name: Some(key.3.clone()),
            subresource: None,
        };
        let patch = json!({"metadata": {"finalizers": finalizers}});
        self.update(&target, &patch, Some(PatchKind::Merge)).0 == 200
    }

    /// Deletes `key`: at once without finalizers, else marks it deleting; `foreground`
    /// (`propagationPolicy: Foreground`) adds [`FOREGROUND_DELETION`] first.
    pub fn delete(
        &mut self,
        key: &Key,
        precondition_uid: Option<&str>,
        foreground: bool,
    ) -> (u16, Value) {
        let Some(current) = self.objects.get(key).cloned() else {
            let message = format!("{} \"{}\" not found", key.1, key.3);
            let (code, mut body) = status(404, "NotFound", &message);
            body["details"] = json!({"name": key.3, "kind": key.1});
            return (code, body);
        };
        if let Some(uid) = precondition_uid
            && current["metadata"]["uid"] != json!(uid)
        {
            return status(409, "Conflict", "Precondition failed: UID in precondition");
        }
        let mut next = current.clone();
        let deleting = !current["metadata"]["deletionTimestamp"].is_null();
        if foreground && !deleting && self.hold_foreground {
            let mut finalizers = next["metadata"]["finalizers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !finalizers.contains(&json!(FOREGROUND_DELETION)) {
                finalizers.push(json!(FOREGROUND_DELETION));
            }
            next["metadata"]["finalizers"] = Value::Array(finalizers);
        }
        let has_finalizers = next["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if !deleting {
                next["metadata"]["deletionTimestamp"] = json!(now());
                self.bump(&mut next);
                self.objects.insert(key.clone(), next.clone());
                self.record(key.clone(), "MODIFIED", next.clone());
            }
            return (200, next);
        }
        self.bump(&mut next);
        self.objects.remove(key);
        self.record(key.clone(), "DELETED", next.clone());
        (200, next)
    }
}
