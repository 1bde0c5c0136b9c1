//! The controller's `/metrics` (Prometheus text) and `/healthz`, on `--metrics-addr`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::error::ControllerError;

/// Counters the controller keeps; cheap to update from any task.
#[derive(Debug, Default)]
pub struct Stats {
    /// Reconciles of a domain, finished or failed.
    pub reconciles: AtomicU64,
    /// Reconciles that failed (and were retried).
    pub reconcile_errors: AtomicU64,
    /// Status writes.
    pub status_writes: AtomicU64,
    /// Other creates, patches and deletes.
    pub other_writes: AtomicU64,
    /// Writes of the binding conditions (`--binding-conditions`): claim conditions, node
    /// labels set and removed for pending channels, node objects of released nodes.
    pub binding_writes: AtomicU64,
    /// Whether this replica leads now.
    pub leader: AtomicBool,
}

impl Stats {
    /// The Prometheus text exposition of the counters.
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        for (name, help, kind, value) in [
            (
                "gpu_dra_compute_domain_reconciles_total",
                "Reconciles of a ComputeDomain.",
                "counter",
                get(&self.reconciles),
            ),
            (
                "gpu_dra_compute_domain_reconcile_errors_total",
                "Reconciles that failed and were retried.",
                "counter",
                get(&self.reconcile_errors),
            ),
            (
                "gpu_dra_compute_domain_status_writes_total",
                "ComputeDomain status writes.",
                "counter",
                get(&self.status_writes),
            ),
            (
                "gpu_dra_compute_domain_object_writes_total",
                "Other creates, patches and deletes.",
                "counter",
                get(&self.other_writes),
            ),
            (
                "gpu_dra_compute_domain_binding_writes_total",
                "Binding-condition writes: claim conditions, node labels, released node objects.",
                "counter",
                get(&self.binding_writes),
            ),
            (
                "gpu_dra_compute_domain_controller_leader",
                "1 while this replica holds the Lease.",
                "gauge",
                u64::from(self.leader.load(Ordering::Relaxed)),
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        out
    }
}

/// Binds `addr` and serves `/metrics` and `/healthz` from a background task until the
/// returned handle is dropped or aborted.
///
/// # Errors
/// [`ControllerError::Metrics`] when the address cannot be bound.
pub async fn serve(
    addr: &str,
    stats: Arc<Stats>,
) -> Result<tokio::task::JoinHandle<()>, ControllerError> {
    let bind_error = |source| ControllerError::Metrics {
        addr: addr.to_string(),
        source,
    };
    // `:port`: every address, IPv6 and IPv4 (crate::metrics::bind_any).
    let listener = crate::metrics::bind_any(addr).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(bind_error)?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            };
            let stats = stats.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (code, body) = match req.uri().path() {
                            "/metrics" => (StatusCode::OK, stats.render()),
                            "/healthz" => (StatusCode::OK, "ok\n".to_string()),
                            other => (
                                StatusCode::NOT_FOUND,
                                format!("not found: {other}; try /metrics or /healthz\n"),
                            ),
                        };
                        async move {
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(code)
                                    .header(
                                        "content-type",
                                        "text/plain; version=0.0.4; charset=utf-8",
                                    )
                                    .body(Full::new(Bytes::from(body)))
                                    .expect("response"),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_gives_every_counter_with_its_help_and_type() {
        let stats = Stats::default();
        stats.reconciles.fetch_add(3, Ordering::Relaxed);
        stats.leader.store(true, Ordering::Relaxed);
        let text = stats.render();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            vec![
                "gpu_dra_compute_domain_reconciles_total 3",
                "gpu_dra_compute_domain_reconcile_errors_total 0",
                "gpu_dra_compute_domain_status_writes_total 0",
                "gpu_dra_compute_domain_object_writes_total 0",
                "gpu_dra_compute_domain_binding_writes_total 0",
                "gpu_dra_compute_domain_controller_leader 1",
            ]
        );
        assert!(text.contains("# TYPE gpu_dra_compute_domain_controller_leader gauge\n"));
    }
}
