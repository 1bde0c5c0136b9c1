//! Group commit of concurrent kubelet calls: calls of one operation that arrive while another
//! holds the plugin lock wait in a queue, and whichever of them takes the lock next serves
//! the whole queue as one batch — one inventory read, one intent write and one completion
//! write of the checkpoint for all of them — then hands each call its own claims' answers.
//!
//! The plugin lock's guarantee is kept: one batch at a time across every plugin instance. A
//! call that gives up while it waits (the kubelet hung up) leaves the queue with it, so its
//! claims are never acted on later for a caller that is gone; once a batch holding it has
//! started, the batch runs to completion as any call does.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;

use super::ClaimRef;

/// Per-claim answers of one call, keyed by claim UID.
pub(crate) type Answers<T> = BTreeMap<String, Result<T, String>>;

/// One call waiting to be served.
struct Waiter<T> {
    ticket: u64,
    claims: Vec<ClaimRef>,
    answer: oneshot::Sender<Answers<T>>,
}

/// The calls of one operation waiting for the plugin lock.
pub(crate) struct Queue<T> {
    next: AtomicU64,
    waiting: Mutex<Vec<Waiter<T>>>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            next: AtomicU64::new(0),
            waiting: Mutex::new(Vec::new()),
        }
    }
}

/// A call's place in the queue; dropping it (the call gave up) takes the call out if no batch
/// has taken it yet.
pub(crate) struct Place<'q, T> {
    queue: &'q Queue<T>,
    ticket: u64,
}

impl<T> Drop for Place<'_, T> {
    fn drop(&mut self) {
        self.queue.lock().retain(|w| w.ticket != self.ticket);
    }
}

/// The calls one batch serves.
pub(crate) struct Batch<T> {
    waiters: Vec<Waiter<T>>,
}

impl<T: Clone> Batch<T> {
    /// Whether no call is left to serve (another batch took them all).
    pub(crate) fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Every claim of the batch's calls, each UID once, in arrival order.
    pub(crate) fn claims(&self) -> Vec<ClaimRef> {
        let mut seen = std::collections::BTreeSet::new();
        self.waiters
            .iter()
            .flat_map(|w| w.claims.iter())
            .filter(|c| seen.insert(c.uid.clone()))
            .cloned()
            .collect()
    }

    /// Hands each call the answers for its claims (a claim two calls named gets the same
    /// answer in both); a claim without an answer is left out, which the caller reports.
    pub(crate) fn answer(self, answered: &Answers<T>) {
        for waiter in self.waiters {
            let mine = waiter
                .claims
                .iter()
                .filter_map(|c| Some((c.uid.clone(), answered.get(&c.uid)?.clone())))
                .collect();
            // A call that gave up no longer listens; its claims were done all the same.
            let _ = waiter.answer.send(mine);
        }
    }
}

impl<T> Queue<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiter<T>>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues a call of `claims`; its answers arrive on the receiver once a batch served it.
    pub(crate) fn join(
        &self,
        claims: Vec<ClaimRef>,
    ) -> (Place<'_, T>, oneshot::Receiver<Answers<T>>) {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let (answer, answers) = oneshot::channel();
        self.lock().push(Waiter {
            ticket,
            claims,
            answer,
        });
        (
            Place {
                queue: self,
                ticket,
            },
            answers,
        )
    }

    /// Takes every call waiting now, for the holder of the plugin lock to serve.
    pub(crate) fn take_all(&self) -> Batch<T> {
        Batch {
            waiters: std::mem::take(&mut *self.lock()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
        }
    }

    #[tokio::test]
    async fn a_batch_serves_every_waiting_call_its_own_claims_and_a_shared_claim_to_both() {
        let queue: Queue<u32> = Queue::default();
        let (_a, a) = queue.join(vec![claim("x"), claim("shared")]);
        let (_b, b) = queue.join(vec![claim("shared"), claim("y")]);
        let batch = queue.take_all();
        let uids: Vec<String> = batch.claims().into_iter().map(|c| c.uid).collect();
        assert_eq!(uids, ["x", "shared", "y"]);
        let answered: Answers<u32> = [("x", Ok(1)), ("shared", Ok(2)), ("y", Err("no".into()))]
            .into_iter()
            .map(|(u, r)| (u.to_string(), r))
            .collect();
        batch.answer(&answered);
        let want_a: Answers<u32> = [("shared".to_string(), Ok(2)), ("x".to_string(), Ok(1))].into();
        let want_b: Answers<u32> = [
            ("shared".to_string(), Ok(2)),
            ("y".to_string(), Err("no".to_string())),
        ]
        .into();
        assert_eq!((a.await.unwrap(), b.await.unwrap()), (want_a, want_b));
        assert!(queue.take_all().is_empty(), "served calls leave the queue");
    }

    #[test]
    fn a_call_that_gives_up_before_a_batch_takes_it_leaves_the_queue() {
        let queue: Queue<()> = Queue::default();
        let (gone, _) = queue.join(vec![claim("gone")]);
        let (_stays, _answers) = queue.join(vec![claim("stays")]);
        drop(gone);
        let uids: Vec<String> = queue
            .take_all()
            .claims()
            .into_iter()
            .map(|c| c.uid)
            .collect();
        assert_eq!(uids, ["stays"]);
    }
}
