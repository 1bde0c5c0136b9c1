//! Building the API client: a kubeconfig file when one is given, else the pod's service account.

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::error::K8sError;

/// A prepare call has 45 s from the kubelet; a request that hangs longer than this is better
/// failed and retried.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects with the kubeconfig at `kubeconfig` (its current context), or with the in-cluster
/// configuration (service account token and CA, `KUBERNETES_SERVICE_HOST`) when `None`.
///
/// The client does not retry on its own: the publisher retries whole reconciliations with a
/// bounded backoff, and a prepare call is retried by the kubelet, so a hidden retry layer would
/// only stretch failures past the kubelet's timeout.
///
/// Fails with [`K8sError::Kubeconfig`] naming the file when it cannot be read or has no usable
/// context, [`K8sError::InCluster`] (which tells to pass `--kubeconfig`) when there is neither,
/// and [`K8sError::BuildClient`] when TLS or authentication cannot be set up. No request is
/// sent: an unreachable server shows up at the first call.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, K8sError> {
    let (mut config, origin) = match kubeconfig {
        Some(path) => {
            let failed = |source| K8sError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(failed)?;
            let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(failed)?;
            (config, format!("kubeconfig {}", path.display()))
        }
        None => {
            let config = Config::incluster().map_err(|source| K8sError::InCluster { source })?;
            (config, "in-cluster configuration".to_string())
        }
    };
    config.default_retry = false;
    config.read_timeout = Some(READ_TIMEOUT);
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    Client::try_from(config).map_err(|source| K8sError::BuildClient {
        origin,
        source: Box::new(source),
    })
}
