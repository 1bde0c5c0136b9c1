use std::path::PathBuf;

/// Everything that can go wrong while setting up, serving or talking to the kubelet-facing
/// sockets. Each variant names the step that failed and the path or value involved.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// A configuration value that ends up in a socket name is unusable.
    #[error("invalid {field} {value:?}: {expected}")]
    InvalidName {
        field: &'static str,
        value: String,
        expected: &'static str,
    },

    /// The kernel stores Unix socket paths in a 108-byte buffer that also holds a NUL byte.
    #[error(
        "socket path {path:?} is {len} bytes long but Unix sockets allow at most {max}; \
         use a shorter plugin or registry directory (or a shorter pod UID)"
    )]
    SocketPathTooLong {
        path: PathBuf,
        len: usize,
        max: usize,
    },

    #[error("cannot resolve the absolute path of {path:?}")]
    AbsolutePath {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot create directory {path:?}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot inspect {path:?} before listening on it")]
    InspectSocketPath {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Only stale sockets are removed; anything else at a socket path is left for a human.
    #[error("{path:?} exists and is not a socket; remove it or choose another directory")]
    NotASocket { path: PathBuf },

    #[error("cannot remove stale socket {path:?}")]
    RemoveStaleSocket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot listen on socket {path:?}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot set permissions {mode:o} on {path:?}")]
    SetPermissions {
        path: PathBuf,
        mode: u32,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot open plugin lock file {path:?}")]
    OpenLock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot take plugin lock {path:?}")]
    TakeLock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("gRPC server on {socket:?} failed")]
    Serve {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },

    #[error("gRPC server task for {socket:?} ended abnormally")]
    ServerTask {
        socket: PathBuf,
        #[source]
        source: tokio::task::JoinError,
    },

    #[error("cannot connect to socket {path:?}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },

    #[error("{call} failed")]
    Rpc {
        call: &'static str,
        #[source]
        source: tonic::Status,
    },

    #[error("plugin registered as type {got:?}, expected {want:?}")]
    UnexpectedPluginType { want: &'static str, got: String },

    #[error("plugin offers {offered:?} but this client only speaks {supported:?}")]
    NoCommonVersion {
        offered: Vec<String>,
        supported: Vec<&'static str>,
    },

    #[error("{call} called before connecting to the plugin's DRA endpoint")]
    NotConnected { call: &'static str },
}
