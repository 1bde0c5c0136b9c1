//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several controller
//! replicas exactly one writes (the one holding the lease).
//!
//! The rules are client-go's `leaderelection`: a candidate takes the Lease when nobody holds
//! it or when its holder has not renewed it for `leaseDurationSeconds` *as this candidate
//! observed* (the time since it last saw the record change, so clocks need not agree); the
//! holder renews every retry period; every write carries the `resourceVersion` read, so of
//! two candidates racing for the same Lease the API server lets exactly one win (the other
//! gets 409 Conflict). A holder that cannot renew within the renew deadline stops leading.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};

use super::error::ControllerError;

/// Timing of the election, client-go's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease holds without renewal (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This candidate holds the lease (acquired or renewed it).
    Leading,
    /// Another candidate holds it.
    Following {
        /// The holder's identity.
        holder: String,
    },
}

/// One candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The last record seen (holder, renew time, transitions) and when it was first seen.
    observed: Option<(Observed, Instant)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    holder: String,
    renew_time: Option<String>,
    transitions: i32,
}

fn observed(lease: &Lease) -> Observed {
    let spec = lease.spec.clone().unwrap_or_default();
    Observed {
        holder: spec.holder_identity.unwrap_or_default(),
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

impl Elector {
    /// A candidate `identity` for Lease `namespace/name`.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: Timing,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            timing,
            observed: None,
        }
    }

    /// The identity this candidate writes as `holderIdentity`.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The election's timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew: at most one GET and one write.
    ///
    /// # Errors
    /// [`ControllerError::Lease`] when the API server cannot be read or written for a reason
    /// other than losing a race (a 409 on create or update is [`Attempt::Following`]).
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, ControllerError> {
        let failed = |source| ControllerError::Lease {
            name: self.name.clone(),
            source,
        };
        let Some(current) = self.api.get_opt(&self.name).await.map_err(failed)? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(0, None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((observed(&created), Instant::now()));
                    Ok(Attempt::Leading)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following {
                    holder: String::new(),
                }),
                Err(e) => Err(failed(e)),
            };
        };
        let seen = observed(&current);
        let now = Instant::now();
        let first_seen = match &self.observed {
            Some((previous, at)) if *previous == seen => *at,
            _ => now,
        };
        self.observed = Some((seen.clone(), first_seen));
        let spec = current.spec.clone().unwrap_or_default();
        let duration = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15),
        );
        let held_by_other = !seen.holder.is_empty() && seen.holder != self.identity;
        if held_by_other && now.duration_since(first_seen) < duration {
            return Ok(Attempt::Following {
                holder: seen.holder,
            });
        }
        let (transitions, acquired) = if seen.holder == self.identity {
            (seen.transitions, spec.acquire_time.clone())
        } else {
            (seen.transitions + 1, None)
        };
        let mut lease = current.clone();
        lease.spec = Some(self.spec(transitions, acquired));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observed = Some((observed(&written), Instant::now()));
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following {
                holder: seen.holder,
            }),
            Err(e) => Err(failed(e)),
        }
    }

    /// Waits until this candidate holds the lease, trying every retry period; errors are
    /// retried too (an unreachable API server must not end a follower).
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became the leader");
                    return;
                }
                Ok(Attempt::Following { holder }) => {
                    tracing::debug!(lease = %self.name, %holder, "following");
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %crate::errors::error_chain(&e), "lease attempt failed")
                }
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews every retry period while leading; returns when a renewal did not succeed
    /// within the renew deadline (or another holder took over): leadership is lost and the
    /// caller must stop acting as the leader.
    pub async fn keep_renewing(&mut self) -> ControllerError {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => last_renewed = Instant::now(),
                Ok(Attempt::Following { holder }) => {
                    return ControllerError::LostLease {
                        name: self.name.clone(),
                        holder,
                    };
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %crate::errors::error_chain(&e), "lease renewal failed");
                    if last_renewed.elapsed() >= self.timing.renew_deadline {
                        return ControllerError::LostLease {
                            name: self.name.clone(),
                            holder: String::new(),
                        };
                    }
                }
            }
        }
    }

    /// Gives the lease up (holder cleared, duration 1 s) so a successor need not wait for
    /// it to expire; best effort, only when this candidate still holds it.
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        if self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .is_ok()
        {
            tracing::info!(lease = %self.name, "released the lease");
        }
    }
}
