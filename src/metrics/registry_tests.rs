//! Unit tests of the handle: what `render` shows after recording into every concern, and
//! that the spliced scrape equals rendering every family. Each concern's own families are
//! tested next to its module.

use super::*;

fn lines_of<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn a_fresh_registry_shows_every_metric_at_zero_except_build_info() {
    let text = Metrics::new().render();
    let types: Vec<&str> = lines_of(&text, "# TYPE ");
    let want = vec![
        "# TYPE gpu_dra_background_costs_total counter",
        "# TYPE gpu_dra_build_info gauge",
        "# TYPE gpu_dra_claim_device_seconds_total counter",
        "# TYPE gpu_dra_claim_status_writes_total counter",
        "# TYPE gpu_dra_device_ecc_errors_total counter",
        "# TYPE gpu_dra_device_memory_total_bytes gauge",
        "# TYPE gpu_dra_device_memory_used_bytes gauge",
        "# TYPE gpu_dra_device_power_limit_watts gauge",
        "# TYPE gpu_dra_device_power_watts gauge",
        "# TYPE gpu_dra_device_retired_pages gauge",
        "# TYPE gpu_dra_device_sm_active_ratio gauge",
        "# TYPE gpu_dra_device_temperature_celsius gauge",
        "# TYPE gpu_dra_device_xid_errors_total counter",
        "# TYPE gpu_dra_errors_total counter",
        "# TYPE gpu_dra_gpus gauge",
        "# TYPE gpu_dra_health_transitions_total counter",
        "# TYPE gpu_dra_healthy_gpus gauge",
        "# TYPE gpu_dra_mig_instances gauge",
        "# TYPE gpu_dra_mps_daemons gauge",
        "# TYPE gpu_dra_orphaned_claims_reclaimed_total counter",
        "# TYPE gpu_dra_prepare_duration_seconds histogram",
        "# TYPE gpu_dra_prepare_requests_total counter",
        "# TYPE gpu_dra_prepared_claims gauge",
        "# TYPE gpu_dra_published_devices gauge",
        "# TYPE gpu_dra_recovery_pending_steps gauge",
        "# TYPE gpu_dra_recovery_retries_total counter",
        "# TYPE gpu_dra_request_path_calls_total counter",
        "# TYPE gpu_dra_request_path_costs_total counter",
        "# TYPE gpu_dra_tainted_devices gauge",
        "# TYPE gpu_dra_unhealthy_gpus gauge",
        "# TYPE gpu_dra_unprepare_duration_seconds histogram",
        "# TYPE gpu_dra_unprepare_requests_total counter",
    ];
    assert_eq!(want, types);
    let build_info = format!(
        "gpu_dra_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    // The background tally is the process's (`crate::cost::background`), not the registry's:
    // other tests of this process count into it.
    let nonzero: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.ends_with(" 0"))
        .filter(|l| !l.starts_with("gpu_dra_background_costs_total"))
        .collect();
    assert_eq!(vec![build_info.as_str()], nonzero);
}

#[test]
fn counters_and_gauges_show_what_was_recorded() {
    let m = Metrics::new();
    m.record_call(Operation::Prepare, Outcome::Success, Duration::ZERO);
    m.record_call(Operation::Prepare, Outcome::Error, Duration::ZERO);
    m.record_call(Operation::Prepare, Outcome::Error, Duration::ZERO);
    m.record_error("busy");
    m.record_error("busy");
    m.record_error("cdi");
    m.set_published_devices(57);
    m.set_mig_instances(3);
    m.set_mps_daemons(1);
    m.set_prepared_claims(2);
    m.set_gpu_health(7, 1);
    m.record_orphan_reclaimed("uid-changed");
    m.set_recovery_pending(2);
    let text = m.render();
    let got: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && !l.contains("duration")
                && !l.contains("build")
                && !l.contains("request_path")
                && !l.contains("background")
        })
        .collect();
    let want = vec![
        r#"gpu_dra_claim_status_writes_total{result="success"} 0"#,
        r#"gpu_dra_claim_status_writes_total{result="error"} 0"#,
        r#"gpu_dra_errors_total{kind="busy"} 2"#,
        r#"gpu_dra_errors_total{kind="cdi"} 1"#,
        "gpu_dra_healthy_gpus 7",
        "gpu_dra_mig_instances 3",
        "gpu_dra_mps_daemons 1",
        r#"gpu_dra_orphaned_claims_reclaimed_total{reason="claim-deleted"} 0"#,
        r#"gpu_dra_orphaned_claims_reclaimed_total{reason="uid-changed"} 1"#,
        r#"gpu_dra_orphaned_claims_reclaimed_total{reason="not-allocated"} 0"#,
        r#"gpu_dra_orphaned_claims_reclaimed_total{reason="unreserved"} 0"#,
        r#"gpu_dra_prepare_requests_total{result="success"} 1"#,
        r#"gpu_dra_prepare_requests_total{result="error"} 2"#,
        "gpu_dra_prepared_claims 2",
        "gpu_dra_published_devices 57",
        "gpu_dra_recovery_pending_steps 2",
        "gpu_dra_recovery_retries_total 0",
        "gpu_dra_unhealthy_gpus 1",
        r#"gpu_dra_unprepare_requests_total{result="success"} 0"#,
        r#"gpu_dra_unprepare_requests_total{result="error"} 0"#,
    ];
    assert_eq!(want, got);
    assert_eq!(
        (1, 2, 2, 0, 1),
        (
            m.requests(Operation::Prepare, Outcome::Success),
            m.requests(Operation::Prepare, Outcome::Error),
            m.errors("busy"),
            m.errors("hardware"),
            m.orphans_reclaimed("uid-changed"),
        )
    );
}

#[test]
fn a_scrape_with_telemetry_is_the_sorted_exposition_of_every_family() {
    use crate::metrics::telemetry::{DeviceReadings, Holder};
    let m = Metrics::new();
    m.record_error("busy");
    m.set_device_telemetry(&[DeviceReadings {
        gpu: 1,
        uuid: "GPU-1".into(),
        device: "gpu-1".into(),
        power_watts: Some(300.0),
        ecc_errors: vec![("single_bit", "aggregate", 3)],
        holders: vec![Holder {
            namespace: "ns".into(),
            claim: "c".into(),
            pod: "p".into(),
        }],
        ..DeviceReadings::default()
    }]);
    assert_eq!(m.render(), text::render(&m.families()));
    assert_eq!(
        Metrics::new().render(),
        text::render(&Metrics::new().families())
    );
}
