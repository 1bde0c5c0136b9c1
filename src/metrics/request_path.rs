//! What the kubelet's calls cost on the request path, counted by [`crate::cost`]
//! (`gpu_dra_request_path_calls_total`, `gpu_dra_request_path_costs_total`): fsyncs, file
//! writes and removals, CDI specs, checkpoint parses and simulator state reads per operation.
//! A rise in fsyncs or checkpoint parses per call is a regression the tests also catch.

use std::sync::atomic::{AtomicU64, Ordering};

use super::calls::Operation;
use super::text::{Family, Kind, Sample};
use crate::cost::{Cost, Tally};

const OPERATIONS: [Operation; 2] = [Operation::Prepare, Operation::Unprepare];

fn label(op: Operation) -> &'static str {
    match op {
        Operation::Prepare => "prepare",
        Operation::Unprepare => "unprepare",
    }
}

fn slot(op: Operation) -> usize {
    match op {
        Operation::Prepare => 0,
        Operation::Unprepare => 1,
    }
}

/// Calls and their costs per operation, counted with atomics.
#[derive(Default)]
pub(super) struct RequestPathCosts {
    calls: [AtomicU64; 2],
    costs: [[AtomicU64; Cost::ALL.len()]; 2],
}

impl RequestPathCosts {
    /// Adds one handler call of `op` that cost `tally`.
    pub(super) fn record(&self, op: Operation, tally: &Tally) {
        self.calls[slot(op)].fetch_add(1, Ordering::Relaxed);
        self.add(op, tally);
    }

    /// Adds `tally` to `op`'s costs without counting a call.
    pub(super) fn add(&self, op: Operation, tally: &Tally) {
        let i = slot(op);
        for (n, (_, count)) in tally.counts().into_iter().enumerate() {
            self.costs[i][n].fetch_add(count, Ordering::Relaxed);
        }
    }

    /// `cost` counted over every call of `op` so far.
    pub(super) fn cost(&self, op: Operation, cost: Cost) -> u64 {
        let n = Cost::ALL.iter().position(|c| *c == cost).unwrap_or(0);
        self.costs[slot(op)][n].load(Ordering::Relaxed)
    }

    /// Both families: calls per operation, costs per operation and kind.
    pub(super) fn families(&self) -> Vec<Family> {
        let calls = OPERATIONS
            .iter()
            .map(|op| {
                Sample::new(
                    vec![("operation", label(*op).to_string())],
                    self.calls[slot(*op)].load(Ordering::Relaxed) as f64,
                )
            })
            .collect();
        let costs = OPERATIONS
            .iter()
            .flat_map(|op| {
                Cost::ALL.iter().map(move |c| {
                    Sample::new(
                        vec![
                            ("operation", label(*op).to_string()),
                            ("cost", c.label().to_string()),
                        ],
                        self.cost(*op, *c) as f64,
                    )
                })
            })
            .collect();
        let background = crate::cost::background()
            .counts()
            .into_iter()
            .map(|(c, n)| Sample::new(vec![("cost", c.label().to_string())], n as f64))
            .collect();
        vec![
            Family {
                name: "gpu_dra_request_path_calls_total",
                help: "Batches of claims the plugin prepared or unprepared for the kubelet (concurrent kubelet calls may share one).",
                kind: Kind::Counter,
                samples: calls,
            },
            Family {
                name: "gpu_dra_request_path_costs_total",
                help: "What those batches did while the kubelet waited: fsyncs, file writes and removals, CDI specs written, checkpoint parses, simulated hardware state reads.",
                kind: Kind::Counter,
                samples: costs,
            },
            Family {
                name: "gpu_dra_background_costs_total",
                help: "What the plugin did outside the kubelet's calls: start-up recovery, claim-status writes, the usage ledger, telemetry, republishing (API requests counted for claim reads and claim-status writes).",
                kind: Kind::Counter,
                samples: background,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_calls_tally_is_added_to_its_operation_only() {
        let costs = RequestPathCosts::default();
        let ((), tally) = crate::cost::measure(async {
            crate::cost::count(Cost::FileWrite);
            crate::cost::count(Cost::FileWrite);
        })
        .await;
        costs.record(Operation::Unprepare, &tally);
        let got = (
            costs.cost(Operation::Unprepare, Cost::FileWrite),
            costs.cost(Operation::Prepare, Cost::FileWrite),
            costs.calls[slot(Operation::Unprepare)].load(Ordering::Relaxed),
        );
        assert_eq!(got, (2, 0, 1));
        let families = costs.families();
        assert_eq!(families[1].samples.len(), 2 * Cost::ALL.len());
    }
}
