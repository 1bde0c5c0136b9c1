//! One kubelet call's claims, prepared or unprepared together.
//!
//! Prepare fetches the claims concurrently (at most [`FETCH_CONCURRENCY`] GETs at once),
//! reads the inventory once, plans every claim against that one model and a checkpoint that
//! already holds the intent of the claims planned before it (so two claims of one call never
//! take one device, exactly as two calls in a row would not), records the intent of all in
//! one checkpoint write, acts claim by claim, and records their completion in one more.
//! Unprepare marks all in one write, undoes each, and forgets all in one write.
//!
//! Each claim's failure stays its own: a claim that cannot be fetched, planned or acted on
//! gets its error (and its own work undone) while its neighbours go on. Only a step done once
//! for all (opening the checkpoint, reading the inventory, a batch write) fails every claim
//! that depended on it, each naming itself ([`ClaimError::Batch`]).
//!
//! Two shares of one device in one call (consumable capacity) go in successive waves, so the
//! second sees the first's completed record, as it would in two calls: it reuses the MIG
//! device the first carved and the MPS daemon the first started.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use super::{
    ClaimAllocation, ClaimError, ClaimId, ClaimSource, ClaimsManager, PreparedDevice, plan,
    prepared, sharing,
};
use crate::checkpoint::{CheckpointStore, ClaimPhase, ClaimRecord};
use plan::PlannedDevice;

/// How many claims of one call are fetched from the API server at the same time: a call of
/// up to 16 claims (a pod's claims; the kubelet's batches of 10 in the side-by-side harness)
/// waits for one GET, not two, against a real server's 2.6 ms; few enough that the idle
/// connections the client pool keeps afterwards stay cheap (HTTP/1.1: one per GET in flight).
pub const FETCH_CONCURRENCY: usize = 16;

type Prepared = Result<Vec<PreparedDevice>, ClaimError>;

/// A claim planned in the current wave.
struct Planned {
    index: usize,
    devices: Vec<PlannedDevice>,
    /// What its device metadata files say (empty when none are written).
    metadata: Vec<super::metadata::MetadataDevice>,
    /// The claim's pod-claim-name annotation.
    pod_claim_name: Option<String>,
    /// The Fabric Manager partition it activates (FM nodes).
    fabric_partition: Option<u32>,
}

impl<S: ClaimSource> ClaimsManager<S> {
    /// Prepares every claim of `ids` (distinct UIDs); one result per claim, in order.
    ///
    /// Per claim as [`ClaimsManager::prepare`]: idempotent, and a failed claim is undone and
    /// not recorded. The checkpoint is written twice per wave (intent, completion) plus once
    /// per carved MIG device, whatever the number of claims.
    pub async fn prepare_batch(&self, ids: &[ClaimId]) -> Vec<Prepared> {
        let mut results: Vec<Option<Prepared>> = ids.iter().map(|_| None).collect();
        let Some(first) = ids.first() else {
            return Vec::new();
        };
        let mut store = match self.check_out(&first.to_string()) {
            Ok(store) => store,
            Err(e) => return fail_all(ids, e),
        };
        let mut todo = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            match store.checkpoint().claims.get(&id.uid) {
                Some(rec) if rec.phase == ClaimPhase::PrepareCompleted => {
                    results[i] = Some(Ok(prepared(&rec.devices)));
                    self.source.prepared_again(id);
                }
                Some(rec) => {
                    // Half done by an earlier call: undo, then start afresh.
                    let rec = rec.clone();
                    match self.roll_back(&mut store, &rec) {
                        Ok(()) => todo.push(i),
                        Err(e) => results[i] = Some(Err(e)),
                    }
                }
                None => todo.push(i),
            }
        }
        let fetches = todo.iter().map(|&i| self.source.fetch(&ids[i])).collect();
        let fetched = join_bounded(fetches, FETCH_CONCURRENCY).await;
        let mut pending: Vec<(usize, ClaimAllocation)> = Vec::with_capacity(todo.len());
        for (i, answer) in todo.into_iter().zip(fetched) {
            match answer {
                Ok(allocation) => pending.push((i, allocation)),
                Err(detail) => {
                    results[i] = Some(Err(ClaimError::Fetch {
                        claim: ids[i].to_string(),
                        detail,
                    }));
                }
            }
        }
        while !pending.is_empty() {
            pending = self.prepare_wave(ids, pending, &mut store, &mut results);
        }
        self.check_in(store);
        results
            .into_iter()
            .zip(ids)
            .map(|(result, id)| {
                result.unwrap_or_else(|| {
                    Err(ClaimError::Batch {
                        claim: id.to_string(),
                        kind: "checkpoint",
                        detail: "the claim was left unprepared".to_string(),
                    })
                })
            })
            .collect()
    }

    /// Plans, records, acts and completes the claims of `pending` that can go together;
    /// returns those that must wait for the next wave (a second share of a device this wave
    /// prepares).
    fn prepare_wave(
        &self,
        ids: &[ClaimId],
        pending: Vec<(usize, ClaimAllocation)>,
        store: &mut CheckpointStore,
        results: &mut [Option<Prepared>],
    ) -> Vec<(usize, ClaimAllocation)> {
        let (first, _) = pending[0];
        let super::WaveModel {
            model,
            buses,
            inventory,
        } = match self.model_and_buses(&ids[first].to_string()) {
            Ok(found) => found,
            Err(e) => {
                for (i, _) in &pending {
                    results[*i] = Some(Err(e.for_claim(&ids[*i])));
                }
                return Vec::new();
            }
        };
        // This wave's records, planned so far: with the checkpoint, what it will be once the
        // wave's intent is recorded.
        let mut wave_records: std::collections::BTreeMap<String, crate::checkpoint::ClaimRecord> =
            std::collections::BTreeMap::new();
        let mut wave: Vec<Planned> = Vec::with_capacity(pending.len());
        let mut later = Vec::new();
        let mut wave_devices = std::collections::BTreeSet::new();
        for (i, allocation) in pending {
            let id = &ids[i];
            let shares_with_wave = allocation
                .devices
                .iter()
                .any(|d| d.share_id.is_some() && wave_devices.contains(d.device.as_str()));
            if shares_with_wave {
                later.push((i, allocation));
                continue;
            }
            let planned = plan::plan(
                id,
                &allocation,
                &model,
                &self.pool,
                plan::Held::new(store.checkpoint(), &wave_records),
            )
            .and_then(|mut planned| {
                sharing::decide(self.sharing.as_ref(), id, &allocation, &model, &mut planned)?;
                self.vfio_preflight(id, &inventory, &mut planned)?;
                let held = plan::Held::new(store.checkpoint(), &wave_records);
                self.vgpu_preflight(id, &inventory, held, &mut planned)?;
                let partition = self.fabric_partition(id, &planned, &model)?;
                Ok((planned, partition))
            });
            match planned {
                Ok((devices, fabric_partition)) => {
                    wave_devices.extend(allocation.devices.iter().map(|d| d.device.clone()));
                    let mut record = intent(id, &devices);
                    record.fabric_partition = fabric_partition;
                    wave_records.insert(id.uid.clone(), record);
                    let metadata = if self.metadata.is_some() {
                        let of: Vec<_> = devices
                            .iter()
                            .map(|p| (&p.allocated, p.record.gpu_uuid.as_str()))
                            .collect();
                        let mut metadata = super::metadata::devices_from_model(&model, &buses, &of);
                        for (m, p) in metadata.iter_mut().zip(&devices) {
                            if let Some(vgpu) = &p.record.vgpu {
                                super::metadata::name_vgpu(&mut m.attributes, vgpu);
                            }
                        }
                        metadata
                    } else {
                        Vec::new()
                    };
                    wave.push(Planned {
                        index: i,
                        devices,
                        metadata,
                        pod_claim_name: allocation.pod_claim_name.clone(),
                        fabric_partition,
                    });
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        if wave.is_empty() {
            return later;
        }
        // A GPU moved to vfio-pci leaves NVML's list and shifts the indices of the GPUs after
        // it, so claims that move GPUs act after those that use indices planned before.
        wave.sort_by_key(|p| {
            p.devices
                .iter()
                .any(|d| matches!(d.action, plan::Action::Vfio { .. }))
        });
        // Without anything to undo but the CDI spec, a claim needs no intent record: a crash
        // before its completion is recorded leaves only a spec no record names, which
        // start-up recovery removes.
        let intent_needed = wave
            .iter()
            .any(|p| p.fabric_partition.is_some() || p.devices.iter().any(needs_undo));
        if intent_needed {
            let recorded = self.update(store, &ids[wave[0].index].to_string(), |cp| {
                for p in &wave {
                    let uid = &ids[p.index].uid;
                    if let Some(rec) = wave_records.remove(uid) {
                        cp.claims.insert(uid.clone(), rec);
                    }
                }
            });
            if let Err(e) = recorded {
                for p in &wave {
                    results[p.index] = Some(Err(e.for_claim(&ids[p.index])));
                }
                return later;
            }
            crate::crashpoint::hit("prepare-intent-recorded");
        }
        let mut done = Vec::with_capacity(wave.len());
        for p in wave {
            let id = &ids[p.index];
            let acted = match self.activate_fabric(id, p.fabric_partition) {
                Ok(()) => self.act(
                    store,
                    id,
                    &p.devices,
                    &p.metadata,
                    p.pod_claim_name.as_deref(),
                ),
                Err(e) => {
                    self.activation_failed(store, id, &e);
                    Err(e)
                }
            };
            match acted {
                Ok(cdi_ids) => done.push((p.index, cdi_ids)),
                Err(e) => {
                    results[p.index] = Some(Err(self.undo_failed(store, id, intent_needed, e)));
                }
            }
        }
        if done.is_empty() {
            return later;
        }
        let now = crate::hardware::health::unix_now();
        let completed = self.update(store, &ids[done[0].0].to_string(), |cp| {
            for (i, cdi_ids) in &done {
                let uid = &ids[*i].uid;
                if !intent_needed && let Some(rec) = wave_records.remove(uid) {
                    cp.claims.insert(uid.clone(), rec);
                }
                if let Some(c) = cp.claims.get_mut(uid) {
                    for (d, ids) in c.devices.iter_mut().zip(cdi_ids) {
                        d.cdi_device_ids = ids.clone();
                    }
                    c.phase = ClaimPhase::PrepareCompleted;
                    c.updated_unix = now;
                }
            }
        });
        match completed {
            Ok(()) => {
                crate::crashpoint::hit("prepare-completed");
                for (i, _) in done {
                    let rec = store.checkpoint().claims.get(&ids[i].uid);
                    results[i] = Some(Ok(rec.map(|r| prepared(&r.devices)).unwrap_or_default()));
                }
            }
            Err(e) => {
                for (i, _) in done {
                    let cause = e.for_claim(&ids[i]);
                    results[i] = Some(Err(self.undo_failed(store, &ids[i], intent_needed, cause)));
                }
            }
        }
        later
    }

    /// Undoes a failed prepare and returns the error the kubelet gets: `cause`, or
    /// [`ClaimError::RollbackIncomplete`] naming `cause` and every undo step that failed
    /// (the record then stays, so a repeat finishes). Without a recorded intent only the CDI
    /// spec can exist; a spec that cannot be removed is also reported (start-up recovery
    /// removes a spec no record names).
    fn undo_failed(
        &self,
        store: &mut CheckpointStore,
        id: &ClaimId,
        intent_recorded: bool,
        cause: ClaimError,
    ) -> ClaimError {
        if intent_recorded {
            return self.fail_prepare(store, id, cause);
        }
        let mut failures = Vec::new();
        if let Err(e) = self.cdi.remove_claim_spec(&id.uid) {
            failures.push(ClaimError::Cdi {
                claim: id.to_string(),
                detail: format!("removing the spec: {}", crate::errors::error_chain(&e)),
            });
        }
        if let Err(e) = self.remove_metadata(&id.to_string(), &id.uid, None) {
            failures.push(e);
        }
        if failures.is_empty() {
            cause
        } else {
            ClaimError::RollbackIncomplete {
                cause: Box::new(cause),
                failures,
            }
        }
    }

    /// Unprepares every claim of `ids` (distinct UIDs); one result per claim, in order.
    ///
    /// Per claim as [`ClaimsManager::unprepare`]. The checkpoint is written twice (all
    /// marked as being unprepared, all forgotten), whatever the number of claims.
    pub async fn unprepare_batch(&self, ids: &[ClaimId]) -> Vec<Result<(), ClaimError>> {
        let mut results: Vec<Result<(), ClaimError>> = ids.iter().map(|_| Ok(())).collect();
        let Some(first) = ids.first() else {
            return results;
        };
        let mut store = match self.check_out(&first.to_string()) {
            Ok(store) => store,
            Err(e) => return fail_all(ids, e),
        };
        let known: Vec<(usize, ClaimRecord)> = ids
            .iter()
            .enumerate()
            .filter_map(|(i, id)| Some((i, store.checkpoint().claims.get(&id.uid)?.clone())))
            .collect();
        let Some(&(first_known, _)) = known.first() else {
            self.check_in(store);
            return results;
        };
        // A claim of whole GPUs or existing (static) MIG devices without sharing left
        // nothing but its CDI spec: its record goes first, in the same write, and its spec
        // after (a crash in between leaves a spec no record names, which start-up recovery
        // removes). The others are marked and undone step by step. Which MIG devices are
        // static the current model says (the inventory read is one `stat` on the simulator);
        // without it, every MIG device is undone step by step. The same read serves every
        // claim's check of the MIG devices it destroys.
        let planned = known
            .iter()
            .any(|(_, rec)| rec.devices.iter().any(|d| d.mig.is_some()))
            .then(|| self.planning_model(&ids[first_known].to_string()).ok())
            .flatten();
        let static_mig = |device: &str| {
            planned.as_ref().is_some_and(|(_, m)| {
                matches!(
                    m.device(device).map(|p| &p.kind),
                    Some(crate::devices::DeviceKind::MigStatic { .. })
                )
            })
        };
        let (spec_only, known): (Vec<_>, Vec<_>) = known.into_iter().partition(|(_, rec)| {
            rec.fabric_partition.is_none()
                && rec.devices.iter().all(|d| {
                    d.sharing.is_none()
                        && d.vfio.is_none()
                        && d.vgpu.is_none()
                        && (d.mig.is_none() || static_mig(&d.device))
                })
        });
        let marked = self.update(&mut store, &ids[first_known].to_string(), |cp| {
            for (_, rec) in &spec_only {
                cp.claims.remove(&rec.uid);
            }
            for (_, rec) in &known {
                if let Some(c) = cp.claims.get_mut(&rec.uid) {
                    c.phase = ClaimPhase::UnprepareStarted;
                }
            }
        });
        if let Err(e) = marked {
            for (i, _) in spec_only.iter().chain(&known) {
                results[*i] = Err(e.for_claim(&ids[*i]));
            }
            self.check_in(store);
            return results;
        }
        crate::crashpoint::hit("unprepare-started");
        for (i, rec) in spec_only {
            if let Err(e) = self.cdi.remove_claim_spec(&rec.uid) {
                results[i] = Err(ClaimError::Cdi {
                    claim: ids[i].to_string(),
                    detail: crate::errors::error_chain(&e),
                });
            } else if let Err(e) = self.remove_metadata(&ids[i].to_string(), &rec.uid, Some(&rec)) {
                results[i] = Err(e);
            }
        }
        // The claims still holding their devices: a share's MIG device or MPS daemon goes
        // with the last claim out, also when several leave in this call.
        // Copied only when a claim has hardware to undo.
        let mut others: Option<crate::checkpoint::Checkpoint> = None;
        let mut undone = Vec::with_capacity(known.len());
        for (i, rec) in known {
            let others = others.get_or_insert_with(|| store.checkpoint().clone());
            match self.undo(&rec, others, planned.as_ref()) {
                Ok(()) => {
                    others.claims.remove(&rec.uid);
                    undone.push(i);
                }
                Err(e) => results[i] = Err(e),
            }
        }
        if let Some(&first) = undone.first() {
            let forgotten = self.update(&mut store, &ids[first].to_string(), |cp| {
                for i in &undone {
                    cp.claims.remove(&ids[*i].uid);
                }
            });
            if let Err(e) = forgotten {
                for i in undone {
                    results[i] = Err(e.for_claim(&ids[i]));
                }
            }
        }
        self.check_in(store);
        results
    }
}

/// Whether undoing `device` takes more than removing the claim's CDI spec: a MIG device
/// carved or a whole GPU whose MIG mode may be switched, a GPU moved to `vfio-pci`, a vGPU
/// created, or any sharing (time-slice, MPS).
fn needs_undo(device: &PlannedDevice) -> bool {
    device.record.sharing.is_some()
        || device.record.vfio.is_some()
        || device.record.vgpu.is_some()
        || !matches!(
            device.action,
            plan::Action::FullGpu { dynamic: false, .. } | plan::Action::StaticMig { .. }
        )
}

/// The intent record of a planned claim.
fn intent(id: &ClaimId, devices: &[PlannedDevice]) -> ClaimRecord {
    ClaimRecord {
        uid: id.uid.clone(),
        namespace: id.namespace.clone(),
        name: id.name.clone(),
        phase: ClaimPhase::PrepareStarted,
        devices: devices.iter().map(|p| p.record.clone()).collect(),
        updated_unix: crate::hardware::health::unix_now(),
        fabric_partition: None,
    }
}

/// Every claim fails with `error` (the first as it is, the others naming themselves).
fn fail_all<T>(ids: &[ClaimId], error: ClaimError) -> Vec<Result<T, ClaimError>> {
    let others: Vec<_> = ids.iter().skip(1).map(|id| error.for_claim(id)).collect();
    std::iter::once(Err(error))
        .chain(others.into_iter().map(Err))
        .collect()
}

/// Runs `futures` with at most `limit` in flight at once, on the calling task; the outputs
/// in the order of `futures`.
pub async fn join_bounded<F: Future>(futures: Vec<F>, limit: usize) -> Vec<F::Output> {
    let total = futures.len();
    let mut queue = futures.into_iter().enumerate();
    let mut running: Vec<(usize, Pin<Box<F>>)> = Vec::with_capacity(limit.min(total));
    let mut outputs: Vec<Option<F::Output>> = (0..total).map(|_| None).collect();
    let mut finished = 0;
    std::future::poll_fn(|cx| {
        loop {
            while running.len() < limit.max(1)
                && let Some((i, f)) = queue.next()
            {
                running.push((i, Box::pin(f)));
            }
            let before = finished;
            running.retain_mut(|(i, f)| match f.as_mut().poll(cx) {
                Poll::Ready(output) => {
                    outputs[*i] = Some(output);
                    finished += 1;
                    false
                }
                Poll::Pending => true,
            });
            if finished == total {
                return Poll::Ready(());
            }
            if finished == before {
                return Poll::Pending;
            }
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn join_bounded_keeps_the_order_and_never_runs_more_than_the_limit() {
        let in_flight = std::sync::atomic::AtomicUsize::new(0);
        let peak = std::sync::atomic::AtomicUsize::new(0);
        let futures = (0..10u64)
            .map(|i| {
                let (in_flight, peak) = (&in_flight, &peak);
                async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    let now = in_flight.fetch_add(1, SeqCst) + 1;
                    peak.fetch_max(now, SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(10 - i)).await;
                    in_flight.fetch_sub(1, SeqCst);
                    i * 2
                }
            })
            .collect();
        let got = join_bounded(futures, 3).await;
        let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!((got, peak), ((0..10).map(|i| i * 2).collect(), 3));
    }
}
