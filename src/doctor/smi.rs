//! The NVML inventory against what `nvidia-smi` reports: names, UUIDs, memory and MIG mode
//! of every GPU, by index.

use crate::hardware::{GpuInfo, NodeInventory};

use super::report::Check;

/// The arguments `doctor` runs `nvidia-smi` with: one CSV line per GPU, bare values.
pub const QUERY_ARGS: [&str; 2] = [
    "--query-gpu=index,name,uuid,memory.total,mig.mode.current,mig.mode.pending",
    "--format=csv,noheader,nounits",
];

/// One GPU as `nvidia-smi` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiGpu {
    /// `index`.
    pub index: u32,
    /// `name`.
    pub name: String,
    /// `uuid`.
    pub uuid: String,
    /// `memory.total`, MiB.
    pub memory_mib: u64,
    /// `mig.mode.current`: `Enabled`, `Disabled` or `[N/A]`.
    pub mig_current: String,
    /// `mig.mode.pending`.
    pub mig_pending: String,
}

/// Parses the output of [`QUERY_ARGS`].
///
/// # Errors
/// The line that does not have the six fields, or a non-numeric index or memory, by line.
pub fn parse(text: &str) -> Result<Vec<SmiGpu>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(n, line)| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let bad = || format!("nvidia-smi line {}: {line:?} is not index, name, uuid, memory.total, mig.mode.current, mig.mode.pending", n + 1);
            let [index, name, uuid, memory, current, pending] = fields[..] else {
                return Err(bad());
            };
            Ok(SmiGpu {
                index: index.parse().map_err(|_| bad())?,
                name: name.to_string(),
                uuid: uuid.to_string(),
                memory_mib: memory.parse().map_err(|_| bad())?,
                mig_current: current.to_string(),
                mig_pending: pending.to_string(),
            })
        })
        .collect()
}

/// How NVML's view of a GPU prints in `nvidia-smi`'s columns.
fn expected(gpu: &GpuInfo) -> SmiGpu {
    let mig = |on: bool| match (gpu.mig.capable, on) {
        (false, _) => "[N/A]",
        (true, true) => "Enabled",
        (true, false) => "Disabled",
    };
    SmiGpu {
        index: gpu.index,
        name: gpu.product_name.clone(),
        uuid: gpu.uuid.clone(),
        memory_mib: gpu.memory_mib,
        mig_current: mig(gpu.mig.current).into(),
        mig_pending: mig(gpu.mig.pending).into(),
    }
}

/// The `nvidia-smi` check: `smi` is the tool's output, or why it could not be run.
pub fn check(inventory: &NodeInventory, smi: &Result<String, String>) -> Check {
    const NAME: &str = "nvidia-smi";
    let text = match smi {
        Ok(text) => text,
        Err(why) => {
            return Check::warn(
                NAME,
                format!("not compared: {why}"),
                "Install nvidia-smi under the driver root (it comes with the driver) so the NVML view can be cross-checked",
                "nvidia-smi",
            );
        }
    };
    let reported = match parse(text) {
        Ok(r) => r,
        Err(why) => {
            return Check::warn(
                NAME,
                format!("not compared: {why}"),
                "Check that nvidia-smi and the driver library are of the same driver version",
                "nvidia-smi",
            );
        }
    };
    let mut differences = Vec::new();
    let want: Vec<SmiGpu> = inventory.gpus.iter().map(expected).collect();
    for w in &want {
        match reported.iter().find(|r| r.index == w.index) {
            None => differences.push(format!(
                "GPU {} ({}) missing from nvidia-smi",
                w.index, w.uuid
            )),
            Some(r) => {
                let mut field = |name: &str, ours: String, theirs: String| {
                    if ours != theirs {
                        differences.push(format!(
                            "GPU {} {name}: NVML {ours:?}, nvidia-smi {theirs:?}",
                            w.index
                        ));
                    }
                };
                field("name", w.name.clone(), r.name.clone());
                field("uuid", w.uuid.clone(), r.uuid.clone());
                // Both divide the same byte count by 1 MiB; allow a rounding step either way.
                if w.memory_mib.abs_diff(r.memory_mib) > 1 {
                    field(
                        "memory.total",
                        w.memory_mib.to_string(),
                        r.memory_mib.to_string(),
                    );
                }
                field(
                    "mig.mode.current",
                    w.mig_current.clone(),
                    r.mig_current.clone(),
                );
                field(
                    "mig.mode.pending",
                    w.mig_pending.clone(),
                    r.mig_pending.clone(),
                );
            }
        }
    }
    for r in reported
        .iter()
        .filter(|r| !want.iter().any(|w| w.index == r.index))
    {
        differences.push(format!("GPU {} ({}) not seen by NVML", r.index, r.uuid));
    }
    if differences.is_empty() {
        Check::ok(
            NAME,
            format!(
                "{} GPU(s) agree with NVML (name, UUID, memory, MIG mode)",
                want.len()
            ),
        )
    } else {
        Check::fail(
            NAME,
            differences.join("; "),
            "Make --nvml-lib / the driver root point at the same driver nvidia-smi uses, and reboot if the driver was upgraded without one",
            "nvidia-smi",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;
    use crate::hardware::GpuBackend;
    use crate::hardware::sim::SimBackend;

    fn render(inv: &NodeInventory) -> String {
        inv.gpus
            .iter()
            .map(expected)
            .map(|g| {
                format!(
                    "{}, {}, {}, {}, {}, {}\n",
                    g.index, g.name, g.uuid, g.memory_mib, g.mig_current, g.mig_pending
                )
            })
            .collect()
    }

    #[test]
    fn agreeing_tools_pass_and_every_difference_is_named() {
        let inv = SimBackend::open("mixed", None)
            .unwrap()
            .inventory()
            .unwrap();
        assert_eq!(check(&inv, &Ok(render(&inv))).status, Status::Ok);
        let mut other = inv.clone();
        other.gpus[0].memory_mib += 2;
        other.gpus[1].memory_mib += 1;
        other.gpus.pop();
        let c = check(&inv, &Ok(render(&other)));
        assert_eq!(c.status, Status::Fail);
        let last = inv.gpus.last().unwrap();
        assert!(c.found.contains("GPU 0 memory.total"), "{}", c.found);
        assert!(
            !c.found.contains("GPU 1 memory.total"),
            "1 MiB is rounding: {}",
            c.found
        );
        assert!(
            c.found
                .contains(&format!("GPU {} ({}) missing", last.index, last.uuid)),
            "{}",
            c.found
        );
    }

    #[test]
    fn unparseable_output_or_a_missing_tool_is_a_warning() {
        let inv = SimBackend::open("mixed", None)
            .unwrap()
            .inventory()
            .unwrap();
        let statuses = [
            check(&inv, &Err("nvidia-smi not found".into())).status,
            check(&inv, &Ok("garbage\n".into())).status,
        ];
        assert_eq!(statuses, [Status::Warn, Status::Warn]);
    }
}
