//! The metrics endpoint over real TCP: raw HTTP/1.1 requests, as Prometheus and the
//! kubelet's probes send them.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use gpu_dra::metrics::{self, Health, Metrics, MetricsServer, Operation, Outcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

async fn start() -> (MetricsServer, Metrics, Health) {
    let m = Metrics::new();
    let health = Health::new();
    let server = metrics::serve("127.0.0.1:0", m.clone(), health.clone())
        .await
        .unwrap();
    (server, m, health)
}

#[tokio::test]
async fn metrics_are_served_in_the_prometheus_text_format() {
    let (server, m, _) = start().await;
    m.record_call(
        Operation::Prepare,
        Outcome::Success,
        std::time::Duration::from_millis(2),
    );
    let got = request(server.local_addr(), "GET", "/metrics").await;
    assert_eq!(200, got.status);
    assert_eq!(
        Some("text/plain; version=0.0.4; charset=utf-8"),
        got.headers.get("content-type").map(String::as_str)
    );
    assert_eq!(m.render(), got.body);
    assert!(
        got.body
            .contains("gpu_dra_prepare_requests_total{result=\"success\"} 1\n"),
        "{}",
        got.body
    );
}

#[tokio::test]
async fn healthz_answers_ok_while_the_process_runs() {
    let (server, _, _) = start().await;
    let got = request(server.local_addr(), "GET", "/healthz").await;
    assert_eq!((200, "ok\n"), (got.status, got.body.as_str()));
}

#[tokio::test]
async fn readyz_says_what_is_missing_until_the_plugin_is_ready() {
    let (server, _, health) = start().await;
    let addr = server.local_addr();
    let got = request(addr, "GET", "/readyz").await;
    assert_eq!(
        (
            503,
            "not ready: start-up recovery has not finished; ResourceSlices have not been \
             published yet; the kubelet has not registered the plugin\n"
        ),
        (got.status, got.body.as_str())
    );
    health.set_recovered();
    health.set_published();
    let got = request(addr, "GET", "/readyz").await;
    assert_eq!(
        (
            503,
            "not ready: the kubelet has not registered the plugin\n"
        ),
        (got.status, got.body.as_str())
    );
    health.set_registered(true);
    let got = request(addr, "GET", "/readyz").await;
    assert_eq!((200, "ready\n"), (got.status, got.body.as_str()));
}

#[tokio::test]
async fn head_gets_the_headers_of_get_without_a_body() {
    let (server, _, _) = start().await;
    let addr = server.local_addr();
    let get = request(addr, "GET", "/metrics").await;
    let head = request(addr, "HEAD", "/metrics").await;
    assert_eq!(200, head.status);
    assert_eq!("", head.body);
    assert_eq!(
        get.headers.get("content-length"),
        head.headers.get("content-length")
    );
    assert_eq!(
        get.headers.get("content-type"),
        head.headers.get("content-type")
    );
}

#[tokio::test]
async fn other_paths_are_not_found_and_other_methods_not_allowed() {
    let (server, _, _) = start().await;
    let addr = server.local_addr();
    let got = request(addr, "GET", "/").await;
    assert_eq!(404, got.status);
    let got = request(addr, "GET", "/metricsx").await;
    assert_eq!(404, got.status);
    for path in ["/metrics", "/healthz", "/readyz"] {
        let got = request(addr, "POST", path).await;
        assert_eq!(
            (405, Some("GET, HEAD")),
            (got.status, got.headers.get("allow").map(String::as_str)),
            "POST {path}"
        );
    }
    let got = request(addr, "DELETE", "/metrics").await;
    assert_eq!(405, got.status);
}

#[tokio::test]
async fn a_query_string_does_not_change_the_path() {
    let (server, _, _) = start().await;
    let got = request(server.local_addr(), "GET", "/healthz?verbose=1").await;
    assert_eq!(200, got.status);
}

#[tokio::test]
async fn an_address_in_use_fails_naming_the_address() {
    let (server, _, _) = start().await;
    let taken = server.local_addr().to_string();
    let err = metrics::serve(&taken, Metrics::new(), Health::new())
        .await
        .unwrap_err();
    assert_eq!(
        format!("binding the metrics address {taken:?}"),
        err.to_string()
    );
    assert!(std::error::Error::source(&err).is_some());
}

#[tokio::test]
async fn a_stopped_server_refuses_connections() {
    let (server, _, _) = start().await;
    let addr = server.local_addr();
    server.shutdown();
    // The endpoint's own thread closes the listener once its runtime sees the stop.
    let mut refused = false;
    for _ in 0..250 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(refused, "{addr} still accepts connections");
}

#[test]
fn an_empty_or_off_metrics_address_turns_the_endpoint_off() {
    use gpu_dra::plugin::config::metrics_addr_flag;
    let got: Vec<Option<String>> = ["", "off", " off ", "0.0.0.0:8080", "localhost:9400"]
        .into_iter()
        .map(metrics_addr_flag)
        .collect();
    let want = vec![
        None,
        None,
        None,
        Some("0.0.0.0:8080".to_string()),
        Some("localhost:9400".to_string()),
    ];
    assert_eq!(want, got);
}

/// The kubelet plugin runs its async work on one thread, and a MIG carve or an MPS start
/// holds that thread while it runs: the probes must still be answered then. Here the test's
/// own one-thread runtime is held by a blocking request, which only a server on another
/// thread can answer.
#[tokio::test]
async fn the_endpoint_answers_while_the_runtime_that_started_it_is_blocked() {
    use std::io::{Read, Write};
    let (server, _, _) = start().await;
    let mut stream = std::net::TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .expect("an answer while this runtime's only thread waits for it");
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
}

#[tokio::test]
async fn a_port_alone_serves_every_address_ipv4_and_ipv6_alike() {
    // `:port`, as the chart passes it: the kubelet probes the pod's IP, IPv4 or IPv6.
    let server = metrics::serve(":0", Metrics::new(), Health::new())
        .await
        .unwrap();
    let port = server.local_addr().port();
    let v4: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(request(v4, "GET", "/healthz").await.status, 200);
    // Where the kernel has IPv6 (the bind fell back to 0.0.0.0 otherwise), over IPv6 too.
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
        assert_eq!(request(v6, "GET", "/healthz").await.status, 200);
    }
}
