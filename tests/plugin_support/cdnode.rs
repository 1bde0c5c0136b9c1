//! The real `gpu-dra compute-domain-plugin` on a simulated kubelet host ([`Node`]'s
//! directories and fake API server), its claims and the `ComputeDomainNode` objects an IMEX
//! daemon would write.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use super::{Node, Plugin, claims};

pub const CD_DRIVER: &str = "compute-domain.nvidia.com";
/// The driver namespace the plugin is told.
pub const DRIVER_NAMESPACE: &str = "gpu-dra";
/// The clique the test node is in.
pub const CLIQUE: &str = "c2a0e7d4-1111-2222-3333-444455556666.1";
/// The node label the plugin sets.
pub const NODE_LABEL: &str = "resource.nvidia.com/computeDomain";

impl Node {
    pub fn cd_plugin_dir(&self) -> PathBuf {
        self.root().join("plugins").join(CD_DRIVER)
    }
    pub fn cd_state_dir(&self) -> PathBuf {
        self.root().join("cd-state")
    }
    pub fn cd_registration_socket(&self) -> PathBuf {
        self.registry_dir().join(format!("{CD_DRIVER}-reg.sock"))
    }
    /// The CDI spec of compute-domain claim `uid`, if written.
    pub fn cd_spec(&self, uid: &str) -> Option<Value> {
        let path = self
            .cdi_root()
            .join(format!("k8s.{CD_DRIVER}-claim_{uid}.json"));
        let text = std::fs::read_to_string(path).ok()?;
        Some(serde_json::from_str(&text).expect("spec is JSON"))
    }
    /// The IMEX config directory of domain `uid`.
    pub fn cd_config_dir(&self, uid: &str) -> PathBuf {
        self.cd_state_dir().join("compute-domains").join(uid)
    }
    /// Every file the plugin may leave behind: CDI specs of its kind and config dirs.
    pub fn cd_leftovers(&self) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(self.cdi_root())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("k8s.{CD_DRIVER}")) {
                found.push(name);
            }
        }
        let dir = self.cd_state_dir().join("compute-domains");
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            found.push(format!(
                "compute-domains/{}",
                entry.file_name().to_string_lossy()
            ));
        }
        found.sort();
        found
    }

    /// The plugin command line on this node, in clique [`CLIQUE`], waiting at most
    /// `ready_timeout_s` for a daemon.
    pub fn cd_command(&self, ready_timeout_s: u32) -> Command {
        self.cd_command_in(CLIQUE, ready_timeout_s)
    }

    /// [`Node::cd_command`] in another clique (`""`: none).
    pub fn cd_command_in(&self, clique: &str, ready_timeout_s: u32) -> Command {
        let mut command = self.node_command(
            env!("CARGO_BIN_EXE_gpu-dra"),
            "compute-domain-plugin",
            &self.cd_plugin_dir(),
            &self.cd_state_dir(),
        );
        command
            .args(["--gpu-backend", "sim", "--sim-node", super::PRESET])
            .args(["--clique-id", clique])
            .args(["--namespace", DRIVER_NAMESPACE])
            .args(["--daemon-ready-timeout", &ready_timeout_s.to_string()]);
        command
    }

    /// Starts `command` (from [`Node::cd_command`]) with extra environment, without waiting.
    pub fn cd_spawn(&self, command: Command, env: &[(&str, &str)]) -> Plugin {
        self.spawn_registering_at(command, env, self.cd_registration_socket())
    }

    /// Starts the plugin and waits until its registration socket answers.
    pub async fn cd_start(&self, ready_timeout_s: u32) -> Plugin {
        let mut plugin = self.cd_spawn(self.cd_command(ready_timeout_s), &[]);
        plugin.wait_registrable().await;
        plugin
    }
}

/// A claim allocated `device` of this node's compute-domain pool, with `config` as the
/// claim's opaque parameters.
pub fn claim(name: &str, uid: &str, device: &str, config: Value) -> Value {
    let mut claim = claims::allocated(name, uid, &[(CD_DRIVER, claims::NODE, device)]);
    claim["status"]["allocation"]["devices"]["config"] = json!([{
        "source": "FromClaim", "requests": [],
        "opaque": {"driver": CD_DRIVER, "parameters": config}
    }]);
    claim
}

/// `ComputeDomainChannelConfig` of domain `uid`.
pub fn channel_config(domain: &str, mode: &str) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
           "domainID": domain, "allocationMode": mode})
}

/// `ComputeDomainDaemonConfig` of domain `uid`.
pub fn daemon_config(domain: &str) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig",
           "domainID": domain})
}

/// The `ComputeDomainNode` an IMEX daemon of `domain` on `node` writes.
pub fn domain_node(
    domain: &str,
    node: &str,
    clique: &str,
    index: u32,
    ip: &str,
    ready: bool,
) -> Value {
    json!({
        "metadata": {"name": gpu_dra::compute_domain::api::compute_domain_node_name(domain, node),
                     "namespace": DRIVER_NAMESPACE,
                     "labels": {"resource.nvidia.com/computeDomain.uid": domain}},
        "spec": {"domainUID": domain, "domainNamespace": "team-a", "domainName": "imex",
                 "nodeName": node, "cliqueID": clique},
        "status": {"ipAddress": ip, "index": index,
                   "status": if ready { "Ready" } else { "NotReady" }}
    })
}

/// A `ComputeDomain` `namespace/name` with UID `uid`.
pub fn compute_domain(namespace: &str, name: &str, uid: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": namespace, "uid": uid},
           "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": format!("{name}-channel")}}}})
}
