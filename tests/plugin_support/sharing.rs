//! Sharing as a test sees it on a node: opaque config entries and consumable-capacity shares
//! put into claims, the simulated tools' record, and the MPS daemons (directories and live
//! processes) a plugin left behind.

use std::path::Path;

use gpu_dra::sharing::simtools;
use serde_json::{Value, json};

use super::Node;
use super::claims::DRIVER;

/// Adds an opaque config entry of this driver, from the claim, for `requests` (all if empty).
pub fn with_config(mut claim: Value, requests: &[&str], parameters: Value) -> Value {
    let entry = json!({
        "source": "FromClaim",
        "requests": requests,
        "opaque": {"driver": DRIVER, "parameters": parameters},
    });
    let config = &mut claim["status"]["allocation"]["devices"]["config"];
    if !config.is_array() {
        *config = json!([]);
    }
    config.as_array_mut().expect("array").push(entry);
    claim
}

/// A `GpuConfig` with MPS limits.
pub fn mps_config(kind: &str, threads: u8, pinned: &str) -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": kind,
        "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": threads,
            "defaultPinnedDeviceMemoryLimit": pinned}},
    })
}

/// Makes result `index` a consumable-capacity share.
pub fn as_share(mut claim: Value, index: usize, share_id: &str, consumed: Value) -> Value {
    let result = &mut claim["status"]["allocation"]["devices"]["results"][index];
    result["shareID"] = json!(share_id);
    result["consumedCapacity"] = consumed;
    claim
}

/// Where the plugin's simulated tools record what they received.
pub fn tools_dir(node: &Node) -> std::path::PathBuf {
    node.state_dir().join("sim").join("tools")
}

/// The simulated tools' invocations, rendered as command lines (with the env they got).
pub fn tool_calls(node: &Node) -> Vec<String> {
    simtools::read_log(&tools_dir(node))
        .iter()
        .map(|i| {
            let env: Vec<String> = i
                .env
                .iter()
                .filter(|(k, _)| k.as_str() == "CUDA_VISIBLE_DEVICES")
                .map(|(k, v)| format!("{k}={v} "))
                .collect();
            format!("{}{}", env.concat(), i.command_line())
        })
        .collect()
}

/// Compute mode and time-slice per GPU UUID as the simulated nvidia-smi holds them.
pub fn smi_state(node: &Node, uuid: &str) -> (String, u8) {
    let state = simtools::read_state(&tools_dir(node));
    state
        .get(uuid)
        .map(|s| (s.compute_mode.clone(), s.timeslice))
        .unwrap_or_else(|| ("DEFAULT".into(), 0))
}

/// MPS daemon directories under the plugin dir.
pub fn daemon_dirs(node: &Node) -> Vec<String> {
    super::state::dir_names(&node.plugin_dir().join("mps"))
}

/// PID of a daemon from its pid file.
pub fn daemon_pid(node: &Node, id: &str) -> Option<u32> {
    let file = node
        .plugin_dir()
        .join("mps")
        .join(id)
        .join("pipe")
        .join("nvidia-cuda-mps-control.pid");
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Live MPS control daemons whose pipe directory is under `root` (the simulated daemon runs
/// detached as `nvidia-cuda-mps-control -f`): the daemons a node's plugins started and did
/// not stop (zombies count as gone; a control client the plugin's supervision runs at that
/// moment is not a daemon).
pub fn live_daemons(root: &Path) -> Vec<u32> {
    let prefix = format!("CUDA_MPS_PIPE_DIRECTORY={}", root.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let daemon = cmdline.split(|b| *b == 0).any(|arg| arg == b"-f");
            !zombie
                && daemon
                && environ
                    .split(|b| *b == 0)
                    .any(|var| var.starts_with(prefix.as_bytes()))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// SIGKILL to `pid` (a daemon the test wants dead, as a crash would leave it).
pub fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

/// Kills every daemon still running under `root` (test clean-up; not an assertion).
pub fn reap(root: &Path) {
    live_daemons(root).into_iter().for_each(kill9);
}
