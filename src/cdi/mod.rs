//! Container Device Interface specs for prepared claims.
//!
//! Compute first, then act:
//! 1. [`HostMode::facts`] gathers what the host offers for the claim's devices (device nodes,
//!    MIG capability nodes, driver files) — probed under configurable roots on a real node,
//!    given explicitly on a simulated one;
//! 2. [`build_claim_spec`] (pure) turns the claim's devices and those facts into one spec
//!    with the minimum `cdiVersion`, validated as a runtime would;
//! 3. [`CdiWriter`] writes it atomically, removes it on unprepare and lists what exists for
//!    crash recovery.
//!
//! Layout and names follow NVIDIA's Go driver (`k8s.gpu.nvidia.com/claim`, one spec per
//! claim, devices `<claim-uid>-<device>`), so claims and nodes can move between drivers.

mod builder;
mod devnodes;
mod discover;
mod driver_edits;
mod driver_files;
mod input;
mod naming;
mod rootfs;
mod sim;
mod spec;
mod validate;
mod version;
mod writer;

pub use builder::{
    BuildError, DEVICE_UUID_ENV_PREFIX, HostFacts, VISIBLE_DEVICES_ENV, build_claim_spec,
    device_ids, uuid_env_name,
};
pub use devnodes::{
    CapAccess, DevNodeError, NodeInfo, cap_node, node_edit, parse_cap_access, parse_char_major,
    stat_node,
};
pub use discover::{DiscoverError, HostMode, discover_common, discover_device};
pub use driver_edits::driver_edits;
pub use driver_files::{
    DriverFile, DriverFiles, DriverFilesError, FileKind, Link, discover_driver_files,
};
pub use input::{ClaimDevice, DriverOptions, GpuDeviceRef, HostLayout};
pub use naming::{
    CLAIM_CLASS, ClaimNaming, DEFAULT_DRIVER_NAME, NameError, validate_device_name,
    validate_vendor_or_class,
};
pub use sim::{NVIDIA_MAJOR, SimError, SimulatedHost};
pub use spec::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
pub use validate::{SpecError, validate_spec};
pub use version::{CdiVersion, minimum_version};
pub use writer::{CdiWriter, WriterError};
