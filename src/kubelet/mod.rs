//! The kubelet-facing side of the driver: plugin registration, the DRA prepare/unprepare
//! service (v1 and v1beta1), the device health stream (v1alpha1 and v1) and the Unix sockets
//! they are served on.
//!
//! [`serve`] puts everything up; the rest of the driver plugs in through [`DraHandler`] and,
//! optionally, a [`HealthSource`]. [`client::KubeletClient`] plays the kubelet's part in tests.

pub mod authority;
pub mod client;
mod combine;
mod dra;
mod error;
mod handler;
mod health;
mod lock;
pub mod proto;
mod rebind;
pub mod recording;
mod registration;
mod server;
mod sockets;

pub use error::KubeletError;
pub use handler::{
    ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults, validate_claims,
};
pub use health::{DeviceHealth, HealthSource, HealthStatus};
pub use lock::{PluginLock, PluginLockGuard};
pub use registration::{
    DRA_V1, DRA_V1BETA1, HEALTH_V1, HEALTH_V1ALPHA1, PLUGIN_TYPE, RegistrationState,
    supported_versions,
};
pub use server::{RunningPlugin, SHUTDOWN_GRACE, serve};
pub use sockets::{
    DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, DIR_MODE, MAX_SOCKET_PATH_BYTES, PluginSockets,
    SOCKET_MODE, check_socket_path, create_private_dir,
};

/// Kept here too for callers written against the kubelet module.
pub use crate::errors::error_chain;
