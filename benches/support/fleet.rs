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

/// The name of node `n` of the fleet (`node-0042`), which is also its pool.
pub fn node(n: usize) -> String {
    format!("node-{n:04}")
}

/// The slices of `nodes` nodes: each a copy of `template` (one simulated dgx-h100's slices)
/// renamed to its node and pool.
pub fn cluster(
    template: &[k8s_openapi::api::resource::v1::ResourceSlice],
    nodes: usize,
) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    let mut slices = Vec::with_capacity(template.len() * nodes);
    for n in 0..nodes {
        let name = node(n);
        for s in template {
            let mut s = s.clone();
            s.spec.node_name = Some(name.clone());
            s.spec.pool.name = name.clone();
            s.metadata.name = s.metadata.name.map(|m| m.replace("dgx-h100", &name));
            slices.push(s);
        }
    }
    slices
}
