//! Undo is best effort to the end, without root or mounts: a directory standing where a claim's
//! CDI spec belongs makes every write and removal of the spec fail, and the other undo steps
//! (destroying the carved MIG device) must still happen, every failure be reported, and the
//! claim stay recorded until a repeat finishes.

mod manager_support;

use std::path::PathBuf;
use std::sync::Arc;

use gpu_dra::checkpoint::{CheckpointStore, ClaimPhase};
use gpu_dra::claims::{AllocatedDevice, ClaimAllocation, ClaimError, ClaimId, ClaimsManager};
use gpu_dra::hardware::GpuBackend;
use gpu_dra::hardware::sim::SimBackend;
use manager_support::Table;

const UID: &str = "u1";
const DEVICE: &str = "gpu-3-mig-3g40gb-4";

struct Node {
    dir: tempfile::TempDir,
    sim: Arc<SimBackend>,
    mgr: ClaimsManager<Table>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimBackend::open("dgx-h100", Some(&dir.path().join("hw"))).unwrap());
        let allocation = ClaimAllocation {
            pod_claim_name: None,
            devices: vec![AllocatedDevice {
                request: "req0".into(),
                pool: "dgx-h100".into(),
                device: DEVICE.into(),
                admin_access: false,
                share_id: None,
                consumed_capacity: Default::default(),
            }],
            config: Vec::new(),
        };
        let mgr = manager_support::manager(
            &sim,
            Table([(UID.to_string(), allocation)].into()),
            dir.path(),
            "dgx-h100",
        );
        Node { dir, sim, mgr }
    }

    fn spec_path(&self) -> PathBuf {
        self.mgr.cdi.spec_path(UID).unwrap()
    }

    /// A non-empty directory where the spec file belongs: no write or removal of it works.
    fn block_spec(&self) {
        let path = self.spec_path();
        let _ = std::fs::remove_file(&path);
        std::fs::create_dir_all(path.join("blocker")).unwrap();
    }

    fn unblock_spec(&self) {
        std::fs::remove_dir_all(self.spec_path()).unwrap();
    }

    fn mig_devices(&self) -> usize {
        self.sim.inventory().unwrap().gpus[3].mig_devices.len()
    }

    fn phase(&self) -> Option<ClaimPhase> {
        let (store, _) = CheckpointStore::open(&self.dir.path().join("state"), "boot-1").unwrap();
        store.checkpoint().claims.get(UID).map(|c| c.phase)
    }
}

fn id() -> ClaimId {
    ClaimId {
        namespace: "ns".into(),
        name: "claim".into(),
        uid: UID.into(),
    }
}

#[tokio::test]
async fn an_unprepare_whose_spec_cannot_be_removed_still_destroys_the_mig_device() {
    let n = Node::new();
    n.mgr.prepare(&id()).await.unwrap();
    assert_eq!(1, n.mig_devices());
    n.block_spec();

    let err = n.mgr.unprepare(&id()).await.unwrap_err();
    match &err {
        ClaimError::Undo { failures, .. } => {
            assert_eq!(1, failures.len(), "{err}");
            assert!(matches!(failures[0], ClaimError::Cdi { .. }), "{err}");
        }
        other => panic!("want an undo error, got {other}"),
    }
    assert!(err.to_string().contains("removing the spec"), "{err}");
    assert_eq!(
        0,
        n.mig_devices(),
        "the MIG device goes whatever the spec did"
    );
    assert_eq!(Some(ClaimPhase::UnprepareStarted), n.phase());
    assert_eq!("undo", err.kind());

    n.unblock_spec();
    n.mgr.unprepare(&id()).await.unwrap();
    assert_eq!(None, n.phase());
}

#[tokio::test]
async fn a_prepare_whose_rollback_is_incomplete_reports_both_and_its_retry_finishes_the_job() {
    let n = Node::new();
    n.block_spec();

    let err = n.mgr.prepare(&id()).await.unwrap_err();
    let text = err.to_string();
    match &err {
        ClaimError::RollbackIncomplete { cause, failures } => {
            assert!(matches!(**cause, ClaimError::Cdi { .. }), "{text}");
            assert_eq!(1, failures.len(), "{text}");
        }
        other => panic!("want an incomplete rollback, got {other}"),
    }
    assert!(
        text.find("CDI spec").unwrap() < text.find("rolling back left 1 step(s) undone").unwrap(),
        "the prepare's own error comes first: {text}"
    );
    assert_eq!("cdi", err.kind(), "counted as the prepare's own failure");
    assert_eq!(0, n.mig_devices(), "the carved device is destroyed");
    assert_eq!(Some(ClaimPhase::PrepareStarted), n.phase());

    n.unblock_spec();
    n.mgr.prepare(&id()).await.unwrap();
    assert_eq!(1, n.mig_devices());
    assert_eq!(Some(ClaimPhase::PrepareCompleted), n.phase());
}

#[tokio::test]
async fn recovery_tries_every_step_and_lists_every_failure() {
    let n = Node::new();
    n.block_spec();
    assert!(n.mgr.prepare(&id()).await.is_err());
    // A leftover the rollback cannot remove, and an orphaned MIG device on another GPU.
    let orphan = n.sim.inventory().unwrap().gpus[5].mig_profiles[0].id;
    n.sim.create_mig_device(5, orphan, 0).unwrap();

    let err = n.mgr.recover().unwrap_err();
    match &err {
        ClaimError::Undo { failures, .. } => assert_eq!(1, failures.len(), "{err}"),
        other => panic!("want an undo error, got {other}"),
    }
    assert_eq!(
        0,
        n.sim.inventory().unwrap().gpus[5].mig_devices.len(),
        "the orphan is destroyed although a rollback failed before it"
    );

    n.unblock_spec();
    let report = n.mgr.recover().unwrap();
    assert_eq!(vec!["ns/claim (u1)".to_string()], report.rolled_back);
    assert_eq!(None, n.phase());
}
