//! The IMEX daemon's files the plugin writes for a daemon claim, and the node's clique, pure.
//!
//! `config.cfg` is read by `nvidia-imex -c` at start; `nodes_config.cfg` lists the peers'
//! IPs, one a line, in the order of their stable index (the line number is what IMEX knows
//! a node by, so the order must never reshuffle). The plugin writes the peers known when
//! the daemon claim is prepared; the IMEX daemon wrapper keeps the file current.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::HostImex;
use crate::compute_domain::api::{self, ComputeDomainNode, Readiness};
use crate::hardware::NodeInventory;

/// What a ready IMEX service answers to `nvidia-imex-ctl -q`.
pub const READY: &str = "READY";

/// The command that asks the host's IMEX service for its state, as NVIDIA's driver runs it:
/// `<ctl> -q --u=<socket>`, under `chroot <driver root>` when the root is not `/`.
pub fn host_query(host: &HostImex) -> (PathBuf, Vec<String>) {
    let query = [
        host.ctl.display().to_string(),
        "-q".to_string(),
        format!("--u={}", host.socket.display()),
    ];
    if host.driver_root == Path::new("/") {
        (PathBuf::from(&query[0]), query[1..].to_vec())
    } else {
        let mut args = vec![host.driver_root.display().to_string()];
        args.extend(query);
        (PathBuf::from("chroot"), args)
    }
}

/// Runs [`host_query`] for at most `timeout` (then kills it).
///
/// # Errors
/// What was wrong, for a message: `answered WAITING_FOR_PEERS`, `answered UNAVAILABLE (exit
/// status 1: …)`, `could not be run: …` or `did not answer within 10 s`.
pub async fn host_ready(host: &HostImex, timeout: Duration) -> Result<(), String> {
    let (program, args) = host_query(host);
    let mut command = tokio::process::Command::new(&program);
    command.args(&args).kill_on_drop(true);
    let output = match tokio::time::timeout(timeout, command.output()).await {
        Err(_) => return Err(format!("did not answer within {} s", timeout.as_secs())),
        Ok(Err(e)) => return Err(format!("could not be run: {e}")),
        Ok(Ok(output)) => output,
    };
    let answer = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if output.status.success() && answer == READY {
        return Ok(());
    }
    let shown = if answer.is_empty() {
        "nothing".to_string()
    } else {
        answer
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stderr = stderr.trim();
    Err(match (output.status.success(), stderr.is_empty()) {
        (true, _) => format!("answered {shown}"),
        (false, true) => format!("answered {shown} ({})", output.status),
        (false, false) => format!("answered {shown} ({}: {stderr})", output.status),
    })
}

/// The daemon's settings, `KEY=value` lines as `nvidia-imex` reads them.
///
/// `IMEX_NODE_CONFIG_FILE` is the nodes file as the daemon container sees it (the config
/// directory is mounted at [`api::DAEMON_CONFIG_MOUNT`]).
pub fn config_cfg(domain: &DomainNames, clique: &str) -> String {
    format!(
        "# IMEX daemon settings of ComputeDomain {namespace}/{name} (uid {uid}), clique {clique};\n\
         # written by gpu-dra compute-domain-plugin when the daemon claim was prepared.\n\
         LOG_LEVEL=4\n\
         LOG_FILE_NAME=\n\
         SERVER_PORT={server}\n\
         SECURITY_MODE=0\n\
         IMEX_CMD_PORT={cmd}\n\
         IMEX_CMD_ENABLED=1\n\
         IMEX_WAIT_FOR_QUORUM=RECOVERY\n\
         IMEX_CONN_WAIT_TIMEOUT=70\n\
         IMEX_NODE_CONFIG_FILE={mount}/{nodes}\n",
        namespace = domain.namespace,
        name = domain.name,
        uid = domain.uid,
        server = api::IMEX_SERVER_PORT,
        cmd = api::IMEX_CMD_PORT,
        mount = api::DAEMON_CONFIG_MOUNT,
        nodes = api::IMEX_NODES_CONFIG_FILE,
    )
}

/// The nodes file: the IPs of `nodes` that belong to `clique` and have one, by index (then
/// name, for two objects racing to one index), one a line. Readiness does not matter: a
/// peer that is still starting is still a peer.
pub fn nodes_config_cfg(nodes: &[ComputeDomainNode], clique: &str) -> String {
    let mut peers: Vec<(u32, &str, &str)> = nodes
        .iter()
        .filter(|n| n.spec.clique_id == clique)
        .filter_map(|n| {
            let status = n.status.as_ref()?;
            (!status.ip_address.is_empty()).then_some((
                status.index,
                n.metadata.name.as_deref().unwrap_or_default(),
                status.ip_address.as_str(),
            ))
        })
        .collect();
    peers.sort();
    peers.dedup_by(|a, b| a.2 == b.2);
    peers.iter().map(|(_, _, ip)| format!("{ip}\n")).collect()
}

/// The domain a daemon claim serves, as the daemon's environment names it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DomainNames {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

/// Whether a `ComputeDomainNode` says its daemon is ready, or why not.
pub fn readiness(node: Option<&ComputeDomainNode>) -> Result<(), String> {
    let Some(node) = node else {
        return Err("the IMEX daemon has not reported yet (no ComputeDomainNode object)".into());
    };
    let status = node.status.clone().unwrap_or_default();
    if status.status == Readiness::Ready {
        return Ok(());
    }
    Err(match (status.reason, status.message) {
        (Some(reason), Some(message)) => format!("NotReady, {reason}: {message}"),
        (Some(reason), None) => format!("NotReady, {reason}"),
        (None, Some(message)) => format!("NotReady: {message}"),
        (None, None) => "NotReady (the daemon gave no reason)".to_string(),
    })
}

/// The node's clique from its GPUs' fabric info: `Ok(None)` when no GPU is in one.
///
/// # Errors
/// A message naming the GPUs when they disagree (a node's GPUs are on one fabric or none).
pub fn clique_of(inventory: &NodeInventory) -> Result<Option<String>, String> {
    let mut seen: Option<(String, u32)> = None;
    for gpu in &inventory.gpus {
        let Some(clique) = gpu.fabric.as_ref().and_then(|f| f.clique()) else {
            continue;
        };
        match &seen {
            Some((first, index)) if *first != clique => {
                return Err(format!(
                    "GPU {index} is in clique {first} but GPU {} in {clique}; a node's GPUs \
                     must share one clique (check the fabric manager, or set --clique-id)",
                    gpu.index
                ));
            }
            Some(_) => {}
            None => seen = Some((clique, gpu.index)),
        }
    }
    Ok(seen.map(|(clique, _)| clique))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_query_is_nvidia_imex_ctl_dash_q_on_the_socket_chrooted_under_a_driver_root() {
        let mut host = HostImex::default();
        let direct = host_query(&host);
        host.driver_root = PathBuf::from("/host");
        let chrooted = host_query(&host);
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            (direct, chrooted),
            (
                (
                    PathBuf::from("/usr/bin/nvidia-imex-ctl"),
                    strings(&["-q", "--u=/etc/nvidia-imex/imex_ctrl.sock"])
                ),
                (
                    PathBuf::from("chroot"),
                    strings(&[
                        "/host",
                        "/usr/bin/nvidia-imex-ctl",
                        "-q",
                        "--u=/etc/nvidia-imex/imex_ctrl.sock"
                    ])
                )
            )
        );
    }
    use crate::compute_domain::api::{ComputeDomainNodeSpec, ComputeDomainNodeState};
    use crate::hardware::fabric::{FabricInfo, FabricState};

    fn node(name: &str, clique: &str, index: u32, ip: &str) -> ComputeDomainNode {
        let mut object = ComputeDomainNode::new(
            name,
            &api::compute_domain_node_resource(),
            ComputeDomainNodeSpec {
                clique_id: clique.into(),
                ..Default::default()
            },
        );
        object.status = Some(ComputeDomainNodeState {
            ip_address: ip.into(),
            index,
            ..Default::default()
        });
        object
    }

    #[test]
    fn the_nodes_file_lists_the_cliques_peers_in_index_order() {
        let nodes = vec![
            node("u.n3", "c.1", 2, "10.0.0.3"),
            node("u.n1", "c.1", 0, "10.0.0.1"),
            node("u.x", "c.2", 1, "10.9.9.9"),
            node("u.n2", "c.1", 1, "10.0.0.2"),
            node("u.n4", "c.1", 3, ""),
        ];
        assert_eq!(
            nodes_config_cfg(&nodes, "c.1"),
            "10.0.0.1\n10.0.0.2\n10.0.0.3\n"
        );
        assert_eq!(nodes_config_cfg(&[], "c.1"), "");
    }

    #[test]
    fn the_config_sets_the_ports_quorum_and_nodes_file_of_the_contract() {
        let text = config_cfg(
            &DomainNames {
                uid: "u".into(),
                namespace: "ns".into(),
                name: "imex".into(),
            },
            "c.1",
        );
        for line in [
            "SERVER_PORT=50000",
            "IMEX_CMD_PORT=50005",
            "IMEX_CMD_ENABLED=1",
            "IMEX_WAIT_FOR_QUORUM=RECOVERY",
            "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    fn inventory_with(fabrics: &[Option<(&str, u32, FabricState)>]) -> NodeInventory {
        use crate::hardware::GpuBackend;
        let sim = crate::hardware::sim::SimBackend::open("dgx-h100", None).unwrap();
        let mut inventory = sim.inventory().unwrap();
        inventory.gpus.truncate(fabrics.len());
        for (gpu, fabric) in inventory.gpus.iter_mut().zip(fabrics) {
            gpu.fabric = fabric.map(|(uuid, clique_id, state)| FabricInfo {
                cluster_uuid: uuid.into(),
                clique_id,
                state,
            });
        }
        inventory
    }

    #[test]
    fn a_nodes_clique_is_the_one_its_gpus_share_and_none_without_fabric() {
        const UUID: &str = "c2a0e7d4-1111-2222-3333-444455556666";
        let done = FabricState::Completed;
        assert_eq!(
            clique_of(&inventory_with(&[
                Some((UUID, 1, done)),
                Some((UUID, 1, done))
            ])),
            Ok(Some(format!("{UUID}.1")))
        );
        assert_eq!(clique_of(&inventory_with(&[None, None])), Ok(None));
        let zero = crate::hardware::fabric::ZERO_CLUSTER_UUID;
        assert_eq!(
            clique_of(&inventory_with(&[Some((zero, 0, done))])),
            Ok(None)
        );
        let error = clique_of(&inventory_with(&[
            Some((UUID, 1, done)),
            Some((UUID, 2, done)),
        ]))
        .unwrap_err();
        assert!(
            error.contains("GPU 0") && error.contains("GPU 1"),
            "{error}"
        );
        assert!(error.contains("--clique-id"), "{error}");
    }

    #[test]
    fn readiness_carries_the_daemons_reason_and_message() {
        let mut n = node("u.n1", "c.1", 0, "10.0.0.1");
        n.status.as_mut().unwrap().reason = Some("DaemonCrashed".into());
        n.status.as_mut().unwrap().message = Some("exit 1".into());
        assert_eq!(
            readiness(Some(&n)),
            Err("NotReady, DaemonCrashed: exit 1".to_string())
        );
        n.status.as_mut().unwrap().status = Readiness::Ready;
        assert_eq!(readiness(Some(&n)), Ok(()));
        assert!(readiness(None).unwrap_err().contains("not reported"));
    }
}
