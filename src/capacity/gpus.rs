//! Reading the driver's ResourceSlices into GPUs with their devices and counters, and the
//! allocated claims into who holds which device.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};

use super::book::{Book, Dev, GpuEntry, memory_slice};
use super::{CapacityError, CapacityOptions, FULL_GPU, Holder, Placement};
use crate::quantity::Quantity;

/// Holders per pool, then per device.
pub(super) type Holders = HashMap<String, HashMap<String, Vec<Holder>>>;

/// Who holds which device of `driver`, from allocated claims' results and `reservedFor`.
/// Admin-access results hold nothing, as in Kubernetes.
pub(super) fn holders(claims: &[ResourceClaim], driver: &str) -> Holders {
    let mut out: Holders = HashMap::new();
    for claim in claims {
        let Some(status) = claim.status.as_ref() else {
            continue;
        };
        let Some(results) = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
        else {
            continue;
        };
        let pods: Vec<String> = status
            .reserved_for
            .iter()
            .flatten()
            .map(|r| match (r.api_group.as_deref(), r.resource.as_str()) {
                (None | Some(""), "pods") => r.name.clone(),
                _ => format!("{}/{}", r.resource, r.name),
            })
            .collect();
        for result in results {
            if result.driver != driver || result.admin_access == Some(true) {
                continue;
            }
            let holder = Holder {
                namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                claim: claim.metadata.name.clone().unwrap_or_default(),
                pods: pods.clone(),
                request: result.request.clone(),
                share_id: result.share_id.clone(),
                consumed: result
                    .consumed_capacity
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect(),
            };
            out.entry(result.pool.clone())
                .or_default()
                .entry(result.device.clone())
                .or_default()
                .push(holder);
        }
    }
    out
}

fn attribute<'a>(
    device: &'a Device,
    driver: &str,
    name: &str,
) -> Option<&'a k8s_openapi::api::resource::v1::DeviceAttribute> {
    let attributes = device.attributes.as_ref()?;
    attributes
        .get(name)
        .or_else(|| attributes.get(&format!("{driver}/{name}")))
}

fn int(device: &Device, driver: &str, name: &str) -> Option<i64> {
    attribute(device, driver, name)?.int
}

fn string<'a>(device: &'a Device, driver: &str, name: &str) -> Option<&'a str> {
    attribute(device, driver, name)?.string.as_deref()
}

/// The GPU (minor number) a device belongs to: its `minor` / `parentMinor`, else its
/// `index` / `parentIndex`, else the `<n>` of a `gpu-<n>…` name.
fn gpu_minor(device: &Device, driver: &str, mig: bool) -> Option<i64> {
    let (minor, index) = if mig {
        ("parentMinor", "parentIndex")
    } else {
        ("minor", "index")
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
    slices: Vec<&'a ResourceSlice>,
    generation: i64,
    expected: i64,
}

fn invalid(slice: &ResourceSlice, field: String, value: &str, problem: String) -> CapacityError {
    CapacityError::InvalidSlice {
        slice: slice.metadata.name.clone().unwrap_or_default(),
        field,
        value: value.to_string(),
        problem,
    }
}

/// The driver's slices at the newest generation of each pool, by pool name.
fn pools<'a>(
    slices: &'a [ResourceSlice],
    options: &CapacityOptions,
    warnings: &mut Vec<String>,
) -> BTreeMap<&'a str, PoolSlices<'a>> {
    let mut pools: BTreeMap<&str, PoolSlices> = BTreeMap::new();
    for slice in slices.iter().filter(|s| s.spec.driver == options.driver) {
        let node = slice
            .spec
            .node_name
            .as_deref()
            .unwrap_or(&slice.spec.pool.name);
        if options.node.as_deref().is_some_and(|n| n != node) {
            continue;
        }
        let pool = &slice.spec.pool;
        let entry = pools.entry(pool.name.as_str()).or_insert(PoolSlices {
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
            warnings.push(format!(
                "pool {name} is incomplete: {} of {} slices at generation {}; counted as is",
                pool.slices.len(),
                pool.expected,
                pool.generation
            ));
        }
    }
    pools
}

/// The GPUs of the driver's slices (of `options.node` only, when set), each with its devices,
/// their counter use and holders. Claims naming a device of a known pool that no slice
/// publishes are reported in `warnings`.
pub(super) fn collect<'a>(
    slices: &'a [ResourceSlice],
    options: &CapacityOptions,
    holders: &'a Holders,
    warnings: &mut Vec<String>,
) -> Result<Vec<GpuEntry<'a>>, CapacityError> {
    let driver = options.driver.as_str();
    let mut gpus: Vec<GpuEntry<'a>> = Vec::new();
    for (pool_name, pool) in pools(slices, options, warnings) {
        let mut totals: HashMap<(&str, &str), Quantity> = HashMap::new();
        for &slice in &pool.slices {
            for set in slice.spec.shared_counters.iter().flatten() {
                for (counter, value) in &set.counters {
                    let q = Quantity::from_k8s(&value.value).map_err(|e| {
                        invalid(
                            slice,
                            format!("spec.sharedCounters[{}].counters.{counter}.value", set.name),
                            &value.value.0,
                            e.problem(),
                        )
                    })?;
                    totals.insert((set.name.as_str(), counter.as_str()), q);
                }
            }
        }
        let pool_holders = holders.get(pool_name);
        let mut by_minor: HashMap<i64, usize> = HashMap::new();
        let mut published: Vec<&str> = Vec::new();
        for &slice in &pool.slices {
            let node = slice.spec.node_name.as_deref().unwrap_or(pool_name);
            for (d, device) in slice.spec.devices.iter().flatten().enumerate() {
                published.push(&device.name);
                let profile = string(device, driver, "profile");
                let mig = profile.is_some() || string(device, driver, "type") == Some("mig");
                let Some(minor) = gpu_minor(device, driver, mig) else {
                    return Err(invalid(
                        slice,
                        format!("spec.devices[{d}].attributes"),
                        &device.name,
                        "the device names no GPU: it has no minor, parentMinor, index or \
                         parentIndex attribute and its name is not gpu-<n>…"
                            .into(),
                    ));
                };
                let at = *by_minor.entry(minor).or_insert_with(|| {
                    gpus.push(GpuEntry {
                        node: node.to_string(),
                        minor,
                        name: format!("gpu-{minor}"),
                        uuid: None,
                        model: "",
                        devices: Vec::new(),
                        book: Book::default(),
                    });
                    gpus.len() - 1
                });
                let gpu = &mut gpus[at];
                if gpu.model.is_empty() {
                    gpu.model = string(device, driver, "productName").unwrap_or("");
                }
                if gpu.uuid.is_none() {
                    gpu.uuid = if mig {
                        string(device, driver, "parentUUID")
                    } else {
                        string(device, driver, "uuid")
                    };
                }
                let mut uses = Vec::new();
                let (mut first, mut last, mut slices_used) = (u32::MAX, 0, 0);
                for (c, consumed) in device.consumes_counters.iter().flatten().enumerate() {
                    for (counter, value) in &consumed.counters {
                        // Unknown sets and counters are ignored, as the scheduler does.
                        let Some(total) = totals.get(&(consumed.counter_set.as_str(), counter))
                        else {
                            continue;
                        };
                        let amount = Quantity::from_k8s(&value.value).map_err(|e| {
                            invalid(
                                slice,
                                format!(
                                    "spec.devices[{d}].consumesCounters[{c}].counters.{counter}.value"
                                ),
                                &value.value.0,
                                e.problem(),
                            )
                        })?;
                        let i = gpu.book.index(&consumed.counter_set, counter, *total);
                        uses.push((i, amount));
                        if let Some(n) = memory_slice(counter) {
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
                    start_from_name(&device.name).map(|start| Placement { start, size: None })
                } else {
                    None
                };
                gpu.devices.push(Dev {
                    name: &device.name,
                    profile: if mig {
                        profile.unwrap_or("unknown")
                    } else {
                        FULL_GPU
                    },
                    placement,
                    uses,
                    holders: pool_holders
                        .and_then(|h| h.get(&device.name))
                        .map(Vec::as_slice),
                });
            }
        }
        for (device, held) in pool_holders.into_iter().flatten() {
            if !published.contains(&device.as_str()) {
                let claims: Vec<String> = held
                    .iter()
                    .map(|h| format!("{}/{}", h.namespace, h.claim))
                    .collect();
                warnings.push(format!(
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
