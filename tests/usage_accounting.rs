//! Usage accounting through the plugin's kubelet handler on a simulated dgx-h100:
//! `gpu_dra_claim_device_seconds_total` counts what prepared claims hold, labelled by
//! namespace, DeviceClass, profile and sharing; an unprepared claim's seconds stay counted;
//! the ledger survives a plugin restart, and claims prepared before accounting are adopted.
//! The request path never writes the ledger: the background writer (or a graceful shutdown)
//! does, and a crash before it costs the bill at most what it did since the last write,
//! never a second count.

mod manager_support;

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_dra::claims::{AllocatedDevice, ClaimAllocation};
use gpu_dra::devices::{self, ModelOptions};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::kubelet::{ClaimRef, DraHandler};
use gpu_dra::metrics::Metrics;
use gpu_dra::plugin::handler::Handler;
use gpu_dra::plugin::usage::{UsageTracker, read_checkpoint};
use gpu_dra::usage::HeldDevice;
use manager_support::Table;

const POOL: &str = "dgx-h100";

fn alloc(device: &str) -> ClaimAllocation {
    ClaimAllocation {
        pod_claim_name: None,
        devices: vec![AllocatedDevice {
            request: "dev".into(),
            pool: POOL.into(),
            device: device.to_string(),
            admin_access: false,
            share_id: None,
            consumed_capacity: Default::default(),
        }],
        config: Vec::new(),
    }
}

const CLAIMS: [(&str, &str, &str); 3] = [
    ("train", "gpu-0-mig-3g40gb-0", "mig.nvidia.com"),
    ("whole", "gpu-2", "gpu.nvidia.com"),
    ("early", "gpu-3", "gpu.nvidia.com"),
];

fn handler(dir: &tempfile::TempDir, usage: Option<Arc<UsageTracker>>) -> Handler<Table> {
    let sim = Arc::new(SimBackend::open(POOL, Some(&dir.path().join("hw"))).unwrap());
    let table = CLAIMS
        .iter()
        .map(|(uid, device, _)| (uid.to_string(), alloc(device)))
        .collect();
    let options = ModelOptions::with_policies(devices::DEFAULT_DRIVER_NAME, &sim.mig_policies());
    if let Some(usage) = &usage {
        usage.set_model(&devices::build(&sim.inventory().unwrap(), &options));
    }
    let manager = {
        let mut m = manager_support::manager(&sim, Table(table), dir.path(), POOL);
        m.model_options = options;
        m
    };
    Handler {
        manager: Arc::new(manager),
        metrics: Metrics::new(),
        usage,
    }
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

/// What the claim source tells the tracker when it reads a claim from the API server.
fn read(usage: &UsageTracker, uid: &str) {
    let (_, device, class) = CLAIMS.iter().find(|(u, _, _)| *u == uid).unwrap();
    usage.fetched(
        uid,
        BTreeMap::from([("dev".to_string(), class.to_string())]),
        vec![HeldDevice {
            request: "dev".into(),
            device: device.to_string(),
            ..Default::default()
        }],
    );
}

/// The counter's series: labels → value.
fn series(metrics: &Metrics) -> BTreeMap<String, f64> {
    metrics
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix("gpu_dra_claim_device_seconds_total{"))
        .map(|l| {
            let (labels, value) = l.rsplit_once("} ").unwrap();
            (labels.to_string(), value.parse().unwrap())
        })
        .collect()
}

const MIG: &str =
    r#"namespace="team-a",class="mig.nvidia.com",profile="3g.40gb",sharing="exclusive""#;
const GPU: &str = r#"namespace="team-a",class="gpu.nvidia.com",profile="gpu",sharing="exclusive""#;

#[tokio::test]
async fn prepared_claims_are_counted_with_their_class_profile_and_sharing() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Metrics::new();
    let usage = Arc::new(UsageTracker::open(
        &dir.path().join("state"),
        metrics.clone(),
    ));
    let h = handler(&dir, Some(Arc::clone(&usage)));
    for uid in ["train", "whole"] {
        read(&usage, uid);
    }
    let results = h.prepare(vec![claim("train"), claim("whole")]).await;
    assert!(results.values().all(Result::is_ok), "{results:?}");
    assert!(
        !dir.path().join("state/usage.json").exists(),
        "the request path does not write the ledger"
    );
    let got = series(&metrics);
    assert_eq!(got.keys().collect::<Vec<_>>(), [GPU, MIG]);
    assert_eq!(
        usage.ledger().live.keys().collect::<Vec<_>>(),
        ["train", "whole"]
    );

    // Unprepare moves the MIG device's seconds into the totals; they stay counted.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let results = h.unprepare(vec![claim("train")]).await;
    assert!(results.values().all(Result::is_ok));
    let ledger = usage.ledger();
    assert_eq!(ledger.live.keys().collect::<Vec<_>>(), ["whole"]);
    let finished: Vec<f64> = ledger.finished.values().copied().collect();
    assert_eq!(finished.len(), 1);
    assert!(finished[0] >= 0.02, "{finished:?}");
    let after = series(&metrics);
    assert!(after[MIG] >= finished[0] && after[GPU] >= got[GPU]);
}

#[tokio::test]
async fn the_counter_survives_a_plugin_restart_and_adopts_claims_prepared_before() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // Prepared by a plugin without accounting.
    let old = handler(&dir, None);
    assert!(old.prepare(vec![claim("early")]).await["early"].is_ok());
    let record_time = read_checkpoint(&state, "boot-1").unwrap().claims["early"].updated_unix;

    let metrics = Metrics::new();
    let usage = Arc::new(UsageTracker::open(&state, metrics.clone()));
    let h = handler(&dir, Some(Arc::clone(&usage)));
    usage.reconcile(read_checkpoint(&state, "boot-1").as_ref());
    assert_eq!(usage.ledger().live["early"].since_unix, record_time as f64);
    read(&usage, "whole");
    assert!(h.prepare(vec![claim("whole")]).await["whole"].is_ok());
    let before = series(&metrics);
    let ledger = usage.ledger();
    assert!(usage.flush(), "a graceful shutdown writes what changed");
    assert!(!usage.flush(), "and nothing more when nothing changed");

    // A restarted plugin reads the same ledger and keeps counting from where it was.
    drop(h);
    let metrics = Metrics::new();
    let restarted = UsageTracker::open(&state, metrics.clone());
    assert_eq!(restarted.ledger(), ledger);
    restarted.reconcile(read_checkpoint(&state, "boot-1").as_ref());
    assert_eq!(restarted.ledger(), ledger, "nothing to adopt or end");
    let after = series(&metrics);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    for (labels, value) in &after {
        assert!(*value >= before[labels], "{labels} went down");
    }

    // After a reboot the checkpoint is stale: every live claim ends, totals stay.
    restarted.reconcile(None);
    assert!(restarted.ledger().live.is_empty());
    let ended = series(&metrics);
    for (labels, value) in &after {
        assert!(ended[labels] >= *value, "{labels} went down");
    }
}

#[tokio::test]
async fn a_crash_before_the_ledger_is_written_counts_an_ended_claim_once_and_the_counter_never_goes_down()
 {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let metrics = Metrics::new();
    let usage = Arc::new(UsageTracker::open(&state, metrics.clone()));
    let h = handler(&dir, Some(Arc::clone(&usage)));
    read(&usage, "whole");
    assert!(h.prepare(vec![claim("whole")]).await["whole"].is_ok());
    assert!(usage.flush());

    // Unprepared, then the plugin is killed before the background writer runs: the file
    // still says the claim is live. The last scrape saw its seconds up to the unprepare.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(h.unprepare(vec![claim("whole")]).await["whole"].is_ok());
    let scraped = series(&metrics)[GPU];
    drop(h);
    drop(usage);

    // The restarted plugin ends it at its start: never below what was published, once.
    let metrics = Metrics::new();
    let restarted = UsageTracker::open(&state, metrics.clone());
    assert_eq!(
        restarted.ledger().live.keys().collect::<Vec<_>>(),
        ["whole"]
    );
    restarted.reconcile(read_checkpoint(&state, "boot-1").as_ref());
    let ended = series(&metrics)[GPU];
    assert!(restarted.ledger().live.is_empty());
    assert!(
        ended >= scraped,
        "the counter went down: {ended} < {scraped}"
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    restarted.reconcile(read_checkpoint(&state, "boot-1").as_ref());
    assert_eq!(
        series(&metrics)[GPU],
        ended,
        "an ended claim is never counted again"
    );
}

#[test]
fn the_class_of_every_request_and_first_available_alternative_is_read_from_the_claim() {
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                {"name": "small", "firstAvailable": [
                    {"name": "h100", "deviceClassName": "mig-1g10gb.nvidia.com"},
                    {"name": "any", "deviceClassName": "mig.nvidia.com"}]}]}}
        }))
        .unwrap();
    let got = gpu_dra::k8s::claims::request_classes(&claim);
    let want: BTreeMap<String, String> = [
        ("gpu", "gpu.nvidia.com"),
        ("small/any", "mig.nvidia.com"),
        ("small/h100", "mig-1g10gb.nvidia.com"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(got, want);
}

/// The background writer, on the paused clock: a start alone is written within
/// `START_FLUSH_DELAY` (a crash before then loses nothing: the restart adopts the claim from
/// the checkpoint), an end brings the write forward to `FLUSH_DELAY` after it, and each is
/// one write carrying every change so far.
#[tokio::test(start_paused = true)]
async fn a_start_is_written_within_ten_seconds_and_an_end_one_second_after_it() {
    use gpu_dra::plugin::usage::{FLUSH_DELAY, START_FLUSH_DELAY};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state/usage.json");
    let usage = Arc::new(UsageTracker::open(
        &dir.path().join("state"),
        Metrics::new(),
    ));
    let h = handler(&dir, Some(Arc::clone(&usage)));
    let writer = tokio::spawn(Arc::clone(&usage).persist());
    // The write runs on a blocking thread, in real time: wait for it in real time.
    let written = |want_live: &[&str]| {
        for _ in 0..400 {
            if let Ok(ledger) = gpu_dra::usage::store::load(&file)
                && ledger
                    .live
                    .keys()
                    .map(String::as_str)
                    .eq(want_live.iter().copied())
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    };

    read(&usage, "train");
    assert!(h.prepare(vec![claim("train")]).await["train"].is_ok());
    tokio::time::sleep(START_FLUSH_DELAY - Duration::from_millis(500)).await;
    read(&usage, "whole");
    assert!(h.prepare(vec![claim("whole")]).await["whole"].is_ok());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !file.exists(),
        "starts alone are not written before START_FLUSH_DELAY"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        written(&["train", "whole"]),
        "both starts, in one write, START_FLUSH_DELAY after the first"
    );

    // An end: written FLUSH_DELAY after it, not START_FLUSH_DELAY.
    read(&usage, "early");
    assert!(h.prepare(vec![claim("early")]).await["early"].is_ok());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(h.unprepare(vec![claim("train")]).await["train"].is_ok());
    tokio::time::sleep(FLUSH_DELAY - Duration::from_millis(100)).await;
    assert!(
        written(&["train", "whole"]),
        "nothing written before FLUSH_DELAY after the end"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        written(&["early", "whole"]),
        "the end and the start before it, in one write, FLUSH_DELAY after the end"
    );
    writer.abort();
}
