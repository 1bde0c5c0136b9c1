//! Simulated IMEX nodes on one machine: each on its own loopback address (127.0.0.x, which
//! Linux routes without setup), with its own config dir, driven through the real command
//! lines (`nvidia-imex -c`, `nvidia-imex-ctl -q|-N`).
#![allow(dead_code)] // each test file uses a different part

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The simulated tools, linked into `dir`: (nvidia-imex, nvidia-imex-ctl).
pub fn tools(dir: &Path) -> (PathBuf, PathBuf) {
    gpu_dra::compute_domain::imex::install_simulated(
        Path::new(env!("CARGO_BIN_EXE_gpu-dra")),
        &dir.join("bin"),
    )
    .expect("install simulated IMEX tools")
}

/// Writes `<dir>/config.cfg` for a node bound to `ip`, as the plugin would (plus the bind
/// address, since every loopback address is this machine's), and the nodes config.
pub fn write_config(dir: &Path, ip: &str, quorum: &str, nodes: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("config.cfg");
    std::fs::write(
        &config,
        format!(
            "# simulated node {ip}\nBIND_INTERFACE_IP={ip}\nSERVER_PORT=50000\nIMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=50005\nIMEX_WAIT_FOR_QUORUM={quorum}\nIMEX_NODE_CONFIG_FILE={}\nLOG_FILE_NAME={}\n",
            dir.join("nodes_config.cfg").display(),
            dir.join("imex.log").display()
        ),
    )
    .unwrap();
    write_nodes(dir, nodes);
    config
}

/// Rewrites `<dir>/nodes_config.cfg`.
pub fn write_nodes(dir: &Path, nodes: &[&str]) {
    let text: String = nodes.iter().map(|n| format!("{n}\n")).collect();
    std::fs::write(dir.join("nodes_config.cfg"), text).unwrap();
}

/// A running simulated daemon, killed when dropped.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nvidia-imex -c <config>`.
pub fn start(imex: &Path, config: &Path) -> Daemon {
    Daemon(
        Command::new(imex)
            .arg("-c")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvidia-imex"),
    )
}

/// Runs `nvidia-imex-ctl` with `args`: (exit code, stdout).
pub fn ctl(ctl: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(ctl)
        .args(args)
        .output()
        .expect("run nvidia-imex-ctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Polls `check` every 50 ms until it returns true; panics with `what` after 15 s.
pub fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `nvidia-imex-ctl -c <config> -q`, trimmed.
pub fn query(ctl_bin: &Path, config: &Path) -> String {
    ctl(ctl_bin, &["-c", config.to_str().unwrap(), "-q"])
        .1
        .trim()
        .to_string()
}

/// The connectivity row of node `from` in `-N` output (letters to each node).
pub fn row(domain: &str, from: usize) -> Vec<String> {
    domain
        .lines()
        .skip_while(|l| !l.contains("Nodes From"))
        .nth(from + 1)
        .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
        .unwrap_or_default()
}

/// A loopback address.
pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
