//! What a plugin leaves on the node, read from the files themselves (not through the library):
//! the simulated hardware state, the checkpoint and the CDI directory.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// A GPU instance on the simulated hardware.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SimInstance {
    /// GPU index.
    pub gpu: u64,
    /// First memory slice of its placement.
    pub start: u64,
    /// Memory slices.
    pub size: u64,
    /// MIG device UUIDs of its compute instances (empty: a GI without a CI, i.e. a leak).
    pub mig_uuids: Vec<String>,
}

/// One claim in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointClaim {
    /// `PrepareStarted`, `PrepareCompleted` or `UnprepareStarted`.
    pub phase: String,
    /// Device names.
    pub devices: Vec<String>,
    /// MIG UUIDs recorded for its devices.
    pub mig_uuids: Vec<String>,
}

/// Everything a prepare or unprepare may change on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// GPU instances, by GPU and placement.
    pub instances: Vec<SimInstance>,
    /// MIG mode in effect per GPU.
    pub mig_mode: Vec<bool>,
    /// Checkpointed claims by UID.
    pub checkpoint: BTreeMap<String, CheckpointClaim>,
    /// File names in the CDI directory.
    pub cdi_files: Vec<String>,
    /// Claim UIDs with a device metadata directory (`<plugin dir>/dra-device-metadata`).
    pub metadata_claims: Vec<String>,
}

/// The CDI spec file of claim `uid`.
pub fn spec_file(uid: &str) -> String {
    format!("k8s.gpu.nvidia.com-claim_{uid}.json")
}

impl Snapshot {
    /// Reads the node under `state_dir`, `cdi_root` and `plugin_dir`. Missing files read as
    /// empty.
    pub fn read(state_dir: &Path, cdi_root: &Path, plugin_dir: &Path) -> Snapshot {
        let (instances, mig_mode) = sim_state(&state_dir.join("sim/sim-gpu-state.json"));
        Snapshot {
            instances,
            mig_mode,
            checkpoint: checkpoint(&state_dir.join("checkpoint.json")),
            cdi_files: dir_names(cdi_root),
            metadata_claims: metadata_claims(&plugin_dir.join("dra-device-metadata")),
        }
    }

    /// Every MIG UUID the hardware has, sorted.
    pub fn hardware_mig_uuids(&self) -> Vec<String> {
        let mut uuids: Vec<String> = self
            .instances
            .iter()
            .flat_map(|i| i.mig_uuids.clone())
            .collect();
        uuids.sort();
        uuids
    }

    /// Every MIG UUID the checkpoint records, sorted.
    pub fn checkpoint_mig_uuids(&self) -> Vec<String> {
        let mut uuids: Vec<String> = self
            .checkpoint
            .values()
            .flat_map(|c| c.mig_uuids.clone())
            .collect();
        uuids.sort();
        uuids
    }

    /// Panics unless hardware, checkpoint and CDI directory agree on exactly `prepared`:
    /// every listed claim completed and nothing else recorded, one spec per claim and no other
    /// file, and the hardware's MIG devices exactly those the checkpoint records (no GI
    /// without its CI).
    pub fn assert_converged(&self, prepared: &[&str], context: &str) {
        let mut want_claims: Vec<String> = prepared.iter().map(|s| s.to_string()).collect();
        want_claims.sort();
        want_claims.dedup();
        let got_claims: Vec<String> = self.checkpoint.keys().cloned().collect();
        assert_eq!(want_claims, got_claims, "{context}: checkpointed claims");
        for (uid, claim) in &self.checkpoint {
            assert_eq!(
                "PrepareCompleted", claim.phase,
                "{context}: phase of claim {uid}"
            );
        }
        let want_files: Vec<String> = want_claims.iter().map(|u| spec_file(u)).collect();
        assert_eq!(want_files, self.cdi_files, "{context}: CDI directory");
        assert_eq!(
            want_claims, self.metadata_claims,
            "{context}: claims with device metadata files"
        );
        assert_eq!(
            self.checkpoint_mig_uuids(),
            self.hardware_mig_uuids(),
            "{context}: MIG devices on the hardware vs. in the checkpoint"
        );
        let leaked: Vec<&SimInstance> = self
            .instances
            .iter()
            .filter(|i| i.mig_uuids.is_empty())
            .collect();
        assert!(
            leaked.is_empty(),
            "{context}: GPU instances without a compute instance: {leaked:?}"
        );
    }
}

fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn sim_state(path: &Path) -> (Vec<SimInstance>, Vec<bool>) {
    let Some(file) = read_json(path) else {
        return (Vec::new(), Vec::new());
    };
    let gpus = file["state"]["gpus"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut instances = Vec::new();
    let mut modes = Vec::new();
    for (index, gpu) in gpus.iter().enumerate() {
        modes.push(gpu["migCurrent"].as_bool().unwrap_or(false));
        for gi in gpu["instances"].as_array().into_iter().flatten() {
            let mig_uuids = gi["computeInstances"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ci| ci[1].as_str().map(str::to_string))
                .collect();
            instances.push(SimInstance {
                gpu: index as u64,
                start: gi["start"].as_u64().unwrap_or(u64::MAX),
                size: gi["size"].as_u64().unwrap_or(u64::MAX),
                mig_uuids,
            });
        }
    }
    instances.sort();
    (instances, modes)
}

fn checkpoint(path: &Path) -> BTreeMap<String, CheckpointClaim> {
    let Some(file) = read_json(path) else {
        return BTreeMap::new();
    };
    let claims = file["payload"]["claims"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    claims
        .into_iter()
        .map(|(uid, claim)| {
            let devices = claim["devices"].as_array().cloned().unwrap_or_default();
            let record = CheckpointClaim {
                phase: claim["phase"].as_str().unwrap_or_default().to_string(),
                devices: devices
                    .iter()
                    .filter_map(|d| d["device"].as_str().map(str::to_string))
                    .collect(),
                mig_uuids: devices
                    .iter()
                    .filter_map(|d| d["mig"]["uuid"].as_str().map(str::to_string))
                    .collect(),
            };
            (uid, record)
        })
        .collect()
}

/// Sorted file names in `dir`; empty when it does not exist.
/// The claim UIDs with device metadata files (`<uid>_<request>.json`) in `dir`, sorted, once
/// each.
fn metadata_claims(dir: &Path) -> Vec<String> {
    let mut uids: Vec<String> = dir_names(dir)
        .into_iter()
        .filter_map(|n| Some(n.strip_suffix(".json")?.rsplit_once('_')?.0.to_string()))
        .collect();
    uids.sort();
    uids.dedup();
    uids
}

pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
