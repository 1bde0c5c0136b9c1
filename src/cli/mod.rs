//! The command line: the top-level `Cli` and its verbs, one module per verb holding that verb's
//! flags (`clap::Args`) and its `run(args) -> anyhow::Result<ExitCode>`. Flags several verbs
//! share are declared once in [`flags`]; the runners' helpers are in [`common`].
//!
//! Exit codes: 0 success, 1 failure (an `Err` from `run`, rendered by `main`), 2 bad input.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub(crate) mod common;
pub(crate) mod flags;

mod capacity;
mod cel;
mod compute_domain_controller;
mod compute_domain_plugin;
mod demo;
mod doctor;
mod explain;
mod imex_daemon;
mod inventory;
mod kubelet_plugin;
mod sim_fault;

/// A Kubernetes DRA driver for NVIDIA GPUs, with a faithful simulated GPU node.
#[derive(Parser, Debug)]
#[command(name = "gpu-dra", version, about, long_about = None)]
pub(crate) struct Cli {
    /// The verb and its flags.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The verbs; the doc comment of each is its `--help` summary.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run the driver's pipeline on a simulated node, in-process, and explain each step.
    Demo(demo::DemoArgs),
    /// Show what a node has and the ResourceSlices it would publish.
    Inventory(inventory::InventoryArgs),
    /// Explain why claims do or do not fit a node: per request, per device, the first reason.
    /// Exit 0 when they fit, 1 when they do not, 2 on bad input.
    Explain(explain::ExplainArgs),
    /// Run the DRA kubelet plugin on this node: publish ResourceSlices, serve prepare/unprepare.
    KubeletPlugin(Box<kubelet_plugin::PluginArgs>),
    /// Run the ComputeDomain kubelet plugin (driver compute-domain.nvidia.com) on this node:
    /// IMEX channel and daemon devices, node labels, IMEX configs.
    ComputeDomainPlugin(Box<compute_domain_plugin::CdPluginArgs>),
    /// Inject a fault into a simulated node's shared state (under the simulator's lock): the
    /// sim backend reports it, and the simulated NVML library delivers the matching events.
    SimFault(sim_fault::SimFaultArgs),
    /// The cluster's GPUs per node, GPU and MIG profile: who holds what, and what is free.
    /// Exit 0, or 2 on bad input.
    Capacity(capacity::CapacityArgs),
    /// ComputeDomains: run this node's IMEX daemon (what the domain's DaemonSet pod runs):
    /// keep its ComputeDomainNode, the nodes config and `nvidia-imex` up to date.
    ImexDaemon(Box<imex_daemon::ImexDaemonArgs>),
    /// Is this node ready for GPU claims, and if not, what to fix: one line per check.
    /// Exit 0 when all are ok, 1 on a warning, 2 on a failure.
    Doctor(Box<doctor::DoctorArgs>),
    /// Run the ComputeDomain controller: per domain its claim templates, IMEX DaemonSet and
    /// status (docs/compute-domains.md).
    ComputeDomainController(compute_domain_controller::ComputeDomainControllerArgs),
    /// Evaluate one CEL selector against one device, as the scheduler would: prints `true`
    /// or `false` (exit 0), or `error: …` (exit 2).
    Cel(cel::CelArgs),
}

impl Command {
    /// The verb as typed on the command line, for the start-up log line.
    pub(crate) fn verb(&self) -> &'static str {
        match self {
            Command::Demo(_) => "demo",
            Command::Inventory(_) => "inventory",
            Command::Explain(_) => "explain",
            Command::KubeletPlugin(_) => "kubelet-plugin",
            Command::ComputeDomainPlugin(_) => "compute-domain-plugin",
            Command::Cel(_) => "cel",
            Command::SimFault(_) => "sim-fault",
            Command::Capacity(_) => "capacity",
            Command::Doctor(_) => "doctor",
            Command::ImexDaemon(_) => "imex-daemon",
            Command::ComputeDomainController(_) => "compute-domain-controller",
        }
    }
}

/// Runs the verb: its exit code (0, or the verb's own for "does not fit", "warning" or
/// "bad input").
///
/// Fails with the verb's error, which `main` prints as `error: …` and exits 1 with.
pub(crate) fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Inventory(args) => inventory::run(args),
        Command::KubeletPlugin(args) => kubelet_plugin::run(*args),
        Command::ComputeDomainPlugin(args) => compute_domain_plugin::run(*args),
        Command::ImexDaemon(args) => imex_daemon::run(*args),
        Command::SimFault(args) => sim_fault::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Capacity(args) => capacity::run(args),
        Command::Doctor(args) => doctor::run(*args),
        Command::ComputeDomainController(args) => compute_domain_controller::run(args),
        Command::Cel(args) => cel::run(args),
    }
}
