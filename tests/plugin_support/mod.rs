//! A node for the real `gpu-dra kubelet-plugin` binary: temp directories laid out as on a
//! kubelet host, a fake API server on a TCP port with a kubeconfig for it, and the plugin as a
//! child process that tests start, drive with [`KubeletClient`], signal and restart.
#![allow(dead_code)] // each test file and the bench use a different part

pub mod apicatalog;
pub mod apicrd;
pub mod apidomains;
pub mod apifaults;
pub mod apiserver;
pub mod cdnode;
pub mod claims;
pub mod disk;
#[path = "../nvml_sim_support/mod.rs"]
pub mod nvml_sim;
// Each support module stands alone, so a test takes only what it uses; one that takes two
// compiles the store twice, as two unrelated types it never mixes.
#[allow(clippy::duplicate_mod)]
#[path = "../api_support/objstore.rs"]
pub mod objstore;
pub mod probe;
pub mod sharing;
pub mod state;
pub mod tls;
#[allow(clippy::duplicate_mod)]
#[path = "../api_support/transport.rs"]
pub mod transport;

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_dra::kubelet::client::{DraApi, KubeletClient, KubeletVersions};

pub use apiserver::FakeApiServer;
pub use state::Snapshot;

/// Waits for start-up and exits are bounded so a broken plugin fails the test instead of
/// hanging it; the bound is generous because machines are noisy, never a measurement.
const PATIENCE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(5);

/// Selects the GPU backend the plugin runs: `sim` (default) or `nvml` (the production NVML
/// backend over the simulated NVML library, same node). `.ci/run` runs the plugin suites with
/// both.
pub const BACKEND_ENV: &str = "GPU_DRA_TEST_GPU_BACKEND";
/// The simulated node every plugin test runs on.
/// The `MALLOC_*` variables the Helm chart sets on the kubelet plugin's container, read from
/// its DaemonSet template (`name:` then `value:` lines), so a benchmark of what the chart
/// deploys runs with the chart's values and cannot drift from them. Panics when the template
/// has none: a bench that cannot run as the chart does must not report figures.
pub fn chart_malloc_env() -> &'static [(&'static str, &'static str)] {
    static ENV: std::sync::OnceLock<Vec<(&'static str, &'static str)>> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deployments/helm/gpu-dra/templates/daemonset.yaml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut lines = text.lines().map(str::trim);
        let mut env = Vec::new();
        while let Some(line) = lines.next() {
            if let Some(name) = line
                .strip_prefix("- name: ")
                .filter(|n| n.starts_with("MALLOC_"))
            {
                let value = lines
                    .next()
                    .and_then(|l| l.strip_prefix("value: "))
                    .unwrap_or_else(|| panic!("{name} without a value in {}", path.display()));
                env.push((name, value.trim_matches('"')));
            }
        }
        assert!(
            !env.is_empty(),
            "no MALLOC_* variable in {}",
            path.display()
        );
        env
    })
}

pub const PRESET: &str = "dgx-h100";

/// The `prepare` bench's node (64 devices, as in the reference driver's side-by-side
/// harness): 8 A100-80GB with 7 static 1g.10gb MIG devices each and 8 L4, so a prepare is the
/// plugin's own work (no MIG device is carved). Its node name is [`claims::NODE`].
pub const STATIC_MIG_NODE: &str = "\
nodeName: dgx-h100
gpus:
  - model: A100-SXM4-80GB
    count: 8
    mig: static
    migDevices: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]
  - model: L4
    count: 8
";

/// Writes [`STATIC_MIG_NODE`] into `node`'s directory; its path, for `--sim-node`.
pub fn static_mig_node_file(node: &Node) -> String {
    let file = node.root().join("bench-node.yaml");
    std::fs::write(&file, STATIC_MIG_NODE).expect("the node file");
    file.to_str().expect("a UTF-8 path").to_string()
}

/// Devices of [`STATIC_MIG_NODE`] a prepare only records (nothing is carved): GPU 0's seven
/// 1g.10gb MIG devices, then `full` whole L4s from `gpu-8` on (at most 8).
pub fn static_mig_devices(full: usize) -> Vec<String> {
    (0..7)
        .map(|i| format!("gpu-0-mig-1g10gb-{i}"))
        .chain((8..8 + full).map(|g| format!("gpu-{g}")))
        .collect()
}

/// Prepares `refs` in one call; every claim must succeed.
pub async fn prepare_all(kubelet: &mut KubeletClient, refs: &[gpu_dra::kubelet::ClaimRef]) {
    let got = kubelet.prepare(refs).await.expect("prepare");
    assert!(
        got.len() == refs.len() && got.values().all(Result::is_ok),
        "{got:?}"
    );
}

/// Unprepares `refs` in one call; every claim must succeed.
pub async fn unprepare_all(kubelet: &mut KubeletClient, refs: &[gpu_dra::kubelet::ClaimRef]) {
    let got = kubelet.unprepare(refs).await.expect("unprepare");
    assert!(
        got.len() == refs.len() && got.values().all(Result::is_ok),
        "{got:?}"
    );
}

/// Whether this run drives the plugin through the NVML backend.
pub fn nvml_backend() -> bool {
    match std::env::var(BACKEND_ENV).as_deref() {
        Ok("nvml") => true,
        Ok("sim") | Err(_) => false,
        Ok(other) => panic!("{BACKEND_ENV}={other:?}: valid choices are sim, nvml"),
    }
}

/// Signal numbers on Linux.
pub const SIGABRT: i32 = 6;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

/// A simulated kubelet host.
pub struct Node {
    dir: tempfile::TempDir,
    /// CDI specs in a directory of their own (another file system), when set.
    cdi_dir: Option<tempfile::TempDir>,
    /// Device metadata files in a directory of their own (`--device-metadata-dir`), when set.
    metadata_dir: Option<tempfile::TempDir>,
    runs: AtomicUsize,
    sim_node: String,
    /// The cluster's API server.
    pub api: FakeApiServer,
}

impl Drop for Node {
    /// MPS daemons are detached processes: a failing test must not leave them running.
    fn drop(&mut self) {
        sharing::reap(self.dir.path());
    }
}

impl Default for Node {
    fn default() -> Self {
        Self::new()
    }
}

impl Node {
    /// Fresh directories under the system's temp directory and an API server that knows
    /// Node `dgx-h100`.
    pub fn new() -> Node {
        Node::new_in(&std::env::temp_dir())
    }

    /// [`Node::new`] with the directories under `parent` (another file system).
    pub fn new_in(parent: &Path) -> Node {
        Node::with_api(parent, FakeApiServer::start(claims::NODE))
    }

    /// [`Node::new_in`] with its API server speaking TLS with client certificates, as a
    /// real kube-apiserver does.
    pub fn new_tls_in(parent: &Path) -> Node {
        Node::with_api(parent, FakeApiServer::start_tls(claims::NODE))
    }

    fn with_api(parent: &Path, api: FakeApiServer) -> Node {
        let dir = tempfile::tempdir_in(parent).expect("temp dir");
        api.write_kubeconfig(&dir.path().join("kubeconfig"));
        Node {
            dir,
            cdi_dir: None,
            metadata_dir: None,
            runs: AtomicUsize::new(0),
            sim_node: claims::NODE.to_string(),
            api,
        }
    }

    /// The same node with another simulated hardware: a preset name or a node file (its
    /// `nodeName` should be [`claims::NODE`], the node the claims are allocated on).
    pub fn with_sim_node(mut self, sim_node: impl Into<String>) -> Node {
        self.sim_node = sim_node.into();
        self
    }

    /// The same node with its CDI specs in a fresh directory under `parent`, as a node keeps
    /// `/var/run/cdi` on another file system (a tmpfs) than its state.
    pub fn with_cdi_in(mut self, parent: &Path) -> Node {
        self.cdi_dir = Some(tempfile::tempdir_in(parent).expect("CDI temp dir"));
        self
    }

    /// The same node with its device metadata files in a fresh directory under `parent`
    /// (`--device-metadata-dir`), as the chart keeps them on a tmpfs.
    pub fn with_metadata_in(mut self, parent: &Path) -> Node {
        self.metadata_dir = Some(tempfile::tempdir_in(parent).expect("metadata temp dir"));
        self
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn plugin_dir(&self) -> PathBuf {
        self.root().join("plugins/gpu.nvidia.com")
    }
    pub fn registry_dir(&self) -> PathBuf {
        self.root().join("registry")
    }
    pub fn cdi_root(&self) -> PathBuf {
        match &self.cdi_dir {
            Some(dir) => dir.path().to_path_buf(),
            None => self.root().join("cdi"),
        }
    }
    pub fn state_dir(&self) -> PathBuf {
        self.root().join("state")
    }
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir().join("gpu.nvidia.com-reg.sock")
    }
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }

    /// Runs `gpu-dra sim-fault --state-dir <this node's state dir> <args>` (a fault, a GPU
    /// added or removed, a load) and returns what it printed; panics with its stderr when it
    /// fails.
    pub fn sim_fault(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
            .arg("sim-fault")
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(args)
            .output()
            .expect("run gpu-dra sim-fault");
        assert!(
            out.status.success(),
            "sim-fault {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What a prepare or unprepare may have changed.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::read(&self.state_dir(), &self.cdi_root(), &self.plugin_dir())
    }

    /// The CDI spec of claim `uid`, if written.
    pub fn spec(&self, uid: &str) -> Option<String> {
        std::fs::read_to_string(self.cdi_root().join(state::spec_file(uid))).ok()
    }

    /// The plugin command line, as a DaemonSet would run it on this node (its simulated
    /// hardware: [`Node::with_sim_node`], `dgx-h100` by default).
    pub fn command(&self) -> Command {
        self.command_on(&self.sim_node)
    }

    /// [`Node::command`] on another simulated node (a preset name or a node file) whose
    /// node name is still `dgx-h100`.
    pub fn command_on(&self, sim_node: &str) -> Command {
        let mut command = self.chart_command_on(sim_node);
        // Tests want the inventory watcher and supervision to react within a second.
        command.args(["--inventory-interval", "1"]);
        command
    }

    /// [`Node::command_on`] with the intervals the Helm chart sets (inventory every 10 s,
    /// telemetry every 10 s, holders every 30 s: the flags' defaults), as a benchmark of what
    /// the chart deploys wants it.
    pub fn chart_command_on(&self, sim_node: &str) -> Command {
        self.chart_command_with(sim_node, nvml_backend())
    }

    /// [`Node::chart_command_on`] on the NVML backend over the simulated library, whatever
    /// backend this run tests: for tests of what the plugin asks NVML.
    pub fn nvml_chart_command_on(&self, sim_node: &str) -> Command {
        self.chart_command_with(sim_node, true)
    }

    fn chart_command_with(&self, sim_node: &str, nvml: bool) -> Command {
        // A bench may measure another build of the same binary (e.g. the image's dist build).
        let binary = std::env::var_os("GPU_DRA_PLUGIN_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_gpu-dra").into());
        let mut command = self.node_command(
            binary,
            "kubelet-plugin",
            &self.plugin_dir(),
            &self.state_dir(),
        );
        if let Some(dir) = &self.metadata_dir {
            command.arg("--device-metadata-dir").arg(dir.path());
        }
        if nvml {
            // The same node through libnvidia-ml's ABI: the simulated library shares the
            // simulator's state directory the sim backend would use (`<state-dir>/sim`).
            command
                .args(["--gpu-backend", "nvml", "--simulated-host"])
                .arg("--nvml-lib")
                .arg(nvml_sim::library())
                .args(["--gpu-mig-policies", &nvml_sim::policies_flag(sim_node)])
                .env("GPU_DRA_SIM_NODE", sim_node)
                .env("GPU_DRA_SIM_STATE_DIR", self.state_dir().join("sim"));
        } else {
            command.args(["--gpu-backend", "sim", "--sim-node", sim_node]);
        }
        command
    }

    /// `binary verb` with the node flags both kubelet plugins take, pointing at this node's
    /// directories and API server.
    pub fn node_command(
        &self,
        binary: impl AsRef<std::ffi::OsStr>,
        verb: &str,
        plugin_dir: &Path,
        state_dir: &Path,
    ) -> Command {
        let mut command = Command::new(binary);
        command
            .arg(verb)
            .args(["--node-name", claims::NODE])
            .arg("--kubeconfig")
            .arg(self.root().join("kubeconfig"))
            .arg("--plugin-dir")
            .arg(plugin_dir)
            .arg("--registry-dir")
            .arg(self.registry_dir())
            .arg("--cdi-root")
            .arg(self.cdi_root())
            .arg("--state-dir")
            .arg(state_dir)
            // Tests run side by side: each plugin takes a free port (the log says which).
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env_remove(gpu_dra::crashpoint::ENV)
            .env_remove("GPU_DRA_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command
    }

    /// Starts the plugin with extra environment, without waiting for it.
    pub fn spawn_with(&self, env: &[(&str, &str)]) -> Plugin {
        self.spawn_command(self.command(), env)
    }

    /// Starts `command` (from [`Node::command`] or [`Node::command_on`]) with extra
    /// environment, without waiting for it; its stderr goes to the node's next log file.
    pub fn spawn_command(&self, command: Command, env: &[(&str, &str)]) -> Plugin {
        self.spawn_registering_at(command, env, self.registration_socket())
    }

    /// [`Node::spawn_command`] for a plugin whose registration socket is `registration`.
    pub fn spawn_registering_at(
        &self,
        mut command: Command,
        env: &[(&str, &str)],
        registration: PathBuf,
    ) -> Plugin {
        let runs = self.runs.fetch_add(1, Ordering::Relaxed);
        let log = self.root().join(format!("plugin-{runs}.log"));
        command.stderr(File::create(&log).expect("log file"));
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().expect("start the gpu-dra plugin");
        Plugin {
            child,
            log,
            registration,
        }
    }

    /// Starts the plugin and waits until its registration socket answers GetInfo.
    pub async fn start(&self) -> Plugin {
        self.start_with(&[]).await
    }

    /// [`Node::start`] with extra environment.
    pub async fn start_with(&self, env: &[(&str, &str)]) -> Plugin {
        let mut plugin = self.spawn_with(env);
        plugin.wait_registrable().await;
        plugin
    }
}

/// The plugin process. Killed when dropped if still running.
pub struct Plugin {
    child: Child,
    log: PathBuf,
    registration: PathBuf,
}

impl Plugin {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Everything the plugin logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the registration socket answers GetInfo; panics with the log if the process
    /// exits first.
    pub async fn wait_registrable(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the plugin exited during start-up ({status}):\n{}",
                    self.log()
                );
            }
            if self.registration.exists()
                && let Ok(mut client) = KubeletClient::connect(&self.registration).await
                && client.get_info().await.is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the plugin did not register:\n{}",
                self.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Registers as a kubelet speaking `api` would: GetInfo, NotifyRegistrationStatus, connect.
    pub async fn register(&self, api: DraApi) -> KubeletClient {
        let versions = KubeletVersions {
            dra: vec![api],
            ..KubeletVersions::default()
        };
        match KubeletClient::register(&self.registration, &versions).await {
            Ok(client) => client,
            Err(e) => panic!("registration failed: {e:?}\n{}", self.log()),
        }
    }

    /// Sends `signal` (by number) with the `kill` utility.
    pub fn signal(&self, signal: i32) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Waits for the process to end; panics with the log if it does not. Async, so the
    /// test's own connections keep answering the plugin (a graceful HTTP/2 shutdown waits for
    /// the peer's acknowledgement).
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the plugin") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the plugin did not exit:\n{}",
                self.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.wait_exit().await
    }

    /// The signal that ended the process, if one did.
    pub fn ended_by(status: &ExitStatus) -> Option<i32> {
        status.signal()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `ready` until it returns `Some`, panicking with `what` after [`PATIENCE`].
pub async fn eventually<T>(what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}
