//! Looking a prepared claim up again, for orphan reconciliation: is it still there, still the
//! same object, still allocated here and still reserved for a pod?
//!
//! Unlike [`super::ClaimReader::fetch`], a missing claim is an answer here, not an error, and
//! only a *real* "not found" counts: a `404` whose `Status` names this claim
//! (`details.name`, `details.kind: resourceclaims`). The API server answers a path it does not
//! serve at all (an API group or version turned off, a proxy in front of it) with a `404`
//! `NotFound` too, but with empty `details`; taking that for "deleted" would unprepare every
//! claim on the node.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::GetParams;
use kube::{Api, Client};

use super::claims::reserved_pods;
use super::error::{ClaimRef, K8sError, Step};

/// What the API server says about a claim the node has prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// No object of that name: a `404` naming the claim.
    Gone,
    /// An object of that name.
    Found {
        /// Its `metadata.uid`.
        uid: String,
        /// Whether its allocation has a device of this driver in this node's pool.
        allocated_here: bool,
        /// Whether `status.reservedFor` names at least one pod.
        reserved_for_pod: bool,
    },
}

/// How fresh an answer must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// From the API server's watch cache (`resourceVersion=0`): cheap, possibly a little
    /// behind. Good for noticing a candidate.
    Cached,
    /// A quorum read from etcd: what acting on the answer needs.
    Quorum,
}

/// Looks claims up for one driver on one node.
#[derive(Clone)]
pub struct ClaimLookup {
    client: Client,
    driver: String,
    pool: String,
}

impl ClaimLookup {
    /// A lookup judging allocations of `driver` in `pool` (the node name).
    pub fn new(client: Client, driver: impl Into<String>, pool: impl Into<String>) -> Self {
        ClaimLookup {
            client,
            driver: driver.into(),
            pool: pool.into(),
        }
    }

    /// Reads claim `claim.namespace/claim.name` and says what state it is in.
    ///
    /// One request, not retried.
    ///
    /// # Errors
    /// [`K8sError::Api`] for any error status other than a `404` naming this claim (a `404`
    /// for an unserved path included), [`K8sError::Unreachable`] or [`K8sError::Protocol`]
    /// otherwise, all for [`Step::GetClaim`]. None of them means the claim is gone.
    pub async fn state(
        &self,
        claim: &ClaimRef,
        freshness: Freshness,
    ) -> Result<ClaimState, K8sError> {
        let api = Api::<ResourceClaim>::namespaced(self.client.clone(), &claim.namespace);
        let params = match freshness {
            Freshness::Cached => GetParams::any(),
            Freshness::Quorum => GetParams::default(),
        };
        match api.get_with(&claim.name, &params).await {
            Ok(found) => Ok(judge(&found, &self.driver, &self.pool)),
            Err(kube::Error::Api(status)) if names_claim(&status, &claim.name) => {
                Ok(ClaimState::Gone)
            }
            Err(e) => Err(K8sError::from_kube(
                Step::GetClaim {
                    claim: Box::new(claim.clone()),
                },
                e,
            )),
        }
    }
}

/// Whether `status` is the API server's "this claim does not exist": `404 NotFound` with
/// details naming the claim among `resourceclaims`.
pub fn names_claim(status: &kube::core::Status, name: &str) -> bool {
    status.code == 404
        && status.reason == "NotFound"
        && status
            .details
            .as_ref()
            .is_some_and(|d| d.name == name && d.kind == "resourceclaims")
}

/// The state of `claim` for `driver` in `pool`. Pure.
pub fn judge(claim: &ResourceClaim, driver: &str, pool: &str) -> ClaimState {
    let allocated_here = crate::alloc::allocation_results(claim)
        .iter()
        .any(|r| r.driver == driver && r.pool == pool);
    ClaimState::Found {
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        allocated_here,
        reserved_for_pod: !reserved_pods(claim).is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(results: serde_json::Value, reserved: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
        }))
        .unwrap()
    }

    fn status(code: u16, reason: &str, details: Option<(&str, &str)>) -> kube::core::Status {
        let mut value = serde_json::json!({"status": "Failure", "code": code, "reason": reason,
                                           "message": "m", "metadata": {}});
        if let Some((name, kind)) = details {
            value["details"] = serde_json::json!({"name": name, "kind": kind,
                                                  "group": "resource.k8s.io"});
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn only_a_not_found_that_names_the_claim_means_it_is_gone() {
        let cases = [
            (status(404, "NotFound", Some(("c", "resourceclaims"))), true),
            // The API server's answer for a path it does not serve.
            (status(404, "NotFound", None), false),
            (
                status(404, "NotFound", Some(("other", "resourceclaims"))),
                false,
            ),
            (
                status(404, "NotFound", Some(("c", "resourceslices"))),
                false,
            ),
            (
                status(403, "Forbidden", Some(("c", "resourceclaims"))),
                false,
            ),
            (status(500, "InternalError", None), false),
        ];
        let got: Vec<bool> = cases.iter().map(|(s, _)| names_claim(s, "c")).collect();
        let want: Vec<bool> = cases.iter().map(|(_, w)| *w).collect();
        assert_eq!(want, got);
    }

    #[test]
    fn a_claim_is_allocated_here_only_with_a_result_of_this_driver_in_this_pool() {
        let result = |driver: &str, pool: &str| serde_json::json!({"request": "r", "driver": driver, "pool": pool, "device": "gpu-0"});
        let pod = serde_json::json!([{"resource": "pods", "name": "p", "uid": "pu"}]);
        let cases = [
            (serde_json::json!([result("gpu.nvidia.com", "node")]), true),
            (
                serde_json::json!([result("gpu.nvidia.com", "other")]),
                false,
            ),
            (serde_json::json!([result("other.com", "node")]), false),
            (serde_json::json!([]), false),
        ];
        for (results, want) in cases {
            let got = judge(
                &claim(results.clone(), pod.clone()),
                "gpu.nvidia.com",
                "node",
            );
            assert_eq!(
                ClaimState::Found {
                    uid: "u1".into(),
                    allocated_here: want,
                    reserved_for_pod: true
                },
                got,
                "{results}"
            );
        }
    }

    #[test]
    fn only_pods_count_as_reservations() {
        let results =
            serde_json::json!([{"request": "r", "driver": "d", "pool": "p", "device": "x"}]);
        let other = serde_json::json!([{"apiGroup": "example.com", "resource": "jobs",
                                        "name": "j", "uid": "ju"}]);
        for (reserved, want) in [(serde_json::json!([]), false), (other, false)] {
            let ClaimState::Found {
                reserved_for_pod, ..
            } = judge(&claim(results.clone(), reserved), "d", "p")
            else {
                panic!("found")
            };
            assert_eq!(want, reserved_for_pod);
        }
    }
}
