//! Demo steps 7 and 8: the sharing strategies on fresh simulated DGX H100 nodes — time-slicing,
//! MPS with limits, MPS on a carved MIG device (opaque config), then two claims sharing one
//! GPU through consumable capacity — prepared by the real claim lifecycle, with the commands
//! the simulated `nvidia-smi` and `nvidia-cuda-mps-control` received.

use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceClass;

use super::claims::{Steps, allocate, prepare_all};
use crate::devices::{ModelOptions, SharedGpus};
use crate::hardware::sim::SimBackend;
use crate::inventory;

/// The node the sharing steps run on (eight H100s with dynamic MIG).
pub const SHARING_PRESET: &str = "dgx-h100";

/// Examples with opaque sharing config, in the order the demo submits them.
pub const SHARING_EXAMPLES: [(&str, &str); 4] = [
    (
        "sharing-time-slicing.yaml",
        include_str!("../../examples/sharing-time-slicing.yaml"),
    ),
    (
        "sharing-mps-limits.yaml",
        include_str!("../../examples/sharing-mps-limits.yaml"),
    ),
    (
        "sharing-mps-on-mig.yaml",
        include_str!("../../examples/sharing-mps-on-mig.yaml"),
    ),
    (
        "sharing-mig-time-slicing-seed.yaml",
        include_str!("../../examples/sharing-mig-time-slicing-seed.yaml"),
    ),
];

/// The consumable-capacity example: two pods, each with a claim of its own.
const CAPACITY_EXAMPLE: &str = include_str!("../../examples/consumable-capacity.yaml");

/// How many equal shares the consumable-capacity step publishes per device.
const SHARES: u8 = 4;

fn node(options: &ModelOptions) -> Result<(Arc<SimBackend>, ModelOptions), String> {
    let backend = Arc::new(
        SimBackend::open(SHARING_PRESET, None).map_err(|e| crate::errors::error_chain(&e))?,
    );
    let options = ModelOptions {
        shared_gpus: options.shared_gpus,
        ..ModelOptions::with_policies(&options.driver_name, &backend.mig_policies())
    };
    Ok((backend, options))
}

/// One round on a fresh node: the title, the allocation of `examples`, then prepare and
/// unprepare with the sharing tools.
fn round(
    out: &mut String,
    options: &ModelOptions,
    classes: &[DeviceClass],
    title: &str,
    examples: &[(&str, &str)],
    uid_prefix: &str,
    steps: &Steps,
) -> Result<(), String> {
    let (backend, options) = node(options)?;
    let view = inventory::view(backend.as_ref(), backend.node_name(), &options)
        .map_err(|e| crate::errors::error_chain(&e))?;
    let _ = writeln!(out, "\n{title}");
    let allocated = allocate(out, examples, &backend, classes, &view.slices, uid_prefix)?;
    prepare_all(out, backend, &options, &allocated, steps)
}

/// Runs steps 7 and 8 and appends what they print.
pub fn run(out: &mut String, driver_name: &str, classes: &[DeviceClass]) -> Result<(), String> {
    let base = ModelOptions::with_policies(driver_name, &[]);
    round(
        out,
        &base,
        classes,
        &format!(
            "7. Sharing strategies (opaque config), on a fresh simulated node: preset {SHARING_PRESET}"
        ),
        &SHARING_EXAMPLES,
        "sharing",
        &Steps {
            prepare: "   Prepare: time-slice set, MPS control daemons started with verified limits",
            unprepare: "   Unprepare: daemons stopped, compute mode and time-slice reset",
            show_mig_spec: false,
        },
    )?;
    let shared = ModelOptions {
        shared_gpus: SharedGpus::Shares(SHARES),
        ..base
    };
    round(
        out,
        &shared,
        classes,
        &format!(
            "8. Consumable capacity: the same preset published with --shared-gpus {SHARES}; two claims share one GPU"
        ),
        &[("consumable-capacity.yaml", CAPACITY_EXAMPLE)],
        "share",
        &Steps {
            prepare: "   Prepare: one MPS daemon for the shared GPU; each claim's CDI spec carries its own client limits",
            unprepare: "   Unprepare: the last share out stops the daemon",
            show_mig_spec: false,
        },
    )
}
