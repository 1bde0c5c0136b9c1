//! The real plugin process serves its metrics and probes: /readyz follows start-up, the
//! kubelet's registration and the first publish; /metrics follows the calls it serves.

mod plugin_support;

use gpu_dra::kubelet::client::DraApi;
use plugin_support::claims::{self, claim_ref};
use plugin_support::probe::{get, metrics_addr};
use plugin_support::{Node, eventually};

fn sample(metrics: &str, series: &str) -> Option<String> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")).map(str::to_string))
}

#[tokio::test]
async fn the_plugin_serves_probes_and_metrics_that_follow_its_work() {
    let node = Node::new();
    node.api
        .put_claim(claims::on_node("training", "uid-full", &["gpu-2"]));
    let plugin = node.start().await;
    let addr = eventually("the metrics address in the log", || {
        metrics_addr(&plugin.log())
    })
    .await;
    assert_eq!(Some((200, "ok\n".to_string())), get(addr, "/healthz"));

    eventually("the first publish", || node.api.complete_pool()).await;
    let want = (
        503,
        "not ready: the kubelet has not registered the plugin\n".to_string(),
    );
    eventually("readiness waiting only for the kubelet", || {
        get(addr, "/readyz").filter(|got| *got == want)
    })
    .await;

    let mut kubelet = plugin.register(DraApi::V1).await;
    eventually("readiness after registration", || {
        get(addr, "/readyz").filter(|(status, _)| *status == 200)
    })
    .await;

    let prepared = kubelet.prepare(&[claim_ref("training", "uid-full")]).await;
    assert!(prepared.unwrap()["uid-full"].is_ok());
    let (status, metrics) = get(addr, "/metrics").unwrap();
    assert_eq!(200, status);
    let got: Vec<Option<String>> = [
        "gpu_dra_prepare_requests_total{result=\"success\"}",
        "gpu_dra_prepare_requests_total{result=\"error\"}",
        "gpu_dra_prepared_claims",
        "gpu_dra_published_devices",
        "gpu_dra_healthy_gpus",
        "gpu_dra_unhealthy_gpus",
    ]
    .iter()
    .map(|series| sample(&metrics, series))
    .collect();
    // 62 published devices: the default `--mig-profiles split` on the simulated DGX H100.
    let want: Vec<Option<String>> = ["1", "0", "1", "62", "8", "0"]
        .iter()
        .map(|v| Some(v.to_string()))
        .collect();
    assert_eq!(want, got, "{metrics}");
}
