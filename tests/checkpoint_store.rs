//! The checkpoint store against a real state directory: every way a file can be bad after a
//! crash, a reboot, an upgrade or a downgrade.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use gpu_dra::checkpoint::{
    CHECKPOINT_FILE, CheckpointStore, ClaimPhase, ClaimRecord, DeviceRecord, LoadOutcome,
    MigRecord, StoreError, checksum,
};
use serde_json::{Value, json};

const BOOT: &str = "2b0c9a5e-1f4d-4c52-9d7e-0a1b2c3d4e5f";
const UID: &str = "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b";

fn claim() -> ClaimRecord {
    ClaimRecord {
        uid: UID.into(),
        namespace: "ml".into(),
        name: "train-gpu".into(),
        phase: ClaimPhase::PrepareCompleted,
        devices: vec![DeviceRecord {
            request_names: vec!["mig".into()],
            pool: "node-a".into(),
            device: "gpu-0-mig-1g10gb-19-0".into(),
            share_id: None,
            cdi_device_ids: vec![format!(
                "k8s.gpu.nvidia.com/claim={UID}-gpu-0-mig-1g10gb-19-0"
            )],
            gpu_uuid: "GPU-aaa".into(),
            mig: Some(MigRecord {
                parent_minor: 0,
                profile_id: 19,
                profile: "1g.10gb".into(),
                placement_start: 0,
                placement_size: 1,
                gi_id: Some(9),
                ci_id: Some(0),
                uuid: Some("MIG-bbb".into()),
            }),
            sharing: Some(json!({"strategy": "MPS", "daemon": {"id": "x", "limits": [50, 1.5]}})),
            vfio: None,
            vgpu: None,
        }],
        updated_unix: 1_760_000_000,
        fabric_partition: None,
    }
}

/// A state dir holding a valid checkpoint with one claim, written by the store itself.
fn saved(boot: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, _) = CheckpointStore::open(tmp.path(), boot).unwrap();
    store
        .update(|cp| cp.claims.insert(UID.into(), claim()))
        .unwrap();
    tmp
}

fn file(dir: &Path) -> PathBuf {
    dir.join(CHECKPOINT_FILE)
}

fn envelope(dir: &Path) -> Value {
    serde_json::from_slice(&fs::read(file(dir)).unwrap()).unwrap()
}

/// Opens a dir whose file is unusable and checks it was moved aside unchanged.
fn expect_corrupt(dir: &Path, reason_part: &str) {
    let before = fs::read(file(dir)).unwrap();
    let (store, outcome) = CheckpointStore::open(dir, BOOT).unwrap();
    let LoadOutcome::Corrupt { moved_to, reason } = &outcome else {
        panic!("want Corrupt, got {outcome:?}");
    };
    assert!(
        reason.contains(reason_part),
        "want {reason_part:?} in {reason:?}"
    );
    assert!(
        outcome.message().contains("moved it to"),
        "{}",
        outcome.message()
    );
    let name = moved_to.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("checkpoint.json.corrupt-"), "{name}");
    assert_eq!(fs::read(moved_to).unwrap(), before);
    assert!(!file(dir).exists());
    assert_eq!(store.checkpoint().claims.len(), 0);
}

#[test]
fn a_missing_file_is_a_fresh_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, outcome) = CheckpointStore::open(&tmp.path().join("state"), BOOT).unwrap();
    assert_eq!(outcome, LoadOutcome::Fresh);
    assert_eq!(store.checkpoint().node_boot_id, BOOT);
}

#[test]
fn records_survive_a_restart_unchanged() {
    let tmp = saved(BOOT);
    let (store, outcome) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded { claims: 1 });
    assert_eq!(store.checkpoint().claims.get(UID), Some(&claim()));
}

#[test]
fn the_file_is_a_versioned_checksummed_envelope_readable_only_by_its_owner() {
    let tmp = saved(BOOT);
    let env = envelope(tmp.path());
    let got = (
        env["version"].clone(),
        env["checksum"].as_str().map(|c| c.len()),
        env["payload"]["nodeBootId"].clone(),
    );
    assert_eq!(got, (json!("v1"), Some("sha256:".len() + 64), json!(BOOT)));
    let mode = fs::metadata(file(tmp.path())).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn reformatting_the_file_keeps_the_checksum_valid() {
    let tmp = saved(BOOT);
    // Compact output with keys in a different order than written.
    let compact = serde_json::to_vec(&envelope(tmp.path())).unwrap();
    fs::write(file(tmp.path()), compact).unwrap();
    let (_, outcome) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded { claims: 1 });
}

#[test]
fn a_payload_changed_behind_the_checksum_is_moved_aside() {
    let tmp = saved(BOOT);
    let mut env = envelope(tmp.path());
    env["payload"]["claims"][UID]["name"] = json!("someone-else");
    fs::write(file(tmp.path()), serde_json::to_vec_pretty(&env).unwrap()).unwrap();
    expect_corrupt(tmp.path(), "checksum mismatch");
}

#[test]
fn a_truncated_file_is_moved_aside() {
    let tmp = saved(BOOT);
    let bytes = fs::read(file(tmp.path())).unwrap();
    fs::write(file(tmp.path()), &bytes[..bytes.len() / 2]).unwrap();
    expect_corrupt(tmp.path(), "not valid JSON");
}

#[test]
fn garbage_and_empty_files_are_moved_aside() {
    for content in [
        &b"\x00\xffnot json"[..],
        b"",
        b"[1, 2]",
        b"{\"version\": 1}",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(file(tmp.path()), content).unwrap();
        let want = if content.starts_with(b"{") || content.starts_with(b"[") {
            "version"
        } else {
            "not valid JSON"
        };
        expect_corrupt(tmp.path(), want);
    }
}

#[test]
fn a_file_from_a_newer_format_is_refused_naming_both_versions_and_left_in_place() {
    let tmp = saved(BOOT);
    let mut env = envelope(tmp.path());
    env["version"] = json!("v2");
    let bytes = serde_json::to_vec(&env).unwrap();
    fs::write(file(tmp.path()), &bytes).unwrap();
    let Err(err) = CheckpointStore::open(tmp.path(), BOOT) else {
        panic!("a newer checkpoint was opened");
    };
    let text = err.to_string();
    assert!(
        text.contains("format version \"v2\"")
            && text.contains("it reads v1")
            && text.contains("Roll forward"),
        "{text}"
    );
    assert_eq!(
        bytes,
        fs::read(file(tmp.path())).unwrap(),
        "the file is untouched"
    );
}

#[test]
fn a_well_checksummed_payload_is_still_validated_on_read() {
    type Breaker = fn(&mut Value);
    let cases: [(&str, Breaker); 2] = [
        ("unknown field `extra`", |p| {
            p["claims"][UID]["extra"] = json!(1)
        }),
        ("uid", |p| p["claims"][UID]["uid"] = json!("other-uid")),
    ];
    for (want, break_it) in cases {
        let tmp = saved(BOOT);
        let mut env = envelope(tmp.path());
        break_it(&mut env["payload"]);
        env["checksum"] = json!(checksum(&env["payload"]));
        fs::write(file(tmp.path()), serde_json::to_vec(&env).unwrap()).unwrap();
        expect_corrupt(tmp.path(), want);
    }
}

#[test]
fn two_bad_files_in_one_second_are_both_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let mut moved = Vec::new();
    for _ in 0..2 {
        fs::write(file(tmp.path()), "garbage").unwrap();
        if let (_, LoadOutcome::Corrupt { moved_to, .. }) =
            CheckpointStore::open(tmp.path(), BOOT).unwrap()
        {
            moved.push(moved_to);
        }
    }
    assert_eq!(moved.len(), 2);
    assert_ne!(moved[0], moved[1]);
    assert!(moved.iter().all(|p| p.exists()));
}

#[test]
fn after_a_reboot_claims_are_dropped_but_handed_over_until_the_next_write() {
    let tmp = saved("old-boot");
    let want = LoadOutcome::BootChanged {
        previous_boot_id: "old-boot".into(),
        dropped: [(UID.to_string(), claim())].into(),
    };
    // A crash before cleanup: the same records are handed over again.
    for _ in 0..2 {
        let (store, outcome) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
        assert_eq!(outcome, want);
        assert_eq!(store.checkpoint().claims.len(), 0);
        assert!(
            outcome.message().contains("node rebooted"),
            "{}",
            outcome.message()
        );
    }
    let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    store.update(|_| ()).unwrap();
    let (_, outcome) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    assert_eq!(outcome, LoadOutcome::Loaded { claims: 0 });
}

#[test]
fn a_temp_file_left_by_a_crashed_write_is_removed_and_the_last_good_state_loads() {
    let tmp = saved(BOOT);
    let leftover = tmp.path().join(".checkpoint.json.tmp-4242-7");
    fs::write(&leftover, "{\"version\": \"v1\", \"chec").unwrap();
    let (store, outcome) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    assert_eq!(
        (outcome, leftover.exists()),
        (LoadOutcome::Loaded { claims: 1 }, false)
    );
    assert_eq!(store.checkpoint().claims.get(UID), Some(&claim()));
}

#[test]
fn an_update_that_breaks_an_invariant_changes_neither_disk_nor_memory() {
    let tmp = saved(BOOT);
    let before = fs::read(file(tmp.path())).unwrap();
    let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    let err = store
        .update(|cp| cp.claims.get_mut(UID).unwrap().namespace.clear())
        .unwrap_err();
    assert!(matches!(err, StoreError::Encode { .. }), "got {err:?}");
    let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(chain.contains("payload is inconsistent"), "{chain}");
    assert_eq!(fs::read(file(tmp.path())).unwrap(), before);
    assert_eq!(store.checkpoint().claims.get(UID), Some(&claim()));
}

/// `update` changes the state in place (no copy of every record per write), so a failed one
/// must put back exactly the state of before: the one its own last write made, and, before
/// any write, the fresh (or rebooted) store's empty one. (A store that only read its file is
/// `an_update_that_breaks_an_invariant_changes_neither_disk_nor_memory`.)
#[test]
fn a_failed_update_restores_what_the_last_write_made_or_the_empty_state_before_any() {
    let second = |mut c: ClaimRecord| {
        c.uid = "second".into();
        c.name = "second-claim".into();
        c
    };
    let breaks = |cp: &mut gpu_dra::checkpoint::Checkpoint| {
        cp.claims.insert("second".into(), second(claim()));
        cp.claims.get_mut(UID).unwrap().namespace.clear();
    };

    // After a write of its own: that write's state, not the one the store read.
    let tmp = saved(BOOT);
    let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    store
        .update(|cp| cp.claims.get_mut(UID).unwrap().updated_unix += 1)
        .unwrap();
    let written = store.checkpoint().clone();
    let on_disk = fs::read(file(tmp.path())).unwrap();
    let err = store.update(breaks).unwrap_err();
    assert!(matches!(err, StoreError::Encode { .. }), "got {err:?}");
    assert_eq!(store.checkpoint(), &written);
    assert_eq!(fs::read(file(tmp.path())).unwrap(), on_disk);
    assert!(store.is_current(), "the file is still what the store holds");
    // And the store goes on from there.
    store
        .update(|cp| cp.claims.insert("second".into(), second(claim())))
        .unwrap();
    let (reopened, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    assert_eq!(reopened.checkpoint(), store.checkpoint());
    assert_eq!(reopened.checkpoint().claims.len(), 2);

    // Before any write: a fresh store, and one whose file is of an earlier boot.
    for tmp in [tempfile::tempdir().unwrap(), saved("old-boot")] {
        let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
        let before = store.checkpoint().clone();
        let err = store
            .update(|cp| {
                cp.claims.insert(UID.into(), claim());
                breaks(cp);
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::Encode { .. }), "got {err:?}");
        assert_eq!(store.checkpoint(), &before);
        assert!(before.claims.is_empty() && before.node_boot_id == BOOT);
    }
}
/// The same when the write itself fails (the file's name taken by a directory): the state
/// of the last write comes back, for a store that wrote and for a fresh one.
#[test]
fn a_failed_write_restores_the_state_before_it() {
    for written_before in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
        if written_before {
            store
                .update(|cp| cp.claims.insert(UID.into(), claim()))
                .unwrap();
            fs::remove_file(file(tmp.path())).unwrap();
        }
        let before = store.checkpoint().clone();
        fs::create_dir(file(tmp.path())).unwrap();
        let err = store
            .update(|cp| {
                cp.claims.clear();
                cp.claims.insert(
                    "other".into(),
                    ClaimRecord {
                        uid: "other".into(),
                        ..claim()
                    },
                );
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::Write { .. }), "got {err:?}");
        assert_eq!(
            store.checkpoint(),
            &before,
            "written before: {written_before}"
        );
        // And with the name free again, the store writes on from there.
        fs::remove_dir(file(tmp.path())).unwrap();
        store.update(|_| ()).unwrap();
        let (reopened, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
        assert_eq!(reopened.checkpoint(), &before);
    }
}

#[test]
fn null_sharing_state_is_stored_as_absent_so_memory_matches_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    let mut record = claim();
    record.devices[0].sharing = Some(Value::Null);
    store
        .update(|cp| cp.claims.insert(UID.into(), record))
        .unwrap();
    let (reopened, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    assert_eq!(reopened.checkpoint(), store.checkpoint());
    assert_eq!(reopened.checkpoint().claims[UID].devices[0].sharing, None);
}

#[test]
fn an_unreadable_checkpoint_path_is_an_error_naming_it_not_a_fresh_start() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(file(tmp.path())).unwrap();
    let err = CheckpointStore::open(tmp.path(), BOOT).unwrap_err();
    assert!(matches!(err, StoreError::Read { .. }), "got {err:?}");
    assert!(
        err.to_string()
            .contains(&file(tmp.path()).display().to_string()),
        "{err}"
    );
}

#[test]
fn an_empty_boot_id_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let err = CheckpointStore::open(tmp.path(), "").unwrap_err();
    assert!(matches!(err, StoreError::EmptyBootId), "got {err:?}");
}

#[test]
fn a_store_stays_current_through_its_own_writes_until_another_store_replaces_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut ours, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    let fresh = ours.is_current();
    ours.update(|cp| cp.claims.insert(UID.into(), claim()))
        .unwrap();
    let after_own_write = ours.is_current();
    let (mut theirs, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    theirs.update(|cp| cp.claims.clear()).unwrap();
    let after_their_write = ours.is_current();
    let reopened = CheckpointStore::open(tmp.path(), BOOT).unwrap().0;
    assert_eq!(
        (
            fresh,
            after_own_write,
            after_their_write,
            reopened.is_current()
        ),
        (true, true, false, true)
    );
    assert!(reopened.checkpoint().claims.is_empty());
}

#[test]
fn a_store_is_not_current_once_its_file_is_removed_or_rewritten_in_place() {
    let dir = saved(BOOT);
    let (store, _) = CheckpointStore::open(dir.path(), BOOT).unwrap();
    let bytes = fs::read(file(dir.path())).unwrap();
    fs::write(file(dir.path()), [&bytes[..], b" "].concat()).unwrap();
    let rewritten = store.is_current();
    fs::remove_file(file(dir.path())).unwrap();
    assert_eq!((rewritten, store.is_current()), (false, false));
}

/// Readers that take no lock (telemetry, usage accounting, orphan checks) race the writer,
/// which overwrites the previous version's inode (`fsutil::replace_atomic_reusing`). The
/// checksum must catch every torn read and a read again must find a whole version: a reader
/// never gets a mixed checkpoint, and almost never has to give up.
#[test]
fn lock_free_readers_racing_the_writer_never_get_a_mixed_checkpoint() {
    use gpu_dra::checkpoint::{Snapshot, read_unlocked};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let (mut store, _) = CheckpointStore::open(&dir, BOOT).unwrap();
    store
        .update(|cp| cp.claims.insert(UID.into(), claim()))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            // Versions of different lengths: 1 to 12 claims, each named after its version.
            let mut version = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                version += 1;
                store
                    .update(|cp| {
                        cp.claims.clear();
                        for i in 0..1 + version % 12 {
                            let mut c = claim();
                            c.uid = format!("{version}-{i}");
                            c.name = format!("v{version}");
                            cp.claims.insert(c.uid.clone(), c);
                        }
                    })
                    .unwrap();
            }
            version
        })
    };
    let (mut whole, mut unreadable) = (0u32, 0u32);
    for _ in 0..3000 {
        match read_unlocked(&dir, BOOT) {
            Snapshot::Current(cp) => {
                // One version, whole: every claim carries the same version, as many as it wrote.
                let names: std::collections::BTreeSet<&str> =
                    cp.claims.values().map(|c| c.name.as_str()).collect();
                assert_eq!(names.len(), 1, "a mixed checkpoint: {names:?}");
                whole += 1;
            }
            Snapshot::Unreadable => unreadable += 1,
            Snapshot::Empty => panic!("the file always exists"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let versions = writer.join().unwrap();
    assert!(versions > 10, "the writer kept writing: {versions}");
    assert!(
        unreadable <= 30,
        "gave up {unreadable} times of 3000 ({whole} whole)"
    );
}

#[test]
fn a_lock_free_read_tells_no_checkpoint_from_an_unreadable_one() {
    use gpu_dra::checkpoint::{Snapshot, read_unlocked};
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(read_unlocked(tmp.path(), BOOT), Snapshot::Empty);
    let other_boot = saved("another-boot");
    assert_eq!(read_unlocked(other_boot.path(), BOOT), Snapshot::Empty);
    let ours = saved(BOOT);
    assert!(
        matches!(read_unlocked(ours.path(), BOOT), Snapshot::Current(cp) if cp.claims.len() == 1)
    );
    fs::write(
        file(ours.path()),
        b"{\"version\": \"v1\", \"checksum\": \"sha256:00\"",
    )
    .unwrap();
    assert_eq!(read_unlocked(ours.path(), BOOT), Snapshot::Unreadable);
    // A lock-free reader never moves the file aside; the store, under the lock, does.
    assert!(file(ours.path()).exists());
}

/// The plugin's background rounds (inventory, usage, telemetry) each read the checkpoint
/// without the lock: an unchanged file is parsed once for all of them, and any write —
/// this store's or another writer's in place — is seen at the next read.
#[test]
fn a_lock_free_reader_parses_an_unchanged_file_once() {
    use gpu_dra::checkpoint::{Snapshot, read_unlocked};
    use gpu_dra::cost::{Cost, measure};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let parses = |dir: &Path| {
        let (snapshot, tally) = runtime.block_on(measure(async { read_unlocked(dir, BOOT) }));
        (snapshot, tally.get(Cost::CheckpointParse))
    };
    let tmp = saved(BOOT);
    let (first, n) = parses(tmp.path());
    assert!(matches!(&first, Snapshot::Current(cp) if cp.claims.len() == 1));
    assert_eq!(n, 1);
    for _ in 0..3 {
        assert_eq!(
            parses(tmp.path()),
            (first.clone(), 0),
            "unchanged: not parsed again"
        );
    }
    let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    store.update(|cp| cp.claims.clear()).unwrap();
    let (after, n) = parses(tmp.path());
    assert!(matches!(&after, Snapshot::Current(cp) if cp.claims.is_empty()));
    assert_eq!(n, 1, "a write is seen at once");
    // Another boot's reader of the same file is not given this boot's snapshot.
    assert_eq!(read_unlocked(tmp.path(), "another-boot"), Snapshot::Empty);
    // A file rewritten in place (same inode) is read again too.
    fs::write(file(tmp.path()), b"{}").unwrap();
    assert_eq!(parses(tmp.path()).0, Snapshot::Unreadable);
}

#[test]
fn a_dropped_store_takes_its_spare_with_it() {
    let tmp = saved(BOOT);
    let (mut store, _) = CheckpointStore::open(tmp.path(), BOOT).unwrap();
    for _ in 0..3 {
        store.update(|cp| cp.claims.clear()).unwrap();
    }
    let names = |dir: &Path| {
        let mut n: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(tmp.path()).len(), 2, "{:?}", names(tmp.path()));
    drop(store);
    assert_eq!(names(tmp.path()), vec![CHECKPOINT_FILE.to_string()]);
}
