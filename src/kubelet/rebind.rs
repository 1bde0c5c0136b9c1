//! Sockets that come back: a plugin socket deleted under a running plugin (someone wipes
//! `/var/lib/kubelet/plugins_registry`, or the plugin directory) is created again at the same
//! path, so the kubelet's plugin watcher sees it appear and registers the plugin again
//! without a restart.
//!
//! Each socket's listener is owned by an accept task that hands connections to the gRPC
//! server and checks every [`CHECK_EVERY`] whether the socket file is still there. Only a
//! *missing* path is re-created: a socket another instance put at the same path (a rolling
//! update without pod UIDs) is left alone, so two instances never take a path back and forth.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::KubeletError;
use super::authority::AuthorityFix;
use super::sockets::{OwnedSocket, listen};

/// How often each socket file is checked: one `stat` every 5 s, on the process's shared
/// timer grid (`crate::ticks`), so an idle plugin wakes for it only when it wakes anyway
/// every other time. A deleted socket is back within 5 s; the kubelet's plugin watcher then
/// registers the plugin again.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Connections accepted on a [`Rebound`] socket, for the gRPC server.
pub(crate) type Incoming = UnboundedReceiverStream<std::io::Result<AuthorityFix<UnixStream>>>;

/// A socket kept at its path; the file currently there if this plugin created it.
#[derive(Debug, Clone)]
pub(crate) struct Rebound {
    path: PathBuf,
    owned: Arc<Mutex<OwnedSocket>>,
}

impl Rebound {
    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file if it is still one this plugin created (see
    /// [`OwnedSocket::remove`]). Stop re-creating first (the `rebinding` token).
    pub(crate) fn remove(&self) {
        self.owned().remove();
    }

    fn owned(&self) -> MutexGuard<'_, OwnedSocket> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Listens on `path` (as [`listen`]) and keeps the socket there until `stop`; re-creates it
/// when its file disappears, until `rebinding` is cancelled. `what` names the socket in logs.
///
/// Fails as [`listen`] does, for the first socket only; a re-creation that fails is logged and
/// tried again at the next check.
pub(crate) fn listen_rebinding(
    path: &Path,
    stop: CancellationToken,
    rebinding: CancellationToken,
    what: &'static str,
) -> Result<(Incoming, Rebound), KubeletError> {
    let (listener, owned) = listen(path)?;
    let rebound = Rebound {
        path: path.to_path_buf(),
        owned: Arc::new(Mutex::new(owned)),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(accept(listener, rebound.clone(), tx, stop, rebinding, what));
    Ok((UnboundedReceiverStream::new(rx), rebound))
}

async fn accept(
    mut listener: UnixListener,
    socket: Rebound,
    connections: mpsc::UnboundedSender<std::io::Result<AuthorityFix<UnixStream>>>,
    stop: CancellationToken,
    rebinding: CancellationToken,
    what: &'static str,
) {
    let mut ticker = crate::ticks::Ticks::every(CHECK_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => {
                let connection = accepted.map(|(stream, _)| AuthorityFix::new(stream));
                if connections.send(connection).is_err() {
                    return; // the server is gone
                }
            }
            _ = ticker.tick(), if !rebinding.is_cancelled() => {
                if std::fs::symlink_metadata(&socket.path).is_ok() {
                    continue;
                }
                match listen(&socket.path) {
                    Ok((fresh, owned)) => {
                        listener = fresh;
                        *socket.owned() = owned;
                        info!(socket = %socket.path.display(), what, "socket was deleted; created it again");
                    }
                    Err(e) => warn!(
                        socket = %socket.path.display(), what,
                        error = %crate::errors::error_chain(&e),
                        "socket was deleted; creating it again failed, retrying"
                    ),
                }
            }
        }
    }
}
