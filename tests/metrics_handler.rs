//! The plugin's kubelet handler counts every claim it prepares or unprepares, by result and
//! by kind of failure, and keeps the prepared-claims gauge in step with the checkpoint.

mod manager_support;

use std::sync::Arc;

use gpu_dra::claims::{AllocatedDevice, ClaimAllocation};
use gpu_dra::hardware::sim::SimBackend;
use gpu_dra::kubelet::{ClaimRef, DraHandler};
use gpu_dra::metrics::{Metrics, Operation, Outcome};
use gpu_dra::plugin::handler::Handler;
use manager_support::Table;

const POOL: &str = "dgx-h100";

fn alloc(devices: &[&str]) -> ClaimAllocation {
    ClaimAllocation {
        pod_claim_name: None,
        devices: devices
            .iter()
            .enumerate()
            .map(|(i, d)| AllocatedDevice {
                request: format!("req{i}"),
                pool: POOL.into(),
                device: d.to_string(),
                admin_access: false,
                share_id: None,
                consumed_capacity: Default::default(),
            })
            .collect(),
        config: Vec::new(),
    }
}

fn handler(dir: &tempfile::TempDir, claims: &[(&str, &[&str])]) -> Handler<Table> {
    let sim = Arc::new(SimBackend::open(POOL, Some(&dir.path().join("hw"))).unwrap());
    let table = claims
        .iter()
        .map(|(uid, devs)| (uid.to_string(), alloc(devs)))
        .collect();
    let manager = manager_support::manager(&sim, Table(table), dir.path(), POOL);
    Handler {
        manager: Arc::new(manager),
        metrics: Metrics::new(),
        usage: None,
    }
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

/// (prepare success, prepare error, unprepare success, unprepare error)
fn calls(m: &Metrics) -> (u64, u64, u64, u64) {
    (
        m.requests(Operation::Prepare, Outcome::Success),
        m.requests(Operation::Prepare, Outcome::Error),
        m.requests(Operation::Unprepare, Outcome::Success),
        m.requests(Operation::Unprepare, Outcome::Error),
    )
}

fn gauge(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_string))
}

#[tokio::test]
async fn a_success_and_a_failure_move_their_own_counters() {
    let dir = tempfile::tempdir().unwrap();
    let h = handler(&dir, &[("good", &["gpu-2"]), ("stale", &["gpu-99"])]);
    let results = h
        .prepare(vec![claim("good"), claim("stale"), claim("missing")])
        .await;
    let got: Vec<(&str, bool)> = results
        .iter()
        .map(|(uid, r)| (uid.as_str(), r.is_ok()))
        .collect();
    assert_eq!(
        vec![("good", true), ("missing", false), ("stale", false)],
        got
    );
    assert_eq!((1, 2, 0, 0), calls(&h.metrics));
    assert_eq!(
        (1, 1, 0),
        (
            h.metrics.errors("unknown_device"),
            h.metrics.errors("fetch"),
            h.metrics.errors("busy"),
        )
    );
    let text = h.metrics.render();
    assert_eq!(
        Some("1".to_string()),
        gauge(&text, "gpu_dra_prepared_claims")
    );
    assert_eq!(
        Some("2".to_string()),
        gauge(
            &text,
            "gpu_dra_prepare_duration_seconds_count{result=\"error\"}"
        )
    );
}

#[tokio::test]
async fn a_busy_device_is_counted_as_busy_and_unprepare_drops_the_gauge() {
    let dir = tempfile::tempdir().unwrap();
    let h = handler(&dir, &[("first", &["gpu-2"]), ("second", &["gpu-2"])]);
    h.prepare(vec![claim("first")]).await;
    let second = h.prepare(vec![claim("second")]).await;
    assert!(second["second"].is_err());
    assert_eq!(1, h.metrics.errors("busy"));
    h.unprepare(vec![claim("first")]).await;
    assert_eq!((1, 1, 1, 0), calls(&h.metrics));
    assert_eq!(
        Some("0".to_string()),
        gauge(&h.metrics.render(), "gpu_dra_prepared_claims")
    );
}
