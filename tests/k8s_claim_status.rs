//! Writing a claim's `status.devices` through a real `kube::Client` against the fake API
//! server: one read and one status `PUT`, fields this client does not know kept, nothing
//! written when nothing changed, a re-created or deleted claim left alone, conflicts
//! transient and refusals permanent.

mod k8s_support;

use gpu_dra::k8s::{
    ClaimRef, ClaimStatusWriter, ConditionStatus, DeviceStatus, K8sError, Readiness, Step,
    SyncOutcome,
};
use k8s_support::fixtures::{self, DRIVER};
use k8s_support::{Answer, FakeApi, Fault};
use serde_json::{Value, json};

const POOL: &str = "node-a";
const NOW: &str = "2026-11-25T10:00:00Z";
const PATH: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/training";

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "team".into(),
        name: "training".into(),
        uid: uid.into(),
    }
}

/// An allocated claim of `gpu-0`, with fields newer than this client's types.
fn stored() -> (String, Value) {
    let status = json!({
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": POOL,
                                     "device": "gpu-0", "fromTheFuture": {"x": 1}}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [POOL]}]}]},
            "allocationTimestamp": "2026-11-25T09:00:00Z"
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
        "somethingNew": "kept"
    });
    fixtures::claim("team", "training", "uid-1", status)
}

fn want() -> Vec<DeviceStatus> {
    vec![DeviceStatus {
        pool: POOL.into(),
        device: "gpu-0".into(),
        share_id: None,
        ready: Readiness {
            status: ConditionStatus::True,
            reason: "Prepared".into(),
            message: String::new(),
        },
        data: json!({"type": "gpu", "uuid": "GPU-1"}),
    }]
}

fn writer() -> (FakeApi, ClaimStatusWriter) {
    let (fake, client) = FakeApi::start(vec![stored()]);
    (fake, ClaimStatusWriter::new(client, DRIVER, POOL))
}

fn lines(fake: &FakeApi) -> Vec<String> {
    fake.take_requests().iter().map(|r| r.line()).collect()
}

#[tokio::test]
async fn a_write_reads_once_puts_the_status_and_keeps_fields_this_client_does_not_know() {
    let (fake, writer) = writer();
    let before = fake.object(PATH).unwrap();
    let got = writer
        .sync(&claim_ref("uid-1"), &want(), NOW)
        .await
        .unwrap();
    assert_eq!(SyncOutcome::Written, got);
    assert_eq!(
        vec![format!("GET {PATH}"), format!("PUT {PATH}/status")],
        lines(&fake)
    );
    let after = fake.object(PATH).unwrap();
    let mut expected = before["status"].clone();
    expected["devices"] = json!([{
        "driver": DRIVER, "pool": POOL, "device": "gpu-0",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": NOW,
                        "reason": "Prepared", "message": ""}],
        "data": {"type": "gpu", "uuid": "GPU-1"}
    }]);
    assert_eq!(expected, after["status"]);
}

#[tokio::test]
async fn a_second_sync_with_nothing_new_only_reads() {
    let (fake, writer) = writer();
    writer
        .sync(&claim_ref("uid-1"), &want(), NOW)
        .await
        .unwrap();
    fake.take_requests();
    let got = writer
        .sync(&claim_ref("uid-1"), &want(), "2026-11-25T11:00:00Z")
        .await
        .unwrap();
    assert_eq!(SyncOutcome::Unchanged, got);
    assert_eq!(vec![format!("GET {PATH}")], lines(&fake));
}

#[tokio::test]
async fn a_recreated_or_deleted_claim_is_left_alone() {
    let (fake, writer) = writer();
    let got = writer
        .sync(&claim_ref("uid-of-the-old-claim"), &want(), NOW)
        .await
        .unwrap();
    assert_eq!(SyncOutcome::ClaimGone, got);
    assert_eq!(vec![format!("GET {PATH}")], lines(&fake));

    let (fake, client) = FakeApi::start(vec![]);
    let writer = ClaimStatusWriter::new(client, DRIVER, POOL);
    let got = writer.sync(&claim_ref("uid-1"), &[], NOW).await.unwrap();
    assert_eq!(SyncOutcome::ClaimGone, got);
    assert_eq!(vec![format!("GET {PATH}")], lines(&fake));
}

#[tokio::test]
async fn a_conflict_is_transient_and_the_next_sync_writes_from_a_fresh_read() {
    let (fake, writer) = writer();
    fake.fail(Fault::new(
        "PUT",
        "status",
        Answer::Status(409, "Conflict", "the object has been modified".into()),
    ));
    let error = writer
        .sync(&claim_ref("uid-1"), &want(), NOW)
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(
        matches!(
            &error,
            K8sError::Api {
                step: Step::UpdateClaimStatus { .. },
                code: 409,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        "writing the status.devices of ResourceClaim team/training (uid-1) was refused by the \
         API server (409 Conflict): the object has been modified",
        error.to_string()
    );
    let got = writer
        .sync(&claim_ref("uid-1"), &want(), NOW)
        .await
        .unwrap();
    assert_eq!(SyncOutcome::Written, got);
}

#[tokio::test]
async fn a_missing_permission_is_permanent() {
    let (fake, writer) = writer();
    // What the API server answers a plugin without resourceclaims/driver permission.
    let message = "ResourceClaim.resource.k8s.io \"training\" is invalid: status.devices: \
                   Forbidden: changing status.devices requires resource=\"resourceclaims/driver\", \
                   verb=\"[associated-node:update arbitrary-node:update]\" permission";
    fake.fail(Fault::new(
        "PUT",
        "status",
        Answer::Status(422, "Invalid", message.into()),
    ));
    let error = writer
        .sync(&claim_ref("uid-1"), &want(), NOW)
        .await
        .unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("resourceclaims/driver"),
        "{error}"
    );
}
