//! MIG packing under churn: one DGX H100 (`--sim-node dgx-h100`, dynamic MIG, the slices
//! `inventory` publishes), seeded streams of 1g/2g/3g/4g/7g claims arriving and leaving,
//! allocated by our allocator (`alloc/`, first fit in slice order, as the scheduler's) with
//! the built-in DeviceClasses and real CEL selectors.
//!
//! After every event it asks whether a `7g.80gb` and a `4g.40gb` request would still fit, and
//! whether they could fit in two best possible layouts of the same allocations, each found by
//! exact search over the MIG placement table:
//! - same GPU: the profiles each GPU holds, re-placed on that GPU (what a packing order can
//!   lose; a 7g.80gb needs an idle GPU, which this never makes, so its share is 100 % here);
//! - any GPU: every held profile re-placed on any GPU of the node (a perfect repack, which no
//!   policy reaches while running MIG instances cannot move).
//!
//! The figure is how often the big profile fits as a share of how often it could, for the
//! packing order `inventory` publishes (new) against the order before it (old: every
//! profile's placements by ascending start). Target: ≥ 90 % for both profiles. Prints figures;
//! asserts only that the allocator never beats the same-GPU search and that never beats the
//! any-GPU one (either would mean a wrong search).
//!
//! Load: every event is an arrival with a fixed probability, else the departure of a random
//! held claim, so that probability sets how full the node runs. Three loads are measured:
//! `moderate` (50 % arrivals: about a third of the node's memory slices held), `busy` (52 %:
//! about half) and `saturated` (55 %: about two thirds, where most 7g.80gb arrivals find no
//! idle GPU).
//!
//! `spread` is a comparison order, not one `inventory` publishes: every GPU's 1g/2g placements
//! clear of memory slices 0–3 first, GPU after GPU, then the rest. It keeps 4g.40gb placeable
//! by starting idle GPUs early, which is what the packing order refuses to do; its row shows
//! what that buys for 4g.40gb and costs for 7g.80gb arrivals.
//!
//! Slice order: kube-scheduler since 1.36 sorts a pool's slices by name before its first-fit
//! walk (`sortSlicesByName`), and our allocator does the same, so the published order holds
//! across the node: the `in order` rows. Up to 1.35 it walked them in the order its
//! ResourceSlice cache listed them, a Go map's (unordered, new each call): the `random` rows
//! shuffle the device slices before every allocation (seeded) to measure that; `by profile`
//! is `--slice-layout by-profile`, whose slices each hold whole profiles, so a one-profile
//! request finds all its candidates in one slice and the order inside it decides, whatever the
//! slice order.
//! Run: `cargo bench --bench churn`.

#[path = "support/walk.rs"]
mod walk;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use gpu_dra::alloc::{Allocator, Detail, Node};
use gpu_dra::devices::SliceLayout;
use gpu_dra::explain_inputs::{SimSliceOptions, builtin_classes, sim_slices};
use gpu_dra::hardware::MigProfile;
use gpu_dra::hardware::catalog;
use gpu_dra::hardware::geometry::fill_placements;
use gpu_dra::selectors::CelEngine;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::json;
use walk::{Rng, shuffle_device_slices};

const NODE: &str = "dgx-h100";
/// GPUs of the node, and memory slices of each (H100).
const GPUS: u32 = 8;
const MEMORY_SLICES: u32 = 8;
const EVENTS: usize = 1500;
const SEEDS: [u64; 3] = [0x5eed_0001, 0x5eed_0002, 0x5eed_0003];
/// Claim mix: profile and weight.
const MIX: [(&str, u32); 5] = [
    ("1g.10gb", 40),
    ("2g.20gb", 25),
    ("3g.40gb", 15),
    ("4g.40gb", 10),
    ("7g.80gb", 10),
];
/// Loads: a name and the percent of events that are arrivals (the rest are departures of a
/// random held claim).
const LOADS: [(&str, u64); 3] = [("moderate", 50), ("busy", 52), ("saturated", 55)];
const BIG: [&str; 2] = ["7g.80gb", "4g.40gb"];

fn request(name: &str, profile: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "churn"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression":
                format!("device.attributes['gpu.nvidia.com'].profile == '{profile}'")}}]
        }}]}}
    }))
    .expect("claim")
}

/// Devices of every slice sorted as `devices::build` emitted them before the packing order:
/// per GPU the full GPU, then profiles in table order, each by ascending start.
fn old_order(slices: &[ResourceSlice], profiles: &[MigProfile]) -> Vec<ResourceSlice> {
    let key = |name: &str| -> (u32, usize, u32) {
        let parts: Vec<&str> = name.split('-').collect();
        let minor = parts[1].parse().expect("minor");
        if parts.len() == 2 {
            return (minor, 0, 0);
        }
        let start = parts[parts.len() - 1].parse().expect("start");
        let profile = parts[3..parts.len() - 1].join("-");
        let at = profiles
            .iter()
            .position(|p| gpu_dra::devices::mig_device_name(minor, &p.name, start) == name)
            .unwrap_or_else(|| panic!("profile {profile} of {name}"));
        (minor, at + 1, start)
    };
    slices
        .iter()
        .cloned()
        .map(|mut s| {
            if let Some(devices) = s.spec.devices.as_mut() {
                devices.sort_by_key(|d| key(&d.name));
            }
            s
        })
        .collect()
}

/// The `spread` comparison order: every device of the node re-sorted, 1g/2g placements that
/// overlap memory slices 0–3 (where a 4g.40gb goes) after every other device of every GPU,
/// otherwise in published order, and re-split into slices of the same sizes. Walked in order.
fn spread_order(slices: &[ResourceSlice]) -> Vec<ResourceSlice> {
    let lower_small = |name: &str| {
        let parts: Vec<&str> = name.split('-').collect();
        let small = parts
            .get(3)
            .is_some_and(|p| p.starts_with("1g") || p.starts_with("2g"));
        let start: u32 = parts.last().and_then(|s| s.parse().ok()).unwrap_or(0);
        small && start < 4
    };
    let sizes: Vec<usize> = slices
        .iter()
        .filter_map(|s| s.spec.devices.as_ref().map(Vec::len))
        .collect();
    let mut all: Vec<_> = slices
        .iter()
        .filter_map(|s| s.spec.devices.clone())
        .flatten()
        .collect();
    all.sort_by_key(|d| lower_small(&d.name));
    let mut all = all.into_iter();
    let mut sizes = sizes.into_iter();
    slices
        .iter()
        .cloned()
        .map(|mut s| {
            if s.spec.devices.is_some() {
                let n = sizes.next().expect("size");
                s.spec.devices = Some(all.by_ref().take(n).collect());
            }
            s
        })
        .collect()
}

/// `slices` with the whole-GPU profile's devices (`7g.80gb`) reordered among the positions
/// they hold so that a `7g.80gb` claim meets the GPUs in `order` (minors). Only their order
/// among themselves decides where a `7g.80gb` claim lands (no other claim selects them), so
/// this reproduces any whole-GPU order of `split` for the MIG claims this bench places.
fn sevens_in(slices: &[ResourceSlice], order: &[u32]) -> Vec<ResourceSlice> {
    let seven = |name: &str| name.ends_with("-mig-7g80gb-0");
    let minor = |name: &str| -> u32 {
        name.split('-')
            .nth(1)
            .expect("minor")
            .parse()
            .expect("minor")
    };
    let rank = |name: &str| {
        order
            .iter()
            .position(|m| *m == minor(name))
            .expect("in order")
    };
    let mut out: Vec<ResourceSlice> = slices.to_vec();
    let mut at = Vec::new();
    for (i, s) in out.iter().enumerate() {
        for (j, d) in s.spec.devices.iter().flatten().enumerate() {
            if seven(&d.name) {
                at.push((i, j));
            }
        }
    }
    let mut moved: Vec<_> = at
        .iter()
        .map(|&(i, j)| out[i].spec.devices.as_ref().expect("devices")[j].clone())
        .collect();
    moved.sort_by_key(|d| rank(&d.name));
    for ((i, j), d) in at.into_iter().zip(moved) {
        out[i].spec.devices.as_mut().expect("devices")[j] = d;
    }
    out
}

/// How the allocator walks a pool's slices.
#[derive(Clone, Copy)]
enum Walk {
    /// In the published order, which is name order: kube-scheduler's since 1.36 (it sorts a
    /// pool's slices by name) and our allocator's.
    InOrder,
    /// In a fresh random order for every allocation: kube-scheduler ≤ 1.35's (its cache is a
    /// map, and those versions walked it unsorted).
    Random,
}

/// A held claim: its profile, the GPU (minor) it landed on, and the claim with its allocation.
struct Held {
    profile: &'static str,
    gpu: u32,
    claim: ResourceClaim,
}

/// Whether `big` fits next to what `held` holds if every GPU's instances could be re-placed:
/// an exact search over the placement table, per GPU.
fn best_fits(held: &[Held], big: &str, profiles: &[MigProfile], gpus: u32) -> bool {
    let by_name = |name: &str| profiles.iter().find(|p| p.name == name).expect("profile");
    let mut per_gpu: BTreeMap<u32, Vec<&MigProfile>> = (0..gpus).map(|g| (g, vec![])).collect();
    for h in held {
        per_gpu.entry(h.gpu).or_default().push(by_name(h.profile));
    }
    per_gpu.values().any(|on_gpu| {
        let mut wanted: Vec<(&MigProfile, Option<u32>)> =
            on_gpu.iter().map(|p| (*p, None)).collect();
        wanted.push((by_name(big), None));
        fill_placements(profiles, &[], &wanted).is_some()
    })
}

/// Held claims counted per profile of [`MIX`], in its order.
type Counts = [u8; MIX.len()];

/// Every load of [`MIX`] profiles one GPU can hold at once (exact search over the placement
/// table), keeping only the maximal ones: any smaller load fits where a maximal one does.
fn gpu_loads(profiles: &[MigProfile]) -> Vec<Counts> {
    let by_name = |name: &str| profiles.iter().find(|p| p.name == name).expect("profile");
    let mix: Vec<&MigProfile> = MIX.iter().map(|(p, _)| by_name(p)).collect();
    let fits = |counts: &Counts| {
        let wanted: Vec<(&MigProfile, Option<u32>)> = counts
            .iter()
            .zip(&mix)
            .flat_map(|(&n, p)| std::iter::repeat_n((*p, None), usize::from(n)))
            .collect();
        fill_placements(profiles, &[], &wanted).is_some()
    };
    // Every vector with each count up to what fits alone, odometer style.
    let mut feasible: Vec<Counts> = Vec::new();
    let mut counts: Counts = [0; MIX.len()];
    'next: loop {
        if fits(&counts) {
            feasible.push(counts);
        }
        for (count, profile) in counts.iter_mut().zip(&mix) {
            if u32::from(*count + 1) * profile.memory_slices <= MEMORY_SLICES {
                *count += 1;
                continue 'next;
            }
            *count = 0;
        }
        break;
    }
    let dominated = |a: &Counts| {
        feasible
            .iter()
            .any(|b| b != a && a.iter().zip(b).all(|(x, y)| x <= y))
    };
    feasible.iter().filter(|a| !dominated(a)).copied().collect()
}

/// Whether `counts` held claims fit on `gpus` GPUs if every claim could be re-placed on any
/// GPU of the node: an exact search over [`gpu_loads`], memoised.
fn fits_across(
    counts: Counts,
    gpus: u32,
    loads: &[Counts],
    memo: &mut HashMap<(Counts, u32), bool>,
) -> bool {
    if counts.iter().all(|&n| n == 0) {
        return true;
    }
    if gpus == 0 {
        return false;
    }
    if let Some(&known) = memo.get(&(counts, gpus)) {
        return known;
    }
    let fits = loads.iter().any(|load| {
        let mut rest = counts;
        for (r, l) in rest.iter_mut().zip(load) {
            *r = r.saturating_sub(*l);
        }
        rest != counts && fits_across(rest, gpus - 1, loads, memo)
    });
    memo.insert((counts, gpus), fits);
    fits
}

#[derive(Default)]
struct Tally {
    events: usize,
    arrivals: BTreeMap<&'static str, (usize, usize)>,
    /// Per big profile: probes where it fits, where it could fit with every GPU's instances
    /// re-placed on that GPU.
    fits: BTreeMap<&'static str, (usize, usize)>,
    /// Per big profile: probes where it fits, where it could fit with every instance re-placed
    /// on any GPU of the node.
    across: BTreeMap<&'static str, (usize, usize)>,
    held_slices: usize,
}

/// What every row shares: the CEL engine, the built-in classes and the GPU's MIG profiles.
struct Fixture<'a> {
    engine: &'a CelEngine,
    classes: &'a [DeviceClass],
    profiles: &'a [MigProfile],
    /// [`gpu_loads`] of the profiles.
    loads: &'a [Counts],
}

/// One seeded stream of `EVENTS` events at `arrivals` percent arrivals, allocated from
/// `slices` walked as `walk` says, added to `tally`.
fn run(
    fixture: &Fixture<'_>,
    slices: &[ResourceSlice],
    seed: u64,
    arrivals: u64,
    tally: &mut Tally,
    walk: Walk,
) {
    let Fixture {
        engine,
        classes,
        profiles,
        loads,
    } = *fixture;
    let mut rng = Rng(seed);
    // Its own stream, so every row sees the same arrivals and departures.
    let mut shuffle = Rng(seed ^ 0x0051_f1ed);
    let node = Node::named(NODE);
    let total: u32 = MIX.iter().map(|(_, w)| w).sum();
    let probes: Vec<ResourceClaim> = BIG
        .iter()
        .map(|p| request(&format!("probe-{p}"), p))
        .collect();
    let mut held: Vec<Held> = Vec::new();
    let size = |p: &str| {
        profiles
            .iter()
            .find(|x| x.name == p)
            .map_or(0, |x| x.memory_slices)
    };
    for event in 0..EVENTS {
        if held.is_empty() || rng.below(100) < arrivals {
            let mut pick = rng.below(u64::from(total)) as u32;
            let profile = MIX
                .iter()
                .find(|(_, w)| {
                    let hit = pick < *w;
                    pick = pick.saturating_sub(*w);
                    hit
                })
                .map_or(MIX[0].0, |(p, _)| p);
            let mut claim = request(&format!("c-{seed:x}-{event}"), profile);
            let allocated: Vec<ResourceClaim> = held.iter().map(|h| h.claim.clone()).collect();
            let walked = match walk {
                Walk::InOrder => slices.to_vec(),
                Walk::Random => {
                    let mut walked = slices.to_vec();
                    shuffle_device_slices(&mut walked, &mut shuffle);
                    walked
                }
            };
            let allocator =
                Allocator::new(engine, classes, &walked, &allocated).expect("allocator");
            let prepared = allocator
                .prepare(std::slice::from_ref(&claim))
                .expect("claim");
            let outcome = allocator.allocate(&prepared, &node, Detail::Brief);
            let entry = tally.arrivals.entry(profile).or_default();
            entry.0 += 1;
            if let Some(mut results) = outcome.allocations {
                entry.1 += 1;
                let result = results.remove(0);
                let device = result
                    .devices
                    .as_ref()
                    .and_then(|d| d.results.as_ref())
                    .and_then(|r| r.first())
                    .map(|r| r.device.clone())
                    .expect("one device");
                let gpu = device.split('-').nth(1).expect("minor").parse().unwrap();
                claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
                    allocation: Some(result),
                    ..Default::default()
                });
                held.push(Held {
                    profile,
                    gpu,
                    claim,
                });
            }
        } else {
            let at = rng.below(held.len() as u64) as usize;
            held.swap_remove(at);
        }
        let allocated: Vec<ResourceClaim> = held.iter().map(|h| h.claim.clone()).collect();
        let allocator = Allocator::new(engine, classes, slices, &allocated).expect("allocator");
        for (probe, big) in probes.iter().zip(BIG) {
            let prepared = allocator
                .prepare(std::slice::from_ref(probe))
                .expect("probe");
            let fits = allocator.allocate(&prepared, &node, Detail::Brief).fits();
            let best = best_fits(&held, big, profiles, GPUS);
            assert!(
                best || !fits,
                "{big} fits where the exact search says it cannot"
            );
            let mut counts: Counts = [0; MIX.len()];
            for h in held.iter().map(|h| h.profile).chain([big]) {
                counts[MIX.iter().position(|(p, _)| *p == h).expect("mix")] += 1;
            }
            let anywhere = fits_across(counts, GPUS, loads, &mut HashMap::new());
            assert!(
                anywhere || !best,
                "{big} fits by re-placing on each GPU where re-placing anywhere says it cannot"
            );
            let entry = tally.fits.entry(big).or_default();
            entry.0 += usize::from(fits);
            entry.1 += usize::from(best);
            let entry = tally.across.entry(big).or_default();
            entry.0 += usize::from(fits);
            entry.1 += usize::from(anywhere);
        }
        tally.events += 1;
        tally.held_slices += held.iter().map(|h| size(h.profile) as usize).sum::<usize>();
    }
}

fn main() {
    let start = Instant::now();
    let engine = CelEngine;
    let classes = builtin_classes().expect("classes");
    let profiles = catalog::model("h100").expect("h100").profiles.clone();
    let slices_in = |slice_layout| {
        sim_slices(
            NODE,
            "gpu.nvidia.com",
            SimSliceOptions {
                slice_layout,
                ..Default::default()
            },
        )
        .expect("slices")
    };
    let new = slices_in(SliceLayout::ByGpu);
    let gpus_first = slices_in(SliceLayout::GpusFirst);
    let interleaved = slices_in(SliceLayout::Interleaved);
    // The default since issue 46: the GPUs share the profiles out (`--mig-profiles split`).
    let split = sim_slices(
        NODE,
        "gpu.nvidia.com",
        SimSliceOptions {
            mig_profiles: gpu_dra::devices::MigProfileSet::Split,
            ..Default::default()
        },
    )
    .expect("slices");
    // Comparison orders of the 7g.80gb walk under `split` (not published; the default is
    // split::whole_order, 5, 3, 1, 6, 7, 2, 0, 4): from the last GPU down (before the
    // whole-GPU order), the whole-GPU order with the small profile's share ranked before the
    // other profiles' (the larger family's GPUs first), and the small family first.
    let split_down = sevens_in(&split, &[7, 6, 5, 4, 3, 2, 1, 0]);
    let split_small_second = sevens_in(&split, &[1, 3, 5, 6, 7, 2, 0, 4]);
    let split_small = sevens_in(&split, &[5, 6, 7, 3, 4, 1, 2, 0]);
    let old = old_order(&new, &profiles);
    let grouped = slices_in(SliceLayout::ByProfile);
    assert_ne!(
        old.iter().map(|s| &s.spec.devices).collect::<Vec<_>>(),
        new.iter().map(|s| &s.spec.devices).collect::<Vec<_>>(),
        "the packing order differs from the old one"
    );
    let spread = spread_order(&new);
    let loads = gpu_loads(&profiles);
    let fixture = Fixture {
        engine: &engine,
        classes: &classes,
        profiles: &profiles,
        loads: &loads,
    };
    println!("{NODE}: {EVENTS} events per seed, seeds {SEEDS:x?}, mix {MIX:?}");
    for (load, arrivals) in LOADS {
        println!("\nload {load}: {arrivals}% of events are arrivals");
        println!(
            "{:<21} {:>6} {:>19} {:>19} {:>19} {:>19} {:>22}",
            "order, slice walk",
            "held",
            "7g fits/same GPU",
            "4g fits/same GPU",
            "7g fits/any GPU",
            "4g fits/any GPU",
            "placed 1g 2g 3g 4g 7g"
        );
        for (label, slices, walk) in [
            ("old, in order", &old, Walk::InOrder),
            ("by-gpu, in order", &new, Walk::InOrder),
            ("gpus-first, in order", &gpus_first, Walk::InOrder),
            ("interleaved, in order", &interleaved, Walk::InOrder),
            ("split (default)", &split, Walk::InOrder),
            ("split, 7g 7..0", &split_down, Walk::InOrder),
            ("split, 7g 1,3,5,6,7", &split_small_second, Walk::InOrder),
            ("split, 7g 5,6,7,3,4", &split_small, Walk::InOrder),
            ("by-gpu, ≤1.35 random", &new, Walk::Random),
            ("by profile, random", &grouped, Walk::Random),
            ("spread, in order", &spread, Walk::InOrder),
        ] {
            let mut tally = Tally::default();
            for seed in SEEDS {
                run(&fixture, slices, seed, arrivals, &mut tally, walk);
            }
            let share = |of: &BTreeMap<&str, (usize, usize)>, big: &str| {
                let (fits, could) = of[big];
                format!(
                    "{fits}/{could} = {:5.1}%",
                    100.0 * fits as f64 / could.max(1) as f64
                )
            };
            let placed: Vec<String> = MIX
                .iter()
                .map(|(p, _)| {
                    let (tried, ok) = tally.arrivals.get(p).copied().unwrap_or_default();
                    format!("{:.0}", 100.0 * ok as f64 / tried.max(1) as f64)
                })
                .collect();
            println!(
                "{label:<21} {:>5.1}% {:>19} {:>19} {:>19} {:>19} {:>22}",
                100.0 * tally.held_slices as f64
                    / (tally.events * (GPUS * MEMORY_SLICES) as usize) as f64,
                share(&tally.fits, "7g.80gb"),
                share(&tally.fits, "4g.40gb"),
                share(&tally.across, "7g.80gb"),
                share(&tally.across, "4g.40gb"),
                placed.join(" ")
            );
        }
    }
    println!(
        "(held: mean share of the node's 64 memory slices held after each event; same GPU: \
         could fit with each GPU's instances re-placed on it; any GPU: with every instance \
         re-placed anywhere on the node; placed: % of arrivals of each profile placed)"
    );
    println!("total {:.1} s", start.elapsed().as_secs_f64());
}
