//! The plugin's metrics and probe endpoint, found in its log and read over plain HTTP/1.1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// The address the plugin logged when it bound `127.0.0.1:0`.
pub fn metrics_addr(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("serving /metrics"))?;
    let start = line.find("127.0.0.1:")?;
    let addr: String = line[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.parse().ok()
}

/// Status and body of `GET path`, or `None` when the connection fails.
pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The value of the series `series` (a metric name with its labels, as exposed:
/// `name{label="v"}`) in a scrape of the plugin that wrote `log`; `None` before the plugin
/// serves metrics or while the series is absent.
pub fn metric(log: &str, series: &str) -> Option<f64> {
    let (_, text) = get(metrics_addr(log)?, "/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// The plugin's `gpu_dra_request_path_calls_total` and `gpu_dra_request_path_costs_total`
/// series for `operation` (`prepare`, `unprepare`) in one scrape: the calls, and each cost's
/// count by its name (`fsync`, `file_write`, ...). `None` before it serves metrics.
pub fn request_path_costs(
    log: &str,
    operation: &str,
) -> Option<(u64, std::collections::BTreeMap<String, u64>)> {
    let (_, text) = get(metrics_addr(log)?, "/metrics")?;
    let calls_prefix = format!("gpu_dra_request_path_calls_total{{operation=\"{operation}\"}} ");
    let calls = text
        .lines()
        .find_map(|l| l.strip_prefix(&calls_prefix))
        .and_then(|v| v.parse().ok())?;
    let prefix = format!("gpu_dra_request_path_costs_total{{operation=\"{operation}\",cost=\"");
    let costs = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (cost, value) = rest.split_once("\"} ")?;
            Some((cost.to_string(), value.parse().ok()?))
        })
        .collect();
    Some((calls, costs))
}

/// The plugin's `gpu_dra_background_costs_total` series in one scrape: each cost's count by
/// its name, summed over the process's life outside every kubelet call. `None` before it
/// serves metrics.
pub fn background_costs(log: &str) -> Option<std::collections::BTreeMap<String, u64>> {
    let (_, text) = get(metrics_addr(log)?, "/metrics")?;
    let prefix = "gpu_dra_background_costs_total{cost=\"";
    let costs: std::collections::BTreeMap<String, u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| {
            let (cost, value) = rest.split_once("\"} ")?;
            Some((cost.to_string(), value.parse().ok()?))
        })
        .collect();
    (!costs.is_empty()).then_some(costs)
}
