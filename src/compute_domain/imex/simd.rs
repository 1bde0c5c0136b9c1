//! Simulated `nvidia-imex`: `nvidia-imex -c <config>` runs in the foreground (the container
//! way), listens for peers on `BIND_INTERFACE_IP:SERVER_PORT`, connects to every other node of
//! the nodes config over TCP with a one-line handshake, serves `nvidia-imex-ctl` on the command
//! port, re-reads the nodes config on SIGUSR1 and exits cleanly on SIGTERM, SIGINT or SIGQUIT.
//!
//! Wire (ours; the real daemon's protocol is private): a peer sends
//! `IMEXSIM/1 HELLO <its ip> <pid>` and gets `IMEXSIM/1 WELCOME <ip> <pid>`, or
//! `IMEXSIM/1 REJECT node-map` when it is not in this node's nodes config; the connection is
//! then held open, so either side sees the other's death as end of stream. The command port
//! answers one line, `QUERY` with `STATE <state>`, `NODES` with the state, one
//! `LINK <ip> <C|N|R>` line per node and `END`.
//!
//! Host-service mode: with `IMEX_CMD_UNIX_DOMAIN_PATH=<socket>` (and `IMEX_CMD_ENABLED=1`) the
//! command service also answers on that Unix socket, as a host's `nvidia-imex.service` does
//! for a driver that runs `nvidia-imex-ctl -q --u=<socket>` (host-managed IMEX). The socket is
//! removed on a clean shutdown.
//!
//! Binding: without `BIND_INTERFACE_IP` the real daemon takes the nodes-config address that
//! is one of the host's; the simulator takes `$POD_IP` when it is listed (nodes simulated on
//! one machine share every loopback address), else the first listed address it can bind.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::config::{self, ImexConfig, WaitForQuorum};

/// Protocol tag of the peer handshake.
pub(super) const TAG: &str = "IMEXSIM/1";
/// How long a peer waits between connection attempts.
const RETRY: Duration = Duration::from_millis(200);

/// One node's view of a peer connection, as `nvidia-imex-ctl -N` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
    /// `N`: never connected.
    Never,
    /// `C`: connected.
    Connected,
    /// `R`: connection lost, clean-up not triggered (the default without a grace time).
    Recovering,
}

impl Link {
    pub(super) fn letter(self) -> char {
        match self {
            Link::Never => 'N',
            Link::Connected => 'C',
            Link::Recovering => 'R',
        }
    }
}

struct Daemon {
    me: IpAddr,
    config: ImexConfig,
    nodes: Mutex<Vec<IpAddr>>,
    links: Mutex<BTreeMap<IpAddr, Link>>,
    log: Option<PathBuf>,
}

impl Daemon {
    fn log(&self, message: &str) {
        let line = format!("[nvidia-imex {}] {message}\n", self.me);
        match &self.log {
            Some(path) => {
                if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
                    let _ = f.write_all(line.as_bytes());
                }
            }
            None => eprint!("{line}"),
        }
    }

    fn set_link(&self, peer: IpAddr, link: Link) {
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, link);
    }

    fn peers(&self) -> Vec<IpAddr> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.iter().copied().filter(|ip| *ip != self.me).collect()
    }

    /// `READY`, or what it still waits for.
    fn state(&self) -> &'static str {
        match self.config.wait_for_quorum {
            WaitForQuorum::None | WaitForQuorum::Recovery => "READY",
            WaitForQuorum::Full => {
                let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
                let all = self
                    .peers()
                    .iter()
                    .all(|p| links.get(p) == Some(&Link::Connected));
                if all { "READY" } else { "WAITING_FOR_PEERS" }
            }
        }
    }

    /// The `NODES` answer: state, then every node's link from here.
    fn nodes_answer(&self) -> String {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut out = format!("STATE {}\n", self.state());
        for ip in nodes {
            let link = if ip == self.me {
                Link::Connected
            } else {
                links.get(&ip).copied().unwrap_or(Link::Never)
            };
            out.push_str(&format!("LINK {ip} {}\n", link.letter()));
        }
        out.push_str("END\n");
        out
    }
}

const USAGE: &str = "usage: nvidia-imex [-c <config file>] [-p <port>]";

/// Runs the simulated daemon with `args` (argv without `argv[0]`) until a terminating signal;
/// exit 0 on a clean shutdown, 1 on a bad command line, config or bind failure (the message on
/// stderr names the key or address).
pub fn run(args: &[String]) -> ExitCode {
    let mut config_path = PathBuf::from(config::DEFAULT_CONFIG_FILE);
    let mut port_override = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-c" | "--config" => match it.next() {
                Some(p) => config_path = PathBuf::from(p),
                None => return usage("-c needs a config file"),
            },
            "-p" | "--port" => match it.next().and_then(|p| p.parse::<u16>().ok()) {
                Some(p) => port_override = Some(p),
                None => return usage("-p needs a TCP port, 0 to 65535"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown option {other:?}")),
        }
    }
    let mut config = match ImexConfig::load(&config_path) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if let Some(port) = port_override {
        config.server_port = port;
    }
    let nodes = match config::load_nodes(&config.node_config_file) {
        Ok(n) => n,
        Err(e) => return fail(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    runtime.block_on(serve(config, nodes))
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("nvidia-imex: {problem}\n{USAGE}");
    ExitCode::from(1)
}

fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("nvidia-imex: {e}");
    ExitCode::from(1)
}

/// The address to serve peers on, and its listener.
async fn bind(config: &ImexConfig, nodes: &[IpAddr]) -> Result<(IpAddr, TcpListener), String> {
    let port = config.server_port;
    if let Some(ip) = config.bind_interface_ip {
        let l = TcpListener::bind((ip, port))
            .await
            .map_err(|e| format!("BIND_INTERFACE_IP={ip}: listening on {ip}:{port}: {e}"))?;
        return Ok((ip, l));
    }
    let pod_ip = std::env::var("POD_IP")
        .ok()
        .and_then(|p| p.parse::<IpAddr>().ok())
        .filter(|ip| nodes.contains(ip));
    for ip in pod_ip.into_iter().chain(nodes.iter().copied()) {
        if let Ok(l) = TcpListener::bind((ip, port)).await {
            return Ok((ip, l));
        }
    }
    Err(format!(
        "BIND_INTERFACE_IP is empty and no address of the nodes config ({}) can be bound on port {port}",
        nodes
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

async fn serve(config: ImexConfig, nodes: Vec<IpAddr>) -> ExitCode {
    let (me, peer_listener) = match bind(&config, &nodes).await {
        Ok(b) => b,
        Err(e) => return fail(&e),
    };
    let cmd_listener = if config.cmd_enabled {
        let addr = SocketAddr::new(config.cmd_bind_interface_ip.unwrap_or(me), config.cmd_port);
        match TcpListener::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => return fail(&format!("IMEX_CMD_PORT: listening on {addr}: {e}")),
        }
    } else {
        None
    };
    let daemon = Arc::new(Daemon {
        me,
        log: config.log_file_name.clone(),
        config,
        nodes: Mutex::new(nodes),
        links: Mutex::new(BTreeMap::new()),
    });
    daemon.log(&format!(
        "listening on {me}:{}, IMEX_WAIT_FOR_QUORUM={}",
        daemon.config.server_port,
        daemon.config.wait_for_quorum.as_str()
    ));
    tokio::spawn(accept_peers(daemon.clone(), peer_listener));
    if let Some(l) = cmd_listener {
        tokio::spawn(accept_commands(daemon.clone(), l));
    }
    let host_socket = match (
        &daemon.config.cmd_unix_domain_path,
        daemon.config.cmd_enabled,
    ) {
        (Some(path), true) => {
            let _ = std::fs::remove_file(path);
            match tokio::net::UnixListener::bind(path) {
                Ok(l) => {
                    daemon.log(&format!("command service on {}", path.display()));
                    tokio::spawn(accept_unix_commands(daemon.clone(), l));
                    Some(path.clone())
                }
                Err(e) => {
                    return fail(&format!(
                        "IMEX_CMD_UNIX_DOMAIN_PATH: listening on {}: {e}",
                        path.display()
                    ));
                }
            }
        }
        _ => None,
    };
    let mut connectors: BTreeMap<IpAddr, JoinHandle<()>> = BTreeMap::new();
    reconcile(&daemon, &mut connectors);
    let code = signals(&daemon, &mut connectors).await;
    if let Some(path) = host_socket {
        let _ = std::fs::remove_file(path);
    }
    code
}

/// Starts a connector for every new peer and stops those of removed ones.
fn reconcile(daemon: &Arc<Daemon>, connectors: &mut BTreeMap<IpAddr, JoinHandle<()>>) {
    let peers = daemon.peers();
    connectors.retain(|ip, task| {
        let keep = peers.contains(ip);
        if !keep {
            task.abort();
        }
        keep
    });
    let mut links = daemon.links.lock().unwrap_or_else(|p| p.into_inner());
    links.retain(|ip, _| peers.contains(ip));
    drop(links);
    for peer in peers {
        connectors
            .entry(peer)
            .or_insert_with(|| tokio::spawn(connect_peer(daemon.clone(), peer)));
    }
}

#[cfg(unix)]
async fn signals(
    daemon: &Arc<Daemon>,
    connectors: &mut BTreeMap<IpAddr, JoinHandle<()>>,
) -> ExitCode {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut usr1), Ok(mut term), Ok(mut int), Ok(mut quit)) = (
        signal(SignalKind::user_defined1()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::quit()),
    ) else {
        return fail(&"installing signal handlers failed");
    };
    loop {
        tokio::select! {
            _ = usr1.recv() => {
                match config::load_nodes(&daemon.config.node_config_file) {
                    Ok(nodes) => {
                        daemon.log(&format!("SIGUSR1: {} node(s) in the nodes config", nodes.len()));
                        *daemon.nodes.lock().unwrap_or_else(|p| p.into_inner()) = nodes;
                        reconcile(daemon, connectors);
                    }
                    Err(e) => daemon.log(&format!("SIGUSR1: keeping the old nodes config: {e}")),
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = quit.recv() => break,
        }
    }
    daemon.log("shutting down");
    ExitCode::SUCCESS
}

/// Keeps one outgoing connection to `peer`: connect, handshake, hold until it drops, retry.
async fn connect_peer(daemon: Arc<Daemon>, peer: IpAddr) {
    let port = daemon.config.server_port;
    // A refusal repeats every retry until the peer's nodes config changes: log it once.
    let mut refused = false;
    loop {
        let attempt =
            tokio::time::timeout(Duration::from_secs(1), TcpStream::connect((peer, port)));
        if let Ok(Ok(stream)) = attempt.await {
            let (read, mut write) = stream.into_split();
            let hello = format!("{TAG} HELLO {} {}\n", daemon.me, std::process::id());
            let mut reader = BufReader::new(read);
            let mut answer = String::new();
            let ok = write.write_all(hello.as_bytes()).await.is_ok()
                && matches!(
                    tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut answer)).await,
                    Ok(Ok(n)) if n > 0
                );
            if ok && answer.starts_with(&format!("{TAG} WELCOME ")) {
                refused = false;
                daemon.set_link(peer, Link::Connected);
                daemon.log(&format!("connected to {peer}"));
                let mut sink = [0u8; 64];
                while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
                daemon.set_link(peer, Link::Recovering);
                daemon.log(&format!("lost connection to {peer}"));
            } else if answer.starts_with(&format!("{TAG} REJECT")) && !refused {
                refused = true;
                daemon.log(&format!("{peer} refused us: {}", answer.trim()));
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn accept_peers(daemon: Arc<Daemon>, listener: TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut reader = BufReader::new(read);
            let mut hello = String::new();
            if reader.read_line(&mut hello).await.unwrap_or(0) == 0 {
                return;
            }
            let mut words = hello.split_whitespace();
            let from = match (words.next(), words.next(), words.next()) {
                (Some(TAG), Some("HELLO"), Some(ip)) => ip.parse::<IpAddr>().ok(),
                _ => None,
            };
            let known = from.is_some_and(|ip| {
                daemon
                    .nodes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&ip)
            });
            let reply = if known {
                format!("{TAG} WELCOME {} {}\n", daemon.me, std::process::id())
            } else {
                format!("{TAG} REJECT node-map\n")
            };
            if write.write_all(reply.as_bytes()).await.is_err() || !known {
                return;
            }
            let mut sink = [0u8; 64];
            while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
        });
    }
}

async fn accept_commands(daemon: Arc<Daemon>, listener: TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let (read, write) = stream.into_split();
            command(&daemon, read, write).await;
        });
    }
}

/// The command service on the host socket (`IMEX_CMD_UNIX_DOMAIN_PATH`).
async fn accept_unix_commands(daemon: Arc<Daemon>, listener: tokio::net::UnixListener) {
    while let Ok((stream, _)) = listener.accept().await {
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let (read, write) = stream.into_split();
            command(&daemon, read, write).await;
        });
    }
}

/// Answers one command line.
async fn command(
    daemon: &Daemon,
    read: impl tokio::io::AsyncRead + Unpin,
    mut write: impl tokio::io::AsyncWrite + Unpin,
) {
    let mut line = String::new();
    let _ = BufReader::new(read).read_line(&mut line).await;
    let answer = match line.trim() {
        "QUERY" => format!("STATE {}\n", daemon.state()),
        "NODES" => daemon.nodes_answer(),
        other => format!("ERROR unknown command {other:?}\n"),
    };
    let _ = write.write_all(answer.as_bytes()).await;
}
