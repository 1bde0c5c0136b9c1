//! A seeded randomized soak of the real plugin: random prepares, unprepares and repeats, the
//! plugin SIGKILLed (between and during calls) and restarted, the kubelet re-registering, API
//! server outages, XIDs and recoveries, and MPS daemons crashing — with every invariant
//! checked after every step: hardware MIG instances = the checkpoint's carved devices; live
//! MPS daemons = the daemons the checkpoint records; CDI specs = prepared claims = what the
//! kubelet wants; after each restart, the published devices = the node's inventory; the
//! plugin's resident memory and open file descriptors bounded.
//!
//! `GPU_DRA_SOAK_SECS` (default 60) bounds the run, `GPU_DRA_SOAK_SEED` replays one. The
//! totals (operations by kind, invariant checks) are printed at the end.

mod plugin_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{as_share, kill9, live_daemons, mps_config, with_config};
use plugin_support::{Node, Plugin, eventually};
use serde_json::json;

/// Open descriptors and resident memory a healthy plugin stays under (generous: a leak of
/// one descriptor or a few KiB per call crosses them within a few hundred operations).
const MAX_FDS: usize = 128;
const MAX_RSS_KIB: u64 = 256 * 1024;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// `--mig-profiles all`: the claim pool's 1g.10gb devices on GPUs 0 and 1 are not among the
/// profiles the default `split` gives those GPUs.
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

/// Claims that never conflict with each other: MIG devices on GPUs 0–2, whole GPUs 6 and 7,
/// MPS claims of GPUs 3 and 5, four consumable-capacity shares of GPU 4.
fn claim_pool(node: &Node) -> Vec<ClaimRef> {
    let mut pool = Vec::new();
    let mut add = |name: String, claim: serde_json::Value| {
        let uid = format!("uid-{name}");
        node.api.put_claim(claim);
        pool.push(claim_ref(&name, &uid));
    };
    for gpu in 0..2 {
        for p in 0..7 {
            let name = format!("mig-{gpu}-{p}");
            let device = format!("gpu-{gpu}-mig-1g10gb-{p}");
            add(
                name.clone(),
                claims::on_node(&name, &format!("uid-{name}"), &[&device]),
            );
        }
    }
    for start in [0, 4] {
        let name = format!("mig-2-{start}");
        let device = format!("gpu-2-mig-3g40gb-{start}");
        add(
            name.clone(),
            claims::on_node(&name, &format!("uid-{name}"), &[&device]),
        );
    }
    for gpu in [6, 7] {
        let name = format!("full-{gpu}");
        add(
            name.clone(),
            claims::on_node(&name, &format!("uid-{name}"), &[&format!("gpu-{gpu}")]),
        );
    }
    for gpu in [3, 5] {
        let name = format!("mps-{gpu}");
        let claim = claims::on_node(&name, &format!("uid-{name}"), &[&format!("gpu-{gpu}")]);
        add(
            name.clone(),
            with_config(claim, &[], mps_config("GpuConfig", 40, "8Gi")),
        );
    }
    for i in 0..4 {
        let name = format!("share-{i}");
        let claim = claims::on_node(&name, &format!("uid-{name}"), &["gpu-4"]);
        let consumed = json!({"memory": "10Gi", "multiprocessors": "16"});
        add(
            name.clone(),
            as_share(claim, 0, &format!("5ace{i:04x}"), consumed),
        );
    }
    pool
}

/// MPS daemon ids the checkpoint records (a claim's own, or a shared GPU's).
fn recorded_daemons(node: &Node) -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(node.state_dir().join("checkpoint.json")).unwrap_or_default();
    let file: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let claims = file["payload"]["claims"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    claims
        .values()
        .flat_map(|c| c["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["sharing"]["daemon"].as_str().map(str::to_string))
        .collect()
}

/// The device names of the published pool, once it is complete.
fn published_devices(node: &Node) -> Option<BTreeSet<String>> {
    let pool = node.api.complete_pool()?;
    Some(
        pool.iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect(),
    )
}

fn fds_and_rss(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (fds, rss)
}

#[derive(Default)]
struct Totals {
    ops: BTreeMap<&'static str, u64>,
    checks: u64,
    max_fds: usize,
    max_rss_kib: u64,
}

impl Totals {
    fn op(&mut self, kind: &'static str) {
        *self.ops.entry(kind).or_default() += 1;
    }
}

struct Soak {
    node: Node,
    pool: Vec<ClaimRef>,
    wanted: BTreeSet<String>,
    plugin: Plugin,
    kubelet: KubeletClient,
    api_down: bool,
    /// The devices the node published at the start (its inventory's).
    published: BTreeSet<String>,
    /// The simulated GPUs, shared with the plugin through the state file.
    hardware: SimBackend,
    rng: Rng,
    seed: u64,
    totals: Totals,
}

impl Soak {
    /// Every invariant, once the plugin is idle (MPS supervision may be restarting a daemon
    /// it just found dead: that converges within a round).
    async fn check(&mut self, step: &str) {
        let context = format!("seed {}, after {step}", self.seed);
        let uids: Vec<&str> = self.wanted.iter().map(String::as_str).collect();
        self.node
            .snapshot()
            .assert_converged(&uids, &format!("{context}\n{}", self.plugin.log()));
        let node = &self.node;
        eventually(
            &format!("{context}: live MPS daemons = recorded daemons"),
            || {
                let recorded = recorded_daemons(node);
                let dirs: BTreeSet<String> = plugin_support::sharing::daemon_dirs(node)
                    .into_iter()
                    .collect();
                (dirs == recorded && live_daemons(node.root()).len() == recorded.len())
                    .then_some(())
            },
        )
        .await;
        let (fds, rss) = fds_and_rss(self.plugin.pid());
        self.totals.max_fds = self.totals.max_fds.max(fds);
        self.totals.max_rss_kib = self.totals.max_rss_kib.max(rss);
        assert!(fds <= MAX_FDS, "{context}: {fds} open descriptors");
        assert!(rss <= MAX_RSS_KIB, "{context}: {rss} KiB resident");
        self.totals.checks += 1;
    }

    /// One to four claims of the pool, as one kubelet call names them (each once).
    fn pick_some(&mut self) -> Vec<ClaimRef> {
        let n = 1 + self.rng.below(4);
        self.pick(n)
    }

    fn pick(&mut self, n: usize) -> Vec<ClaimRef> {
        let mut picked: Vec<ClaimRef> = (0..n)
            .map(|_| self.pool[self.rng.below(self.pool.len())].clone())
            .collect();
        picked.sort_by(|a, b| a.uid.cmp(&b.uid));
        picked.dedup_by(|a, b| a.uid == b.uid);
        picked
    }

    /// A prepare of claims the kubelet wants; during an outage, claims not yet prepared fail
    /// (their claim cannot be fetched) and the kubelet keeps them unwanted until it retries.
    async fn prepare(&mut self, claims: Vec<ClaimRef>) {
        let results = self.kubelet.prepare(&claims).await.expect("prepare call");
        for c in &claims {
            match &results[&c.uid] {
                Ok(_) => {
                    self.wanted.insert(c.uid.clone());
                }
                Err(e) => {
                    assert!(
                        self.api_down && e.contains("could not be reached"),
                        "seed {}: prepare of {} failed: {e}",
                        self.seed,
                        c.uid
                    );
                }
            }
        }
    }

    async fn unprepare(&mut self, claims: Vec<ClaimRef>) {
        let results = self
            .kubelet
            .unprepare(&claims)
            .await
            .expect("unprepare call");
        for c in &claims {
            assert_eq!(
                Ok(()),
                results[&c.uid],
                "seed {}: unprepare of {}",
                self.seed,
                c.uid
            );
            self.wanted.remove(&c.uid);
        }
    }

    /// SIGKILL (during a call when `mid_call`), restart, and the kubelet's retries.
    async fn kill_and_restart(&mut self, mid_call: bool) {
        if mid_call {
            let claims = self.pick_some();
            let delay = Duration::from_millis(self.rng.below(40) as u64);
            // The kubelet wants what it asked for until told otherwise.
            let unprepare = self.rng.chance(40);
            if !unprepare {
                self.wanted.extend(claims.iter().map(|c| c.uid.clone()));
            }
            let kubelet = &mut self.kubelet;
            let call = async {
                if unprepare {
                    let _ = kubelet.unprepare(&claims).await;
                } else {
                    let _ = kubelet.prepare(&claims).await;
                }
            };
            tokio::select! {
                () = call => {}
                () = tokio::time::sleep(delay) => {}
            }
            if unprepare {
                for c in &claims {
                    self.wanted.remove(&c.uid);
                }
            }
        }
        self.plugin.kill().await;
        self.plugin = self
            .node
            .start_with(&[("GPU_DRA_SHARED_GPUS", "4"), EVERY_PROFILE])
            .await;
        self.kubelet = self.plugin.register(DraApi::V1).await;
        let api_was_down = self.api_down;
        if api_was_down {
            // The kubelet retries until the cluster answers; here: once it is back.
            self.node.api.set_down(false);
            self.api_down = false;
        }
        let (want, rest): (Vec<ClaimRef>, Vec<ClaimRef>) = self
            .pool
            .iter()
            .cloned()
            .partition(|c| self.wanted.contains(&c.uid));
        self.prepare(want).await;
        self.unprepare(rest).await;
        // A fresh plugin publishes at once: the cluster's devices must be the node's.
        let node = &self.node;
        let published = &self.published;
        eventually(
            &format!("seed {}: published devices = inventory", self.seed),
            || (published_devices(node).as_ref() == Some(published)).then_some(()),
        )
        .await;
        self.totals.checks += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_randomized_soak_keeps_every_invariant_after_every_step() {
    let secs: u64 = std::env::var("GPU_DRA_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("GPU_DRA_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x50a1_c0de);
    let node = Node::new();
    let pool = claim_pool(&node);
    let plugin = node
        .start_with(&[("GPU_DRA_SHARED_GPUS", "4"), EVERY_PROFILE])
        .await;
    let published = eventually("slices", || published_devices(&node)).await;
    assert!(
        published.len() > 100,
        "{} devices published",
        published.len()
    );
    let kubelet = plugin.register(DraApi::V1).await;
    let hardware = SimBackend::open("dgx-h100", Some(&node.state_dir().join("sim")))
        .expect("the plugin's simulated GPUs");
    let mut soak = Soak {
        published,
        hardware,
        node,
        pool,
        wanted: BTreeSet::new(),
        plugin,
        kubelet,
        api_down: false,
        rng: Rng(seed | 1),
        seed,
        totals: Totals::default(),
    };
    soak.check("start").await;
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        let roll = soak.rng.below(100);
        let step = match roll {
            0..38 => {
                let claims = soak.pick_some();
                soak.prepare(claims).await;
                "prepare"
            }
            38..66 => {
                let claims = soak.pick_some();
                soak.unprepare(claims).await;
                "unprepare"
            }
            66..76 => {
                // A repeat of calls already answered: prepared claims come back unchanged,
                // unknown claims unprepare fine.
                let wanted: Vec<ClaimRef> = soak
                    .pool
                    .iter()
                    .filter(|c| soak.wanted.contains(&c.uid))
                    .cloned()
                    .collect();
                soak.prepare(wanted).await;
                "repeat"
            }
            76..80 => {
                soak.kill_and_restart(false).await;
                "kill between calls"
            }
            80..84 => {
                soak.kill_and_restart(true).await;
                "kill during a call"
            }
            84..88 => {
                soak.kubelet = soak.plugin.register(DraApi::V1).await;
                "kubelet re-registration"
            }
            88..92 => {
                soak.api_down = !soak.api_down;
                soak.node.api.set_down(soak.api_down);
                if soak.api_down {
                    "API server outage"
                } else {
                    "API server back"
                }
            }
            92..96 => {
                // A critical XID marks a GPU unhealthy, a reset recovers it: the inventory watcher,
                // health stream and publisher react while calls go on.
                let gpu = soak.rng.below(8) as u32;
                let healthy = soak.rng.chance(50);
                soak.hardware
                    .set_healthy(gpu, healthy)
                    .expect("simulated XID");
                if healthy { "XID recovery" } else { "XID" }
            }
            _ => match live_daemons(soak.node.root()).first() {
                Some(pid) => {
                    kill9(*pid);
                    "MPS daemon crash"
                }
                None => continue,
            },
        };
        soak.totals.op(step);
        soak.check(step).await;
    }
    soak.node.api.set_down(false);
    let all = soak.pool.clone();
    soak.unprepare(all).await;
    soak.check("final unprepare").await;
    let ops: u64 = soak.totals.ops.values().sum();
    eprintln!(
        "soak seed {seed:#x}, {secs} s: {ops} operations {:?}, {} invariant checks passed, \
         max {} open fds, max {} KiB resident",
        soak.totals.ops, soak.totals.checks, soak.totals.max_fds, soak.totals.max_rss_kib
    );
}
