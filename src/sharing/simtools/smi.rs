//! Simulated `nvidia-smi`: `-i <id> -c <mode>` and `compute-policy -i <id> --set-timeslice
//! <N>`, with the state kept per device in `nvidia-smi-state.json`, and `--query-gpu`
//! (`query.rs`).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::Path;
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use super::BAD_ARGS;
use crate::sharing::spec::validate_uuid;

const STATE_FILE: &str = "nvidia-smi-state.json";

/// What the simulated `nvidia-smi` holds for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmiGpuState {
    pub compute_mode: String,
    pub timeslice: u8,
}

impl Default for SmiGpuState {
    fn default() -> SmiGpuState {
        SmiGpuState {
            compute_mode: "DEFAULT".into(),
            timeslice: 0,
        }
    }
}

enum Action {
    ComputeMode(String, &'static str),
    Timeslice(String, u8),
}

pub(super) fn run(args: &[String], dir: Option<&Path>) -> ExitCode {
    if super::query::is_query(args) {
        return super::query::run(args);
    }
    let action = match parse(args) {
        Ok(a) => a,
        Err((code, msg)) => {
            println!("{msg}");
            return ExitCode::from(code);
        }
    };
    let result = update(dir, |state| match &action {
        Action::ComputeMode(id, mode) => {
            let gpu = state.entry(id.clone()).or_default();
            if gpu.compute_mode == *mode {
                format!("Compute mode is already set to {mode} for GPU {id}.\nAll done.")
            } else {
                gpu.compute_mode = mode.to_string();
                format!("Set compute mode to {mode} for GPU {id}.\nAll done.")
            }
        }
        Action::Timeslice(id, level) => {
            state.entry(id.clone()).or_default().timeslice = *level;
            format!("Set timeslice to {level} for GPU {id}.")
        }
    });
    match result {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            println!("Unable to update state: {msg}");
            ExitCode::from(255)
        }
    }
}

fn parse(args: &[String]) -> Result<Action, (u8, String)> {
    let bad = || (2, BAD_ARGS.to_string());
    let (policy, rest) = match args.first().map(String::as_str) {
        Some("compute-policy") => (true, &args[1..]),
        _ => (false, args),
    };
    let mut id = None;
    let mut mode = None;
    let mut slice = None;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-i" | "--id" => id = Some(it.next().ok_or_else(bad)?.clone()),
            "-c" | "--compute-mode" if !policy => mode = Some(it.next().ok_or_else(bad)?.clone()),
            "--set-timeslice" if policy => slice = Some(it.next().ok_or_else(bad)?.clone()),
            s if policy && s.starts_with("--set-timeslice=") => {
                slice = Some(s["--set-timeslice=".len()..].to_string());
            }
            _ => return Err(bad()),
        }
    }
    let id = id.ok_or_else(bad)?;
    if validate_uuid("id", &id).is_err() && id.parse::<u32>().is_err() {
        return Err((6, "No devices were found".into()));
    }
    match (policy, mode, slice) {
        (false, Some(m), None) => {
            let mode = match m.to_ascii_uppercase().as_str() {
                "0" | "DEFAULT" => "DEFAULT",
                "2" | "PROHIBITED" => "PROHIBITED",
                "3" | "EXCLUSIVE_PROCESS" => "EXCLUSIVE_PROCESS",
                _ => return Err((2, format!("Invalid compute mode value: {m}"))),
            };
            Ok(Action::ComputeMode(id, mode))
        }
        (true, None, Some(s)) => {
            if id.starts_with("MIG-") {
                return Err((
                    3,
                    format!("Setting timeslice for MIG device {id} is Not Supported"),
                ));
            }
            match s.parse::<u8>() {
                Ok(n) if n <= 3 => Ok(Action::Timeslice(id, n)),
                _ => Err((
                    2,
                    format!("Invalid timeslice value: {s}; valid values are 0-3"),
                )),
            }
        }
        _ => Err(bad()),
    }
}

/// Applies `change` to the state file under an exclusive lock (tools may run concurrently).
pub(super) fn update(
    dir: Option<&Path>,
    change: impl FnOnce(&mut BTreeMap<String, SmiGpuState>) -> String,
) -> Result<String, String> {
    let Some(dir) = dir else {
        return Ok(change(&mut BTreeMap::new()));
    };
    let lock_path = dir.join(format!("{STATE_FILE}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let mut state = load(dir);
    let msg = change(&mut state);
    let bytes = serde_json::to_vec_pretty(&state).map_err(|e| e.to_string())?;
    crate::fsutil::write_atomic(&dir.join(STATE_FILE), &bytes, 0o644).map_err(|e| e.to_string())?;
    Ok(msg)
}

pub(super) fn load(dir: &Path) -> BTreeMap<String, SmiGpuState> {
    std::fs::read(dir.join(STATE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn compute_mode_and_timeslice_are_kept_per_uuid() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Some(tmp.path());
        run(&args(&["-i", "GPU-aa", "-c", "EXCLUSIVE_PROCESS"]), dir);
        run(
            &args(&["compute-policy", "-i", "GPU-bb", "--set-timeslice=2"]),
            dir,
        );
        let got = load(tmp.path());
        let want = BTreeMap::from([
            (
                "GPU-aa".to_string(),
                SmiGpuState {
                    compute_mode: "EXCLUSIVE_PROCESS".into(),
                    timeslice: 0,
                },
            ),
            (
                "GPU-bb".to_string(),
                SmiGpuState {
                    compute_mode: "DEFAULT".into(),
                    timeslice: 2,
                },
            ),
        ]);
        assert_eq!(got, want);
    }

    #[test]
    fn bad_arguments_are_rejected_like_the_real_tool() {
        let codes: Vec<u8> = [
            args(&["-i", "GPU-aa", "-c", "SHARED"]),
            args(&["compute-policy", "-i", "GPU-aa", "--set-timeslice", "4"]),
            args(&["-i", "bogus", "-c", "DEFAULT"]),
            args(&["--frobnicate"]),
            args(&["compute-policy", "-i", "MIG-aa", "--set-timeslice", "1"]),
        ]
        .iter()
        .map(|a| match parse(a) {
            Ok(_) => 0,
            Err((code, _)) => code,
        })
        .collect();
        assert_eq!(codes, vec![2, 2, 6, 2, 3]);
    }
}
