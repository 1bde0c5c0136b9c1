use super::*;

const DRIVER: &str = "gpu.nvidia.com";
const POOL: &str = "node-a";
const NOW: &str = "2026-11-25T10:00:00Z";
const EARLIER: &str = "2026-11-25T09:00:00Z";

fn want(device: &str, status: ConditionStatus, reason: &str) -> DeviceStatus {
    DeviceStatus {
        pool: POOL.to_string(),
        device: device.to_string(),
        share_id: None,
        ready: Readiness {
            status,
            reason: reason.to_string(),
            message: String::new(),
        },
        data: json!({"uuid": format!("GPU-{device}")}),
    }
}

fn written(device: &str, status: &str, reason: &str, since: &str) -> Value {
    json!({
        "driver": DRIVER, "pool": POOL, "device": device,
        "conditions": [{"type": "Ready", "status": status, "observedGeneration": 3,
                        "lastTransitionTime": since, "reason": reason, "message": ""}],
        "data": {"uuid": format!("GPU-{device}")}
    })
}

fn other_driver() -> Value {
    json!({"driver": "nic.example.com", "pool": POOL, "device": "eth0",
           "conditions": [{"type": "Ready", "status": "True"}],
           "networkData": {"interfaceName": "eth0"}})
}

#[test]
fn a_first_write_adds_one_ready_entry_per_device_after_other_drivers_entries() {
    let status = json!({"allocation": {}, "devices": [other_driver()]});
    let got = merge(
        &status,
        DRIVER,
        POOL,
        &[
            want("gpu-0", ConditionStatus::True, "Prepared"),
            want("gpu-1", ConditionStatus::True, "Prepared"),
        ],
        Some(3),
        NOW,
    );
    let want = vec![
        other_driver(),
        written("gpu-0", "True", "Prepared", NOW),
        written("gpu-1", "True", "Prepared", NOW),
    ];
    assert_eq!(Some(want), got);
}

#[test]
fn an_entry_already_as_wanted_needs_no_write() {
    let status =
        json!({"devices": [other_driver(), written("gpu-0", "True", "Prepared", EARLIER)]});
    let got = merge(
        &status,
        DRIVER,
        POOL,
        &[want("gpu-0", ConditionStatus::True, "Prepared")],
        Some(3),
        NOW,
    );
    assert_eq!(None, got);
}

#[test]
fn a_status_change_moves_the_transition_time_and_a_reason_change_alone_does_not() {
    let status = json!({"devices": [written("gpu-0", "True", "Prepared", EARLIER)]});
    let unhealthy = merge(
        &status,
        DRIVER,
        POOL,
        &[want("gpu-0", ConditionStatus::False, "Unhealthy")],
        Some(3),
        NOW,
    );
    assert_eq!(
        Some(vec![written("gpu-0", "False", "Unhealthy", NOW)]),
        unhealthy
    );
    let reworded = merge(
        &status,
        DRIVER,
        POOL,
        &[want("gpu-0", ConditionStatus::True, "Healthy")],
        Some(3),
        NOW,
    );
    assert_eq!(
        Some(vec![written("gpu-0", "True", "Healthy", EARLIER)]),
        reworded
    );
}

#[test]
fn nothing_wanted_removes_only_this_drivers_entries_in_this_pool() {
    let elsewhere = json!({"driver": DRIVER, "pool": "node-b", "device": "gpu-0"});
    let status = json!({"devices": [
        written("gpu-0", "True", "Prepared", EARLIER),
        other_driver(),
        elsewhere.clone(),
        written("gpu-1", "True", "Prepared", EARLIER),
    ]});
    let got = merge(&status, DRIVER, POOL, &[], Some(3), NOW);
    assert_eq!(Some(vec![other_driver(), elsewhere]), got);
    let empty = merge(&json!({}), DRIVER, POOL, &[], Some(3), NOW);
    assert_eq!(None, empty, "no entries and none wanted: no write");
}

#[test]
fn shares_of_one_device_are_separate_entries_keyed_by_share_id() {
    let mut a = want("gpu-0", ConditionStatus::True, "Prepared");
    a.share_id = Some("share-a".into());
    let mut b = a.clone();
    b.share_id = Some("share-b".into());
    b.ready.status = ConditionStatus::False;
    let mut before_a = written("gpu-0", "True", "Prepared", EARLIER);
    before_a["shareID"] = json!("share-a");
    let got = merge(
        &json!({"devices": [before_a]}),
        DRIVER,
        POOL,
        &[a, b],
        None,
        NOW,
    )
    .expect("share-b is new");
    let shares: Vec<(&Value, &Value, &Value)> = got
        .iter()
        .map(|e| {
            (
                &e["shareID"],
                &e["conditions"][0]["status"],
                &e["conditions"][0]["lastTransitionTime"],
            )
        })
        .collect();
    let (a, b) = (json!("share-a"), json!("share-b"));
    let (t, f) = (json!("True"), json!("False"));
    let (earlier, now) = (json!(EARLIER), json!(NOW));
    assert_eq!(vec![(&a, &t, &earlier), (&b, &f, &now)], shares);
    assert_eq!(
        None,
        got[0]["conditions"][0].get("observedGeneration"),
        "no generation known, none claimed"
    );
}

#[test]
fn a_long_message_is_cut_at_a_character_boundary_within_the_limit() {
    let mut w = want("gpu-0", ConditionStatus::False, "Unhealthy");
    w.ready.message = "é".repeat(MAX_MESSAGE_BYTES);
    let got = merge(&json!({}), DRIVER, POOL, &[w], None, NOW).unwrap();
    let message = got[0]["conditions"][0]["message"].as_str().unwrap();
    assert_eq!(MAX_MESSAGE_BYTES, message.len());
    assert!(message.chars().all(|c| c == 'é'));
}
