//! `gpu-dra sim-fault`: faults, hot-plug and load injected into a simulated node's shared state.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use gpu_dra::hardware::sim::{self, SimBackend};

use super::common::emit;

/// Flags of `gpu-dra sim-fault`: the state directory, and the fault as a subcommand.
#[derive(clap::Args, Debug)]
pub(crate) struct SimFaultArgs {
    /// The simulator's state directory (holding sim-gpu-state.json); a plugin's --state-dir
    /// works too (its `sim` subdirectory is used).
    #[arg(long, env = "GPU_DRA_SIM_STATE_DIR")]
    state_dir: PathBuf,
    #[command(subcommand)]
    fault: FaultCommand,
}

#[derive(Subcommand, Debug)]
enum FaultCommand {
    /// An XID error (79: fallen off the bus; 13, 31, 43, 45, 68, 109 are application errors
    /// that leave the GPU healthy).
    Xid {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// The XID.
        #[arg(long)]
        code: u64,
        /// Attribute the XID to this GPU instance (a MIG-scoped XID, as NVML reports for
        /// errors contained in one MIG device); default: the whole GPU.
        #[arg(long, value_name = "GI")]
        gpu_instance: Option<u32>,
    },
    /// An ECC error: corrected (single-bit), or uncorrectable with --double-bit.
    Ecc {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// Uncorrectable: the GPU becomes unhealthy.
        #[arg(long)]
        double_bit: bool,
    },
    /// The GPU falls off the bus (XID 79).
    Lost {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
    },
    /// A GPU reset that clears the fault.
    Recover {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
    },
    /// A GPU is added to the node (next free index, MIG off).
    AddGpu {
        /// GPU model (`gpu-dra inventory --list-presets` lists them).
        #[arg(long)]
        model: String,
    },
    /// A GPU is taken off the node (its index is not reused).
    RemoveGpu {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
    },
    /// Sets the load a GPU and its MIG devices report (power, SM activity, memory,
    /// temperature) through both backends; figures not given follow the load model.
    Load {
        /// GPU index.
        #[arg(long)]
        gpu: u32,
        /// SM activity of the GPU and each of its MIG devices, 0 to 1.
        #[arg(long, value_parser = sm_ratio)]
        sm: Option<f64>,
        /// Board power draw, watts.
        #[arg(long)]
        power: Option<u32>,
        /// Memory in use on a GPU with MIG off, MiB.
        #[arg(long)]
        memory_mib: Option<u64>,
        /// Core temperature, °C.
        #[arg(long)]
        temperature: Option<u32>,
        /// Forget the load set earlier: back to the model.
        #[arg(long, conflicts_with_all = ["sm", "power", "memory_mib", "temperature"])]
        clear: bool,
    },
}

/// `--sm`: a ratio from 0 to 1.
fn sm_ratio(value: &str) -> Result<f64, String> {
    let ratio: f64 = value.parse().map_err(|_| {
        format!("--sm {value:?} is not a number; give a ratio from 0 to 1, e.g. 0.8")
    })?;
    if !(0.0..=1.0).contains(&ratio) {
        return Err(format!(
            "--sm {value} is out of range; give a ratio from 0 to 1, e.g. 0.8"
        ));
    }
    Ok(ratio)
}

/// Applies the fault and prints what happened: the events delivered and the GPU's health.
///
/// Fails when the state directory holds no simulated node, the GPU index or model is unknown,
/// or the state cannot be updated.
pub(crate) fn run(args: SimFaultArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::hardware::health;
    use gpu_dra::hardware::sim::faults::Fault;
    let nested = args.state_dir.join("sim");
    let dir = if !args.state_dir.join(sim::STATE_FILE).exists()
        && nested.join(sim::STATE_FILE).exists()
    {
        nested
    } else {
        args.state_dir
    };
    let sim = SimBackend::open_state_dir(&dir)?;
    let (gpu, fault) = match args.fault {
        FaultCommand::AddGpu { model } => {
            let index = sim.add_gpu(&model)?;
            emit(&format!("added GPU {index} ({model})\n"))?;
            return Ok(ExitCode::SUCCESS);
        }
        FaultCommand::RemoveGpu { gpu } => {
            sim.remove_gpu(gpu)?;
            emit(&format!("removed GPU {gpu}\n"))?;
            return Ok(ExitCode::SUCCESS);
        }
        FaultCommand::Load {
            gpu,
            sm,
            power,
            memory_mib,
            temperature,
            clear,
        } => {
            use gpu_dra::hardware::sim::telemetry::SimLoad;
            let load = (!clear).then_some(SimLoad {
                sm_active_percent: sm.map(|r| (r * 100.0).round() as u32),
                power_watts: power,
                memory_used_mib: memory_mib,
                temperature_celsius: temperature,
            });
            sim.set_load(gpu, load)?;
            emit(&match load {
                Some(l) => format!("GPU {gpu}: load set to {l:?}\n"),
                None => format!("GPU {gpu}: load cleared\n"),
            })?;
            return Ok(ExitCode::SUCCESS);
        }
        FaultCommand::Xid {
            gpu,
            code,
            gpu_instance,
        } => (gpu, Fault::Xid { code, gpu_instance }),
        FaultCommand::Ecc { gpu, double_bit } => (gpu, Fault::Ecc { double_bit }),
        FaultCommand::Lost { gpu } => (gpu, Fault::Lost),
        FaultCommand::Recover { gpu } => (gpu, Fault::Recover),
    };
    let events = sim.inject(gpu, fault)?;
    let state = sim.fault_state(gpu)?;
    let mut out = String::new();
    for e in &events {
        let name = match e.event_type {
            health::EVENT_XID_CRITICAL => "XID critical error",
            health::EVENT_SINGLE_BIT_ECC => "single-bit ECC error",
            health::EVENT_DOUBLE_BIT_ECC => "double-bit ECC error",
            health::EVENT_GPU_UNAVAILABLE => "GPU unavailable",
            health::EVENT_GPU_RECOVERY_ACTION => "recovery action",
            _ => "event",
        };
        out.push_str(&format!(
            "GPU {gpu}: {name} (type {:#x}, data {})\n",
            e.event_type, e.data
        ));
    }
    out.push_str(&format!(
        "GPU {gpu} is {}{}\n",
        if state.healthy {
            "healthy"
        } else {
            "unhealthy"
        },
        if state.lost { " (lost)" } else { "" }
    ));
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}
