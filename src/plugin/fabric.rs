//! `--fabric-manager`: the FM client the plugin uses, and the partition list it reads once at
//! start (validated), which the device model publishes and prepare checks claims against.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::info;

use super::config::{BackendChoice, FabricManagerConfig, PluginConfig};
use crate::claims::fabric::FabricPartitions;
use crate::fabric_manager::{self, Endpoint, FabricError, FmClient};

/// Whether the plugin drives the simulated node's FM (the sim backend, or the simulated NVML
/// library on a simulated host, with the default driver root), as the sharing tools do.
fn simulated(config: &PluginConfig) -> bool {
    (matches!(config.backend, BackendChoice::Sim { .. }) || config.simulated_host)
        && config.driver_root == Path::new("/")
}

/// The endpoint: `--fabric-manager-address` (TCP; empty means `127.0.0.1`), else
/// `--fabric-manager-socket`, else NVIDIA's socket under `root`.
pub fn endpoint(fm: &FabricManagerConfig, root: &Path) -> Endpoint {
    match (&fm.address, &fm.socket) {
        (Some(address), _) if address.is_empty() => Endpoint::Tcp("127.0.0.1".into()),
        (Some(address), _) => Endpoint::Tcp(address.clone()),
        (None, Some(socket)) => Endpoint::Unix(socket.clone()),
        (None, None) => Endpoint::Unix(root.join(fabric_manager::client::DEFAULT_SOCKET)),
    }
}

/// The FM client for `config`: on a simulated node, this binary as `fmpm` against the
/// simulated FM (started here when the node file sets `fabricMode: 1`); otherwise `fmpm`
/// from `--fmpm-path` or under the driver root.
///
/// # Errors
/// [`FabricError::ToolNotFound`], or [`FabricError::Spawn`] when the simulated tool cannot
/// be installed or the simulated FM started.
pub fn client(config: &PluginConfig, fm: &FabricManagerConfig) -> Result<FmClient, FabricError> {
    let sim_state = config.state_dir.join("sim");
    let simulated = simulated(config) && fm.fmpm.is_none();
    if simulated {
        fabric_manager::sim::start(&sim_state).map_err(|e| FabricError::Spawn {
            program: "simulated Fabric Manager".into(),
            detail: e.to_string(),
        })?;
    }
    let tools = sim_state.join("fabricmanager/bin");
    client_for(simulated, &sim_state, &tools, &config.driver_root, fm)
}

/// The FM client without starting anything: `simulated` runs this binary as `fmpm` over the
/// simulated node in `sim_state`, linked as `<tools>/fmpm` (the plugin links it under its
/// state; `doctor`, which must not write the plugin's directories, in a scratch directory it
/// keeps until the client has run); otherwise `fmpm` from `fm.fmpm` or under `driver_root`.
/// `doctor` uses it as the plugin would.
///
/// # Errors
/// [`FabricError::ToolNotFound`], or [`FabricError::Spawn`] when the simulated tool cannot
/// be linked.
pub fn client_for(
    simulated: bool,
    sim_state: &Path,
    tools: &Path,
    driver_root: &Path,
    fm: &FabricManagerConfig,
) -> Result<FmClient, FabricError> {
    if simulated {
        let io = |e: std::io::Error| FabricError::Spawn {
            program: "simulated fmpm".into(),
            detail: e.to_string(),
        };
        let exe = std::env::current_exe().map_err(io)?;
        let program = fabric_manager::sim::install(&exe, tools).map_err(io)?;
        let mut client = FmClient::new(program, endpoint(fm, sim_state));
        client.env.push((
            fabric_manager::sim::STATE_DIR_ENV.into(),
            sim_state.to_string_lossy().into_owned(),
        ));
        return Ok(client);
    }
    let program: PathBuf = match &fm.fmpm {
        Some(path) => path.clone(),
        None => FmClient::find(driver_root)?,
    };
    Ok(FmClient::new(program, endpoint(fm, driver_root)))
}

/// Connects to FM and reads its partition list once.
///
/// # Errors
/// As [`client`], and [`FmClient::list`]'s errors (unreachable, an invalid list).
pub fn setup(
    config: &PluginConfig,
    fm: &FabricManagerConfig,
) -> Result<FabricPartitions, FabricError> {
    let client = client(config, fm)?;
    let table = Arc::new(client.list()?);
    info!(
        fmpm = %client.program.display(),
        endpoint = %client.endpoint,
        partitions = table.partitions().len(),
        active = ?table.partitions().iter().filter(|p| p.is_active).map(|p| p.partition_id).collect::<Vec<_>>(),
        "Fabric Manager partitions"
    );
    Ok(FabricPartitions { client, table })
}
