//! The `gpu-dra` binary: flag parsing and the edge where library errors become messages and
//! exit codes (0 success, 1 failure, 2 bad input). The verbs' flags and runners are in `cli/`,
//! one module per verb.

use std::process::ExitCode;

use clap::Parser;
use gpu_dra::logging;
use gpu_dra::sharing::simtools;

mod cli;

use cli::{Cli, Command};

fn main() -> ExitCode {
    // Run as `nvidia-smi` or `nvidia-cuda-mps-control` (symlinks made by the simulated tools),
    // the binary is that tool.
    let mut argv = std::env::args_os();
    let argv0 = argv.next().unwrap_or_default();
    if let Some(tool) = simtools::personality(&argv0) {
        let args = argv.map(|a| a.to_string_lossy().into_owned()).collect();
        return simtools::run(tool, args);
    }
    // Likewise `nvidia-imex` / `nvidia-imex-ctl` (compute_domain::imex::install_simulated).
    if let Some(tool) = gpu_dra::compute_domain::imex::personality(&argv0) {
        let args = argv.map(|a| a.to_string_lossy().into_owned()).collect();
        return gpu_dra::compute_domain::imex::run(tool, args);
    }
    // And `fmpm` (gpu_dra::fabric_manager::sim::install).
    if gpu_dra::fabric_manager::sim::personality(&argv0) {
        let args: Vec<String> = argv.map(|a| a.to_string_lossy().into_owned()).collect();
        return gpu_dra::fabric_manager::sim::run(&args);
    }
    let cli = Cli::parse();
    let (format, default_level) = match &cli.command {
        Command::KubeletPlugin(a) => (
            a.node.log.log_format.into(),
            a.node.log.log_level.directive(),
        ),
        Command::ComputeDomainPlugin(a) => (
            a.node.log.log_format.into(),
            a.node.log.log_level.directive(),
        ),
        Command::ImexDaemon(_) => (logging::Format::Text, "info"),
        Command::ComputeDomainController(a) => {
            (a.log.log_format.into(), a.log.log_level.directive())
        }
        _ => (logging::Format::Text, "warn"),
    };
    let colour = logging::init(format, default_level);
    tracing::debug!(
        verb = cli.command.verb(),
        version = env!("CARGO_PKG_VERSION"),
        colour,
        "gpu-dra starting"
    );
    match cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cli::common::chain(&e));
            ExitCode::from(1)
        }
    }
}
