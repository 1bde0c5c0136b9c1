//! Fabric Manager partitions on NVSwitch systems in shared NVSwitch virtualization mode
//! (`FABRIC_MODE=1`): GPUs reach each other over NVLink only inside a partition FM has
//! activated, from FM's fixed list.
//!
//! The plugin talks to FM through NVIDIA's `fmpm` tool (NVIDIA/Fabric-Manager-Client), not
//! the C library `libnvfm.so`: a child process needs no `unsafe` (the house keeps that to
//! NVML) and is how the plugin already drives `nvidia-smi`, `nvidia-cuda-mps-control` and
//! `nvidia-imex-ctl`. The cost: `fmpm` must be on the host (under the driver root), and each
//! call is a process start (docs/fabric-manager.md has the measured cost). With the simulated node the tool is the
//! `gpu-dra` binary itself run as `fmpm` ([`sim`]), which keeps the active partitions in the
//! simulated node's state directory.
//!
//! * [`partitions`] (pure): the list, its validation, the published attributes and the
//!   partition a claim must fill exactly.
//! * [`order`] (pure): the order a node offers its whole GPUs in, free partitions first, so
//!   kube-scheduler's first-fit walk finds them.
//! * [`client`]: runs `fmpm -l / -a / -d` against FM's Unix socket or TCP address.
//! * [`sim`]: the simulated `fmpm` and Fabric Manager.

pub mod client;
pub mod order;
pub mod partitions;
pub mod sim;

pub use client::{Endpoint, FmClient};
pub use partitions::{PartitionTable, attributes, partition_for};

/// What went wrong talking to Fabric Manager or with what it said.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// `fmpm` is not under the driver root.
    #[error(
        "fmpm (NVIDIA/Fabric-Manager-Client) not found; tried {}: install it on the host or set --fmpm-path",
        tried.join(", ")
    )]
    ToolNotFound {
        /// Paths tried.
        tried: Vec<String>,
    },
    /// FM did not answer at its endpoint (socket missing, FM not running, not listening).
    #[error(
        "Fabric Manager unreachable at {endpoint}: {detail} (is nvidia-fabricmanager running with FABRIC_MODE=1 and FM_CMD_UNIX_SOCKET_PATH / FM_CMD_BIND_INTERFACE set to this endpoint?)"
    )]
    Unreachable {
        /// The socket path or address.
        endpoint: String,
        /// What fmpm said.
        detail: String,
    },
    /// The partition's GPUs are in another active partition.
    #[error(
        "Fabric Manager partition {partition} is busy: its GPUs are in another active partition ({detail})"
    )]
    PartitionBusy {
        /// The partition.
        partition: u32,
        /// What fmpm said.
        detail: String,
    },
    /// A claim's GPUs are not exactly one partition's.
    #[error("the claim's GPUs (modules {modules}) match no Fabric Manager partition: {detail}")]
    Mismatch {
        /// The claim's module IDs, comma-separated.
        modules: String,
        /// The partitions that would fit and the fix.
        detail: String,
    },
    /// A GPU of the claim has no module ID published (not an FM GPU).
    #[error(
        "device {device} has no gpuModuleID: its GPU is not on Fabric Manager's NVSwitch fabric"
    )]
    NoModule {
        /// The device.
        device: String,
    },
    /// FM's list is unusable.
    #[error("Fabric Manager's partition list is invalid: {detail}")]
    BadList {
        /// What is wrong.
        detail: String,
    },
    /// `fmpm` failed otherwise.
    #[error("fmpm {args} failed (fmReturn {code}): {detail}")]
    Failed {
        /// Its arguments.
        args: String,
        /// FM's return code (`fmReturn_t`), negative.
        code: i32,
        /// What it printed.
        detail: String,
    },
    /// `fmpm` could not be run or did not finish.
    #[error("running {program}: {detail}")]
    Spawn {
        /// The program.
        program: String,
        /// Cause.
        detail: String,
    },
}

impl FabricError {
    /// A stable snake-case kind (metric label `kind` of `gpu_dra_errors_total`).
    pub fn kind(&self) -> &'static str {
        match self {
            FabricError::ToolNotFound { .. } | FabricError::Unreachable { .. } => {
                "fabric_manager_unreachable"
            }
            FabricError::PartitionBusy { .. } => "fabric_partition_busy",
            FabricError::Mismatch { .. } | FabricError::NoModule { .. } => {
                "fabric_partition_mismatch"
            }
            FabricError::BadList { .. }
            | FabricError::Failed { .. }
            | FabricError::Spawn { .. } => "fabric_manager",
        }
    }
}

/// `fmReturn_t` codes this crate names (nv_fm_types.h).
pub mod codes {
    /// `FM_ST_BADPARAM`.
    pub const BADPARAM: i32 = -1;
    /// `FM_ST_NOT_SUPPORTED`: FM is not in shared NVSwitch mode.
    pub const NOT_SUPPORTED: i32 = -3;
    /// `FM_ST_UNINITIALIZED`: the partition is not activated.
    pub const UNINITIALIZED: i32 = -4;
    /// `FM_ST_IN_USE`: the partition is already active.
    pub const IN_USE: i32 = -7;
    /// `FM_ST_CONNECTION_NOT_VALID`: FM did not answer.
    pub const CONNECTION_NOT_VALID: i32 = -9;
    /// `FM_ST_RESOURCE_USED_IN_ANOTHER_PARTITION`.
    pub const RESOURCE_USED_IN_ANOTHER_PARTITION: i32 = -24;
}
