//! [`explain`](super::explain) over slices that arrive one at a time, node by node, so that a
//! 1,000-node cluster (208,000 devices) is never held at once: [`NodeScan`].
//!
//! Lists name a node's slices one after another (the API server and kubectl sort slices by
//! name, which starts with the node's), so the scan collects a *run* of slices naming one node
//! and judges the node when the run ends: an allocator over the run and the slices that name
//! no node (`allNodes`, node selectors), the claims already holding devices of those pools,
//! then the slices go. What stays per node is its outcome; the closest nodes' full
//! explanations are made while their slices are still there.
//!
//! The answer is the one [`explain`](super::explain) gives for the same slices in any order.
//! A run is only judged as if it were the node's whole story; the scan checks afterwards that
//! it was, and reads the slices again (another pass, the caller's loop) when it was not:
//!
//! * a node named again after another node's run, or a pool whose newest generation or slice
//!   count differs between the run and the whole list (a pool spread over nodes, a newer
//!   generation published later in the list): such nodes, and the pools they share, are held
//!   in memory on the next pass and judged together at its end;
//! * a slice naming no node after some node was judged: the next pass judges every node again,
//!   with all of those slices known from the start.
//!
//! A second pass is enough; inputs sorted by node take one.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use super::{ExplainReport, NEAR_MISSES};
use crate::alloc::{Allocator, CounterRollback, Detail, Node, Outcome, Prepared, SelectorEngine};

/// `(driver, pool name)`.
type PoolKey = (String, String);

/// A pool's newest generation among some of its slices, and how many of those slices are of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PoolStat {
    generation: i64,
    slices: usize,
}

impl PoolStat {
    fn add(stat: Option<&mut PoolStat>, generation: i64) -> Option<PoolStat> {
        match stat {
            Some(s) if generation == s.generation => {
                s.slices += 1;
                None
            }
            Some(s) if generation > s.generation => {
                *s = PoolStat {
                    generation,
                    slices: 1,
                };
                None
            }
            Some(_) => None,
            None => Some(PoolStat {
                generation,
                slices: 1,
            }),
        }
    }
}

fn pool_key(slice: &ResourceSlice) -> PoolKey {
    (slice.spec.driver.clone(), slice.spec.pool.name.clone())
}

/// The node a slice names, if any.
fn node_of(slice: &ResourceSlice) -> Option<&str> {
    slice.spec.node_name.as_deref().filter(|n| !n.is_empty())
}

/// Where the closest nodes are ranked: furthest progress first; an aborted search is as
/// interesting as a near fit; then by name (the order [`super::explain`] tries nodes in).
type Rank = (Reverse<usize>, bool, String);

fn rank(outcome: &Outcome) -> Rank {
    (
        Reverse(outcome.progress.placed),
        outcome.abort.is_none(),
        outcome.node.clone(),
    )
}

/// One node's verdict.
struct Verdict {
    /// [`Detail::Brief`].
    brief: Outcome,
    /// [`Detail::Full`], made when the node was among the closest, or could be the only node.
    full: Option<Outcome>,
    /// The run's pools, to check against the whole list.
    pools: Vec<(PoolKey, PoolStat)>,
}

/// What the next pass does differently.
#[derive(Default)]
struct Plan {
    /// Judge every run again (slices naming no node arrived late).
    rejudge: bool,
    /// Nodes whose slices are held and judged together at the end of the pass.
    held_nodes: HashSet<String>,
    /// Pools whose slices are held too (those of the held nodes).
    held_pools: HashSet<PoolKey>,
    /// Nodes kept from an earlier pass whose full explanation is still to be made.
    full_for: HashSet<String>,
}

/// Passes after which a report is made whatever is missing: a live cluster listed again may
/// have changed, and a node shown may be gone; its brief outcome is shown then.
const MAX_PASSES: u32 = 3;

/// Explains claims over slices fed one at a time; see the module docs.
///
/// Use: [`NodeScan::new`], then for each pass [`NodeScan::add`] every slice of the input (in
/// the same order each time) and [`NodeScan::end_pass`], until it answers `false`; then
/// [`NodeScan::report`].
pub struct NodeScan<'a, E: SelectorEngine> {
    engine: &'a E,
    classes: &'a [DeviceClass],
    allocated: &'a [ResourceClaim],
    /// `<namespace>/<name>` of the claims explained.
    names: Vec<String>,
    prepared: Result<Prepared<'a, E>, String>,
    /// Indices into `allocated` of the claims holding devices of each pool.
    holders: HashMap<(&'a str, &'a str), Vec<usize>>,
    pass: u32,
    plan: Plan,
    /// The slices naming no node, then the current run's slices.
    work: Vec<ResourceSlice>,
    /// How many of `work` name no node.
    elsewhere: usize,
    /// The node of the current run.
    run_node: Option<String>,
    /// Pass 1: every pool's newest generation and slice count over the whole list.
    pool_stats: HashMap<PoolKey, PoolStat>,
    /// Pass 1: how many runs named each node.
    runs: HashMap<String, u32>,
    /// Pass 1: a slice naming no node came after a node was judged.
    elsewhere_late: bool,
    /// The held slices of this pass.
    held: Vec<ResourceSlice>,
    verdicts: BTreeMap<String, Verdict>,
    /// The ranks of the verdicts that do not fit.
    misses: BTreeSet<Rank>,
    /// Nodes judged in this pass.
    judged_this_pass: usize,
    counter_rollback: CounterRollback,
}

impl<'a, E: SelectorEngine> NodeScan<'a, E> {
    /// A scan explaining `claims` with `classes`, what `allocated` claims hold being taken.
    ///
    /// Bad input (no claims, an unreadable allocated claim, a claim the allocator refuses)
    /// makes the report an input error; slices fed then are ignored.
    pub fn new(
        engine: &'a E,
        classes: &'a [DeviceClass],
        allocated: &'a [ResourceClaim],
        claims: &'a [ResourceClaim],
    ) -> Self {
        let names: Vec<String> = claims.iter().map(crate::alloc::claim_display).collect();
        let prepared = if claims.is_empty() {
            Err("no claims to explain".to_string())
        } else {
            // Reads every allocated claim once, and compiles the claims once for every node.
            Allocator::new(engine, classes, &[], allocated)
                .map_err(|e| e.to_string())
                .and_then(|a| a.prepare(claims).map_err(|e| e.to_string()))
        };
        let mut holders: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        for (i, claim) in allocated.iter().enumerate() {
            for result in crate::alloc::allocation_results(claim) {
                let list = holders
                    .entry((result.driver.as_str(), result.pool.as_str()))
                    .or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        NodeScan {
            engine,
            classes,
            allocated,
            names,
            prepared,
            holders,
            pass: 1,
            plan: Plan::default(),
            work: Vec::new(),
            elsewhere: 0,
            run_node: None,
            pool_stats: HashMap::new(),
            runs: HashMap::new(),
            elsewhere_late: false,
            held: Vec::new(),
            verdicts: BTreeMap::new(),
            misses: BTreeSet::new(),
            judged_this_pass: 0,
            counter_rollback: CounterRollback::default(),
        }
    }

    /// Judges every node as a kube-scheduler whose allocator undoes a refused candidate this
    /// way would ([`CounterRollback`]); call before the first [`NodeScan::add`].
    pub fn with_counter_rollback(mut self, rollback: CounterRollback) -> Self {
        self.counter_rollback = rollback;
        self
    }

    /// Takes the next slice of the current pass.
    pub fn add(&mut self, slice: ResourceSlice) {
        if self.prepared.is_err() {
            return;
        }
        if self.pass == 1 {
            let key = pool_key(&slice);
            let stat = self.pool_stats.get_mut(&key);
            if let Some(new) = PoolStat::add(stat, slice.spec.pool.generation) {
                self.pool_stats.insert(key, new);
            }
        }
        let Some(node) = node_of(&slice) else {
            if self.pass == 1 {
                if self.judged_this_pass > 0 {
                    self.elsewhere_late = true;
                }
                self.work.insert(self.elsewhere, slice);
                self.elsewhere += 1;
            }
            // Later passes know them all from the first.
            return;
        };
        if self.pass > 1 {
            if self.plan.held_nodes.contains(node) {
                self.held.push(slice);
                return;
            }
            if self.plan.held_pools.contains(&pool_key(&slice)) {
                self.held.push(slice.clone());
            }
        }
        if self.run_node.as_deref() != Some(node) {
            self.end_run();
            self.run_node = Some(node.to_string());
        }
        self.work.push(slice);
    }

    /// Ends the current pass: `true` when the slices must be fed once more, in the same order.
    pub fn end_pass(&mut self) -> bool {
        if self.prepared.is_err() {
            return false;
        }
        self.end_run();
        let plan = if self.pass == 1 {
            self.plan_second_pass()
        } else {
            self.judge_held();
            Plan::default()
        };
        let mut again = plan.rejudge || !plan.held_nodes.is_empty();
        if again {
            if plan.rejudge {
                self.verdicts.clear();
                self.misses.clear();
            } else {
                for node in &plan.held_nodes {
                    self.remove_verdict(node);
                }
            }
            self.plan = plan;
        } else {
            // Every verdict is final: are the full explanations the report shows all made?
            let missing: HashSet<String> = self
                .reported_nodes()
                .into_iter()
                .filter(|n| self.verdicts.get(n).is_some_and(|v| v.full.is_none()))
                .collect();
            again = !missing.is_empty() && self.pass < MAX_PASSES;
            self.plan = Plan {
                full_for: missing,
                ..Plan::default()
            };
        }
        if again {
            self.pass += 1;
            self.judged_this_pass = 0;
        }
        again
    }

    fn insert_verdict(&mut self, node: String, verdict: Verdict) {
        self.remove_verdict(&node);
        if !verdict.brief.fits() {
            self.misses.insert(rank(&verdict.brief));
        }
        self.verdicts.insert(node, verdict);
    }

    fn remove_verdict(&mut self, node: &str) {
        if let Some(old) = self.verdicts.remove(node)
            && !old.brief.fits()
        {
            self.misses.remove(&rank(&old.brief));
        }
    }

    /// After pass 1: which nodes were judged on less than their whole story.
    fn plan_second_pass(&self) -> Plan {
        let mut plan = Plan {
            rejudge: self.elsewhere_late,
            ..Plan::default()
        };
        let mut pools_of: HashMap<&str, Vec<&PoolKey>> = HashMap::new();
        for (node, verdict) in &self.verdicts {
            let partial = verdict
                .pools
                .iter()
                .any(|(key, stat)| self.pool_stats.get(key) != Some(stat));
            pools_of.insert(node, verdict.pools.iter().map(|(k, _)| k).collect());
            if partial {
                plan.held_nodes.insert(node.clone());
            }
        }
        // A node named again after another node was judged on its first run only.
        for (node, count) in &self.runs {
            if *count > 1 {
                plan.held_nodes.insert(node.clone());
            }
        }
        for node in &plan.held_nodes {
            for key in pools_of.get(node.as_str()).into_iter().flatten() {
                plan.held_pools.insert((*key).clone());
            }
        }
        // The held nodes' pools are held whole; so are the nodes those pools name.
        let mut changed = true;
        while changed {
            changed = false;
            for (node, pools) in &pools_of {
                if !plan.held_nodes.contains(*node)
                    && pools.iter().any(|k| plan.held_pools.contains(*k))
                {
                    plan.held_nodes.insert(node.to_string());
                    plan.held_pools.extend(pools.iter().map(|k| (*k).clone()));
                    changed = true;
                }
            }
        }
        plan
    }

    /// Judges the current run, if any, and keeps what the report may need of it.
    fn end_run(&mut self) {
        let Some(node) = self.run_node.take() else {
            return;
        };
        if self.pass == 1 {
            let count = self.runs.entry(node.clone()).or_default();
            *count += 1;
            if *count > 1 {
                // Judged in the next pass, with all its slices held.
                self.work.truncate(self.elsewhere);
                return;
            }
        }
        if self.pass == 1 || self.plan.rejudge {
            let verdict = self.judge_run(&node);
            self.insert_verdict(node, verdict);
            self.judged_this_pass += 1;
        } else if self.full_needed(&node) {
            // A node kept from the first pass, now among the closest (or the only one left).
            let outcome = self.allocate(&self.work, &node, Detail::Full);
            if let Some(verdict) = self.verdicts.get_mut(&node) {
                verdict.full = Some(outcome);
            }
        }
        self.work.truncate(self.elsewhere);
    }

    /// For a node kept from an earlier pass whose run goes by: whether its full explanation
    /// may be shown and is not made yet. The nodes judged at the end of this pass can only
    /// push it further from the closest, so one among the closest now is made.
    fn full_needed(&self, node: &str) -> bool {
        let Some(verdict) = self.verdicts.get(node) else {
            return false;
        };
        if verdict.full.is_some() {
            return false;
        }
        self.plan.full_for.contains(node)
            || self.verdicts.len() == 1
            || (!verdict.brief.fits() && self.among_closest(&rank(&verdict.brief)))
    }

    /// Whether a node ranked `r` is among the [`NEAR_MISSES`] closest of the verdicts so far
    /// (itself, if there, included).
    fn among_closest(&self, r: &Rank) -> bool {
        self.misses.iter().take(NEAR_MISSES).any(|m| m >= r) || self.misses.len() < NEAR_MISSES
    }

    /// The current run's verdict.
    fn judge_run(&self, node: &str) -> Verdict {
        let brief = self.allocate(&self.work, node, Detail::Brief);
        let first = self.judged_this_pass == 0;
        let closest = !brief.fits() && self.among_closest(&rank(&brief));
        let full = (first || closest).then(|| self.allocate(&self.work, node, Detail::Full));
        let mut pools: HashMap<PoolKey, PoolStat> = HashMap::new();
        for slice in &self.work[self.elsewhere..] {
            let key = pool_key(slice);
            let stat = pools.get_mut(&key);
            if let Some(new) = PoolStat::add(stat, slice.spec.pool.generation) {
                pools.insert(key, new);
            }
        }
        Verdict {
            brief,
            full,
            pools: pools.into_iter().collect(),
        }
    }

    /// Allocates on `node` over `slices`, with the allocated claims holding devices of their
    /// pools (in their input order, as [`super::explain`] reads them).
    fn allocate(&self, slices: &[ResourceSlice], node: &str, detail: Detail) -> Outcome {
        let Ok(prepared) = &self.prepared else {
            unreachable!("slices are only judged with prepared claims");
        };
        let mut wanted: Vec<usize> = Vec::new();
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        for slice in slices {
            let key = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
            if seen.insert(key)
                && let Some(claims) = self.holders.get(&key)
            {
                wanted.extend(claims);
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        let allocated: Vec<ResourceClaim> =
            wanted.iter().map(|&i| self.allocated[i].clone()).collect();
        match Allocator::new(self.engine, self.classes, slices, &allocated) {
            Ok(allocator) => allocator
                .with_counter_rollback(self.counter_rollback)
                .allocate(prepared, &Node::named(node), detail),
            Err(e) => unreachable!("every allocated claim was read in NodeScan::new: {e}"),
        }
    }

    /// End of a later pass: the held nodes, judged over the held slices, with the full
    /// explanations the report shows.
    fn judge_held(&mut self) {
        if self.plan.held_nodes.is_empty() {
            return;
        }
        let mut slices: Vec<ResourceSlice> = self.work[..self.elsewhere].to_vec();
        slices.append(&mut self.held);
        // Only nodes a slice of its pool's newest generation names are nodes.
        let exists: BTreeSet<String> = match Allocator::new(self.engine, self.classes, &slices, &[])
        {
            Ok(a) => a.node_names().into_iter().collect(),
            Err(_) => BTreeSet::new(),
        };
        let mut nodes: Vec<String> = self
            .plan
            .held_nodes
            .iter()
            .filter(|n| exists.contains(*n))
            .cloned()
            .collect();
        nodes.sort();
        for node in nodes {
            let brief = self.allocate(&slices, &node, Detail::Brief);
            let verdict = Verdict {
                brief,
                full: None,
                pools: Vec::new(),
            };
            self.insert_verdict(node, verdict);
        }
        for node in self.reported_nodes() {
            if self.plan.held_nodes.contains(&node)
                && self.verdicts.get(&node).is_some_and(|v| v.full.is_none())
            {
                let full = self.allocate(&slices, &node, Detail::Full);
                if let Some(verdict) = self.verdicts.get_mut(&node) {
                    verdict.full = Some(full);
                }
            }
        }
    }

    /// The nodes whose full explanation the report shows: the only node, or the closest
    /// non-fitting ones when none fits.
    fn reported_nodes(&self) -> Vec<String> {
        if self.verdicts.len() == 1 {
            return self.verdicts.keys().cloned().collect();
        }
        if self.verdicts.values().any(|v| v.brief.fits()) {
            return Vec::new();
        }
        self.misses
            .iter()
            .take(NEAR_MISSES)
            .map(|(_, _, node)| node.clone())
            .collect()
    }

    /// The report, as [`super::explain`] makes it for the same slices.
    pub fn report(mut self) -> ExplainReport {
        if let Err(error) = &self.prepared {
            return ExplainReport::failed(self.names, error.clone());
        }
        if self.verdicts.is_empty() {
            // Only slices reachable from every node (or none at all): any node will do.
            let outcome = self.allocate(&self.work[..self.elsewhere], "", Detail::Full);
            self.verdicts.insert(
                String::new(),
                Verdict {
                    brief: outcome.clone(),
                    full: Some(outcome),
                    pools: Vec::new(),
                },
            );
        }
        let reported = self.reported_nodes();
        let mut report = ExplainReport {
            claims: self.names,
            fits: false,
            error: None,
            nodes_checked: self.verdicts.len(),
            fitting_nodes: Vec::new(),
            chosen: None,
            near_misses: Vec::new(),
            note: None,
            // Slices arrive node by node here; what a node's slices lack may be another's.
            unpublished_allocations: Vec::new(),
        };
        // A full explanation missing after the last pass (the cluster changed between two
        // lists) is shown as far as it is known.
        let shown = |verdict: &mut Verdict| match verdict.full.take() {
            Some(full) => full,
            None => verdict.brief.clone(),
        };
        if report.nodes_checked == 1 {
            let verdict = self.verdicts.values_mut().next().expect("one verdict");
            let outcome = shown(verdict);
            report.fits = outcome.fits();
            if report.fits {
                report.fitting_nodes.push(outcome.node.clone());
                report.chosen = Some(outcome);
            } else {
                report.near_misses.push(outcome);
            }
            return report;
        }
        for (node, verdict) in &self.verdicts {
            if verdict.brief.fits() {
                report.fitting_nodes.push(node.clone());
                if report.chosen.is_none() {
                    report.chosen = Some(verdict.brief.clone());
                }
            }
        }
        report.fits = !report.fitting_nodes.is_empty();
        if !report.fits {
            for node in reported {
                if let Some(verdict) = self.verdicts.get_mut(&node) {
                    report.near_misses.push(shown(verdict));
                }
            }
        }
        report
    }
}
