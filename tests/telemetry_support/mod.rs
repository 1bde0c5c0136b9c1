//! Shared by the tests that check what the `gpu_dra_device_*` families export (the
//! observability doc, the Grafana dashboard): one device row with every kind of reading.

use gpu_dra::metrics::telemetry::{DeviceReadings, Holder};

/// A held device with every reading present, so each `gpu_dra_device_*` family gets a sample
/// carrying every label it can have (the device and holder labels, plus `type` and `scope`,
/// `xid` or `cause`).
pub fn every_reading() -> DeviceReadings {
    DeviceReadings {
        power_watts: Some(1.0),
        power_limit_watts: Some(1.0),
        sm_active: Some(1.0),
        memory_used_bytes: Some(1),
        memory_total_bytes: Some(1),
        temperature_celsius: Some(1.0),
        ecc_errors: vec![("double_bit", "volatile", 0)],
        xid_errors: vec![(48, 0)],
        retired_pages: vec![("double_bit", 0)],
        holders: vec![Holder {
            namespace: "ns".into(),
            claim: "c".into(),
            pod: "p".into(),
        }],
        ..DeviceReadings::default()
    }
}
