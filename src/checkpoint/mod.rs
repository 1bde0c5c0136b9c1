//! The crash-safe record of what the plugin has prepared on this node.
//!
//! Intent is recorded before acting and completion after, so a restarted plugin knows which
//! claims to finish, undo or forget. The file is versioned (`v1`), checksummed, validated on
//! write and on read, and replaced atomically; content problems never stop the plugin
//! ([`LoadOutcome`]), only real I/O failures do ([`StoreError`]).

mod boot;
mod model;
mod store;
mod wire;

pub use boot::{BootIdError, boot_id};
pub use model::{
    Checkpoint, ClaimPhase, ClaimRecord, DeviceRecord, InvalidCheckpoint, MigRecord, VfioRecord,
    VgpuRecord,
};
pub use store::{
    CHECKPOINT_FILE, CheckpointStore, LoadOutcome, Snapshot, StoreError, read_unlocked,
};
pub use wire::{CURRENT_VERSION, DecodeError, SUPPORTED_VERSIONS, checksum, decode, encode};
