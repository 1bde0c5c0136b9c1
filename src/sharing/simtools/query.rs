//! Simulated `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits] [-i <id>]`
//! over the simulated node the simulated NVML library also reads: `GPU_DRA_SIM_STATE_DIR`
//! (the state file, which also names the node) or else `GPU_DRA_SIM_NODE` (a preset or node
//! file). Without either, it fails as the real tool does on a host without a driver.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::hardware::sim::{STATE_FILE, SimBackend};
use crate::hardware::{GpuBackend, GpuInfo, NodeInventory};

/// The simulated node, as the simulated NVML library names it.
pub const NODE_ENV: &str = "GPU_DRA_SIM_NODE";
/// The simulated node's state directory, as the simulated NVML library names it.
pub const STATE_DIR_ENV: &str = "GPU_DRA_SIM_STATE_DIR";

/// What the real tool prints when it cannot talk to the driver (exit code 9).
const NO_DRIVER: &str = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA \
                         driver. Make sure that the latest NVIDIA driver is installed and running.";

/// Whether `args` ask for a query (`--query-gpu=…` or `--query-gpu …`).
pub(super) fn is_query(args: &[String]) -> bool {
    args.iter().any(|a| a.starts_with("--query-gpu"))
}

/// Runs the query; prints what the real tool prints.
pub(super) fn run(args: &[String]) -> ExitCode {
    let request = match parse(args) {
        Ok(r) => r,
        Err((code, msg)) => {
            println!("{msg}");
            return ExitCode::from(code);
        }
    };
    let inventory = match open_node().and_then(|b| b.inventory().map_err(|e| e.to_string())) {
        Ok(inv) => inv,
        Err(_) => {
            println!("{NO_DRIVER}");
            return ExitCode::from(9);
        }
    };
    match render(&request, &inventory) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err((code, msg)) => {
            println!("{msg}");
            ExitCode::from(code)
        }
    }
}

fn open_node() -> Result<SimBackend, String> {
    let state = std::env::var_os(STATE_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    if let Some(dir) = &state
        && dir.join(STATE_FILE).exists()
    {
        return SimBackend::open_state_dir(dir).map_err(|e| e.to_string());
    }
    let node = std::env::var(NODE_ENV).map_err(|_| format!("{NODE_ENV} is not set"))?;
    SimBackend::open(&node, None).map_err(|e| e.to_string())
}

#[derive(Debug, PartialEq, Eq)]
struct Request {
    fields: Vec<String>,
    header: bool,
    units: bool,
    id: Option<String>,
}

const FIELDS: [&str; 10] = [
    "index",
    "name",
    "uuid",
    "memory.total",
    "mig.mode.current",
    "mig.mode.pending",
    "pci.bus_id",
    "driver_version",
    "serial",
    "count",
];

fn parse(args: &[String]) -> Result<Request, (u8, String)> {
    let bad = || (2, super::BAD_ARGS.to_string());
    let mut fields = None;
    let mut format = None;
    let mut id = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| -> Result<String, (u8, String)> {
            match a.strip_prefix(flag) {
                Some(v) if v.starts_with('=') => Ok(v[1..].to_string()),
                _ => it.next().cloned().ok_or_else(bad),
            }
        };
        if a.starts_with("--query-gpu") {
            fields = Some(value("--query-gpu")?);
        } else if a.starts_with("--format") {
            format = Some(value("--format")?);
        } else if a == "-i" || a.starts_with("--id") {
            id = Some(value("--id")?);
        } else {
            return Err(bad());
        }
    }
    let fields: Vec<String> = fields
        .ok_or_else(bad)?
        .split(',')
        .map(|f| f.trim().to_string())
        .collect();
    if let Some(f) = fields.iter().find(|f| !FIELDS.contains(&f.as_str())) {
        return Err((2, format!("Field \"{f}\" is not a valid field to query.")));
    }
    let format = format.ok_or_else(|| (2, "Format must be specified.".to_string()))?;
    let opts: Vec<&str> = format.split(',').map(str::trim).collect();
    if opts.first() != Some(&"csv")
        || opts[1..]
            .iter()
            .any(|o| !["noheader", "nounits"].contains(o))
    {
        return Err((2, format!("\"{format}\" is not a valid format.")));
    }
    Ok(Request {
        fields,
        header: !opts.contains(&"noheader"),
        units: !opts.contains(&"nounits"),
        id,
    })
}

fn render(req: &Request, inv: &NodeInventory) -> Result<String, (u8, String)> {
    let gpus: Vec<&GpuInfo> = match &req.id {
        None => inv.gpus.iter().collect(),
        Some(id) => {
            let found: Vec<&GpuInfo> = inv
                .gpus
                .iter()
                .filter(|g| g.uuid == *id || g.index.to_string() == *id)
                .collect();
            if found.is_empty() {
                return Err((6, "No devices were found".into()));
            }
            found
        }
    };
    let mut out = String::new();
    if req.header {
        let names: Vec<String> = req
            .fields
            .iter()
            .map(|f| match (f.as_str(), req.units) {
                ("memory.total", true) => "memory.total [MiB]".to_string(),
                _ => f.clone(),
            })
            .collect();
        out.push_str(&names.join(", "));
        out.push('\n');
    }
    for gpu in gpus {
        let values: Vec<String> = req
            .fields
            .iter()
            .map(|f| value(f, gpu, inv, req.units))
            .collect();
        out.push_str(&values.join(", "));
        out.push('\n');
    }
    Ok(out)
}

fn value(field: &str, gpu: &GpuInfo, inv: &NodeInventory, units: bool) -> String {
    let mig = |on: bool| match (gpu.mig.capable, on) {
        (false, _) => "[N/A]".to_string(),
        (true, true) => "Enabled".to_string(),
        (true, false) => "Disabled".to_string(),
    };
    match field {
        "index" => gpu.index.to_string(),
        "name" => gpu.product_name.clone(),
        "uuid" => gpu.uuid.clone(),
        "memory.total" if units => format!("{} MiB", gpu.memory_mib),
        "memory.total" => gpu.memory_mib.to_string(),
        "mig.mode.current" => mig(gpu.mig.current),
        "mig.mode.pending" => mig(gpu.mig.pending),
        // nvidia-smi prints the domain with eight digits.
        "pci.bus_id" => format!("0000{}", gpu.pci_bus_id.to_ascii_uppercase()),
        "driver_version" => inv.driver_version.clone(),
        "count" => inv.gpus.len().to_string(),
        _ => "[N/A]".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::sim::SimBackend;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn query(list: &[&str], inv: &NodeInventory) -> Result<String, (u8, String)> {
        render(&parse(&args(list))?, inv)
    }

    #[test]
    fn csv_query_prints_one_line_per_gpu_like_the_real_tool() {
        let sim = SimBackend::open("mixed", None).unwrap();
        sim.set_mig_mode(0, true).unwrap();
        let inv = sim.inventory().unwrap();
        let got = query(
            &[
                "--query-gpu=index,name,uuid,memory.total,mig.mode.current,mig.mode.pending",
                "--format=csv",
            ],
            &inv,
        )
        .unwrap();
        let mut lines = got.lines();
        assert_eq!(
            lines.next(),
            Some("index, name, uuid, memory.total [MiB], mig.mode.current, mig.mode.pending")
        );
        for (line, gpu) in lines.zip(&inv.gpus) {
            let mig = |on: bool| match (gpu.mig.capable, on) {
                (false, _) => "[N/A]",
                (true, true) => "Enabled",
                (true, false) => "Disabled",
            };
            let want = format!(
                "{}, {}, {}, {} MiB, {}, {}",
                gpu.index,
                gpu.product_name,
                gpu.uuid,
                gpu.memory_mib,
                mig(gpu.mig.current),
                mig(gpu.mig.pending)
            );
            assert_eq!(line, want);
        }
        assert_eq!(got.lines().count(), inv.gpus.len() + 1);
    }

    #[test]
    fn noheader_nounits_and_an_id_select_bare_values_of_one_gpu() {
        let inv = SimBackend::open("mixed", None)
            .unwrap()
            .inventory()
            .unwrap();
        let gpu = &inv.gpus[1];
        let got = query(
            &[
                "--query-gpu",
                "uuid,memory.total",
                "--format",
                "csv,noheader,nounits",
                "-i",
                "1",
            ],
            &inv,
        )
        .unwrap();
        assert_eq!(got, format!("{}, {}\n", gpu.uuid, gpu.memory_mib));
    }

    #[test]
    fn unknown_fields_formats_and_ids_fail_with_the_real_tools_codes() {
        let inv = SimBackend::open("mixed", None)
            .unwrap()
            .inventory()
            .unwrap();
        let codes: Vec<u8> = [
            vec!["--query-gpu=name,frobs", "--format=csv"],
            vec!["--query-gpu=name", "--format=xml"],
            vec!["--query-gpu=name"],
            vec!["--query-gpu=name", "--format=csv", "-i", "GPU-nope"],
        ]
        .iter()
        .map(|a| query(a, &inv).map(|_| 0).unwrap_or_else(|(c, _)| c))
        .collect();
        assert_eq!(codes, vec![2, 2, 2, 6]);
    }
}
