//! The 1,000-node fleet the cluster-wide benches share (`capacity`, `cluster_tools`).

/// The devices the claims of one dgx-h100 node hold: GPUs 0–2 carved 3g.40gb@0 + 2g.20gb@4 +
/// 1g.10gb@6, GPU 3 whole (10 claims a node, one device each).
pub fn held_per_node() -> Vec<String> {
    let mut held = Vec::new();
    for g in 0..3 {
        for device in ["mig-3g40gb-0", "mig-2g20gb-4", "mig-1g10gb-6"] {
            held.push(format!("gpu-{g}-{device}"));
        }
    }
    held.push("gpu-3".into());
    held
}
