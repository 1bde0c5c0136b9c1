//! Named crash points for crash-recovery tests.
//!
//! The claim lifecycle calls [`hit`] after each durable step. When the environment variable
//! `GPU_DRA_CRASH_AT` names that step, the process aborts on the spot — as a SIGKILL or a
//! power cut would stop it — so tests can restart the plugin and check that hardware,
//! checkpoint and CDI directory converge. Unset (always, in production), a crash point is one
//! environment lookup.

/// The environment variable naming the step to abort at.
pub const ENV: &str = "GPU_DRA_CRASH_AT";

/// Every crash point, in the order a prepare and then an unprepare pass them.
pub const POINTS: &[&str] = &[
    "prepare-intent-recorded",
    "prepare-gpu-instance-created",
    "prepare-mig-device-created",
    "prepare-sharing-applied",
    "prepare-metadata-written",
    "prepare-cdi-written",
    "prepare-completed",
    "unprepare-started",
    "unprepare-cdi-removed",
    "unprepare-sharing-undone",
    "unprepare-mig-destroyed",
];

/// The crash points of a VFIO device's driver switch, in the order a prepare and then an
/// unprepare pass them (each between two sysfs writes or after the NVML call before them).
pub const VFIO_POINTS: &[&str] = &[
    "prepare-intent-recorded",
    "prepare-vfio-persistence-off",
    "prepare-vfio-unbound",
    "prepare-vfio-bound",
    "prepare-cdi-written",
    "prepare-completed",
    "unprepare-started",
    "unprepare-cdi-removed",
    "unprepare-vfio-unbound",
    "unprepare-vfio-bound",
];

/// The crash points of Fabric Manager partitions, passed only on FM nodes
/// (`--fabric-manager`): after FM activated a claim's partition, and after it deactivated it.
/// Kept out of [`POINTS`], whose every point a MIG claim on a plain node passes;
/// `tests/plugin_fabric.rs` crashes at each of these.
pub const FABRIC_POINTS: &[&str] = &["prepare-fabric-activated", "unprepare-fabric-deactivated"];

/// Aborts the process if `GPU_DRA_CRASH_AT` equals `point`.
pub fn hit(point: &str) {
    if std::env::var_os(ENV).is_some_and(|v| v == point) {
        eprintln!("gpu-dra: crash point {point} reached ({ENV}); aborting");
        std::process::abort();
    }
}
