//! Where the plugin's sockets live and how they are created: validated names, the Unix path
//! limit, private directories and sockets, and removal of stale sockets only.

use std::fs::{self, DirBuilder, Permissions};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::KubeletError;

/// Longest socket path the kernel accepts: `sun_path` holds 108 bytes including the NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Mode of every socket this plugin creates: only the owner (the kubelet runs as root) connects.
pub const SOCKET_MODE: u32 = 0o600;

/// Mode of every directory this plugin creates.
pub const DIR_MODE: u32 = 0o750;

/// The kubelet's registry directory, watched for `*-reg.sock` files.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";

/// The parent of every driver's plugin directory.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// Where the plugin's sockets go and what they are called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSockets {
    /// The DRA driver name, e.g. `gpu.nvidia.com`.
    pub driver_name: String,
    /// The kubelet's plugin registry directory.
    pub registry_dir: PathBuf,
    /// This driver's own directory: the DRA socket and `plugin.lock` live here.
    pub plugin_dir: PathBuf,
    /// Set during a seamless rolling update, when two plugin pods run side by side and each
    /// needs its own socket names.
    pub pod_uid: Option<String>,
}

impl PluginSockets {
    /// The kubelet's standard locations for `driver_name`, without a pod UID.
    pub fn new(driver_name: impl Into<String>) -> Self {
        let driver_name = driver_name.into();
        Self {
            plugin_dir: Path::new(DEFAULT_PLUGINS_DIR).join(&driver_name),
            registry_dir: PathBuf::from(DEFAULT_REGISTRY_DIR),
            driver_name,
            pod_uid: None,
        }
    }

    /// `<registry-dir>/<driver>-reg.sock`, or `<driver>-<podUID>-reg.sock` with a pod UID.
    pub fn registration_socket(&self) -> PathBuf {
        let file = match &self.pod_uid {
            Some(uid) => format!("{}-{uid}-reg.sock", self.driver_name),
            None => format!("{}-reg.sock", self.driver_name),
        };
        self.registry_dir.join(file)
    }

    /// `<plugin-dir>/dra.sock`, or `dra-<podUID>.sock` with a pod UID.
    pub fn dra_socket(&self) -> PathBuf {
        let file = match &self.pod_uid {
            Some(uid) => format!("dra-{uid}.sock"),
            None => "dra.sock".to_string(),
        };
        self.plugin_dir.join(file)
    }

    /// `<plugin-dir>/plugin.lock`, shared by every instance of the plugin on the node.
    pub fn lock_file(&self) -> PathBuf {
        self.plugin_dir.join("plugin.lock")
    }

    /// Checks the names that end up in socket paths and the resulting path lengths, and makes
    /// both directories absolute (the kubelet needs an absolute endpoint).
    ///
    /// Fails with [`KubeletError::InvalidName`] for a driver name that is not a DNS subdomain,
    /// a pod UID that is not made of letters, digits and dashes or a plugin directory that is
    /// not UTF-8, and with
    /// [`KubeletError::SocketPathTooLong`] when a socket path would not fit a Unix address.
    pub fn validated(mut self) -> Result<Self, KubeletError> {
        check_driver_name(&self.driver_name)?;
        if let Some(uid) = &self.pod_uid {
            check_pod_uid(uid)?;
        }
        self.registry_dir = absolute(&self.registry_dir)?;
        self.plugin_dir = absolute(&self.plugin_dir)?;
        if self.plugin_dir.to_str().is_none() {
            // The endpoint travels to the kubelet as a protobuf string, which must be UTF-8.
            return Err(KubeletError::InvalidName {
                field: "plugin directory",
                value: self.plugin_dir.to_string_lossy().into_owned(),
                expected: "a UTF-8 path",
            });
        }
        check_socket_path(&self.registration_socket())?;
        check_socket_path(&self.dra_socket())?;
        Ok(self)
    }
}

fn absolute(path: &Path) -> Result<PathBuf, KubeletError> {
    std::path::absolute(path).map_err(|source| KubeletError::AbsolutePath {
        path: path.to_path_buf(),
        source,
    })
}

fn check_driver_name(name: &str) -> Result<(), KubeletError> {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        return Ok(());
    }
    Err(KubeletError::InvalidName {
        field: "driver name",
        value: name.to_string(),
        expected: "a DNS subdomain: dot-separated labels of lowercase letters, digits and '-', \
                   e.g. gpu.nvidia.com",
    })
}

fn check_pod_uid(uid: &str) -> Result<(), KubeletError> {
    if !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Ok(());
    }
    Err(KubeletError::InvalidName {
        field: "pod UID",
        value: uid.to_string(),
        expected: "letters, digits and '-', e.g. 3f1c2a9e-8d4b-4c1e-9a7f-2b6d5e8c0a11",
    })
}

/// Fails with [`KubeletError::SocketPathTooLong`] when `path` cannot be bound as given.
pub fn check_socket_path(path: &Path) -> Result<(), KubeletError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(KubeletError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
            max: MAX_SOCKET_PATH_BYTES,
        });
    }
    Ok(())
}

/// Creates `dir` and any missing parents with mode [`DIR_MODE`]. Directories that already
/// exist (such as the kubelet's own) keep their mode.
pub fn create_private_dir(dir: &Path) -> Result<(), KubeletError> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|ancestor| !ancestor.as_os_str().is_empty() && !ancestor.exists())
        .collect();
    for path in missing.into_iter().rev() {
        let created = DirBuilder::new().mode(DIR_MODE).create(path);
        match created {
            Ok(()) => set_mode(path, DIR_MODE)?,
            // Another instance may create the same directory at the same moment.
            Err(source) if source.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(KubeletError::CreateDir {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<(), KubeletError> {
    // The process umask may have stripped bits from the mode asked for at creation.
    fs::set_permissions(path, Permissions::from_mode(mode)).map_err(|source| {
        KubeletError::SetPermissions {
            path: path.to_path_buf(),
            mode,
            source,
        }
    })
}

/// A socket file this plugin created, remembered by inode so that removing it never removes
/// a socket another instance has since put at the same path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnedSocket {
    pub(crate) path: PathBuf,
    identity: (u64, u64),
    removed: bool,
}

impl OwnedSocket {
    /// Removes the socket file if it is still the one this plugin created, once: after that
    /// the inode number may be reused by a successor's socket. Best effort: the file going
    /// away by other means is fine.
    pub(crate) fn remove(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        let still_ours = fs::symlink_metadata(&self.path)
            .map(|meta| (meta.dev(), meta.ino()) == self.identity)
            .unwrap_or(false);
        if still_ours {
            // Nothing useful to do if it vanished in between.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Listens on `path`: checks its length, creates its directory, removes a stale socket left
/// by an earlier run, binds, and restricts the socket to [`SOCKET_MODE`].
///
/// Fails without touching the file when something other than a socket is in the way
/// ([`KubeletError::NotASocket`]).
pub(crate) fn listen(path: &Path) -> Result<(UnixListener, OwnedSocket), KubeletError> {
    check_socket_path(path)?;
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            fs::remove_file(path).map_err(|source| KubeletError::RemoveStaleSocket {
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(_) => {
            return Err(KubeletError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(KubeletError::InspectSocketPath {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    let listener = UnixListener::bind(path).map_err(|source| KubeletError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    set_mode(path, SOCKET_MODE)?;
    let meta = fs::symlink_metadata(path).map_err(|source| KubeletError::InspectSocketPath {
        path: path.to_path_buf(),
        source,
    })?;
    let owned = OwnedSocket {
        path: path.to_path_buf(),
        identity: (meta.dev(), meta.ino()),
        removed: false,
    };
    Ok((listener, owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_follow_the_kubelet_conventions() {
        let mut sockets = PluginSockets::new("gpu.nvidia.com");
        let got = (sockets.registration_socket(), sockets.dra_socket());
        let want = (
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"),
        );
        assert_eq!(got, want);

        sockets.pod_uid = Some("1234-abcd".into());
        let got = (sockets.registration_socket(), sockets.dra_socket());
        let want = (
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-1234-abcd-reg.sock"),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.nvidia.com/dra-1234-abcd.sock"),
        );
        assert_eq!(got, want);
    }

    #[test]
    fn driver_names_that_are_not_dns_subdomains_are_rejected() {
        for bad in ["", "GPU.nvidia.com", "gpu/../x", "-gpu.com", "gpu..com"] {
            let got = PluginSockets::new(bad).validated();
            assert!(
                matches!(got, Err(KubeletError::InvalidName { field: "driver name", ref value, .. }) if value == bad),
                "{bad:?} gave {got:?}"
            );
        }
    }

    #[test]
    fn pod_uids_with_path_characters_are_rejected() {
        let mut sockets = PluginSockets::new("gpu.nvidia.com");
        sockets.pod_uid = Some("../evil".into());
        let got = sockets.validated();
        assert!(matches!(
            got,
            Err(KubeletError::InvalidName {
                field: "pod UID",
                ..
            })
        ));
    }

    #[test]
    fn a_socket_path_of_108_bytes_is_rejected_and_107_accepted() {
        let at_limit = PathBuf::from(format!("/{}", "a".repeat(106)));
        assert_eq!(check_socket_path(&at_limit).ok(), Some(()));
        let over = PathBuf::from(format!("/{}", "a".repeat(107)));
        let got = check_socket_path(&over);
        assert!(matches!(
            got,
            Err(KubeletError::SocketPathTooLong {
                len: 108,
                max: 107,
                ..
            })
        ));
    }
}
