use super::*;
use crate::checkpoint::MigRecord;

fn device(name: &str, mig: Option<MigRecord>, sharing: Option<Value>) -> DeviceRecord {
    DeviceRecord {
        request_names: vec!["gpu".into()],
        pool: "node-a".into(),
        device: name.into(),
        share_id: None,
        cdi_device_ids: vec![],
        gpu_uuid: "GPU-0000".into(),
        mig,
        sharing,
        vfio: None,
        vgpu: None,
    }
}

fn mig() -> MigRecord {
    MigRecord {
        parent_minor: 0,
        profile_id: 9,
        profile: "3g.40gb".into(),
        placement_start: 4,
        placement_size: 4,
        gi_id: Some(2),
        ci_id: Some(0),
        uuid: Some("MIG-1111".into()),
    }
}

fn record(phase: ClaimPhase, devices: Vec<DeviceRecord>) -> ClaimRecord {
    ClaimRecord {
        uid: "uid-1".into(),
        namespace: "team-a".into(),
        name: "claim".into(),
        phase,
        devices,
        updated_unix: 0,
        fabric_partition: None,
    }
}

fn health(device: &str, status: HealthStatus, message: &str) -> DeviceHealth {
    DeviceHealth {
        pool_name: "node-a".into(),
        device_name: device.into(),
        status,
        message: message.into(),
        ..DeviceHealth::default()
    }
}

#[test]
fn a_full_gpu_shows_its_uuid_and_a_mig_device_its_own_uuid_profile_and_parent() {
    let got = vec![
        device_data(&device("gpu-0", None, None)),
        device_data(&device("gpu-0-mig-3g40gb-4", Some(mig()), None)),
    ];
    let want = vec![
        json!({"type": "gpu", "uuid": "GPU-0000"}),
        json!({"type": "mig", "uuid": "MIG-1111", "parentUUID": "GPU-0000",
               "profile": "3g.40gb", "placement": {"start": 4, "size": 4}}),
    ];
    assert_eq!(want, got);
}

#[test]
fn sharing_shows_the_strategy_and_its_limits() {
    let mps = json!({"strategy": "MPS", "daemon": "d1", "ordinal": 0,
                     "activeThreadPercentage": 50, "pinnedMemoryBytes": 1073741824u64});
    let share = json!({"strategy": "Share", "daemon": "d2", "activeThreadPercentage": 25});
    let slicing = json!({"strategy": "TimeSlicing", "level": 2});
    let got: Vec<Value> = [mps, share, slicing]
        .into_iter()
        .map(|s| device_data(&device("gpu-0", None, Some(s)))["sharing"].clone())
        .collect();
    let want = vec![
        json!({"strategy": "MPS", "activeThreadPercentage": 50,
               "pinnedMemoryLimitBytes": 1073741824u64}),
        json!({"strategy": "MPS", "perShare": true, "activeThreadPercentage": 25}),
        json!({"strategy": "TimeSlicing", "timeSliceLevel": 2}),
    ];
    assert_eq!(want, got);
}

#[test]
fn the_largest_data_stays_far_below_the_api_limit() {
    let sharing = json!({"strategy": "Share", "daemon": "d".repeat(200),
                         "activeThreadPercentage": 100, "pinnedMemoryBytes": u64::MAX});
    let mut d = device(&"x".repeat(63), Some(mig()), Some(sharing));
    d.gpu_uuid = format!("GPU-{}", "f".repeat(100));
    let bytes = serde_json::to_vec(&device_data(&d)).unwrap().len();
    assert!(
        bytes < crate::k8s::claim_status::MAX_DATA_BYTES / 10,
        "{bytes}"
    );
}

#[test]
fn readiness_follows_the_devices_health() {
    let record = record(
        ClaimPhase::PrepareCompleted,
        vec![
            device("gpu-0", None, None),
            device("gpu-1", None, None),
            device("gpu-2", None, None),
            device("gpu-3", None, None),
        ],
    );
    let health = vec![
        health("gpu-0", HealthStatus::Healthy, ""),
        health(
            "gpu-1",
            HealthStatus::Unhealthy,
            "GPU GPU-0000 reported a fatal error",
        ),
        health("gpu-2", HealthStatus::Unknown, "no verdict yet"),
        // Another pool's device of the same name is not this one.
        DeviceHealth {
            pool_name: "node-b".into(),
            ..health("gpu-3", HealthStatus::Healthy, "")
        },
    ];
    // Indexed (a round over many claims) or searched (a call's few): the same answer.
    let got = |index: HealthIndex<'_>| -> Vec<(String, ConditionStatus, String, String)> {
        wanted(Some(&record), &index)
            .into_iter()
            .map(|w| (w.device, w.ready.status, w.ready.reason, w.ready.message))
            .collect()
    };
    let (indexed, scanned) = (
        got(HealthIndex::new(&health)),
        got(HealthIndex::scan(&health)),
    );
    let want = vec![
        (
            "gpu-0".into(),
            ConditionStatus::True,
            "Prepared".into(),
            String::new(),
        ),
        (
            "gpu-1".into(),
            ConditionStatus::False,
            "Unhealthy".into(),
            "GPU GPU-0000 reported a fatal error".into(),
        ),
        (
            "gpu-2".into(),
            ConditionStatus::Unknown,
            "HealthUnknown".into(),
            "no verdict yet".into(),
        ),
        (
            "gpu-3".into(),
            ConditionStatus::Unknown,
            "NotPublished".into(),
            "the device is no longer published by this node (its GPU is gone?)".into(),
        ),
    ];
    assert_eq!(want, indexed);
    assert_eq!(want, scanned);
}

#[test]
fn only_a_completed_prepare_shows_entries() {
    let devices = vec![device("gpu-0", None, None)];
    let health = vec![health("gpu-0", HealthStatus::Healthy, "")];
    let got: Vec<usize> = [
        Some(record(ClaimPhase::PrepareStarted, devices.clone())),
        Some(record(ClaimPhase::PrepareCompleted, devices.clone())),
        Some(record(ClaimPhase::UnprepareStarted, devices)),
        None,
    ]
    .iter()
    .map(|r| wanted(r.as_ref(), &HealthIndex::new(&health)).len())
    .collect();
    assert_eq!(vec![0, 1, 0, 0], got);
}
