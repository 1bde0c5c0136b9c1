//! Reading the driver's slice records into GPUs with their devices and counters, and the
//! allocated claims into who holds which device.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::book::GpuEntry;
use super::counters::{Book, Dev, Kind, memory_slice};
use super::records::{Attr, ClaimRecord, DeviceRecord, SliceRecord};
use super::{CapacityError, CapacityOptions, FULL_GPU, Holder, Placement};
use crate::quantity::Quantity;

/// Holders per pool, then per device.
pub(super) type Holders<'a> = HashMap<&'a str, HashMap<&'a str, Vec<Holder>>>;

/// Who holds which device of `driver`, from allocated claims' results and `reservedFor`.
/// Admin-access results hold nothing, as in Kubernetes.
pub(super) fn holders<'a>(claims: &'a [ClaimRecord<'a>], driver: &str) -> Holders<'a> {
    let mut out: Holders = HashMap::new();
    for claim in claims {
        for result in &claim.results {
            if result.driver != driver || result.admin_access == Some(true) {
                continue;
            }
            let holder = Holder {
                namespace: claim.namespace.to_string(),
                claim: claim.name.to_string(),
                pods: claim.pods.iter().map(|p| p.to_string()).collect(),
                request: result.request.to_string(),
                share_id: result.share_id.map(str::to_string),
                consumed: result
                    .consumed_capacity
                    .0
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            };
            out.entry(result.pool)
                .or_default()
                .entry(result.device)
                .or_default()
                .push(holder);
        }
    }
    out
}

fn int(device: &DeviceRecord, driver: &str, attr: Attr) -> Option<i64> {
    device.attribute(driver, attr)?.int
}

fn string<'a>(device: &'a DeviceRecord, driver: &str, attr: Attr) -> Option<&'a str> {
    device.attribute(driver, attr)?.string
}

/// The GPU (minor number) a VFIO or vGPU device (`gpu-vfio-<i>`, `vgpu-<i>-…`, no minor
/// attribute) belongs to: the `<minor>` of the `gpu-<minor>-counter-set` it consumes; `None`
/// for a bare VFIO device (its GPU on `vfio-pci` since before the plugin started, NVML never
/// saw it).
fn counter_set_minor(device: &DeviceRecord) -> Option<i64> {
    device.consumes_counters.iter().flatten().find_map(|c| {
        c.counter_set
            .strip_prefix("gpu-")?
            .strip_suffix("-counter-set")?
            .parse()
            .ok()
    })
}

/// The GPU (minor number) a device belongs to: its `minor` / `parentMinor`, else its
/// `index` / `parentIndex`, else the `<n>` of a `gpu-<n>…` name.
fn gpu_minor(device: &DeviceRecord, driver: &str, mig: bool) -> Option<i64> {
    let (minor, index) = if mig {
        (Attr::ParentMinor, Attr::ParentIndex)
    } else {
        (Attr::Minor, Attr::Index)
    };
    int(device, driver, minor)
        .or_else(|| int(device, driver, index))
        .or_else(|| {
            let rest = device.name.strip_prefix("gpu-")?;
            rest.split('-').next()?.parse().ok()
        })
}

/// The `<start>` of a MIG device named `gpu-<minor>-mig-<profile>-<start>[-ci<n>]`.
fn start_from_name(name: &str) -> Option<u32> {
    let mut parts = name.rsplit('-');
    let last = parts.next()?;
    let start = if last.starts_with("ci") {
        parts.next()?
    } else {
        last
    };
    start.parse().ok()
}

struct PoolSlices<'a> {
    slices: Vec<&'a SliceRecord<'a>>,
    generation: i64,
    expected: i64,
}

fn invalid(slice: &SliceRecord, field: String, value: &str, problem: String) -> CapacityError {
    CapacityError::InvalidSlice {
        slice: slice.name.to_string(),
        field,
        value: value.to_string(),
        problem,
    }
}

/// What makes the view less than exact, in report order: every incomplete pool first, then
/// every claim naming a device no slice publishes, each by pool name.
#[derive(Default)]
pub(super) struct Warnings {
    pub(super) incomplete: Vec<String>,
    pub(super) ghosts: Vec<String>,
}

impl Warnings {
    /// Appends `other`'s warnings (of pools after this one's) to this one's.
    pub(super) fn extend(&mut self, other: Warnings) {
        self.incomplete.extend(other.incomplete);
        self.ghosts.extend(other.ghosts);
    }

    /// The warnings in report order.
    pub(super) fn into_list(self) -> Vec<String> {
        let mut list = self.incomplete;
        list.extend(self.ghosts);
        list
    }
}

/// The driver's slices at the newest generation of each pool, by pool name.
fn pools<'a>(
    slices: &'a [SliceRecord<'a>],
    options: &CapacityOptions,
    warnings: &mut Warnings,
) -> BTreeMap<&'a str, PoolSlices<'a>> {
    let mut pools: BTreeMap<&str, PoolSlices> = BTreeMap::new();
    for slice in slices.iter().filter(|s| s.spec.driver == options.driver) {
        let pool = &slice.spec.pool;
        let node = slice.spec.node_name.unwrap_or(pool.name);
        if options.node.as_deref().is_some_and(|n| n != node) {
            continue;
        }
        let entry = pools.entry(pool.name).or_insert(PoolSlices {
            slices: Vec::new(),
            generation: pool.generation,
            expected: pool.resource_slice_count,
        });
        if pool.generation > entry.generation {
            entry.slices.clear();
            entry.generation = pool.generation;
            entry.expected = pool.resource_slice_count;
        }
        if pool.generation == entry.generation {
            entry.slices.push(slice);
        }
    }
    for (name, pool) in &pools {
        if (pool.slices.len() as i64) < pool.expected {
            warnings.incomplete.push(format!(
                "pool {name} is incomplete: {} of {} slices at generation {}; counted as is",
                pool.slices.len(),
                pool.expected,
                pool.generation
            ));
        }
    }
    pools
}

/// A counter quantity. Most are small integers (`1`, `16`), read without the general parser.
fn quantity(text: &str) -> Result<Quantity, crate::quantity::QuantityError> {
    if !text.is_empty() && text.len() <= 9 && text.bytes().all(|b| b.is_ascii_digit()) {
        let value = text.bytes().fold(0i64, |n, b| n * 10 + i64::from(b - b'0'));
        return Ok(Quantity::from_i64(value));
    }
    text.parse()
}

/// A pool's shared counters: its counter sets in the order published, each counter with its
/// total. Sets and counters are few (one set per GPU, a dozen or so counters), so they are
/// found by walking; consumptions list counters in the same order as their set does (both
/// sorted by name), which a hint makes a single step.
#[derive(Default)]
struct PoolCounters<'a> {
    sets: Vec<SetCounters<'a>>,
    /// The set found last: a GPU's devices follow one another.
    last: std::cell::Cell<usize>,
}

struct SetCounters<'a> {
    name: &'a str,
    counters: Vec<KnownCounter<'a>>,
}

struct KnownCounter<'a> {
    name: &'a str,
    total: Quantity,
    /// `n` of a `memory-slice-<n>` counter.
    memory_slice: Option<u32>,
}

impl<'a> PoolCounters<'a> {
    /// Records a counter's total; a counter published twice keeps the later total.
    fn insert(&mut self, set: &'a str, counter: &'a str, total: Quantity) {
        let at = match self.sets.iter().position(|s| s.name == set) {
            Some(at) => at,
            None => {
                self.sets.push(SetCounters {
                    name: set,
                    counters: Vec::new(),
                });
                self.sets.len() - 1
            }
        };
        let counters = &mut self.sets[at].counters;
        match counters.iter_mut().find(|c| c.name == counter) {
            Some(known) => known.total = total,
            None => counters.push(KnownCounter {
                name: counter,
                total,
                memory_slice: memory_slice(counter),
            }),
        }
    }

    /// The index of counter set `name`.
    fn set(&self, name: &str) -> Option<usize> {
        let last = self.last.get();
        if self.sets.get(last).is_some_and(|s| s.name == name) {
            return Some(last);
        }
        let at = self.sets.iter().position(|s| s.name == name)?;
        self.last.set(at);
        Some(at)
    }

    /// The index of `name` in set `set`, looked for from `hint` on first.
    fn counter(&self, set: usize, name: &str, hint: usize) -> Option<usize> {
        let counters = &self.sets[set].counters;
        let hint = hint.min(counters.len());
        let (before, after) = counters.split_at(hint);
        after
            .iter()
            .position(|c| c.name == name)
            .map(|i| hint + i)
            .or_else(|| before.iter().position(|c| c.name == name))
    }
}

/// The GPUs of the driver's slices (of `options.node` only, when set), each with its devices,
/// their counter use and holders, pools in name order. Claims naming a device of a known pool
/// that no slice publishes are reported in `warnings`.
pub(super) fn collect<'a>(
    slices: &'a [SliceRecord<'a>],
    options: &CapacityOptions,
    holders: &'a Holders<'a>,
    warnings: &mut Warnings,
) -> Result<Vec<GpuEntry<'a>>, CapacityError> {
    let driver = options.driver.as_str();
    let mut gpus: Vec<GpuEntry<'a>> = Vec::new();
    for (pool_name, pool) in pools(slices, options, warnings) {
        let mut counters = PoolCounters::default();
        for &slice in &pool.slices {
            for set in slice.spec.shared_counters.iter().flatten() {
                for (counter, value) in &set.counters.0 {
                    let q = quantity(value.value).map_err(|e| {
                        invalid(
                            slice,
                            format!("spec.sharedCounters[{}].counters.{counter}.value", set.name),
                            value.value,
                            e.problem(),
                        )
                    })?;
                    counters.insert(set.name, counter, q);
                }
            }
        }
        let pool_holders = holders.get(pool_name);
        let mut matched: HashSet<&str> = HashSet::new();
        let mut by_minor: HashMap<i64, usize> = HashMap::new();
        let mut bare = 0i64;
        for &slice in &pool.slices {
            let node = slice.spec.node_name.unwrap_or(pool_name);
            for (d, device) in slice.spec.devices.iter().flatten().enumerate() {
                let profile = string(device, driver, Attr::Profile);
                let kind = match string(device, driver, Attr::Type) {
                    Some("vfio") => Kind::Vfio,
                    Some("vgpu") => Kind::Vgpu,
                    Some("mig") => Kind::Mig,
                    _ if profile.is_some() => Kind::Mig,
                    _ => Kind::Gpu,
                };
                let mig = kind == Kind::Mig;
                let vfio = kind == Kind::Vfio;
                // A bare VFIO device is a GPU of its own: negative keys never meet a minor. A
                // vGPU names its GPU by the counter set it consumes, else by its `index`.
                let found = match kind {
                    Kind::Vfio => Some(counter_set_minor(device).unwrap_or_else(|| {
                        bare -= 1;
                        bare
                    })),
                    Kind::Vgpu => {
                        counter_set_minor(device).or_else(|| int(device, driver, Attr::Index))
                    }
                    Kind::Gpu | Kind::Mig => gpu_minor(device, driver, mig),
                };
                let Some(minor) = found else {
                    return Err(invalid(
                        slice,
                        format!("spec.devices[{d}].attributes"),
                        device.name,
                        "the device names no GPU: it has no minor, parentMinor, index or \
                         parentIndex attribute and its name is not gpu-<n>…"
                            .into(),
                    ));
                };
                let at = *by_minor.entry(minor).or_insert_with(|| {
                    gpus.push(GpuEntry {
                        node: node.to_string(),
                        minor,
                        name: if minor < 0 {
                            device.name.to_string()
                        } else {
                            format!("gpu-{minor}")
                        },
                        uuid: None,
                        model: "",
                        devices: Vec::new(),
                        book: Book::default(),
                    });
                    gpus.len() - 1
                });
                let gpu = &mut gpus[at];
                if gpu.model.is_empty() {
                    gpu.model = string(device, driver, Attr::ProductName).unwrap_or("");
                }
                if gpu.uuid.is_none() && !vfio {
                    gpu.uuid = if mig {
                        string(device, driver, Attr::ParentUuid)
                    } else {
                        string(device, driver, Attr::Uuid)
                    };
                }
                let mut uses = Vec::new();
                let mut groups: Vec<&str> = Vec::new();
                let (mut first, mut last, mut slices_used) = (u32::MAX, 0, 0);
                for (c, consumed) in device.consumes_counters.iter().flatten().enumerate() {
                    // Unknown sets and counters are ignored, as the scheduler does.
                    let Some(set) = counters.set(consumed.counter_set) else {
                        continue;
                    };
                    groups.extend(consumed.compatibility_groups.iter().flatten().copied());
                    uses.reserve(consumed.counters.0.len());
                    let mut hint = 0;
                    for (counter, value) in &consumed.counters.0 {
                        let Some(at) = counters.counter(set, counter, hint) else {
                            continue;
                        };
                        hint = at + 1;
                        let amount = quantity(value.value).map_err(|e| {
                            invalid(
                                slice,
                                format!(
                                    "spec.devices[{d}].consumesCounters[{c}].counters.{counter}.value"
                                ),
                                value.value,
                                e.problem(),
                            )
                        })?;
                        let known = &counters.sets[set].counters[at];
                        let i = gpu.book.index(
                            (set as u32, at as u32),
                            known.name,
                            known.total,
                            known.memory_slice,
                        );
                        uses.push((i, amount));
                        if let Some(n) = known.memory_slice {
                            first = first.min(n);
                            last = last.max(n);
                            slices_used += 1;
                        }
                    }
                }
                let placement = if slices_used > 0 {
                    Some(Placement {
                        start: first,
                        size: Some(last - first + 1),
                    })
                } else if mig {
                    start_from_name(device.name).map(|start| Placement { start, size: None })
                } else {
                    None
                };
                let held = pool_holders
                    .and_then(|h| h.get(&*device.name))
                    .map(Vec::as_slice);
                if held.is_some() {
                    matched.insert(device.name);
                }
                gpu.devices.push(Dev {
                    name: device.name,
                    profile: match kind {
                        Kind::Vfio => super::VFIO_GPU,
                        Kind::Mig => profile.unwrap_or("unknown"),
                        Kind::Vgpu => profile.unwrap_or("vgpu"),
                        Kind::Gpu => FULL_GPU,
                    },
                    kind,
                    placement,
                    uses,
                    holders: held,
                    groups,
                });
            }
        }
        let Some(pool_holders) = pool_holders else {
            continue;
        };
        if matched.len() < pool_holders.len() {
            let mut ghosts: Vec<(&&str, &Vec<Holder>)> = pool_holders
                .iter()
                .filter(|(device, _)| !matched.contains(**device))
                .collect();
            ghosts.sort_by_key(|(device, _)| **device);
            for (device, held) in ghosts {
                let claims: Vec<String> = held
                    .iter()
                    .map(|h| format!("{}/{}", h.namespace, h.claim))
                    .collect();
                warnings.ghosts.push(format!(
                    "claim {} holds device {device} of pool {pool_name}, which no slice publishes",
                    claims.join(", ")
                ));
            }
        }
    }
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mig_device_name_gives_its_placement_start_with_or_without_a_compute_instance() {
        assert_eq!(start_from_name("gpu-0-mig-3g40gb-4"), Some(4));
        assert_eq!(start_from_name("gpu-0-mig-1g10gb-me-6"), Some(6));
        assert_eq!(start_from_name("gpu-0-mig-1g5gb-2-ci1"), Some(2));
        assert_eq!(start_from_name("gpu-0"), Some(0));
        assert_eq!(start_from_name("odd"), None);
    }
}
