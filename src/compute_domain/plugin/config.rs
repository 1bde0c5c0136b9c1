//! What `gpu-dra compute-domain-plugin` is told on its command line, and its defaults: chosen
//! so that it runs beside `gpu-dra kubelet-plugin` on the same node without sharing a socket,
//! a state file, a CDI spec file or a port with it.

use std::path::PathBuf;
use std::time::Duration;

use crate::compute_domain::api;
use crate::plugin::BackendChoice;

/// The plugin directory (DRA socket, `plugin.lock`, and by default the state).
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/compute-domain.nvidia.com";
/// `--metrics-addr` default, every address (IPv6 and IPv4): the GPU plugin's is `:8080`.
pub const DEFAULT_METRICS_ADDR: &str = ":8081";
/// `--namespace` default: where the IMEX daemons' `ComputeDomainNode` objects live (the
/// chart's namespace).
pub const DEFAULT_NAMESPACE: &str = "gpu-dra";
/// `--max-domains` default: channel and daemon devices per node. Every workload pod of the
/// default class shares `channel-0` (see [`super::devices::SHARED_CHANNEL`]), so this bounds
/// only the single-claim channels `1..N-1` of admins' own classes and the daemon devices;
/// 8 keeps the node's slice at 16 devices: 16,000 over 1,000 nodes for the scheduler to walk.
pub const DEFAULT_MAX_DOMAINS: u32 = 8;
/// `--daemon-ready-timeout` default: how long a channel prepare waits for the node's IMEX
/// daemon. Well under the kubelet's 45 s limit on a prepare call, so the plugin answers
/// with its own error (naming the daemon's reason) rather than the kubelet timing out.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// `--imex-host-socket` default: the command socket of the host's `nvidia-imex.service`
/// (its `IMEX_CMD_UNIX_DOMAIN_PATH`), as NVIDIA's driver defaults it.
pub const DEFAULT_IMEX_HOST_SOCKET: &str = "/etc/nvidia-imex/imex_ctrl.sock";
/// `--imex-ctl-bin` default: `nvidia-imex-ctl` as the driver installs it (run under
/// `--driver-root` with `chroot` when that is not `/`).
pub const DEFAULT_IMEX_CTL: &str = "/usr/bin/nvidia-imex-ctl";

/// Who runs the node's IMEX daemon (`--imex-mode`, chart value `computeDomains.imex.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImexMode {
    /// One IMEX daemon per ComputeDomain and node, started by the driver (a DaemonSet pod
    /// on each labelled node); channels are handed out once that daemon is Ready.
    #[default]
    DriverManaged,
    /// The node runs `nvidia-imex` as a host service: no per-domain daemons, every domain
    /// gets channel 0, and a channel is handed out only while `nvidia-imex-ctl -q` answers
    /// `READY`.
    HostManaged,
}

impl ImexMode {
    /// Every choice, in the order `--help` and errors list them.
    pub const ALL: [ImexMode; 2] = [ImexMode::DriverManaged, ImexMode::HostManaged];

    /// The flag and chart value.
    pub fn name(self) -> &'static str {
        match self {
            ImexMode::DriverManaged => "DriverManaged",
            ImexMode::HostManaged => "HostManaged",
        }
    }
}

impl std::fmt::Display for ImexMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `--imex-mode`: `DriverManaged` or `HostManaged`, exactly.
///
/// # Errors
/// A message naming the value and the valid choices.
pub fn imex_mode_flag(value: &str) -> Result<ImexMode, String> {
    ImexMode::ALL
        .into_iter()
        .find(|m| m.name() == value.trim())
        .ok_or_else(|| {
            format!("--imex-mode {value:?} is not valid; valid: DriverManaged, HostManaged")
        })
}

/// How the plugin asks a host-managed IMEX service whether it is ready:
/// `[chroot <driver_root>] <ctl> -q --u=<socket>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostImex {
    /// `--imex-host-socket`: the service's command socket, as the host sees it.
    pub socket: PathBuf,
    /// `--imex-ctl-bin`: `nvidia-imex-ctl`, as seen under `driver_root`.
    pub ctl: PathBuf,
    /// `--driver-root`: where the host's driver files are; the tool runs under `chroot` when
    /// it is not `/`.
    pub driver_root: PathBuf,
}

impl Default for HostImex {
    fn default() -> HostImex {
        HostImex {
            socket: PathBuf::from(DEFAULT_IMEX_HOST_SOCKET),
            ctl: PathBuf::from(DEFAULT_IMEX_CTL),
            driver_root: PathBuf::from("/"),
        }
    }
}

/// The compute-domain plugin's configuration; every field has a flag and an environment
/// variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdPluginConfig {
    /// This node's name (the pool name, and the node labelled for a domain).
    pub node_name: String,
    /// Kubeconfig; in-cluster config when absent.
    pub kubeconfig: Option<PathBuf>,
    /// Where the node's clique comes from: the GPUs' fabric info through this backend.
    pub backend: BackendChoice,
    /// `--clique-id`: the node's clique (`<clusterUuid>.<cliqueId>`) as given by the operator,
    /// over what the GPUs report (for nodes whose NVML cannot answer fabric queries). An
    /// empty value is "no clique".
    pub clique_override: Option<String>,
    /// The node has no NVIDIA driver: channel device nodes are described (type, major,
    /// minor) rather than looked up under `dev_root`. Implied by the sim backend.
    pub simulated_host: bool,
    /// Directory of the DRA socket and lock.
    pub plugin_dir: PathBuf,
    /// Directory the kubelet watches for registration sockets.
    pub registry_dir: PathBuf,
    /// Pod UID for seamless rolling updates.
    pub pod_uid: Option<String>,
    /// Where CDI specs go.
    pub cdi_root: PathBuf,
    /// Root under which `/dev` is found (channel device nodes on a real node).
    pub dev_root: PathBuf,
    /// The checkpoint of prepared claims and the daemons' config directories
    /// (`<state-dir>/compute-domains/<uid>/`).
    pub state_dir: PathBuf,
    /// `host:port` serving `/metrics`, `/healthz` and `/readyz`; `None`: not served.
    pub metrics_addr: Option<String>,
    /// Namespace of the `ComputeDomainNode` objects (the driver's namespace).
    pub namespace: String,
    /// Channel and daemon devices published (`channel-0..N-1`, `daemon-0..N-1`); `channel-0`
    /// shared by any number of claims, the others one claim each.
    pub max_domains: u32,
    /// How long a channel prepare waits for the node's IMEX daemon to be Ready.
    pub ready_timeout: Duration,
    /// `--imex-mode`: per-domain daemons (default) or the host's IMEX service.
    pub imex_mode: ImexMode,
    /// How the host's IMEX service is queried (used with [`ImexMode::HostManaged`]).
    pub host_imex: HostImex,
    /// `--device-metadata`: write each claim's device metadata file (KEP-5304).
    pub device_metadata: bool,
    /// `--binding-conditions`: channel devices carry `bindingConditions: [IMEXDaemonReady]`
    /// and `bindingFailureConditions: [IMEXDaemonFailed]`, which the controller started with
    /// the same flag sets (docs/compute-domains.md#binding-conditions).
    pub binding_conditions: bool,
}

impl CdPluginConfig {
    /// The driver name this plugin registers and publishes as.
    pub fn driver_name(&self) -> &'static str {
        api::DRIVER_NAME
    }

    /// Whether channel device nodes are simulated (sim backend or `--simulated-host`).
    pub fn simulated_devices(&self) -> bool {
        self.simulated_host || matches!(self.backend, BackendChoice::Sim { .. })
    }
}

/// `--max-domains`: a whole number of 1..=[`api::MAX_CHANNELS`].
///
/// # Errors
/// A message naming the value and the valid range.
pub fn max_domains_flag(value: &str) -> Result<u32, String> {
    let valid = format!("a whole number from 1 to {}", api::MAX_CHANNELS);
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=api::MAX_CHANNELS).contains(&n) => Ok(n),
        _ => Err(format!("--max-domains {value:?} is not valid: {valid}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imex_mode_takes_the_two_exact_names_and_lists_them_otherwise() {
        assert_eq!(imex_mode_flag("HostManaged"), Ok(ImexMode::HostManaged));
        assert_eq!(imex_mode_flag("DriverManaged"), Ok(ImexMode::DriverManaged));
        assert_eq!(
            imex_mode_flag("hostManaged"),
            Err(
                "--imex-mode \"hostManaged\" is not valid; valid: DriverManaged, HostManaged"
                    .to_string()
            )
        );
    }

    #[test]
    fn max_domains_accepts_one_to_the_kernels_channel_count_and_names_the_range_otherwise() {
        assert_eq!(max_domains_flag("8"), Ok(8));
        assert_eq!(max_domains_flag("2048"), Ok(2048));
        for bad in ["0", "2049", "-1", "eight", ""] {
            let error = max_domains_flag(bad).unwrap_err();
            assert!(error.contains("from 1 to 2048"), "{error}");
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }
}
