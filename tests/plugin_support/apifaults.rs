//! The fake API server's answers and the faults it injects: error statuses with
//! `Retry-After`, hang-ups mid-request (a list or get cut off), and slow answers. Refused
//! connections (an outage closes the port and cuts open connections) are the shared
//! transport's (`api_support/transport.rs`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::json;
use tokio::sync::watch;

use super::apiserver::{GetsInFlight, Latency, Recorded, Store, status};
use super::objstore::query_pairs;
use super::transport::Connections;

/// What happens to a request a [`Rule`] matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The connection is closed without an answer (a list or get interrupted).
    Hangup,
    /// An error `Status` with this code and reason; with `retry_after` seconds it carries
    /// the `Retry-After` header and `details.retryAfterSeconds`, as the API server's
    /// 429 (priority and fairness) and 503 answers do.
    Status {
        code: u16,
        reason: &'static str,
        retry_after: Option<u32>,
    },
    /// The normal answer, after this delay.
    Delay(Duration),
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// HTTP method, any when `None`.
    pub method: Option<String>,
    /// Substring of the path.
    pub path: String,
    /// The fault.
    pub fault: Fault,
    /// Requests still to fault; `None`: every one.
    pub times: Option<usize>,
}

impl Store {
    /// The fault for `r`, if a rule matches (using up one of its times).
    fn fault_for(&mut self, r: &Recorded) -> Option<Fault> {
        let at = self.faults.iter().position(|rule| {
            rule.method.as_deref().is_none_or(|m| m == r.method)
                && r.path.contains(&rule.path)
                && rule.times != Some(0)
        })?;
        let rule = &mut self.faults[at];
        if let Some(times) = rule.times.as_mut() {
            *times -= 1;
        }
        Some(rule.fault.clone())
    }
}

type Answer = Result<Response<Full<Bytes>>, std::io::Error>;

/// What the server is told to do and what it counts, shared with the test's handle.
pub(super) struct Meters {
    /// Latencies and CPU to add to answers.
    pub(super) latency: Arc<Latency>,
    /// GETs being answered.
    pub(super) gets: Arc<GetsInFlight>,
    /// Connections and handshakes.
    pub(super) connections: Arc<Connections>,
}

/// Serves `listener` ([`super::transport::serve`]: TLS, outages, counted connections) with
/// this server's answers, faults and latencies.
pub(super) async fn serve(
    listener: std::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    store: Arc<Mutex<Store>>,
    meters: Meters,
    stopped: tokio::sync::oneshot::Receiver<()>,
    down: watch::Receiver<bool>,
) {
    let Meters {
        latency,
        gets,
        connections,
    } = meters;
    let service = move || {
        let (store, latency, gets) = (store.clone(), latency.clone(), gets.clone());
        hyper::service::service_fn(move |req| {
            answer(store.clone(), latency.clone(), gets.clone(), req)
        })
    };
    super::transport::serve(listener, tls, service, connections, stopped, down).await;
}

/// Answers one request: GETs are counted while in flight and take at least the GET latency,
/// writes at least the write latency (the fake's stand-ins for an API server's read and
/// etcd's write latency).
async fn answer(
    store: Arc<Mutex<Store>>,
    latency: Arc<Latency>,
    gets: Arc<GetsInFlight>,
    request: Request<Incoming>,
) -> Answer {
    let arrived = Instant::now();
    let is_get = request.method() == hyper::Method::GET;
    if is_get {
        let now = gets.now.fetch_add(1, Ordering::SeqCst) + 1;
        gets.peak.fetch_max(now, Ordering::SeqCst);
    }
    let answer = answer_faulted(store, request).await;
    let (wait_ns, cpu_ns) = if is_get {
        (
            latency.get_ns.load(Ordering::Relaxed),
            latency.get_cpu_ns.load(Ordering::Relaxed),
        )
    } else {
        (
            latency.write_ns.load(Ordering::Relaxed),
            latency.write_cpu_ns.load(Ordering::Relaxed),
        )
    };
    if wait_ns > 0 {
        let until = latency.wake_at(arrived, wait_ns);
        // A blocking sleep: tokio's timer rounds up to whole milliseconds. Without timer
        // slack, or the kernel's default 50 µs would be added to a 500 µs GET; and ending as
        // early as waking up takes (`Latency::learn`), so the answer leaves on time. The
        // server's own CPU share is spent first, busy, on this thread's core.
        let _ = tokio::task::spawn_blocking(move || {
            let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
            burn_cpu(Duration::from_nanos(cpu_ns.min(wait_ns)));
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        })
        .await;
        let took = arrived.elapsed();
        latency.learn(took, wait_ns);
        if is_get {
            latency.record_get(took);
        }
    }
    if is_get {
        gets.now.fetch_sub(1, Ordering::SeqCst);
    }
    answer
}

/// Keeps this thread's core busy for `cpu` of its own CPU time (not wall time: a thread
/// that waits for a core spends its share later, as a server process would).
fn burn_cpu(cpu: Duration) {
    if cpu.is_zero() {
        return;
    }
    let thread_cpu = || {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    };
    let start = thread_cpu();
    while thread_cpu() - start < cpu {
        std::hint::spin_loop();
    }
}

async fn answer_faulted(store: Arc<Mutex<Store>>, request: Request<Incoming>) -> Answer {
    let (parts, body) = request.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let recorded = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(query_pairs).unwrap_or_default(),
        body: serde_json::from_slice(&bytes).ok(),
        authorization: parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        at: Instant::now(),
    };
    let fault = {
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        store.requests.push(recorded.clone());
        store.fault_for(&recorded)
    };
    let mut retry_after = None;
    let (code, value) = match fault {
        Some(Fault::Hangup) => {
            return Err(std::io::Error::other("injected hang-up"));
        }
        Some(Fault::Status {
            code,
            reason,
            retry_after: after,
        }) => {
            retry_after = after;
            let (code, mut value) = status(code, reason, &format!("injected {code} {reason}"));
            if let Some(seconds) = after {
                value["details"] = json!({"retryAfterSeconds": seconds});
            }
            (code, value)
        }
        Some(Fault::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            store.route(&recorded)
        }
        None => {
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            store.route(&recorded)
        }
    };
    let mut response = Response::builder()
        .status(code)
        .header("content-type", "application/json");
    if let Some(seconds) = retry_after {
        response = response.header("retry-after", seconds.to_string());
    }
    Ok(response
        .body(Full::new(Bytes::from(value.to_string())))
        .expect("response"))
}
