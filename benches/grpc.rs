//! Round-trip latency of NodePrepareResources over the Unix socket with a handler that does
//! nothing: what the gRPC layer, the validation and the plugin lock cost per kubelet call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_dra::kubelet::client::{DraApi, KubeletClient, KubeletVersions};
use gpu_dra::kubelet::{
    ClaimRef, DraHandler, PluginSockets, PrepareResults, PreparedDevice, UnprepareResults, serve,
};

struct NoopHandler;

impl DraHandler for NoopHandler {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let device = PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/device=gpu-0".into()],
            share_id: None,
        };
        claims
            .into_iter()
            .map(|claim| (claim.uid, Ok(vec![device.clone()])))
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims
            .into_iter()
            .map(|claim| (claim.uid, Ok(())))
            .collect()
    }
}

fn claims(count: usize) -> Vec<ClaimRef> {
    (0..count)
        .map(|i| ClaimRef {
            namespace: "bench".into(),
            name: format!("claim-{i}"),
            uid: format!("uid-{i}"),
        })
        .collect()
}

fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "{label:<28} n={:<5} min={:>9.1?} median={:>9.1?} p99={:>9.1?} mean={:>9.1?}",
        samples.len(),
        samples[0],
        at(0.5),
        at(0.99),
        mean
    );
}

async fn measure(kubelet: &mut KubeletClient, batch: usize, rounds: usize) -> Vec<Duration> {
    let claims = claims(batch);
    for _ in 0..rounds / 10 {
        kubelet.prepare(&claims).await.expect("warm-up call failed");
    }
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        kubelet.prepare(&claims).await.expect("prepare call failed");
        samples.push(start.elapsed());
    }
    samples
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the Tokio runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("cannot create a temp dir");
        let sockets = PluginSockets {
            driver_name: "gpu.nvidia.com".into(),
            registry_dir: dir.path().join("registry"),
            plugin_dir: dir.path().join("plugins/gpu.nvidia.com"),
            pod_uid: None,
        };
        let plugin = serve(sockets, Arc::new(NoopHandler), None)
            .await
            .expect("cannot serve the plugin sockets");
        for api in [DraApi::V1, DraApi::V1beta1] {
            let versions = KubeletVersions {
                dra: vec![api],
                health: vec![],
            };
            let mut kubelet = KubeletClient::register(plugin.registration_socket(), &versions)
                .await
                .expect("cannot register like the kubelet");
            for batch in [1, 32] {
                let samples = measure(&mut kubelet, batch, 2000).await;
                report(&format!("prepare {api:?} x{batch} claims"), samples);
            }
        }
        plugin.shutdown().await.expect("shutdown failed");
    });
}
