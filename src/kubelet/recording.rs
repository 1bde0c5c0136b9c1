//! A [`DraHandler`] that records every call and answers from a script, for tests of anything
//! that sits between the kubelet and the handler.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults};

/// One call the handler received, with its claims in the order they arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerCall {
    /// [`DraHandler::prepare`] with these claims.
    Prepare(Vec<ClaimRef>),
    /// [`DraHandler::unprepare`] with these claims.
    Unprepare(Vec<ClaimRef>),
}

/// Records calls; answers scripted outcomes per claim UID, success with no devices for
/// unscripted claims, and nothing at all for omitted ones.
#[derive(Debug, Default)]
pub struct RecordingHandler {
    calls: Mutex<Vec<HandlerCall>>,
    prepared: BTreeMap<String, Result<Vec<PreparedDevice>, String>>,
    unprepared: BTreeMap<String, Result<(), String>>,
    omitted: BTreeSet<String>,
}

impl RecordingHandler {
    /// A handler that succeeds for every claim.
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers prepare calls for `uid` with `outcome`.
    pub fn on_prepare(
        mut self,
        uid: impl Into<String>,
        outcome: Result<Vec<PreparedDevice>, String>,
    ) -> Self {
        self.prepared.insert(uid.into(), outcome);
        self
    }

    /// Answers unprepare calls for `uid` with `outcome`.
    pub fn on_unprepare(mut self, uid: impl Into<String>, outcome: Result<(), String>) -> Self {
        self.unprepared.insert(uid.into(), outcome);
        self
    }

    /// Leaves `uid` out of every answer, as a buggy handler would.
    pub fn omit(mut self, uid: impl Into<String>) -> Self {
        self.omitted.insert(uid.into());
        self
    }

    /// Every call received so far, oldest first.
    pub fn calls(&self) -> Vec<HandlerCall> {
        self.log().clone()
    }

    fn log(&self) -> MutexGuard<'_, Vec<HandlerCall>> {
        // A panicking test thread must not hide the calls recorded before it.
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn answer<T: Clone>(
        &self,
        claims: &[ClaimRef],
        script: &BTreeMap<String, Result<T, String>>,
        default: T,
    ) -> BTreeMap<String, Result<T, String>> {
        claims
            .iter()
            .filter(|claim| !self.omitted.contains(&claim.uid))
            .map(|claim| {
                let outcome = script
                    .get(&claim.uid)
                    .cloned()
                    .unwrap_or_else(|| Ok(default.clone()));
                (claim.uid.clone(), outcome)
            })
            .collect()
    }
}

impl DraHandler for RecordingHandler {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let answer = self.answer(&claims, &self.prepared, Vec::new());
        self.log().push(HandlerCall::Prepare(claims));
        answer
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let answer = self.answer(&claims, &self.unprepared, ());
        self.log().push(HandlerCall::Unprepare(claims));
        answer
    }
}
