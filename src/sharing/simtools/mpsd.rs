//! Simulated `nvidia-cuda-mps-control`: `-d` starts a detached daemon listening on
//! `<pipe>/control` (a Unix socket, one command per connection), `-f` is that daemon in the
//! foreground, and no argument is the client that sends stdin commands and prints answers.
//! `-d -M` / `-f -M` run the daemon in multi-user mode (NVIDIA's DRA driver's spelling); any
//! other spelling (`-m`, `--multiuser`, `-multiuser-server`, …) is refused with exit status 1,
//! so a driver that sends the wrong flag fails here as it would on a node that lacks it.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{INTERNAL_ENV, Tool, record};
use crate::sharing::commands::MULTI_USER_FLAG;
use crate::sharing::procfs::{process_alive, read_pid};

const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

pub(super) fn run(args: &[String]) -> ExitCode {
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => client(),
        ["-d"] => {
            record(Tool::MpsControl, args, Vec::new());
            start_detached(false)
        }
        ["-d", MULTI_USER_FLAG] => {
            record(Tool::MpsControl, args, Vec::new());
            start_detached(true)
        }
        ["-f"] => {
            record(Tool::MpsControl, args, Vec::new());
            foreground(false)
        }
        ["-f", MULTI_USER_FLAG] => {
            record(Tool::MpsControl, args, Vec::new());
            foreground(true)
        }
        _ => {
            record(Tool::MpsControl, args, Vec::new());
            println!("Invalid arguments; usage: nvidia-cuda-mps-control [-d [-M] | -f [-M]]");
            ExitCode::from(1)
        }
    }
}

fn dir_from_env(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(default), PathBuf::from)
}

fn pipe_dir() -> PathBuf {
    dir_from_env("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
}

fn log_dir() -> PathBuf {
    dir_from_env("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
}

/// Client mode: each stdin line is one command; answers go to stdout.
fn client() -> ExitCode {
    let commands: Vec<String> = std::io::stdin()
        .lock()
        .lines()
        .map_while(Result::ok)
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    record(Tool::MpsControl, &[], commands.clone());
    let socket = pipe_dir().join("control");
    for command in commands {
        match ask(&socket, &command) {
            Ok(answer) if answer.is_empty() => {}
            Ok(answer) => println!("{}", answer.trim_end()),
            Err(_) => {
                eprintln!("Cannot find MPS control daemon process");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}

fn ask(socket: &Path, command: &str) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// `-d`: start a detached copy in the foreground mode (`-f`, with `-M` when `multi_user`) and
/// return once it listens.
fn start_detached(multi_user: bool) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            println!("Cannot start daemon: {e}");
            return ExitCode::from(1);
        }
    };
    let mut command = Command::new(exe);
    command.arg0(Tool::MpsControl.name()).arg("-f");
    if multi_user {
        command.arg(MULTI_USER_FLAG);
    }
    let spawned = command
        .env(INTERNAL_ENV, "1")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            println!("Cannot start daemon: {e}");
            return ExitCode::from(1);
        }
    };
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "ready" {
        return ExitCode::SUCCESS;
    }
    let _ = child.wait();
    let reason = line
        .trim()
        .strip_prefix("error: ")
        .unwrap_or("daemon exited");
    println!("{reason}");
    ExitCode::from(1)
}

/// `-f`: the daemon itself. Tells a `-d` parent "ready" (or "error: …") on stdout.
fn foreground(multi_user: bool) -> ExitCode {
    let (pipe, log) = (pipe_dir(), log_dir());
    let fail = |msg: String| {
        println!("error: {msg}");
        ExitCode::from(1)
    };
    for dir in [&pipe, &log] {
        if let Err(e) = fs::create_dir_all(dir) {
            return fail(format!("cannot create {}: {e}", dir.display()));
        }
    }
    let pid_file = pipe.join(PID_FILE);
    if let Some(pid) = read_pid(&pid_file)
        && pid != std::process::id()
        && process_alive(Path::new("/proc"), pid)
    {
        return fail("An instance of this daemon is already running".into());
    }
    let socket = pipe.join("control");
    let _ = fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", socket.display())),
    };
    if let Err(e) = fs::write(&pid_file, format!("{}\n", std::process::id())) {
        return fail(format!("cannot write {}: {e}", pid_file.display()));
    }
    let log_file = log.join("control.log");
    let journal = |text: &str| append_log(&log_file, text);
    let mode = if multi_user {
        " in multi-user mode"
    } else {
        ""
    };
    journal(&format!(
        "Starting control daemon{mode} using socket {}",
        socket.display()
    ));
    let mut daemon = Daemon::from_env();
    println!("ready");
    let _ = std::io::stdout().flush();
    watch_socket(socket.clone());
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            continue;
        }
        let command = line.trim();
        journal(&format!("Cmd:{command}"));
        let reply = daemon.handle(command);
        if !reply.answer.is_empty() {
            let _ = stream.write_all(format!("{}\n", reply.answer).as_bytes());
        }
        drop(stream);
        if reply.quit {
            let _ = fs::remove_file(&pid_file);
            let _ = fs::remove_file(&socket);
            journal("Exit");
            return ExitCode::SUCCESS;
        }
    }
    ExitCode::SUCCESS
}

/// A daemon whose directory was removed without `quit` (a test that panicked, a manual
/// `rm -rf`) exits instead of lingering.
fn watch_socket(socket: PathBuf) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(500));
            if !socket.exists() {
                std::process::exit(0);
            }
        }
    });
}

fn append_log(path: &Path, text: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!(
        "[{}.{:03} Control {}] {text}\n",
        now.as_secs(),
        now.subsec_millis(),
        std::process::id()
    );
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}

/// The daemon's settings: defaults for the servers it would spawn.
#[derive(Debug, Clone, PartialEq)]
struct Daemon {
    devices: Vec<String>,
    active_thread_percentage: f64,
    pinned_mib: BTreeMap<usize, u64>,
}

#[derive(Debug, PartialEq)]
struct Reply {
    answer: String,
    quit: bool,
}

impl Daemon {
    fn from_env() -> Daemon {
        let devices = std::env::var("CUDA_VISIBLE_DEVICES")
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let active_thread_percentage = std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100.0);
        Daemon {
            devices,
            active_thread_percentage,
            pinned_mib: BTreeMap::new(),
        }
    }

    fn handle(&mut self, command: &str) -> Reply {
        let words: Vec<&str> = command.split_whitespace().collect();
        let answer = |text: String| Reply {
            answer: text,
            quit: false,
        };
        match words[..] {
            ["get_default_active_thread_percentage"] => {
                answer(format!("{:.1}", self.active_thread_percentage))
            }
            ["set_default_active_thread_percentage", pct] => match pct.parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => {
                    self.active_thread_percentage = p;
                    answer(String::new())
                }
                _ => answer(format!("Invalid active thread percentage {pct}")),
            },
            ["set_default_device_pinned_mem_limit", dev, value] => {
                match (self.ordinal(dev), parse_limit(value)) {
                    (Some(i), Some(mib)) => {
                        self.pinned_mib.insert(i, mib);
                        answer(String::new())
                    }
                    (None, _) => answer(format!("Invalid device {dev}")),
                    (_, None) => answer(format!("Invalid memory limit {value}")),
                }
            }
            ["get_default_device_pinned_mem_limit", dev] => match self.ordinal(dev) {
                Some(i) => answer(format!("{}M", self.pinned_mib.get(&i).unwrap_or(&0))),
                None => answer(format!("Invalid device {dev}")),
            },
            ["get_server_list"] => answer(String::new()),
            ["quit"] => Reply {
                answer: String::new(),
                quit: true,
            },
            _ => answer(format!("Invalid command: {command}")),
        }
    }

    /// An ordinal into `CUDA_VISIBLE_DEVICES`, or one of its UUIDs.
    fn ordinal(&self, dev: &str) -> Option<usize> {
        match dev.parse::<usize>() {
            Ok(i) => (i < self.devices.len()).then_some(i),
            Err(_) => self.devices.iter().position(|d| d == dev),
        }
    }
}

/// `<n>M` or `<n>G` in MiB.
fn parse_limit(value: &str) -> Option<u64> {
    let (n, factor) = match value.chars().last()? {
        'M' => (&value[..value.len() - 1], 1),
        'G' => (&value[..value.len() - 1], 1024),
        _ => return None,
    };
    n.parse::<u64>().ok().map(|n| n * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon() -> Daemon {
        Daemon {
            devices: vec!["GPU-aa".into(), "MIG-bb".into()],
            active_thread_percentage: 100.0,
            pinned_mib: BTreeMap::new(),
        }
    }

    #[test]
    fn limits_set_by_ordinal_or_uuid_are_read_back_in_mib() {
        let mut d = daemon();
        let answers: Vec<String> = [
            "set_default_active_thread_percentage 25",
            "get_default_active_thread_percentage",
            "set_default_device_pinned_mem_limit 0 2G",
            "set_default_device_pinned_mem_limit MIG-bb 512M",
            "get_default_device_pinned_mem_limit GPU-aa",
            "get_default_device_pinned_mem_limit 1",
            "set_default_device_pinned_mem_limit 2 1M",
            "bogus",
        ]
        .iter()
        .map(|c| d.handle(c).answer)
        .collect();
        let want = [
            "",
            "25.0",
            "",
            "",
            "2048M",
            "512M",
            "Invalid device 2",
            "Invalid command: bogus",
        ];
        assert_eq!(answers, want.map(String::from).to_vec());
    }

    #[test]
    fn quit_ends_the_daemon() {
        assert!(daemon().handle("quit").quit);
    }
}
