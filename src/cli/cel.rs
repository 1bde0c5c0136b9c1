//! `gpu-dra cel`: one CEL selector against one device file, as the scheduler would evaluate it.

use std::path::PathBuf;
use std::process::ExitCode;

use gpu_dra::devices::DEFAULT_DRIVER_NAME;

use super::common::{chain, emit};

/// Flags of `gpu-dra cel`.
#[derive(clap::Args, Debug)]
pub(crate) struct CelArgs {
    /// The selector, e.g. "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'".
    #[arg(long, short = 'e')]
    expression: String,
    /// A resource.k8s.io/v1 Device (name, attributes, capacity, allowMultipleAllocations)
    /// as YAML or JSON.
    #[arg(long, short = 'd')]
    device: PathBuf,
    /// The driver publishing the device: the domain of unqualified attribute names.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver: String,
}

/// Prints `true` or `false` (exit 0); a selector or device that cannot be read or evaluated
/// prints `error: …` and exits 2.
///
/// Fails only when stdout cannot be written.
pub(crate) fn run(args: CelArgs) -> anyhow::Result<ExitCode> {
    match gpu_dra::cel::evaluate_device_file(&args.expression, &args.device, &args.driver) {
        Ok(matched) => {
            emit(&format!("{matched}\n"))?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", chain(&anyhow::Error::new(e)));
            Ok(ExitCode::from(2))
        }
    }
}
