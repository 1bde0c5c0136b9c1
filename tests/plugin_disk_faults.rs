//! Full and read-only disks under the real plugin: the CDI directory or the state directory is
//! a small tmpfs the test turns read-only (EROFS) or fills up (ENOSPC) while the plugin runs.
//!
//! Every failed prepare must roll back completely (no MIG instance, no MPS daemon, no temp
//! file, the old checkpoint byte for byte), the plugin must keep serving the claims it has,
//! and the kubelet's retry must succeed once the fault clears.

mod plugin_support;

use gpu_dra::kubelet::client::{DraApi, KubeletClient};
use plugin_support::claims::{self, claim_ref};
use plugin_support::disk::Tmpfs;
use plugin_support::sharing::{live_daemons, mps_config, with_config};
use plugin_support::{Node, Plugin, Snapshot};

const KEEP: &str = "uid-keep";
const MIG: &str = "uid-mig";
const MPS: &str = "uid-mps";
/// `--mig-profiles all`, for every plugin serving [`node_with_claims`]: the default `split`
/// gives GPU 0 no 3g.40gb.
const EVERY_PROFILE: (&str, &str) = ("GPU_DRA_MIG_PROFILES", "all");

/// A node with a claim of a full GPU (prepared before the fault), a dynamic MIG claim and an
/// MPS claim.
fn node_with_claims() -> Node {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("keep", KEEP, &["gpu-6"]));
    node.api
        .put_claim(claims::on_node("mig", MIG, &["gpu-0-mig-3g40gb-4"]));
    node.api.put_claim(with_config(
        claims::on_node("mps", MPS, &["gpu-3"]),
        &[],
        mps_config("GpuConfig", 50, "10Gi"),
    ));
    node
}

async fn prepare(kubelet: &mut KubeletClient, name: &str, uid: &str) -> Result<usize, String> {
    let got = kubelet.prepare(&[claim_ref(name, uid)]).await.unwrap();
    got[uid].clone().map(|devices| devices.len())
}

async fn unprepare(kubelet: &mut KubeletClient, name: &str, uid: &str) -> Result<(), String> {
    let got = kubelet.unprepare(&[claim_ref(name, uid)]).await.unwrap();
    got[uid].clone()
}

/// Nothing of the failed claims is left: only `prepared` recorded, specced and carved, and
/// no MPS daemon runs.
fn assert_rolled_back(node: &Node, plugin: &Plugin, prepared: &[&str], context: &str) {
    let snapshot: Snapshot = node.snapshot();
    let cdi_files: Vec<String> = snapshot
        .cdi_files
        .iter()
        .filter(|n| *n != ".disk-filler")
        .cloned()
        .collect();
    Snapshot {
        cdi_files,
        ..snapshot
    }
    .assert_converged(prepared, &format!("{context}\n{}", plugin.log()));
    assert_eq!(
        Vec::<u32>::new(),
        live_daemons(node.root()),
        "{context}: MPS daemons left running"
    );
}

#[tokio::test]
async fn a_read_only_cdi_directory_fails_the_prepare_and_rolls_back_every_step() {
    let node = node_with_claims();
    let Some(cdi) = Tmpfs::mount(&node.cdi_root(), "1m") else {
        return;
    };
    let mut plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "keep", KEEP).await);

    cdi.set_read_only(true);
    for (name, uid) in [("mig", MIG), ("mps", MPS)] {
        let error = prepare(&mut kubelet, name, uid).await.unwrap_err();
        assert!(error.contains("Read-only file system"), "{error}");
        assert!(
            !error.contains("rolling back left"),
            "the rollback must finish: {error}"
        );
        assert_rolled_back(&node, &plugin, &[KEEP], &format!("after {name} failed"));
    }
    assert_eq!(
        Ok(1),
        prepare(&mut kubelet, "keep", KEEP).await,
        "a prepared claim is still served"
    );

    cdi.set_read_only(false);
    assert_eq!(Ok(1), prepare(&mut kubelet, "mig", MIG).await);
    assert_eq!(Ok(1), prepare(&mut kubelet, "mps", MPS).await);
    node.snapshot()
        .assert_converged(&[KEEP, MIG, MPS], "after the retries");
    assert!(plugin.is_running());
}

#[tokio::test]
async fn unprepare_on_a_read_only_cdi_directory_still_destroys_the_mig_device_and_stops_the_daemon()
{
    let node = node_with_claims();
    let Some(cdi) = Tmpfs::mount(&node.cdi_root(), "1m") else {
        return;
    };
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "mig", MIG).await);
    assert_eq!(Ok(1), prepare(&mut kubelet, "mps", MPS).await);
    assert_eq!(1, live_daemons(node.root()).len());

    cdi.set_read_only(true);
    let error = unprepare(&mut kubelet, "mig", MIG).await.unwrap_err();
    assert!(
        error.contains("undo incomplete, 1 step(s) failed"),
        "{error}"
    );
    assert!(error.contains("Read-only file system"), "{error}");
    let error = unprepare(&mut kubelet, "mps", MPS).await.unwrap_err();
    assert!(
        error.contains("undo incomplete, 1 step(s) failed"),
        "{error}"
    );
    let after = node.snapshot();
    assert_eq!(
        Vec::<String>::new(),
        after.hardware_mig_uuids(),
        "the MIG device is destroyed although its spec could not be removed\n{}",
        plugin.log()
    );
    assert_eq!(Vec::<u32>::new(), live_daemons(node.root()));
    assert_eq!(
        "UnprepareStarted", after.checkpoint[MIG].phase,
        "the claim stays recorded until its spec is gone"
    );

    cdi.set_read_only(false);
    assert_eq!(Ok(()), unprepare(&mut kubelet, "mig", MIG).await);
    assert_eq!(Ok(()), unprepare(&mut kubelet, "mps", MPS).await);
    assert_rolled_back(&node, &plugin, &[], "after the retries");
}

#[tokio::test]
async fn a_full_cdi_directory_fails_the_prepare_leaving_no_temp_file_and_no_mig_device() {
    let node = node_with_claims();
    let Some(cdi) = Tmpfs::mount(&node.cdi_root(), "64k") else {
        return;
    };
    let plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "keep", KEEP).await);

    cdi.fill();
    for (name, uid) in [("mig", MIG), ("mps", MPS)] {
        let error = prepare(&mut kubelet, name, uid).await.unwrap_err();
        assert!(error.contains("No space left on device"), "{error}");
        assert!(!error.contains("rolling back left"), "{error}");
        assert_eq!(
            vec![plugin_support::state::spec_file(KEEP)],
            cdi.files(),
            "only the old spec, no temp file"
        );
        assert_rolled_back(&node, &plugin, &[KEEP], &format!("after {name} failed"));
    }

    cdi.free();
    assert_eq!(Ok(1), prepare(&mut kubelet, "mig", MIG).await);
    assert_eq!(Ok(1), prepare(&mut kubelet, "mps", MPS).await);
    node.snapshot()
        .assert_converged(&[KEEP, MIG, MPS], "after the retries");
}

#[tokio::test]
async fn a_full_state_directory_keeps_the_old_checkpoint_and_the_prepared_claims() {
    let node = node_with_claims();
    let Some(state) = Tmpfs::mount(&node.state_dir(), "2m") else {
        return;
    };
    let mut plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "keep", KEEP).await);
    let checkpoint = node.state_dir().join("checkpoint.json");
    let before = std::fs::read(&checkpoint).unwrap();

    state.fill();
    for (name, uid) in [("mig", MIG), ("mps", MPS)] {
        let error = prepare(&mut kubelet, name, uid).await.unwrap_err();
        // Over the simulated NVML library the simulated GPUs' own state lives on the same
        // full disk (a real GPU's does not), and the C ABI reports its failed write as
        // NVML_ERROR_UNKNOWN: whichever write comes first, the plugin's checkpoint (its
        // spare file may have the room) or the carve's, the disk is what failed.
        let simulated_gpu_failed =
            plugin_support::nvml_backend() && error.contains("NVML error 999");
        assert!(
            error.contains("No space left on device") || simulated_gpu_failed,
            "{error}"
        );
        assert_eq!(
            before,
            std::fs::read(&checkpoint).unwrap(),
            "the old checkpoint is intact"
        );
        // The usage ledger (`usage.json`) may be there too, written before the disk filled,
        // and the checkpoint store's one spare (the previous version, overwritten by the next
        // write: `fsutil::replace_atomic_reusing`), which is not a leftover.
        let all = state.files();
        let spares = all
            .iter()
            .filter(|f| f.starts_with(".checkpoint.json.spare-"))
            .count();
        assert!(spares <= 1, "one spare at most: {all:?}");
        let files: Vec<String> = all
            .into_iter()
            .filter(|f| f != "usage.json" && !f.starts_with(".checkpoint.json.spare-"))
            .collect();
        assert_eq!(
            vec!["checkpoint.json".to_string(), "sim".to_string()],
            files,
            "no temp file"
        );
        assert_rolled_back(&node, &plugin, &[KEEP], &format!("after {name} failed"));
    }
    assert_eq!(Ok(1), prepare(&mut kubelet, "keep", KEEP).await);

    state.free();
    assert_eq!(Ok(1), prepare(&mut kubelet, "mig", MIG).await);
    assert_eq!(Ok(1), prepare(&mut kubelet, "mps", MPS).await);
    node.snapshot()
        .assert_converged(&[KEEP, MIG, MPS], "after the retries");
    assert!(plugin.is_running());
}

#[tokio::test]
async fn start_up_recovery_on_a_read_only_cdi_directory_tries_every_step_reports_them_and_starts() {
    let node = node_with_claims();
    let Some(cdi) = Tmpfs::mount(&node.cdi_root(), "1m") else {
        return;
    };
    // A crash right after the spec was written leaves a half-done claim: MIG device carved,
    // spec on disk, record not completed.
    let mut plugin = node
        .start_with(&[
            (gpu_dra::crashpoint::ENV, "prepare-cdi-written"),
            EVERY_PROFILE,
        ])
        .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert!(kubelet.prepare(&[claim_ref("mig", MIG)]).await.is_err());
    plugin.wait_exit().await;
    assert_eq!(1, node.snapshot().instances.len());

    cdi.set_read_only(true);
    // The plugin starts anyway (a crash loop would keep every other claim of the node down),
    // says what it could not undo, and supervision finishes it once the directory is
    // writable again, without a restart.
    let mut plugin = node.spawn_with(&[EVERY_PROFILE]);
    plugin.wait_registrable().await;
    let log = plugin.log();
    assert!(log.contains("undo incomplete at start-up"), "{log}");
    assert!(log.contains("Read-only file system"), "{log}");
    assert_eq!(
        Vec::<String>::new(),
        node.snapshot().hardware_mig_uuids(),
        "the MIG device is destroyed although the spec could not be removed\n{log}"
    );
    assert!(plugin.is_running());

    cdi.set_read_only(false);
    plugin_support::eventually("supervision to finish the undo", || {
        let snapshot = node.snapshot();
        let files = snapshot.cdi_files.iter().filter(|n| *n != ".disk-filler");
        (files.count() == 0 && snapshot.checkpoint.is_empty()).then_some(())
    })
    .await;
    assert_rolled_back(
        &node,
        &plugin,
        &[],
        "after recovery with the directory writable",
    );
}

#[tokio::test]
async fn a_plugin_started_on_a_read_only_cdi_directory_serves_reports_and_converges_without_a_restart()
 {
    let node = node_with_claims();
    let Some(cdi) = Tmpfs::mount(&node.cdi_root(), "1m") else {
        return;
    };
    // One claim prepared for good; then a crash right after a spec was written leaves a
    // half-done claim (MIG device carved, spec on disk); and a spec no claim names is left.
    let mut plugin = node.start_with(&[EVERY_PROFILE]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert_eq!(Ok(1), prepare(&mut kubelet, "keep", KEEP).await);
    plugin.kill().await;
    let mut plugin = node
        .start_with(&[
            (gpu_dra::crashpoint::ENV, "prepare-cdi-written"),
            EVERY_PROFILE,
        ])
        .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    assert!(kubelet.prepare(&[claim_ref("mig", MIG)]).await.is_err());
    plugin.wait_exit().await;
    let stale = node
        .cdi_root()
        .join(plugin_support::state::spec_file("uid-stale"));
    std::fs::copy(
        node.cdi_root().join(plugin_support::state::spec_file(KEEP)),
        &stale,
    )
    .unwrap();

    cdi.set_read_only(true);
    let mut plugin = node.spawn_with(&[EVERY_PROFILE]);
    plugin.wait_registrable().await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    // It serves: the prepared claim answers; a new claim, which needs a spec written, is
    // refused with the cause.
    assert_eq!(Ok(1), prepare(&mut kubelet, "keep", KEEP).await);
    let refused = prepare(&mut kubelet, "mps", MPS).await.unwrap_err();
    assert!(refused.contains("Read-only file system"), "{refused}");
    // It reports: a Warning Event on the node, the pending steps, a log line per retry.
    let warning = plugin_support::eventually("a RecoveryIncomplete event", || {
        node.api
            .events()
            .into_iter()
            .find(|e| e["reason"] == "RecoveryIncomplete")
    })
    .await;
    assert_eq!(
        ("Warning", "Node", claims::NODE),
        (
            warning["type"].as_str().unwrap(),
            warning["involvedObject"]["kind"].as_str().unwrap(),
            warning["involvedObject"]["name"].as_str().unwrap()
        )
    );
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{warning}"
    );
    plugin_support::eventually("a retry logged and counted", || {
        let retried = plugin
            .log()
            .contains("start-up recovery still incomplete; retrying");
        let pending =
            plugin_support::probe::metric(&plugin.log(), "gpu_dra_recovery_pending_steps")?;
        (retried && pending >= 2.0).then_some(())
    })
    .await;
    assert!(
        stale.exists(),
        "nothing can be removed from a read-only directory"
    );

    // Writable again: the half-done claim and the stale spec are undone, without a restart.
    cdi.set_read_only(false);
    plugin_support::eventually("recovery to converge", || {
        let done =
            plugin_support::probe::metric(&plugin.log(), "gpu_dra_recovery_pending_steps")? == 0.0;
        let completed = node
            .api
            .events()
            .iter()
            .any(|e| e["reason"] == "RecoveryCompleted");
        (done && completed).then_some(())
    })
    .await;
    assert_rolled_back(&node, &plugin, &[KEEP], "after recovery converged");
    assert_eq!(Ok(1), prepare(&mut kubelet, "mps", MPS).await);
    assert!(plugin.is_running());
}
