//! Writing this driver's entries of a ResourceClaim's `status.devices` (KEP-4817,
//! `resource.k8s.io/v1` `AllocatedDeviceStatus`): one entry per prepared device, with a
//! `Ready` condition and driver data.
//!
//! # How the write is made, and why
//!
//! `GET` the claim, replace this driver's entries in this node's pool, `PUT` the status
//! subresource with the `resourceVersion` read; a `409 Conflict` (someone else wrote the claim
//! meanwhile) is transient and the caller tries again from a fresh read.
//!
//! - *Correct with other drivers' entries*: every entry of another driver (or of this driver
//!   in another pool) is sent back exactly as read, as raw JSON (the claim is read as a
//!   [`DynamicObject`], so fields this client's types do not know survive the round trip),
//!   and the `resourceVersion` guard turns a concurrent write into a conflict instead of a
//!   lost update. Entries this driver left behind under an older field manager are still
//!   ours to clean, which server-side apply would not do.
//! - *The same claim*: the write goes only to the object whose UID the kubelet named; a claim
//!   deleted and re-created under the same name is left alone ([`SyncOutcome::ClaimGone`]).
//! - *Least permission*: `get` on `resourceclaims` is granted for prepare already; this adds
//!   `update` on `resourceclaims/status` and, for Kubernetes 1.36's granular status
//!   authorization, `associated-node:update` on `resourceclaims/driver` with
//!   `resourceNames: [<driver>]`. Server-side apply would need the same two verbs spelt
//!   `patch`, so it saves nothing.
//!
//! Where that second permission comes from (Kubernetes 1.36 source): the status strategy's
//! `ValidateUpdate` (`pkg/registry/resource/resourceclaim/strategy.go`) calls
//! `AuthorizedForDeviceStatus` (`pkg/registry/resource/utils.go`), which, for every driver
//! whose entries an update adds, removes or changes (`getModifiedDrivers`), checks verb
//! `associated-node:<request verb>` — then `arbitrary-node:<request verb>` — on
//! `resourceclaims/driver` with the driver name as resource name (`checkDriverAuthorization`).
//! The `associated-node:` verb is only tried when the caller is a service account whose token
//! carries the `authentication.kubernetes.io/node-name` extra equal to the node in the
//! claim's single-node allocation (`saAssociatedWithAllocatedNode`, `nodeNameFromAllocation`).
//! A refusal comes back as `422 Invalid` with `Forbidden: changing status.devices requires
//! ...`. Leaving `status.allocation` and `status.reservedFor` untouched keeps
//! `AuthorizedForBinding` (which wants `resourceclaims/binding`) out of the way.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{Map, Value, json};

use super::claims::LeanObject;
use super::error::{ClaimRef, K8sError, Step};

/// The field manager named in the writes (`managedFields`), as for the slices.
pub const FIELD_MANAGER: &str = "gpu-dra";

/// The condition type every entry carries.
pub const READY: &str = "Ready";

/// Largest `data` the API server accepts per entry, in bytes of JSON.
pub const MAX_DATA_BYTES: usize = 10 * 1024;

/// Largest condition `message` the API server accepts, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;

/// A condition's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl ConditionStatus {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// The `Ready` condition of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// True once prepared and healthy.
    pub status: ConditionStatus,
    /// CamelCase reason (`Prepared`, `Unhealthy`, …).
    pub reason: String,
    /// Detail for humans; cut to [`MAX_MESSAGE_BYTES`] when written.
    pub message: String,
}

/// One `status.devices` entry as this driver wants it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceStatus {
    /// Pool (this node's).
    pub pool: String,
    /// Device name.
    pub device: String,
    /// The allocation's share, for consumable capacity.
    pub share_id: Option<String>,
    /// The `Ready` condition.
    pub ready: Readiness,
    /// Driver data: a JSON object of at most [`MAX_DATA_BYTES`] once encoded.
    pub data: Value,
}

/// What one [`ClaimStatusWriter::sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The status was written.
    Written,
    /// The claim already showed what was wanted; nothing was written.
    Unchanged,
    /// The claim is deleted, re-created under another UID, or no longer allocated: there is
    /// nothing to write to (the API server drops a deallocated claim's entries itself).
    ClaimGone,
}

/// Writes this driver's `status.devices` entries of claims in one pool.
#[derive(Clone)]
pub struct ClaimStatusWriter {
    client: Client,
    driver: String,
    pool: String,
}

impl ClaimStatusWriter {
    /// A writer of `driver`'s entries in `pool` (the node name).
    pub fn new(client: Client, driver: impl Into<String>, pool: impl Into<String>) -> Self {
        ClaimStatusWriter {
            client,
            driver: driver.into(),
            pool: pool.into(),
        }
    }

    /// Makes this driver's entries of `claim` in this pool be exactly `want` (empty: none),
    /// leaving every other entry and field as it is. `now` stamps conditions whose status
    /// changes.
    ///
    /// One read and at most one write, not retried. Fails with [`K8sError::Api`] /
    /// [`K8sError::Unreachable`] / [`K8sError::Protocol`] for [`Step::GetClaim`] or
    /// [`Step::UpdateClaimStatus`]; a `409` conflict ([`K8sError::is_transient`]) means
    /// another writer got there first: call again.
    pub async fn sync(
        &self,
        claim: &ClaimRef,
        want: &[DeviceStatus],
        now: &str,
    ) -> Result<SyncOutcome, K8sError> {
        self.sync_from(claim, want, now, None)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`ClaimStatusWriter::sync`] starting from `known`, the claim as last read or written
    /// (the read of the prepare that is being reported, or what the previous write of its
    /// status returned), so no read is needed: the write carries `known`'s resourceVersion,
    /// and when someone wrote the claim since, the server refuses it (`409`) and the claim is
    /// read afresh and written once more. `known` already showing `want` means nothing is
    /// sent. Returns the outcome and the claim as it now is on the server, when known, for
    /// the next call.
    pub async fn sync_from(
        &self,
        claim: &ClaimRef,
        want: &[DeviceStatus],
        now: &str,
        known: Option<DynamicObject>,
    ) -> Result<(SyncOutcome, Option<DynamicObject>), K8sError> {
        let resource = ApiResource::erase::<ResourceClaim>(&());
        let writes =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &claim.namespace, &resource);
        let known = known.filter(|o| o.metadata.uid.as_deref() == Some(claim.uid.as_str()));
        if let Some(object) = known {
            match self.write(&writes, claim, want, now, object).await {
                Err(kube::Error::Api(status)) if status.is_conflict() => {}
                done => return self.outcome(claim, done),
            }
        }
        crate::cost::count(crate::cost::Cost::ApiRequest);
        // Read as the prepare reads it: one pass, without the managed fields a write never
        // sends.
        let api =
            Api::<LeanObject>::namespaced_with(self.client.clone(), &claim.namespace, &resource);
        let found = match api.get_opt(&claim.name).await {
            Ok(found) => found.map(|LeanObject(object)| object),
            Err(e) => {
                let step = Step::GetClaim {
                    claim: Box::new(claim.clone()),
                };
                return Err(K8sError::from_kube(step, e));
            }
        };
        let Some(object) = found else {
            return Ok((SyncOutcome::ClaimGone, None));
        };
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Ok((SyncOutcome::ClaimGone, None));
        }
        let written = self.write(&writes, claim, want, now, object).await;
        self.outcome(claim, written)
    }

    /// The write's result in this module's terms.
    fn outcome(
        &self,
        claim: &ClaimRef,
        written: Result<(SyncOutcome, Option<DynamicObject>), kube::Error>,
    ) -> Result<(SyncOutcome, Option<DynamicObject>), K8sError> {
        match written {
            Ok(done) => Ok(done),
            Err(kube::Error::Api(status)) if status.is_not_found() => {
                Ok((SyncOutcome::ClaimGone, None))
            }
            Err(e) => {
                let step = Step::UpdateClaimStatus {
                    claim: Box::new(claim.clone()),
                };
                Err(K8sError::from_kube(step, e))
            }
        }
    }

    /// Writes `want` into `object` (the claim as read or last written) with its
    /// resourceVersion, unless it already shows `want` or is no longer allocated.
    async fn write(
        &self,
        api: &Api<DynamicObject>,
        claim: &ClaimRef,
        want: &[DeviceStatus],
        now: &str,
        mut object: DynamicObject,
    ) -> Result<(SyncOutcome, Option<DynamicObject>), kube::Error> {
        let status = object.data.get("status").unwrap_or(&Value::Null);
        if status.get("allocation").is_none_or(Value::is_null) {
            return Ok((SyncOutcome::ClaimGone, None));
        }
        let generation = object.metadata.generation;
        let Some(devices) = merge(status, &self.driver, &self.pool, want, generation, now) else {
            return Ok((SyncOutcome::Unchanged, Some(object)));
        };
        let status = object
            .data
            .as_object_mut()
            .and_then(|o| o.get_mut("status"))
            .and_then(Value::as_object_mut);
        if let Some(status) = status {
            if devices.is_empty() {
                status.remove("devices");
            } else {
                status.insert("devices".to_string(), Value::Array(devices));
            }
        }
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        // managedFields are not sent: the server keeps the live ones when a request has
        // none (an empty list never resets them), and the ones we hold go stale with our
        // own write.
        object.metadata.managed_fields = None;
        let body = serde_json::to_vec(&object).map_err(kube::Error::SerdeError)?;
        let mut request = kube::core::Request::new(api.resource_url())
            .replace_subresource("status", &claim.name, &params, body)
            .map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("replace_status");
        crate::cost::count(crate::cost::Cost::ApiRequest);
        let answer = self.client.request_text(request).await?;
        // The claim as written is the object sent with the server's new resourceVersion:
        // only that is read from the answer, not the whole claim again.
        let written: Written = serde_json::from_str(&answer).map_err(kube::Error::SerdeError)?;
        object.metadata.resource_version = written.metadata.resource_version;
        Ok((SyncOutcome::Written, Some(object)))
    }
}

/// What is read of the claim the server answers a status write with.
#[derive(serde::Deserialize)]
struct Written {
    metadata: WrittenMeta,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    resource_version: Option<String>,
}

/// The claim's new `status.devices` list, or `None` when `status` already shows `want`.
///
/// Entries of other drivers, and of `driver` in other pools, are kept as they are and in their
/// order; this driver's entries in `pool` follow, in `want`'s order. A condition keeps its
/// `lastTransitionTime` while its status stays the same; otherwise it gets `now`.
/// `observedGeneration` is the claim's `generation`. Pure.
pub fn merge(
    status: &Value,
    driver: &str,
    pool: &str,
    want: &[DeviceStatus],
    generation: Option<i64>,
    now: &str,
) -> Option<Vec<Value>> {
    let current: Vec<Value> = status
        .get("devices")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ours = |e: &Value| e["driver"] == json!(driver) && e["pool"] == json!(pool);
    let mut next: Vec<Value> = current.iter().filter(|e| !ours(e)).cloned().collect();
    for w in want {
        let before = current.iter().find(|e| {
            ours(e) && e["device"] == json!(w.device) && e.get("shareID") == share_json(w).as_ref()
        });
        next.push(entry(driver, w, before, generation, now));
    }
    (next != current).then_some(next)
}

fn share_json(w: &DeviceStatus) -> Option<Value> {
    w.share_id.as_ref().map(|s| json!(s))
}

fn entry(
    driver: &str,
    w: &DeviceStatus,
    before: Option<&Value>,
    generation: Option<i64>,
    now: &str,
) -> Value {
    let previous_ready = before
        .and_then(|e| e["conditions"].as_array())
        .and_then(|c| c.iter().find(|c| c["type"] == json!(READY)));
    let since = match previous_ready {
        Some(c) if c["status"] == json!(w.ready.status.as_str()) => c["lastTransitionTime"].clone(),
        _ => json!(now),
    };
    let mut condition = Map::new();
    condition.insert("type".into(), json!(READY));
    condition.insert("status".into(), json!(w.ready.status.as_str()));
    if let Some(generation) = generation {
        condition.insert("observedGeneration".into(), json!(generation));
    }
    condition.insert("lastTransitionTime".into(), since);
    condition.insert("reason".into(), json!(w.ready.reason));
    condition.insert(
        "message".into(),
        json!(cut(&w.ready.message, MAX_MESSAGE_BYTES)),
    );
    let mut e = Map::new();
    e.insert("driver".into(), json!(driver));
    e.insert("pool".into(), json!(w.pool));
    e.insert("device".into(), json!(w.device));
    if let Some(share) = &w.share_id {
        e.insert("shareID".into(), json!(share));
    }
    e.insert("conditions".into(), json!([Value::Object(condition)]));
    e.insert("data".into(), w.data.clone());
    Value::Object(e)
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
#[path = "claim_status_tests.rs"]
mod tests;
