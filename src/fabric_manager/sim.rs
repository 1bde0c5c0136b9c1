//! The simulated `fmpm` and the Fabric Manager behind it: the `gpu-dra` binary run as
//! `fmpm` (a symlink, as for the simulated `nvidia-smi`), with fmpm's command line
//! (`-l`, `-a <id>`, `-d <id>`, `--unix-domain-socket <path>`, `--hostname <host>`), its
//! JSON, its messages (`Failed to … fmReturn: <n>`) and its exit status (FM's return code).
//!
//! The node is the simulated one in `GPU_DRA_SIM_STATE_DIR`: FM answers only when the node
//! file sets `fabricMode: 1` (shared NVSwitch mode), lists the HGX 8-GPU table over the GPUs'
//! module IDs, and keeps the active partitions in `<state>/fabricmanager/active.json`
//! under a lock, so every process sees one truth; every call is appended to
//! `<state>/fabricmanager/calls.log` ([`calls`]). FM "runs" while its socket
//! `<state>/run/nvidia-fabricmanager/socket` exists ([`start`] creates it; removing it makes
//! FM unreachable).
//!
//! Deliberate difference: fmpm at NVIDIA/Fabric-Manager-Client `58c6738` overwrites the
//! `--unix-domain-socket` address with the (default) hostname before connecting, so its
//! socket option does not take effect; the simulation honours it, as the option intends.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::codes;
use super::partitions::{PartitionList, hgx_8gpu_table};
use crate::hardware::sim::SimBackend;

/// The executable name.
pub const TOOL: &str = "fmpm";
/// The env var naming the simulated node's state directory.
pub const STATE_DIR_ENV: &str = "GPU_DRA_SIM_STATE_DIR";
/// Most partitions FM supports (`FM_MAX_FABRIC_PARTITIONS`).
const MAX_PARTITIONS: u32 = 64;

/// Whether `argv[0]`'s file name is `fmpm`.
pub fn personality(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(TOOL))
}

/// The simulated FM's socket in the node's state directory `state`.
pub fn socket(state: &Path) -> PathBuf {
    state.join(super::client::DEFAULT_SOCKET)
}

/// Starts the simulated FM of the node in `state` when its node file sets shared mode:
/// creates its Unix socket (a socket inode nobody answers on; the simulated `fmpm` only
/// checks it is there). Returns the socket, or `None` when the node has no FM in shared mode.
///
/// # Errors
/// The I/O error creating the socket's directory or the socket.
pub fn start(state: &Path) -> std::io::Result<Option<PathBuf>> {
    let shared = SimBackend::open_state_dir(state)
        .map(|sim| sim.plan().spec.fabric_mode == 1)
        .unwrap_or(false);
    if !shared {
        return Ok(None);
    }
    let path = socket(state);
    if std::fs::symlink_metadata(&path).is_err() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        drop(std::os::unix::net::UnixListener::bind(&path)?);
    }
    Ok(Some(path))
}

/// Links `<dir>/fmpm` to `exe` (the `gpu-dra` binary), replacing an older link.
///
/// # Errors
/// The I/O error creating the directory or the link.
pub fn install(exe: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let link = dir.join(TOOL);
    match std::fs::remove_file(&link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(exe, &link)?;
    Ok(link)
}

enum Op {
    List,
    Activate(u32),
    Deactivate(u32),
}

/// Runs the simulated `fmpm` with `args` (argv without `argv[0]`).
pub fn run(args: &[String]) -> ExitCode {
    if args.is_empty() || (args.len() == 1 && args[0] == "-h") {
        println!(
            "-l : List partitions\n-a <Partition ID> : Activate partition\n-d <Partition ID> : Deactivate partition\n--hostname : hostname or IP address (TCP socket) of Fabric Manager.\n--unix-domain-socket : UNIX domain socket path for Fabric Manager connection\n-v : Show version"
        );
        return ExitCode::SUCCESS;
    }
    let mut op = None;
    let mut hostname = "127.0.0.1".to_string();
    let mut socket_path: Option<String> = None;
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1);
        match args[i].as_str() {
            "-l" => op = Some(Op::List),
            "-a" | "-d" => {
                let Some(id) = value.and_then(|v| v.parse::<u32>().ok()) else {
                    eprintln!("Error: {} option requires partition ID.", args[i]);
                    return exit(codes::BADPARAM);
                };
                if id >= MAX_PARTITIONS {
                    println!("Invalid Partition ID.");
                    return exit(codes::BADPARAM);
                }
                op = Some(if args[i] == "-a" {
                    Op::Activate(id)
                } else {
                    Op::Deactivate(id)
                });
                i += 1;
            }
            "--hostname" | "--unix-domain-socket" => {
                let Some(v) = value else {
                    eprintln!("Error: {} option requires a value.", args[i]);
                    return ExitCode::from(1);
                };
                if args[i] == "--hostname" {
                    hostname = v.clone();
                } else {
                    socket_path = Some(v.clone());
                }
                i += 1;
            }
            "-v" => {
                println!("1.0.1");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("Invalid argument.\n");
                return exit(codes::BADPARAM);
            }
        }
        i += 1;
    }
    let Some(op) = op else {
        return ExitCode::SUCCESS;
    };
    let Some(state) = std::env::var_os(STATE_DIR_ENV).map(PathBuf::from) else {
        println!("Failed to connect to Fabric Manager instance.");
        return exit(codes::CONNECTION_NOT_VALID);
    };
    record(&state, args);
    let running = std::fs::symlink_metadata(socket(&state)).is_ok();
    let reachable = match &socket_path {
        Some(path) => running && std::fs::symlink_metadata(path).is_ok(),
        None => running && matches!(hostname.as_str(), "127.0.0.1" | "localhost"),
    };
    if !reachable {
        println!("Failed to connect to Fabric Manager instance.");
        return exit(codes::CONNECTION_NOT_VALID);
    }
    match answer(&state, op) {
        Ok(()) => ExitCode::SUCCESS,
        Err((message, code)) => {
            println!("{message} fmReturn: {code}");
            exit(code)
        }
    }
}

/// FM's return code as fmpm's exit status (`return fmReturn` from `main`).
fn exit(code: i32) -> ExitCode {
    ExitCode::from(code as u8)
}

/// The node's GPUs by module ID (UUID, PCI bus ID), module 1 first, when it is in shared
/// mode; else FM's "not supported".
fn node_gpus(state: &Path) -> Result<Vec<(String, String)>, i32> {
    let sim = SimBackend::open_state_dir(state).map_err(|_| codes::CONNECTION_NOT_VALID)?;
    gpus_of(&sim)
}

/// The partition list the simulated FM of `sim` answers `fmpm -l` with, none active (a node
/// without a state directory has activated nothing), validated as the plugin validates FM's
/// answer: what a plugin started with `--fabric-manager` on this node publishes from. For
/// tools that build the node's slices in-process (`explain --fabric-manager`), with no FM
/// process and no `fmpm`.
///
/// # Errors
/// [`super::FabricError::Failed`] with FM's `FM_ST_NOT_SUPPORTED` when the node is not in shared
/// NVSwitch mode (its node file lacks `nvswitch: true` / `fabricMode: 1`), or
/// `FM_ST_CONNECTION_NOT_VALID` when its inventory cannot be read.
pub fn partitions(sim: &SimBackend) -> Result<super::PartitionTable, super::FabricError> {
    let gpus = gpus_of(sim).map_err(|code| super::FabricError::Failed {
        args: "-l".into(),
        code,
        detail: match code {
            codes::NOT_SUPPORTED => format!(
                "the simulated node {} is not in shared NVSwitch mode: its node file needs `nvswitch: true` and `fabricMode: 1` (presets: hgx-h100-fm, hgx-h100-passthrough)",
                sim.node_name()
            ),
            _ => format!("the simulated node {} has no readable inventory", sim.node_name()),
        },
    })?;
    super::PartitionTable::new(hgx_8gpu_table(&gpus, &BTreeSet::new()))
}

/// [`node_gpus`] of an open node: UUID and PCI bus ID of modules 1, 2, … in order. Every GPU
/// of the baseboard, NVML-visible or not: FM's list does not change when the host moves a
/// GPU to `vfio-pci` (an earlier version took NVML's list, so module numbers shifted past a
/// GPU on `vfio-pci`).
fn gpus_of(sim: &SimBackend) -> Result<Vec<(String, String)>, i32> {
    if sim.plan().spec.fabric_mode != 1 {
        return Err(codes::NOT_SUPPORTED);
    }
    let gpus = sim.baseboard_gpus();
    let Some(&(last, _, _)) = gpus.last() else {
        return Err(codes::CONNECTION_NOT_VALID);
    };
    Ok((1..=last)
        .map(|m| {
            gpus.iter()
                .find(|(module, _, _)| *module == m)
                .map(|(_, uuid, bus)| (uuid.clone(), bus.clone()))
                .unwrap_or_default()
        })
        .collect())
}

fn answer(state: &Path, op: Op) -> Result<(), (&'static str, i32)> {
    let failed = match op {
        Op::List => "Failed to get partition list.",
        Op::Activate(_) => "Failed to activate partition.",
        Op::Deactivate(_) => "Failed to deactivate partition.",
    };
    let gpus = node_gpus(state).map_err(|code| (failed, code))?;
    let dir = state.join("fabricmanager");
    std::fs::create_dir_all(&dir).map_err(|_| (failed, -2))?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(|_| (failed, -2))?;
    lock.lock().map_err(|_| (failed, -2))?;
    let mut active = read_active(&dir);
    let table = hgx_8gpu_table(&gpus, &active);
    let modules_of = |id: u32| {
        table
            .iter()
            .find(|p| p.partition_id == id)
            .map(|p| p.modules())
    };
    match op {
        Op::List => {
            let list = PartitionList {
                version: 0x0100_0000 | 8,
                num_partitions: table.len() as u32,
                max_num_partitions: MAX_PARTITIONS,
                partition_info: table,
            };
            let text = serde_json::to_string_pretty(&list).map_err(|_| (failed, -2))?;
            // A reader that stops early (`fmpm -l | head`) is not FM's failure.
            let _ = writeln!(std::io::stdout(), "{text}");
        }
        Op::Activate(id) => {
            let Some(wanted) = modules_of(id) else {
                return Err((failed, codes::BADPARAM));
            };
            if active.contains(&id) {
                return Err((failed, codes::IN_USE));
            }
            let overlaps = active
                .iter()
                .filter_map(|&a| modules_of(a))
                .any(|m| !m.is_disjoint(&wanted));
            if overlaps {
                return Err((failed, codes::RESOURCE_USED_IN_ANOTHER_PARTITION));
            }
            active.insert(id);
            write_active(&dir, &active).map_err(|_| (failed, -2))?;
        }
        Op::Deactivate(id) => {
            if modules_of(id).is_none() {
                return Err((failed, codes::BADPARAM));
            }
            if !active.remove(&id) {
                return Err((failed, codes::UNINITIALIZED));
            }
            write_active(&dir, &active).map_err(|_| (failed, -2))?;
        }
    }
    drop(lock);
    Ok(())
}

/// The active partition IDs recorded in `dir`; none when there is no file.
fn read_active(dir: &Path) -> BTreeSet<u32> {
    std::fs::read_to_string(dir.join("active.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

fn write_active(dir: &Path, active: &BTreeSet<u32>) -> std::io::Result<()> {
    let tmp = dir.join("active.json.tmp");
    let text = serde_json::to_string(active).map_err(std::io::Error::other)?;
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join("active.json"))
}

/// Appends `args` as one line to `<state>/fabricmanager/calls.log` (one `O_APPEND` write, so
/// concurrent calls do not interleave); a log that cannot be written is skipped.
fn record(state: &Path, args: &[String]) {
    let dir = state.join("fabricmanager");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("calls.log"))
    {
        let _ = f.write_all(format!("{}\n", args.join(" ")).as_bytes());
    }
}

/// The simulated `fmpm` calls made against the node in `state`, oldest first, each as its
/// arguments joined by spaces (for tests counting what a prepare costs).
pub fn calls(state: &Path) -> Vec<String> {
    std::fs::read_to_string(state.join("fabricmanager/calls.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The partitions the simulated FM of the node in `state` has active (for tests and the
/// demo; what `fmpm -l` reports as `isActive`).
pub fn active(state: &Path) -> BTreeSet<u32> {
    read_active(&state.join("fabricmanager"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::hardware::passthrough::PciHost;
    use crate::hardware::sim::SimBackend;
    use crate::hardware::sim::sysfs::SimKernel;

    #[test]
    fn a_gpu_moved_to_vfio_pci_keeps_its_module_in_fms_list() {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimBackend::open("hgx-h100-passthrough", Some(dir.path())).unwrap();
        let before = super::partitions(&sim).unwrap();
        let root = sim.host_root().unwrap().to_path_buf();
        let pci = PciHost::new(&root, Arc::new(SimKernel::new(&root)));
        // Module 3's GPU goes to a VM: NVML stops listing it, FM does not.
        let module3 = before.partitions()[0].gpu_info[2].pci_bus_id.clone();
        assert!(!module3.is_empty());
        pci.switch(&module3, "nvidia", "vfio-pci", "test").unwrap();
        let after = super::partitions(&sim).unwrap();
        let buses = |t: &super::super::PartitionTable| -> Vec<(u32, String)> {
            t.partitions()[0]
                .gpu_info
                .iter()
                .map(|g| (g.physical_id, g.pci_bus_id.clone()))
                .collect()
        };
        assert_eq!(buses(&before), buses(&after));
        assert_eq!(after.module_by_pci_bus_id(&module3), Some(3));
    }
}
