//! Fake `nvidia-smi` and `nvidia-cuda-mps-control` (bash scripts) for the sharing tests and
//! the MPS bench. They record every call in `<dir>/calls.log`, one line each:
//! `nvidia-smi <args>`, `nvidia-cuda-mps-control -d <env>`, `mps-client <command>`.
//!
//! Switches: `<dir>/smi.fail` makes nvidia-smi print its content on stderr and exit 3;
//! `<dir>/mps.lie` makes the daemon answer its content to
//! `get_default_active_thread_percentage`. The daemon reads commands from the FIFO
//! `<pipe>/cmd` and answers on `<pipe>/ans`.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpu_dra::sharing::{MpsDaemonSpec, MpsDevice, Tools};

const FAKE_SMI: &str = r#"#!/bin/bash
D="@DIR@"
echo "nvidia-smi $*" >> "$D/calls.log"
if [ -f "$D/smi.fail" ]; then cat "$D/smi.fail" >&2; exit 3; fi
echo "All done."
"#;

const FAKE_MPS: &str = r#"#!/bin/bash
D="@DIR@"
P="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
L="${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}"
PIDF="$P/nvidia-cuda-mps-control.pid"
alive() {
  local pid
  pid=$(cat "$PIDF" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}
daemon() {
  local pct=100.0 ans line
  declare -A lim
  echo "$BASHPID" > "$PIDF"
  while :; do
    [ -p "$P/cmd" ] || exit 0
    read -r line < "$P/cmd" || continue
    echo "Cmd:$line" >> "$L/control.log"
    set -- $line
    ans=""
    case "$1" in
      get_default_active_thread_percentage)
        if [ -f "$D/mps.lie" ]; then ans=$(cat "$D/mps.lie"); else ans="$pct"; fi ;;
      set_default_active_thread_percentage) pct="$2.0" ;;
      set_default_device_pinned_mem_limit) lim[$2]="$3" ;;
      get_default_device_pinned_mem_limit) ans="${lim[$2]:-0M}" ;;
      quit) rm -f "$PIDF"; printf '\n' > "$P/ans"; exit 0 ;;
      *) ans="Invalid command" ;;
    esac
    printf '%s\n' "$ans" > "$P/ans"
  done
}
case "$1" in
  -d)
    echo "nvidia-cuda-mps-control -d CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_LOG_DIRECTORY=$L" >> "$D/calls.log"
    if alive; then echo "An instance of this daemon is already running"; exit 1; fi
    rm -f "$P/cmd" "$P/ans" "$PIDF"
    mkfifo "$P/cmd" "$P/ans"
    daemon </dev/null >/dev/null 2>&1 &
    while [ ! -s "$PIDF" ]; do sleep 0.002; done
    exit 0 ;;
  "")
    alive || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
    while read -r line; do
      [ -z "$line" ] && continue
      echo "mps-client $line" >> "$D/calls.log"
      printf '%s\n' "$line" > "$P/cmd"
      read -r ans < "$P/ans"
      [ -n "$ans" ] && echo "$ans"
    done
    exit 0 ;;
  *) echo "unknown option $1"; exit 1 ;;
esac
"#;

/// Writes the fake tools into `<dir>/bin` and returns [`Tools`] for them (5 s per call).
pub fn fake_tools(dir: &Path) -> Tools {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let d = dir.to_str().unwrap();
    for (name, text) in [
        ("nvidia-smi", FAKE_SMI),
        ("nvidia-cuda-mps-control", FAKE_MPS),
    ] {
        let path = bin.join(name);
        fs::write(&path, text.replace("@DIR@", d)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    Tools::new(bin.join("nvidia-smi"), bin.join("nvidia-cuda-mps-control"))
        .with_timeout(Duration::from_secs(5))
}

/// The recorded calls, one per line.
pub fn calls(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// Forgets the calls recorded so far.
pub fn clear_calls(dir: &Path) {
    let _ = fs::remove_file(dir.join("calls.log"));
}

/// Makes the fake nvidia-smi fail with `stderr`.
pub fn fail_smi(dir: &Path, stderr: &str) {
    fs::write(dir.join("smi.fail"), stderr).unwrap();
}

/// Makes the fake daemon answer `answer` to `get_default_active_thread_percentage`.
pub fn lie_about_percentage(dir: &Path, answer: &str) {
    fs::write(dir.join("mps.lie"), answer).unwrap();
}

pub fn gpu(uuid: &str) -> MpsDevice {
    MpsDevice {
        uuid: uuid.into(),
        full_gpu: true,
    }
}

pub fn mig(uuid: &str) -> MpsDevice {
    MpsDevice {
        uuid: uuid.into(),
        full_gpu: false,
    }
}

/// A spec over one GPU and one MIG device with 50 % threads and 4 GiB pinned on the GPU.
pub fn spec(id: &str) -> MpsDaemonSpec {
    MpsDaemonSpec {
        id: id.into(),
        devices: vec![gpu("GPU-aa11"), mig("MIG-bb22")],
        active_thread_percentage: Some(50),
        pinned_memory_bytes: vec![Some(4096 * 1024 * 1024), None],
        multi_user: false,
    }
}

pub fn pid_of(root: &Path, id: &str) -> Option<u32> {
    fs::read_to_string(root.join(id).join("pipe/nvidia-cuda-mps-control.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub fn alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rfind(')').map(|i| stat[i + 2..].chars().next());
    !matches!(state, Some(Some('Z' | 'X')))
}

pub fn kill9(pid: u32) {
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
}

/// Kills every daemon left under `root` when dropped, so a failing test leaks nothing.
pub struct Reaper(pub PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        let Ok(entries) = fs::read_dir(&self.0) else {
            return;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = pid_of(&self.0, &id)
                && alive(pid)
            {
                kill9(pid);
            }
        }
    }
}
