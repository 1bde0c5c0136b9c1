//! kube-scheduler's DRA cost per pod, modelled from counts (issue 46).
//!
//! **Per node evaluation** the upstream incubating allocator (k8s.io/dynamic-resource-allocation
//! v0.37.0-alpha.2, the one kube-scheduler 1.36 + PR 138917 runs) converts and validates every
//! slice of the node and walks its devices first fit. Its prices were measured with a Go
//! benchmark that drives it as the scheduler's plugin does (a new allocator per pod over every
//! slice of the cluster, `Allocate` node after node) over our generated slices and thirteen
//! synthetic variants (more or fewer devices, counter entries, slices), on this 2-core machine,
//! CPU time including GC, fitted with an rms error of 8 µs (docs/architecture.md, "Scheduling
//! cost"): [`PRICES`]. Those prices do not grow with the cluster: a node evaluation costs the
//! same from 200 to 2,000 nodes.
//!
//! **Per pod** the held-out runs (issue 46: 1,000 and 500 dgx-h100 nodes) cost more than the
//! evaluations explain, and the excess grows with nodes evaluated × nodes in the cluster (0.69×
//! at 500 nodes, 0.34× at 1,000, for the same layout): something outside the allocator (GC
//! under a memory limit, non-DRA plugins) which the Go benchmark does not have. So the model
//! is `T_pod = t0 + f · N_eval · e(layout) + k · N_eval · N`, with `f` (this machine's Go to
//! the held-out machine) and `k`, `t0` fitted to the six held-out rows; the rate is `1 / T_pod`,
//! at most the MIG-disabled rate measured in the same runs (the baseline is not bound by the
//! allocator). [`Fit::check`] reports how close it reproduces each row; the bench refuses to
//! predict when a row is off by more than 0.05.

/// Prices of the upstream allocator per node evaluation, µs (this machine's Go, GC included).
#[derive(Debug, Clone, Copy)]
pub struct Prices {
    /// Per node evaluation whatever the node publishes (less the selector evaluations).
    pub base: f64,
    /// Per device that consumes counters (converted, its consumption validated).
    pub counting_device: f64,
    /// Per device without counters.
    pub plain_device: f64,
    /// Per consumed counter entry.
    pub entry: f64,
    /// Per slice of the node.
    pub slice: f64,
    /// Per CEL selector evaluation of the walk (class selectors, then the request's).
    pub selector: f64,
}

/// The measured prices (issue 46; docs/architecture.md). The fixed part measured with a
/// `1g.10gb` claim, 87 µs, is `base` plus its three selector evaluations.
pub const PRICES: Prices = Prices {
    base: 33.0,
    counting_device: 0.69,
    plain_device: 0.23,
    entry: 0.02,
    slice: 1.35,
    selector: 18.0,
};

/// What one node publishes and one claim's walk costs, in the units the prices take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counts {
    /// Devices that consume counters.
    pub counting_devices: usize,
    /// Devices that do not.
    pub plain_devices: usize,
    /// Consumed counter entries, summed over devices.
    pub entries: usize,
    /// Slices of the node (counter-set slices included).
    pub slices: usize,
    /// Selector evaluations of one node evaluation of the claim on an idle node.
    pub selectors: f64,
}

impl Counts {
    /// The upstream allocator's time per node evaluation, µs, at [`PRICES`].
    pub fn per_eval_us(&self) -> f64 {
        let p = PRICES;
        p.base
            + p.counting_device * self.counting_devices as f64
            + p.plain_device * self.plain_devices as f64
            + p.entry * self.entries as f64
            + p.slice * self.slices as f64
            + p.selector * self.selectors
    }
}

/// How many nodes kube-scheduler evaluates per pod (its default adaptive
/// percentageOfNodesToScore), as `feasible_to_find` in the bench.
pub fn evaluations(nodes: usize) -> f64 {
    if nodes < 100 {
        return nodes as f64;
    }
    let percent = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * percent / 100).max(100) as f64
}

/// One held-out row: what the node published, the cluster size and the rate measured relative
/// to MIG-disabled nodes in the same run.
#[derive(Debug, Clone)]
pub struct Row {
    /// For the report.
    pub label: String,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// The layout's counts.
    pub counts: Counts,
    /// Measured rate relative to MIG-disabled nodes.
    pub measured: f64,
}

/// The MIG-disabled rate of the held-out runs, pods/s (issue 46).
pub const BASELINE_PODS_PER_S: f64 = 14.0;

/// The fitted per-pod model.
#[derive(Debug, Clone, Copy)]
pub struct Fit {
    /// Constant per pod, ms.
    pub t0: f64,
    /// This machine's Go time to the held-out machine's.
    pub f: f64,
    /// ns per (node evaluated × node in the cluster).
    pub k: f64,
}

impl Fit {
    /// Least squares over the rows' times per pod (three unknowns, normal equations).
    pub fn to(rows: &[Row]) -> Fit {
        let x: Vec<[f64; 3]> = rows
            .iter()
            .map(|r| {
                let n = evaluations(r.nodes);
                [
                    1.0,
                    n * r.counts.per_eval_us() / 1000.0,
                    n * r.nodes as f64 / 1e6,
                ]
            })
            .collect();
        let y: Vec<f64> = rows
            .iter()
            .map(|r| 1000.0 / (r.measured * BASELINE_PODS_PER_S))
            .collect();
        let mut a = [[0.0; 3]; 3];
        let mut b = [0.0; 3];
        for (xi, yi) in x.iter().zip(&y) {
            for i in 0..3 {
                b[i] += xi[i] * yi;
                for j in 0..3 {
                    a[i][j] += xi[i] * xi[j];
                }
            }
        }
        let c = solve3(a, b);
        Fit {
            t0: c[0],
            f: c[1],
            // c[2] is ms per million (evaluated × cluster) node pairs: ns per pair.
            k: c[2],
        }
    }

    /// The time per pod, ms.
    pub fn pod_ms(&self, nodes: usize, counts: &Counts) -> f64 {
        let n = evaluations(nodes);
        self.t0 + self.f * n * counts.per_eval_us() / 1000.0 + self.k * n * nodes as f64 / 1e6
    }

    /// The rate relative to MIG-disabled nodes, at most 1 (the baseline's own rate).
    pub fn ratio(&self, nodes: usize, counts: &Counts) -> f64 {
        (1000.0 / self.pod_ms(nodes, counts) / BASELINE_PODS_PER_S).min(1.0)
    }

    /// Each row's model ratio, and whether every row is within `tolerance` of its measurement.
    pub fn check(&self, rows: &[Row], tolerance: f64) -> (Vec<f64>, bool) {
        let model: Vec<f64> = rows
            .iter()
            .map(|r| self.ratio(r.nodes, &r.counts))
            .collect();
        let ok = rows
            .iter()
            .zip(&model)
            .all(|(r, m)| (m - r.measured).abs() <= tolerance);
        (model, ok)
    }
}

/// Solves a 3 × 3 system by Cramer's rule.
fn solve3(a: [[f64; 3]; 3], b: [f64; 3]) -> [f64; 3] {
    let det = |m: [[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det(a);
    let mut out = [0.0; 3];
    for (i, o) in out.iter_mut().enumerate() {
        let mut m = a;
        for r in 0..3 {
            m[r][i] = b[r];
        }
        *o = det(m) / d;
    }
    out
}
