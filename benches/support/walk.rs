//! What two benches share to walk slices as kube-scheduler ≤ 1.35 did: a small seeded
//! generator and a shuffle of a node's device slices (those versions listed slices from a map,
//! in an order that changed from call to call; 1.36 and later sort them by name).

use k8s_openapi::api::resource::v1::ResourceSlice;

/// splitmix64: a small seeded generator, enough for a reproducible stream.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Shuffles one node's device slices in place (Fisher–Yates) and hands their names out again
/// in the new order, so that a walk in name order (our allocator's, and kube-scheduler's since
/// 1.36) follows the shuffle, as kube-scheduler ≤ 1.35 walked its cache's order; its counter
/// slices, which come first, stay where they are (their place does not matter to the walk).
pub fn shuffle_device_slices(node: &mut [ResourceSlice], rng: &mut Rng) {
    let first = node
        .iter()
        .position(|s| s.spec.devices.is_some())
        .unwrap_or(node.len());
    let mut names: Vec<Option<String>> = node[first..]
        .iter()
        .map(|s| s.metadata.name.clone())
        .collect();
    names.sort();
    for i in (first + 1..node.len()).rev() {
        let j = first + rng.below((i - first + 1) as u64) as usize;
        node.swap(i, j);
    }
    for (slice, name) in node[first..].iter_mut().zip(names) {
        slice.metadata.name = name;
    }
}
