//! The HTTP/1.1 endpoint for Prometheus and the kubelet's probes: `/metrics`, `/healthz`,
//! `/readyz`. GET and HEAD only; anything else on those paths is 405, other paths 404.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use super::{Health, Metrics, MetricsError, text};

/// A client that opens a connection and never finishes its request headers is dropped
/// after this long, so idle sockets cannot pile up.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Accept failures (e.g. out of file descriptors) are retried after a short pause instead
/// of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

const PLAIN: &str = "text/plain; charset=utf-8";

/// The running endpoint, on a thread of its own. Dropping it (or [`MetricsServer::shutdown`])
/// stops accepting and closes the listening socket; requests in flight are cut off.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    /// Dropped (or sent) to stop the endpoint's runtime.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl MetricsServer {
    /// The address actually bound (the port chosen when `:0` was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops serving.
    pub fn shutdown(self) {}
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds `addr`: `host:port` (a host name is resolved, the first address that binds wins),
/// or `:port` for every address of the host, IPv6 and IPv4: `[::]:port` (Linux accepts IPv4
/// on it too unless `net.ipv6.bindv6only` is set), else `0.0.0.0:port` where the kernel has no
/// IPv6. The chart's probes reach the pod's IP, which is IPv6 on a single-stack IPv6 cluster.
///
/// # Errors
/// The last bind error.
pub fn bind_any(addr: &str) -> std::io::Result<std::net::TcpListener> {
    match addr.strip_prefix(':') {
        Some(port) => std::net::TcpListener::bind(format!("[::]:{port}"))
            .or_else(|_| std::net::TcpListener::bind(format!("0.0.0.0:{port}"))),
        None => std::net::TcpListener::bind(addr),
    }
}

/// Binds `addr` (`host:port`; a host name is resolved, the first address that binds wins;
/// `:port` is every address of the pod, IPv6 and IPv4 alike: `[::]:port`, or `0.0.0.0:port`
/// on a kernel without IPv6, so one chart serves probes on IPv4, IPv6 and dual-stack
/// clusters) and serves `metrics` and `health` on it from a thread of its own
/// (`gpu-dra-metrics`, with a one-thread runtime).
///
/// The kubelet plugin runs its async work on one thread, where a MIG carve or an MPS daemon's
/// start holds everything else for as long as it takes; the kubelet's probes and Prometheus
/// must still get their answers then, so the endpoint does not share that thread. What it
/// serves is shared memory ([`Metrics`], [`Health`]), so it answers from whatever state the
/// plugin is in.
///
/// # Errors
/// [`MetricsError::Bind`] when the address does not resolve or cannot be bound (in use,
/// no permission), [`MetricsError::LocalAddr`] when the bound address cannot be read,
/// [`MetricsError::Thread`] when the thread or its runtime cannot start or the socket cannot
/// be registered with it.
pub async fn serve(
    addr: &str,
    metrics: Metrics,
    health: Health,
) -> Result<MetricsServer, MetricsError> {
    let bind_error = |source| MetricsError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = bind_any(addr).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| MetricsError::LocalAddr { source })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| MetricsError::Thread { source })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The socket can only be registered with the runtime that serves it, on its thread; the
    // outcome comes back here, so a failure fails the start instead of leaving no endpoint.
    let (registered, registration) = tokio::sync::oneshot::channel::<std::io::Result<()>>();
    std::thread::Builder::new()
        .name("gpu-dra-metrics".to_string())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(listener) => {
                        let _ = registered.send(Ok(()));
                        listener
                    }
                    Err(e) => {
                        let _ = registered.send(Err(e));
                        return;
                    }
                };
                tokio::select! {
                    () = accept_loop(listener, metrics, health) => {}
                    _ = stopped => {}
                }
            });
        })
        .map_err(|source| MetricsError::Thread { source })?;
    match registration.await {
        Ok(Ok(())) => {}
        Ok(Err(source)) => return Err(MetricsError::Thread { source }),
        Err(_) => {
            return Err(MetricsError::Thread {
                source: std::io::Error::other("the metrics thread ended before serving"),
            });
        }
    }
    info!(addr = %local_addr, "serving /metrics, /healthz and /readyz");
    Ok(MetricsServer {
        local_addr,
        stop: Some(stop),
    })
}

async fn accept_loop(listener: TcpListener, metrics: Metrics, health: Health) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "accepting a metrics connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = respond(req.method(), req.uri().path(), &metrics, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                // A scraper hanging up mid-response is routine, not worth a warning.
                debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
}

/// The answer to `method path`. HEAD gets GET's headers; hyper leaves the body out.
pub fn respond(
    method: &Method,
    path: &str,
    metrics: &Metrics,
    health: &Health,
) -> Response<Full<Bytes>> {
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return plain(
            StatusCode::NOT_FOUND,
            format!("not found: {path}; try /metrics, /healthz or /readyz\n"),
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method {method} not allowed on {path}; use GET or HEAD\n"),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => with_type(StatusCode::OK, metrics.render(), text::CONTENT_TYPE),
        "/readyz" => {
            let missing = health.missing();
            if missing.is_empty() {
                plain(StatusCode::OK, "ready\n".to_string())
            } else {
                plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", missing.join("; ")),
                )
            }
        }
        // Answering at all proves the runtime's event loop is alive.
        _ => plain(StatusCode::OK, "ok\n".to_string()),
    }
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    with_type(status, body, PLAIN)
}

fn with_type(
    status: StatusCode,
    body: String,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
