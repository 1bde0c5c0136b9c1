//! The network side of both fake API servers (`plugin_support`'s and `cd_support`'s): a
//! listener on a port of 127.0.0.1, plain HTTP/1.1 or TLS with client certificates as
//! kube-apiserver serves it, each connection on its own task with `TCP_NODELAY` (as Go's
//! net/http sets it), counted with its handshake; an outage switch that closes the port and
//! cuts open connections until it is turned off again. What a server answers is the service
//! it passes in.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

/// Connections a server accepted and the TLS handshakes it completed, counted as they
/// happen.
#[derive(Default)]
pub struct Connections {
    accepted: AtomicU64,
    full: AtomicU64,
    resumed: AtomicU64,
    http2: AtomicU64,
}

impl Connections {
    /// Counts a completed server-side handshake: full or resumed, and whether the client
    /// chose HTTP/2 by ALPN.
    fn handshake(&self, tls: &rustls::ServerConnection) {
        let counter = match tls.handshake_kind() {
            Some(rustls::HandshakeKind::Resumed) => &self.resumed,
            _ => &self.full,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if tls.alpn_protocol() == Some(b"h2") {
            self.http2.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What was counted so far.
    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            accepted: self.accepted.load(Ordering::Relaxed),
            full_handshakes: self.full.load(Ordering::Relaxed),
            resumed_handshakes: self.resumed.load(Ordering::Relaxed),
            http2: self.http2.load(Ordering::Relaxed),
        }
    }
}

/// What a server's [`Connections`] counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// TCP connections accepted.
    pub accepted: u64,
    /// Full TLS handshakes completed (each costs the client a signature with its key and a
    /// certificate check, the server as much again).
    pub full_handshakes: u64,
    /// Resumed TLS handshakes (a session ticket; no certificates exchanged).
    pub resumed_handshakes: u64,
    /// Connections on which the client chose HTTP/2 by ALPN.
    pub http2: u64,
}

impl ConnectionStats {
    /// What happened between `earlier` and this reading.
    pub fn since(&self, earlier: &ConnectionStats) -> ConnectionStats {
        ConnectionStats {
            accepted: self.accepted - earlier.accepted,
            full_handshakes: self.full_handshakes - earlier.full_handshakes,
            resumed_handshakes: self.resumed_handshakes - earlier.resumed_handshakes,
            http2: self.http2 - earlier.http2,
        }
    }
}

impl std::fmt::Display for ConnectionStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} accepted, {} full and {} resumed TLS handshakes, {} HTTP/2",
            self.accepted, self.full_handshakes, self.resumed_handshakes, self.http2
        )
    }
}

/// A listener on a free port of 127.0.0.1, ready for [`serve`].
pub fn listen() -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a fake API server");
    listener.set_nonblocking(true).expect("nonblocking");
    listener
}

/// Serves `listener` until `stopped` fires (or its sender is dropped): each connection,
/// after the TLS handshake when `tls` is set (a client without a certificate the CA signed
/// fails it), answered by a service `service` makes, counted in `connections`. While `down`
/// reads `true` nothing listens (connections are refused) and open connections are cut;
/// back to `false`, the same port listens again. Returns when `down`'s sender is dropped.
pub async fn serve<M, S, B>(
    listener: std::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    service: M,
    connections: Arc<Connections>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    mut down: watch::Receiver<bool>,
) where
    M: Fn() -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let addr = listener.local_addr().expect("address");
    let mut listener = Some(tokio::net::TcpListener::from_std(listener).expect("tokio listener"));
    loop {
        let Some(open) = listener.as_ref() else {
            // Down: nothing listens, so connections are refused, until the test says up.
            tokio::select! {
                changed = down.changed() => if changed.is_err() { return },
                _ = &mut stopped => return,
            }
            if !*down.borrow() {
                let std = std::net::TcpListener::bind(addr).expect("listen again");
                std.set_nonblocking(true).expect("nonblocking");
                listener = Some(tokio::net::TcpListener::from_std(std).expect("listener"));
            }
            continue;
        };
        let stream = tokio::select! {
            accepted = open.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.accepted.fetch_add(1, Ordering::Relaxed);
                    // As Go's net/http (kube-apiserver) does for every accepted connection.
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(_) => continue,
            },
            changed = down.changed() => {
                if changed.is_err() { return }
                if *down.borrow() { listener = None; }
                continue;
            }
            _ = &mut stopped => return,
        };
        let service = service();
        let mut cut = down.clone();
        let tls = tls.clone();
        let counted = connections.clone();
        tokio::spawn(async move {
            let stream: Box<dyn Stream> = match tls {
                None => Box::new(stream),
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => {
                        counted.handshake(stream.get_ref().1);
                        Box::new(stream)
                    }
                    Err(_) => return,
                },
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            // Until it ends or an outage cuts it; a client that hangs up mid-request is not
            // the server's problem.
            tokio::select! {
                _ = connection => {}
                _ = cut.wait_for(|down| *down) => {}
            }
        });
    }
}

/// A connection's byte stream, plain or TLS.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}
