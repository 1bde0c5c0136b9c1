//! The compatibility corpus (`tests/state_corpus/`): state files as a previous release wrote
//! them, read by this one — the library's decoders, and the real plugin binary taking over a
//! node with prepared MIG, MPS, consumable-capacity and whole-GPU claims (a rolling update),
//! then writing only what that release can read back (the rollback). And the other direction:
//! files of a newer release (docs/upgrades.md).
//!
//! `v1/` was written by the `main` binary of the release before this one, with
//! `GPU_DRA_PLUGIN_BIN=<that binary> cargo test --test state_corpus -- --ignored` (the
//! generator below); its `boot_id` is the boot the files belong to.

mod plugin_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gpu_dra::kubelet::ClaimRef;
use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims::{self, claim_ref};
use plugin_support::sharing::{as_share, live_daemons, mps_config, with_config};
use plugin_support::{Node, SIGTERM, eventually};
use serde_json::{Value, json};

/// The corpus directory of format version `version`.
fn corpus(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/state_corpus")
        .join(version)
}

/// The claims of the corpus node: `(name, uid)`.
const CLAIMS: [(&str, &str); 5] = [
    ("mig", "uid-mig"),
    ("mps", "uid-mps"),
    ("share-a", "uid-share-a"),
    ("share-b", "uid-share-b"),
    ("whole", "uid-whole"),
];

/// The claims as the API server holds them: a dynamic MIG device, MPS on a whole GPU, two
/// consumable-capacity shares of one GPU, and a whole GPU.
fn put_claims(node: &Node) {
    let share = |name: &str, uid: &str, id: &str, memory: &str| {
        as_share(
            claims::on_node(name, uid, &["gpu-4"]),
            0,
            id,
            json!({"memory": memory}),
        )
    };
    node.api
        .put_claim(claims::on_node("mig", "uid-mig", &["gpu-0-mig-3g40gb-4"]));
    node.api.put_claim(with_config(
        claims::on_node("mps", "uid-mps", &["gpu-3"]),
        &[],
        mps_config("GpuConfig", 50, "10Gi"),
    ));
    node.api
        .put_claim(share("share-a", "uid-share-a", "aaaa1111", "40Gi"));
    node.api
        .put_claim(share("share-b", "uid-share-b", "bbbb2222", "20Gi"));
    node.api
        .put_claim(claims::on_node("whole", "uid-whole", &["gpu-6"]));
}

fn refs() -> Vec<ClaimRef> {
    CLAIMS.iter().map(|(n, u)| claim_ref(n, u)).collect()
}

const SHARED_GPUS: (&str, &str) = ("GPU_DRA_SHARED_GPUS", "4");

/// State files of the corpus, relative to the node's state directory.
const STATE_FILES: [&str; 3] = ["checkpoint.json", "usage.json", "sim/sim-gpu-state.json"];

#[tokio::test]
#[ignore = "writes the corpus; run with GPU_DRA_PLUGIN_BIN=<previous release's binary>"]
async fn generate_the_corpus_with_the_plugin_binary() {
    let node = Node::new();
    put_claims(&node);
    // Every profile on every GPU: a release defaulting to `--mig-profiles split` gives GPU 0
    // no 3g.40gb (older ones ignore the variable or publish every profile anyway).
    let mut plugin = node
        .start_with(&[SHARED_GPUS, ("GPU_DRA_MIG_PROFILES", "all")])
        .await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet.prepare(&refs()).await.unwrap();
    assert!(got.values().all(Result::is_ok), "{got:?}");
    plugin.signal(SIGTERM);
    plugin.wait_exit().await;
    let out = corpus("v1");
    std::fs::create_dir_all(out.join("sim")).unwrap();
    std::fs::create_dir_all(out.join("cdi")).unwrap();
    for file in STATE_FILES {
        std::fs::copy(node.state_dir().join(file), out.join(file)).unwrap();
    }
    for spec in plugin_support::state::dir_names(&node.cdi_root()) {
        std::fs::copy(node.cdi_root().join(&spec), out.join("cdi").join(&spec)).unwrap();
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    std::fs::write(out.join("boot_id"), boot.trim()).unwrap();
}

/// Puts the corpus of `version` on `node` as if this boot had written it: the checkpoint's
/// boot ID becomes this boot's (its checksum recomputed), everything else byte for byte.
fn install(node: &Node, version: &str) {
    let from = corpus(version);
    std::fs::create_dir_all(node.state_dir().join("sim")).unwrap();
    std::fs::create_dir_all(node.cdi_root()).unwrap();
    for file in STATE_FILES {
        std::fs::copy(from.join(file), node.state_dir().join(file)).unwrap();
    }
    for spec in plugin_support::state::dir_names(&from.join("cdi")) {
        std::fs::copy(from.join("cdi").join(&spec), node.cdi_root().join(&spec)).unwrap();
    }
    let path = node.state_dir().join("checkpoint.json");
    let mut checkpoint: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    checkpoint["payload"]["nodeBootId"] = json!(boot.trim());
    checkpoint["checksum"] = json!(gpu_dra::checkpoint::checksum(&checkpoint["payload"]));
    std::fs::write(&path, serde_json::to_vec_pretty(&checkpoint).unwrap()).unwrap();
}

/// Every key path of `value` (`payload.claims.*.devices.*.mig.uuid`), map keys that are
/// data (claim UIDs, GPU slots) and array indexes written as `*`.
fn key_paths(value: &Value, data_maps: &[&str], prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            let data = data_maps.iter().any(|d| prefix.ends_with(d));
            for (key, child) in map {
                let key = if data { "*" } else { key.as_str() };
                let path = format!("{prefix}.{key}");
                out.insert(path.clone());
                key_paths(child, data_maps, &path, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                key_paths(item, data_maps, &format!("{prefix}.*"), out);
            }
        }
        _ => {}
    }
}

fn paths_of(path: &Path) -> BTreeSet<String> {
    let value: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut out = BTreeSet::new();
    key_paths(&value, &[".claims", ".loads", ".live"], "", &mut out);
    out
}

#[test]
fn every_corpus_file_is_read_by_this_release() {
    let dir = corpus("v1");
    let checkpoint =
        gpu_dra::checkpoint::decode(&std::fs::read(dir.join("checkpoint.json")).unwrap())
            .expect("the previous release's checkpoint");
    let uids: Vec<&str> = checkpoint.claims.keys().map(String::as_str).collect();
    let mut want: Vec<&str> = CLAIMS.iter().map(|(_, u)| *u).collect();
    want.sort();
    assert_eq!(want, uids);
    let state = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.join("sim/sim-gpu-state.json"),
        state.path().join("sim-gpu-state.json"),
    )
    .unwrap();
    let sim = gpu_dra::hardware::sim::SimBackend::open_state_dir(state.path())
        .expect("the previous release's simulator state");
    let carved: usize = gpu_dra::hardware::GpuBackend::inventory(&sim)
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.mig_devices.len())
        .sum();
    assert_eq!(1, carved, "the MIG claim's device");
    // The usage ledger: one it cannot read is moved aside to `usage.json.bad`.
    let ledger = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("usage.json"), ledger.path().join("usage.json")).unwrap();
    let _usage =
        gpu_dra::plugin::usage::UsageTracker::open(ledger.path(), gpu_dra::metrics::Metrics::new());
    assert_eq!(
        vec!["usage.json".to_string()],
        plugin_support::state::dir_names(ledger.path()),
        "the previous release's ledger is read, not moved aside"
    );
}

#[tokio::test]
async fn a_node_of_the_previous_release_keeps_its_claims_through_the_upgrade_and_the_rollback() {
    let node = Node::new();
    put_claims(&node);
    install(&node, "v1");
    let before = node.snapshot();
    let recorded = gpu_dra::checkpoint::decode(
        &std::fs::read(node.state_dir().join("checkpoint.json")).unwrap(),
    )
    .unwrap();

    // The upgrade: this release takes the node over and serves every claim as prepared,
    // touching no hardware; the MPS daemon (gone with the old pod) is started again.
    let plugin = node.start_with(&[SHARED_GPUS]).await;
    let mut kubelet = plugin.register(DraApi::V1).await;
    let got = kubelet.prepare(&refs()).await.unwrap();
    for (_, uid) in CLAIMS {
        let devices = got[uid].as_ref().unwrap_or_else(|e| panic!("{uid}: {e}"));
        let want: Vec<Vec<String>> = recorded.claims[uid]
            .devices
            .iter()
            .map(|d| d.cdi_device_ids.clone())
            .collect();
        let ids: Vec<Vec<String>> = devices.iter().map(|d| d.cdi_device_ids.clone()).collect();
        assert_eq!(
            want, ids,
            "{uid}: the devices the previous release prepared"
        );
    }
    let after = node.snapshot();
    assert_eq!(
        before.instances, after.instances,
        "no MIG device carved or destroyed"
    );
    assert_eq!(before.cdi_files, after.cdi_files, "every spec kept");
    eventually("the MPS daemon running", || {
        (!live_daemons(node.root()).is_empty()).then_some(())
    })
    .await;

    // This release writes (an unprepare): the rollback's binary must read what it wrote, so
    // it writes the same versions and no field the previous release did not write.
    let one = [claim_ref("whole", "uid-whole")];
    let done = kubelet.unprepare(&one).await.unwrap();
    assert_eq!(Some(&Ok(())), done.get("uid-whole"));
    for file in ["checkpoint.json", "sim/sim-gpu-state.json"] {
        let written = paths_of(&node.state_dir().join(file));
        let known = paths_of(&corpus("v1").join(file));
        let new: Vec<&String> = written.difference(&known).collect();
        assert!(
            new.is_empty(),
            "{file}: fields the previous release never wrote: {new:?}"
        );
    }
    let version = |file: &str| {
        let value: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        value["version"].clone()
    };
    for file in STATE_FILES {
        assert_eq!(
            version(corpus("v1").join(file).to_str().unwrap()),
            version(node.state_dir().join(file).to_str().unwrap()),
            "{file}: the version the previous release wrote"
        );
    }

    let rest: Vec<ClaimRef> = refs()
        .into_iter()
        .filter(|c| c.uid != "uid-whole")
        .collect();
    let done = kubelet.unprepare(&rest).await.unwrap();
    assert!(done.values().all(Result::is_ok), "{done:?}");
    node.snapshot()
        .assert_converged(&[], "after every claim was unprepared");
}

#[tokio::test]
async fn a_checkpoint_of_a_newer_release_stops_the_start_and_is_left_in_place() {
    let node = Node::new();
    put_claims(&node);
    install(&node, "v1");
    let path = node.state_dir().join("checkpoint.json");
    let mut checkpoint: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    checkpoint["version"] = json!("v2");
    let bytes = serde_json::to_vec_pretty(&checkpoint).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let before = node.snapshot();

    let mut plugin = node.spawn_with(&[SHARED_GPUS]);
    let status = plugin.wait_exit().await;
    assert!(!status.success());
    let log = plugin.log();
    assert!(
        log.contains("format version \"v2\"") && log.contains("it reads v1"),
        "{log}"
    );
    assert_eq!(
        bytes,
        std::fs::read(&path).unwrap(),
        "the checkpoint is untouched"
    );
    assert_eq!(
        before.instances,
        node.snapshot().instances,
        "no MIG device destroyed"
    );
}

#[test]
fn a_simulator_state_of_a_newer_release_is_used_and_its_new_fields_survive_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        corpus("v1").join("sim/sim-gpu-state.json"),
        dir.path().join("sim-gpu-state.json"),
    )
    .unwrap();
    let path = dir.path().join("sim-gpu-state.json");
    let mut state: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    state["futureFile"] = json!({"a": 1});
    state["state"]["futureNode"] = json!([1, 2]);
    state["state"]["gpus"][0]["futureGpu"] = json!("x");
    std::fs::write(&path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();

    let sim = gpu_dra::hardware::sim::SimBackend::open_state_dir(dir.path())
        .expect("a file with newer fields is read");
    let inventory = gpu_dra::hardware::GpuBackend::inventory(&sim).unwrap();
    let gpu = inventory.gpus.iter().find(|g| g.index == 7).unwrap();
    let profile = gpu
        .mig_profiles
        .iter()
        .find(|p| p.name == "1g.10gb")
        .unwrap();
    gpu_dra::hardware::GpuBackend::create_mig_device(&sim, 7, profile.id, 0).expect("and used");
    let rewritten: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        (json!({"a": 1}), json!([1, 2]), json!("x")),
        (
            rewritten["futureFile"].clone(),
            rewritten["state"]["futureNode"].clone(),
            rewritten["state"]["gpus"][0]["futureGpu"].clone()
        )
    );

    // A newer version number is an incompatible change: refused, naming both versions.
    let mut newer = rewritten;
    newer["version"] = json!(2);
    std::fs::write(&path, serde_json::to_vec_pretty(&newer).unwrap()).unwrap();
    let text = match gpu_dra::hardware::sim::SimBackend::open_state_dir(dir.path()) {
        Err(e) => gpu_dra::errors::error_chain(&e),
        Ok(sim) => {
            let refused = gpu_dra::hardware::GpuBackend::inventory(&sim).err();
            gpu_dra::errors::error_chain(&refused.expect("refused"))
        }
    };
    assert!(
        text.contains("version 2") && text.contains("reads version 1"),
        "{text}"
    );
}
