//! The IMEX daemon's config file (`nvidia-imex -c <file>`) and nodes config, as NVIDIA's IMEX
//! guide defines them: `KEY=VALUE` lines, `#` comments, defaults for absent keys. Pure: text
//! in, validated settings or an error naming the key, the value and the valid choices out.
//!
//! Only the keys the simulator acts on are validated; every other key of the real daemon's
//! long list (SSL, GSSAPI, logging levels, …) is accepted and ignored, as a config written for
//! the real daemon must run on the simulated one.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Errors reading an IMEX config or nodes config.
#[derive(Debug, thiserror::Error)]
pub enum ImexConfigError {
    /// A key has a value the daemon does not accept.
    #[error("{file}: {key}={value:?} is invalid; valid: {valid}")]
    InvalidValue {
        /// Config file.
        file: String,
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What is accepted.
        valid: String,
    },
    /// A line is not `KEY=VALUE`.
    #[error("{file}:{line}: {text:?} is not KEY=VALUE")]
    Malformed {
        /// Config file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A nodes config line is not an IP address.
    #[error("{file}:{line}: {text:?} is not an IPv4 or IPv6 address (one node IP per line)")]
    BadNode {
        /// Nodes config file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A file could not be read.
    #[error("reading {} failed", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// `IMEX_WAIT_FOR_QUORUM`: what the daemon waits for before it reports READY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitForQuorum {
    /// `NONE`: ready as soon as it serves.
    None,
    /// `RECOVERY` (default): ready at once after a clean start; after an unclean one it would
    /// wait for the nodes that had imported its memory. The simulator has no imports, so it is
    /// ready once it serves.
    Recovery,
    /// `FULL`: ready once connected to every node of the nodes config.
    Full,
}

impl WaitForQuorum {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitForQuorum::None => "NONE",
            WaitForQuorum::Recovery => "RECOVERY",
            WaitForQuorum::Full => "FULL",
        }
    }
}

/// The settings the simulated `nvidia-imex` acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImexConfig {
    /// `BIND_INTERFACE_IP`: the address peers connect to; empty means "the address of the
    /// nodes config that is one of this host's".
    pub bind_interface_ip: Option<IpAddr>,
    /// `SERVER_PORT` (default 50000).
    pub server_port: u16,
    /// `IMEX_CMD_ENABLED` (default 0 in the guide; the DRA driver sets 1).
    pub cmd_enabled: bool,
    /// `IMEX_CMD_PORT` (default 50005).
    pub cmd_port: u16,
    /// `IMEX_CMD_BIND_INTERFACE_IP`; default: the bind address.
    pub cmd_bind_interface_ip: Option<IpAddr>,
    /// `IMEX_NODE_CONFIG_FILE` (default `/etc/nvidia-imex/nodes_config.cfg`); relative paths
    /// are taken from the config file's directory.
    pub node_config_file: PathBuf,
    /// `IMEX_WAIT_FOR_QUORUM` (default RECOVERY).
    pub wait_for_quorum: WaitForQuorum,
    /// `LOG_FILE_NAME`; empty means stderr.
    pub log_file_name: Option<PathBuf>,
    /// `IMEX_CMD_UNIX_DOMAIN_PATH`: the command service also listens on this Unix socket
    /// (with `IMEX_CMD_ENABLED=1`), as a host's `nvidia-imex.service` does for
    /// `nvidia-imex-ctl -q --u=<socket>`; empty or absent means none.
    pub cmd_unix_domain_path: Option<PathBuf>,
}

/// Default `IMEX_NODE_CONFIG_FILE`.
pub const DEFAULT_NODE_CONFIG_FILE: &str = "/etc/nvidia-imex/nodes_config.cfg";
/// Default config file of `nvidia-imex` and `nvidia-imex-ctl`.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/nvidia-imex/config.cfg";

impl ImexConfig {
    /// Reads and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<ImexConfig, ImexConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ImexConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        ImexConfig::parse(&path.display().to_string(), &text, path.parent())
    }

    /// Parses a config file's text; `file` names it in errors, `dir` resolves a relative
    /// nodes config path.
    pub fn parse(
        file: &str,
        text: &str,
        dir: Option<&Path>,
    ) -> Result<ImexConfig, ImexConfigError> {
        let mut config = ImexConfig {
            bind_interface_ip: None,
            server_port: 50000,
            cmd_enabled: false,
            cmd_port: 50005,
            cmd_bind_interface_ip: None,
            node_config_file: PathBuf::from(DEFAULT_NODE_CONFIG_FILE),
            wait_for_quorum: WaitForQuorum::Recovery,
            log_file_name: None,
            cmd_unix_domain_path: None,
        };
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(ImexConfigError::Malformed {
                    file: file.into(),
                    line: n + 1,
                    text: raw.into(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            let invalid = |valid: &str| ImexConfigError::InvalidValue {
                file: file.into(),
                key: key.into(),
                value: value.into(),
                valid: valid.into(),
            };
            let ip = |value: &str| -> Result<Option<IpAddr>, ImexConfigError> {
                if value.is_empty() {
                    return Ok(None);
                }
                value
                    .parse()
                    .map(Some)
                    .map_err(|_| invalid("an IPv4 or IPv6 address, or empty"))
            };
            let port = |value: &str| -> Result<u16, ImexConfigError> {
                value.parse().map_err(|_| invalid("a TCP port, 0 to 65535"))
            };
            match key {
                "BIND_INTERFACE_IP" => config.bind_interface_ip = ip(value)?,
                "SERVER_PORT" => config.server_port = port(value)?,
                "IMEX_CMD_PORT" => config.cmd_port = port(value)?,
                "IMEX_CMD_BIND_INTERFACE_IP" => config.cmd_bind_interface_ip = ip(value)?,
                "IMEX_CMD_ENABLED" => {
                    config.cmd_enabled = match value {
                        "0" => false,
                        "1" => true,
                        _ => return Err(invalid("0 or 1")),
                    }
                }
                "IMEX_WAIT_FOR_QUORUM" => {
                    config.wait_for_quorum = match value {
                        "NONE" => WaitForQuorum::None,
                        "RECOVERY" => WaitForQuorum::Recovery,
                        "FULL" => WaitForQuorum::Full,
                        _ => return Err(invalid("NONE, RECOVERY or FULL")),
                    }
                }
                "IMEX_NODE_CONFIG_FILE" => {
                    if value.is_empty() {
                        return Err(invalid("a file path"));
                    }
                    config.node_config_file = node_config_path(value, dir);
                }
                "LOG_FILE_NAME" => {
                    config.log_file_name = (!value.is_empty()).then(|| PathBuf::from(value));
                }
                "IMEX_CMD_UNIX_DOMAIN_PATH" => {
                    config.cmd_unix_domain_path = (!value.is_empty()).then(|| PathBuf::from(value));
                }
                _ => {}
            }
        }
        Ok(config)
    }

    /// Where `nvidia-imex-ctl` reaches the command service: the command bind address, else
    /// the bind address, else loopback.
    pub fn cmd_address(&self) -> std::net::SocketAddr {
        let ip = self
            .cmd_bind_interface_ip
            .or(self.bind_interface_ip)
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        std::net::SocketAddr::new(ip, self.cmd_port)
    }
}

/// Where `IMEX_NODE_CONFIG_FILE=value` of a config in `dir` points: relative paths are taken
/// from `dir`; so is a path under the daemon container's mount (`/etc/nvidia-imex/…`, what
/// the plugin writes) when the config itself is read from elsewhere, i.e. outside the
/// container (simulated nodes on one machine, each with its own directory).
fn node_config_path(value: &str, dir: Option<&Path>) -> PathBuf {
    let path = PathBuf::from(value);
    let mount = Path::new(crate::compute_domain::api::DAEMON_CONFIG_MOUNT);
    match dir {
        Some(dir) if path.is_relative() => dir.join(path),
        Some(dir) if dir != mount => match path.strip_prefix(mount) {
            Ok(rest) => dir.join(rest),
            Err(_) => path,
        },
        _ => path,
    }
}

/// Parses a nodes config: one node IP per line, blank lines and `#` comments skipped, in the
/// order given (a node's line is its index).
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<IpAddr>, ImexConfigError> {
    let mut nodes = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let ip = line.parse().map_err(|_| ImexConfigError::BadNode {
            file: file.into(),
            line: n + 1,
            text: raw.into(),
        })?;
        nodes.push(ip);
    }
    Ok(nodes)
}

/// Reads and parses the nodes config at `path`.
pub fn load_nodes(path: &Path) -> Result<Vec<IpAddr>, ImexConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ImexConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_nodes(&path.display().to_string(), &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dra_drivers_settings_parse_and_unknown_keys_are_ignored() {
        let text = "# written by the plugin\nSERVER_PORT=50000\nIMEX_CMD_PORT=50005\nIMEX_CMD_ENABLED=1\nIMEX_WAIT_FOR_QUORUM=RECOVERY\nIMEX_NODE_CONFIG_FILE=nodes_config.cfg\nBIND_INTERFACE_IP=127.0.0.2\nIMEX_ENABLE_AUTH_ENCRYPTION=0\nLOG_FILE_NAME=\n";
        let c = ImexConfig::parse("config.cfg", text, Some(Path::new("/etc/x"))).unwrap();
        assert_eq!(
            c,
            ImexConfig {
                bind_interface_ip: Some("127.0.0.2".parse().unwrap()),
                server_port: 50000,
                cmd_enabled: true,
                cmd_port: 50005,
                cmd_bind_interface_ip: None,
                node_config_file: PathBuf::from("/etc/x/nodes_config.cfg"),
                wait_for_quorum: WaitForQuorum::Recovery,
                log_file_name: None,
                cmd_unix_domain_path: None,
            }
        );
        assert_eq!(c.cmd_address().to_string(), "127.0.0.2:50005");
    }

    #[test]
    fn the_containers_nodes_path_maps_to_the_configs_own_directory_outside_it() {
        let at = |dir: &str| {
            ImexConfig::parse(
                "c.cfg",
                "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n",
                Some(Path::new(dir)),
            )
            .unwrap()
            .node_config_file
        };
        assert_eq!(
            at("/etc/nvidia-imex"),
            PathBuf::from("/etc/nvidia-imex/nodes_config.cfg")
        );
        assert_eq!(
            at("/var/lib/cd/u1"),
            PathBuf::from("/var/lib/cd/u1/nodes_config.cfg")
        );
        let other = ImexConfig::parse(
            "c.cfg",
            "IMEX_NODE_CONFIG_FILE=/srv/n.cfg\n",
            Some(Path::new("/x")),
        )
        .unwrap();
        assert_eq!(other.node_config_file, PathBuf::from("/srv/n.cfg"));
    }

    #[test]
    fn a_bad_value_names_the_key_the_value_and_the_choices() {
        let err = ImexConfig::parse("c.cfg", "IMEX_WAIT_FOR_QUORUM=ALL\n", None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "c.cfg: IMEX_WAIT_FOR_QUORUM=\"ALL\" is invalid; valid: NONE, RECOVERY or FULL"
        );
        let err = ImexConfig::parse("c.cfg", "SERVER_PORT=70000\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SERVER_PORT=\"70000\"") && err.contains("0 to 65535"),
            "{err}"
        );
        let err = ImexConfig::parse("c.cfg", "just words\n", None)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "c.cfg:1: \"just words\" is not KEY=VALUE");
    }

    #[test]
    fn nodes_config_lists_ips_in_order_and_refuses_names() {
        assert_eq!(
            parse_nodes("n", "127.0.0.3\n\n# c\n127.0.0.2\n").unwrap(),
            vec![
                "127.0.0.3".parse::<IpAddr>().unwrap(),
                "127.0.0.2".parse().unwrap()
            ]
        );
        let err = parse_nodes("n", "node-a\n").unwrap_err().to_string();
        assert!(err.starts_with("n:1: \"node-a\" is not an IPv4"), "{err}");
    }
}
