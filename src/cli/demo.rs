//! `gpu-dra demo`: the driver's pipeline on a simulated node, in-process, explained.

use std::process::ExitCode;

use gpu_dra::demo;

use super::common::emit;
use super::flags::DriverNameFlag;

/// Flags of `gpu-dra demo`.
#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Simulated node: a preset name or a node file.
    #[arg(long, env = "GPU_DRA_SIM_NODE", default_value = demo::DEFAULT_PRESET)]
    sim_node: String,
    /// `--driver-name`.
    #[command(flatten)]
    driver_name: DriverNameFlag,
}

/// Prints the demo's walk-through.
///
/// Fails when the simulated node cannot be read or a step of the pipeline fails.
pub(crate) fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    emit(&demo::run(&args.sim_node, &args.driver_name.driver_name)?)?;
    Ok(ExitCode::SUCCESS)
}
