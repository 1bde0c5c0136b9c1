//! What `gpu-dra kubelet-plugin` is told on its command line.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::devices::SharedGpus;
use crate::hardware::MigPolicy;

/// Which GPUs the plugin drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendChoice {
    /// GPUs through NVML.
    Nvml {
        /// `--nvml-lib`: the NVML library to load instead of the system's
        /// `libnvidia-ml.so.1` (e.g. the simulated one).
        lib: Option<PathBuf>,
    },
    /// A simulated node (preset or node file).
    Sim {
        /// `--sim-node`.
        sim_node: String,
    },
}

/// The plugin's configuration; every field has a flag and an environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConfig {
    /// DRA driver name.
    pub driver_name: String,
    /// This node's name (also the pool name).
    pub node_name: String,
    /// Kubeconfig; in-cluster config when absent.
    pub kubeconfig: Option<PathBuf>,
    /// GPU backend.
    pub backend: BackendChoice,
    /// MIG policy for every GPU; `None`: the node file's (sim) or static/disabled by mode.
    pub mig_policy: Option<MigPolicy>,
    /// `--gpu-mig-policies`: MIG policy of single GPUs by index, over `mig_policy`.
    pub gpu_mig_policies: BTreeMap<u32, MigPolicy>,
    /// `--mig-profiles`: the MIG profiles dynamic-MIG GPUs publish.
    pub mig_profiles: crate::devices::MigProfileSet,
    /// How devices are grouped into slices (`--slice-layout`).
    pub slice_layout: crate::devices::SliceLayout,
    /// What MIG devices carry (`--mig-attributes`).
    pub mig_attributes: crate::devices::MigAttributes,
    /// `--vgpu-types`: the vGPU types GPUs offer; off by default.
    pub vgpu_types: crate::devices::VgpuTypes,
    /// `--compatibility-groups`: compatibility groups on the counter consumptions of GPUs
    /// offering vGPU types (Kubernetes 1.37 `DRADeviceCompatibilityGroups`).
    pub compatibility_groups: bool,
    /// `--partitionable-devices-type`: `partitionTypeAttribute` on slices holding dynamic-MIG
    /// devices (Kubernetes 1.37 `DRAPartitionableDevicesType`).
    pub partitionable_devices_type: bool,
    /// `--simulated-host`: the node has no NVIDIA driver files or device nodes (kind, CI):
    /// CDI specs name the simulated device nodes and the sharing tools are the simulated
    /// ones, as with the sim backend. For the NVML backend over the simulated library.
    pub simulated_host: bool,
    /// Directory of the DRA socket and lock.
    pub plugin_dir: PathBuf,
    /// Directory the kubelet watches for registration sockets.
    pub registry_dir: PathBuf,
    /// Pod UID for seamless rolling updates (socket names carry it).
    pub pod_uid: Option<String>,
    /// Where CDI specs go.
    pub cdi_root: PathBuf,
    /// Driver root as the plugin sees it.
    pub driver_root: PathBuf,
    /// Driver root on the host, when it differs from `driver_root`.
    pub host_driver_root: Option<PathBuf>,
    /// Root under which `/dev` is found.
    pub dev_root: PathBuf,
    /// The proc filesystem.
    pub proc_root: PathBuf,
    /// Checkpoint (and simulated hardware state) directory.
    pub state_dir: PathBuf,
    /// How often the inventory is re-read for health and model changes (and MPS daemons
    /// checked).
    pub inventory_interval: Duration,
    /// How often telemetry is sampled for `/metrics` (`--telemetry-interval`).
    pub telemetry_interval: Duration,
    /// How often the pods of claims shared by several pods are re-read for the telemetry's
    /// holder labels (`--holders-refresh-interval`).
    pub holders_refresh_interval: Duration,
    /// `--orphan-grace-period`: how long a prepared claim may be reserved for no pod before
    /// the plugin unprepares it ([`super::orphans`]); zero turns orphan reconciliation off.
    pub orphan_grace_period: Duration,
    /// MPS allowed (opaque config and consumable-capacity shares).
    pub mps: bool,
    /// Time-slicing allowed.
    pub time_slicing: bool,
    /// `--device-metadata`: write each prepared claim's device metadata file (KEP-5304) and
    /// mount it through the claim's CDI spec.
    pub device_metadata: bool,
    /// `--device-metadata-dir`: where the metadata files are kept; `None`:
    /// `<plugin dir>/dra-device-metadata` (Kubernetes' library's place).
    pub device_metadata_dir: Option<PathBuf>,
    /// `--passthrough`: publish a VFIO device `gpu-vfio-<i>` per GPU and hand GPUs to VMs
    /// (driver switch to `vfio-pci`).
    pub passthrough: bool,
    /// `--host-root`: where the host's `sys/`, `dev/vfio/` and `proc/` are found for
    /// passthrough; `None`: `/`, or the simulated node's tree with the sim backend.
    pub host_root: Option<PathBuf>,
    /// Publish GPUs and MIG devices shareable (consumable capacity).
    pub shared_gpus: SharedGpus,
    /// `--health-policy`: the health policy file (YAML or JSON); `None`: the built-in
    /// defaults ([`crate::health::HealthPolicy::default`]).
    pub health_policy: Option<PathBuf>,
    /// `host:port` serving `/metrics`, `/healthz` and `/readyz`; `None`: not served.
    pub metrics_addr: Option<String>,
    /// `--fabric-manager`: Fabric Manager partitions on an NVSwitch node in shared mode;
    /// `None` (default): no FM attributes, no partition checks.
    pub fabric_manager: Option<FabricManagerConfig>,
}

/// Where Fabric Manager and `fmpm` are (`--fabric-manager-*`, `--fmpm-path`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricManagerConfig {
    /// FM's Unix socket; `None`: `<driver-root>/run/nvidia-fabricmanager/socket` (the
    /// simulated node's own with the sim backend).
    pub socket: Option<PathBuf>,
    /// FM's TCP address (`FM_CMD_BIND_INTERFACE`); when set it wins over the socket, and an
    /// empty value means `127.0.0.1`.
    pub address: Option<String>,
    /// The `fmpm` executable; `None`: found under the driver root.
    pub fmpm: Option<PathBuf>,
}

/// The `--metrics-addr` value as [`PluginConfig::metrics_addr`]: empty or `off` turn the
/// endpoint off; anything else is an address, checked when it is bound.
pub fn metrics_addr_flag(value: &str) -> Option<String> {
    match value.trim() {
        "" | "off" => None,
        addr => Some(addr.to_string()),
    }
}
