//! Simulated `nvidia-imex-ctl`, with the real tool's command line:
//! `nvidia-imex-ctl [-i <IP> <PORT> | -u <socket> | -c <config>] <-q|-N|-n|-s|-d|-m> [-H] [-j]
//! [-t <ms>]`, `-c /etc/nvidia-imex/config.cfg` assumed when no target is given.
//!
//! * `-q` prints the local daemon's state (`READY`, `WAITING_FOR_PEERS`, …) and exits 0; a
//!   daemon it cannot reach prints `UNAVAILABLE` and exits 1.
//! * `-N` asks every node of the nodes config (on its command port) and prints the node list
//!   with each node's state, the connectivity table (`C` connected, `N` never connected, `R`
//!   recovering, `I` unreachable) and the domain state: `UP` (every node ready and connected
//!   to every other), `DOWN` (no node reachable) or `DEGRADED`. `-j` prints the same as JSON.
//! * `-u <socket>` (also spelled `--u=<socket>`, as NVIDIA's DRA driver passes it) targets the
//!   command service on a Unix socket: a host's `nvidia-imex.service` with
//!   `IMEX_CMD_UNIX_DOMAIN_PATH`; only `-q` is answered there.
//! * `-n`, `-s`, `-d` and `-m` are not simulated: a one-line error, exit 2.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::config::{self, ImexConfig};

const USAGE: &str = "Usage: nvidia-imex-ctl [-i <IP> <PORT>|-u <unix domain socket path>|-c <nvidia-imex config.cfg path>] <-n|-N|-q|-s|-d|-m> [-t <timeout>]";

enum Target {
    Config(PathBuf),
    Address(SocketAddr),
    Socket(PathBuf),
}

/// Runs the simulated tool with `args` (argv without `argv[0]`); see the module docs for what
/// it prints and its exit codes.
pub fn run(args: &[String]) -> ExitCode {
    let mut target = Target::Config(PathBuf::from(config::DEFAULT_CONFIG_FILE));
    let mut action = None;
    let mut json = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-c" => match it.next() {
                Some(p) => target = Target::Config(PathBuf::from(p)),
                None => return usage("-c needs the nvidia-imex config path"),
            },
            "-i" => {
                let ip = it.next().and_then(|ip| ip.parse::<IpAddr>().ok());
                let port = it.next().and_then(|p| p.parse::<u16>().ok());
                match (ip, port) {
                    (Some(ip), Some(port)) => target = Target::Address(SocketAddr::new(ip, port)),
                    _ => return usage("-i needs an IP address and a port"),
                }
            }
            "-u" => match it.next() {
                Some(p) => target = Target::Socket(PathBuf::from(p)),
                None => return usage("-u needs the unix domain socket path"),
            },
            long if long.starts_with("--u=") => {
                target = Target::Socket(PathBuf::from(&long["--u=".len()..]));
            }
            "-q" | "-N" => action = Some(arg.clone()),
            "-j" => json = true,
            "-H" => {}
            "-t" => {
                if it.next().and_then(|t| t.parse::<u64>().ok()).is_none() {
                    return usage("-t needs a timeout in milliseconds");
                }
            }
            "-n" | "-s" | "-d" | "-m" => {
                eprintln!("nvidia-imex-ctl (simulated): {arg} is not simulated; use -q or -N");
                return ExitCode::from(2);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown option {other:?}")),
        }
    }
    match action.as_deref() {
        Some("-q") => query(&target),
        Some(_) => domain(&target, json),
        None => usage("one of -q or -N is required"),
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("nvidia-imex-ctl: {problem}\n{USAGE}");
    ExitCode::from(2)
}

/// Sends one command line and returns the answer's lines.
fn ask(addr: SocketAddr, command: &str) -> std::io::Result<Vec<String>> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    BufReader::new(stream).lines().collect()
}

fn state_of(lines: &[String]) -> Option<String> {
    lines
        .first()
        .and_then(|l| l.strip_prefix("STATE "))
        .map(str::to_string)
}

/// `-q` on a Unix socket: the host service's state, or `UNAVAILABLE` (exit 1).
fn query_socket(path: &std::path::Path) -> ExitCode {
    let asked = (|| {
        let mut stream = std::os::unix::net::UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"QUERY\n")?;
        BufReader::new(stream)
            .lines()
            .collect::<std::io::Result<Vec<String>>>()
    })();
    match asked.map(|l| state_of(&l)) {
        Ok(Some(state)) => {
            println!("{state}");
            ExitCode::SUCCESS
        }
        Ok(None) => unavailable(&path.display(), &"no answer"),
        Err(e) => unavailable(&path.display(), &e),
    }
}

fn query(target: &Target) -> ExitCode {
    let addr = match target {
        Target::Socket(path) => return query_socket(path),
        Target::Address(a) => *a,
        Target::Config(path) => match ImexConfig::load(path) {
            // Without a bind address the simulated daemon serves on $POD_IP (see simd), so
            // the query goes there too.
            Ok(c) => match std::env::var("POD_IP")
                .ok()
                .and_then(|p| p.parse::<IpAddr>().ok())
            {
                Some(ip) if c.cmd_bind_interface_ip.is_none() && c.bind_interface_ip.is_none() => {
                    SocketAddr::new(ip, c.cmd_port)
                }
                _ => c.cmd_address(),
            },
            Err(e) => {
                eprintln!("nvidia-imex-ctl: {e}");
                return ExitCode::from(1);
            }
        },
    };
    match ask(addr, "QUERY").map(|l| state_of(&l)) {
        Ok(Some(state)) => {
            println!("{state}");
            ExitCode::SUCCESS
        }
        Ok(None) => unavailable(&addr, &"no answer"),
        Err(e) => unavailable(&addr, &e),
    }
}

fn unavailable(addr: &dyn std::fmt::Display, why: &dyn std::fmt::Display) -> ExitCode {
    println!("UNAVAILABLE");
    eprintln!("nvidia-imex-ctl: the IMEX daemon's command service at {addr} is unreachable: {why}");
    ExitCode::from(1)
}

/// One node's answer to `NODES`: its state and its link letter to every node.
struct NodeRow {
    ip: IpAddr,
    state: String,
    links: Vec<(IpAddr, char)>,
}

fn domain(target: &Target, json: bool) -> ExitCode {
    let Target::Config(path) = target else {
        eprintln!("nvidia-imex-ctl: -N requires a config file (-c)");
        return ExitCode::from(2);
    };
    let (config, nodes) = match ImexConfig::load(path)
        .and_then(|c| config::load_nodes(&c.node_config_file).map(|n| (c, n)))
    {
        Ok(x) => x,
        Err(e) => {
            eprintln!("nvidia-imex-ctl: {e}");
            return ExitCode::from(1);
        }
    };
    let rows: Vec<NodeRow> = nodes
        .iter()
        .map(|ip| {
            let answer = ask(SocketAddr::new(*ip, config.cmd_port), "NODES").unwrap_or_default();
            let state = state_of(&answer).unwrap_or_else(|| "UNAVAILABLE".into());
            let links = answer
                .iter()
                .filter_map(|l| {
                    let mut w = l.strip_prefix("LINK ")?.split_whitespace();
                    Some((w.next()?.parse().ok()?, w.next()?.chars().next()?))
                })
                .collect();
            NodeRow {
                ip: *ip,
                state,
                links,
            }
        })
        .collect();
    let letter = |from: &NodeRow, to: IpAddr| {
        if from.state == "UNAVAILABLE" {
            return 'I';
        }
        from.links
            .iter()
            .find(|(ip, _)| *ip == to)
            .map(|(_, l)| *l)
            .unwrap_or('N')
    };
    let ready = rows.iter().filter(|r| r.state == "READY").count();
    let reachable = rows.iter().filter(|r| r.state != "UNAVAILABLE").count();
    let all_connected = rows
        .iter()
        .all(|r| nodes.iter().all(|to| letter(r, *to) == 'C'));
    let domain_state = if ready == rows.len() && all_connected {
        "UP"
    } else if reachable == 0 {
        "DOWN"
    } else {
        "DEGRADED"
    };
    if json {
        let value = serde_json::json!({
            "nodes": rows.iter().enumerate().map(|(i, r)| serde_json::json!({
                "index": i,
                "ip": r.ip.to_string(),
                "status": r.state,
                "connections": nodes.iter().map(|to| letter(r, *to).to_string()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "status": domain_state,
        });
        println!("{value}");
        return ExitCode::SUCCESS;
    }
    let mut out = String::from(
        "Connectivity Table Legend:\nI - Invalid - Node wasn't reachable, no connection status available\nN - Never Connected\nR - Recovering - Connection was lost, but clean up has not yet been triggered.\nC - Connected - Ready for operation\n\nNodes:\n",
    );
    for (i, r) in rows.iter().enumerate() {
        let version = if r.state == "UNAVAILABLE" { "" } else { "sim" };
        out.push_str(&format!(
            "Node #{i:<3} - {:<15} - {:<20} - Version: {version}\n",
            r.ip.to_string(),
            r.state
        ));
    }
    out.push_str("\n Nodes From\\To ");
    for i in 0..rows.len() {
        out.push_str(&format!(" {i:<3}"));
    }
    out.push('\n');
    for (i, r) in rows.iter().enumerate() {
        out.push_str(&format!("       {i:<8}"));
        for to in &nodes {
            out.push_str(&format!(" {:<3}", letter(r, *to)));
        }
        out.push('\n');
    }
    out.push_str(&format!("Domain State: {domain_state}\n"));
    print!("{out}");
    ExitCode::SUCCESS
}
