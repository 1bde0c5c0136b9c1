//! `gpu-dra capacity`: the cluster's GPUs per node, GPU and MIG profile; who holds what, and
//! what is free.

use std::path::PathBuf;
use std::process::ExitCode;

use gpu_dra::devices::DEFAULT_DRIVER_NAME;

use super::common::{chain, emit};
use super::flags::Output;

/// Flags of `gpu-dra capacity`.
#[derive(clap::Args, Debug)]
pub(crate) struct CapacityArgs {
    /// ResourceSlices from a file or directory (`kubectl get resourceslices -o yaml`);
    /// without it, everything is read from the cluster.
    #[arg(long, conflicts_with = "in_cluster")]
    slices: Option<PathBuf>,
    /// With --slices: ResourceClaims (`kubectl get resourceclaims -A -o yaml`); the allocated
    /// ones hold devices.
    #[arg(long, requires = "slices")]
    claims: Option<PathBuf>,
    /// With --slices: Nodes (`kubectl get nodes -o yaml`), for --pool-label.
    #[arg(long, requires = "slices")]
    nodes: Option<PathBuf>,
    /// Without --slices: read slices, claims and nodes from this cluster.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Without --slices: read them from the cluster this pod runs in.
    #[arg(long, conflicts_with = "kubeconfig")]
    in_cluster: bool,
    /// Only this node (with it, the table shows every GPU in detail).
    #[arg(long)]
    node: Option<String>,
    /// Group nodes into pools by this node label, e.g. `gpu-pool` or `topology.kubernetes.io/zone`.
    #[arg(long)]
    pool_label: Option<String>,
    /// Table: list every allocation and every GPU's layout and free placements.
    #[arg(long)]
    detail: bool,
    /// DRA driver name.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Output: tables for people, or the report as JSON or YAML.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
}

/// Prints the capacity report; exit 0, or 2 (with `error: …`) when the inputs cannot be read
/// or do not make a report.
///
/// Fails when the cluster cannot be reached or listed, or stdout cannot be written.
pub(crate) fn run(args: CapacityArgs) -> anyhow::Result<ExitCode> {
    use gpu_dra::capacity::{self, CapacityOptions, TableOptions};
    let bad_input = |e: anyhow::Error| {
        eprintln!("error: {}", chain(&e));
        Ok(ExitCode::from(2))
    };
    let options = CapacityOptions {
        driver: args.driver_name.clone(),
        pool_label: args.pool_label.clone(),
        node: args.node.clone(),
    };
    let report = match &args.slices {
        Some(slices) => capacity::build_from_files(
            capacity::InputFiles {
                slices,
                claims: args.claims.as_deref(),
                nodes: args.nodes.as_deref(),
            },
            &options,
        ),
        None => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            // A cluster that cannot be reached is the command's input failing: exit 2.
            match runtime.block_on(gpu_dra::k8s::connect(args.kubeconfig.as_deref())) {
                Ok(client) => runtime.block_on(capacity::build_from_cluster(client, &options)),
                Err(e) => return bad_input(e.into()),
            }
        }
    };
    let report = match report {
        Ok(report) => report,
        Err(e) => return bad_input(e.into()),
    };
    match args.output {
        Output::Table => emit(&capacity::render_table(
            &report,
            &TableOptions {
                detail: args.detail || options.node.is_some(),
                ..TableOptions::default()
            },
        ))?,
        Output::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?,
        Output::Yaml => emit(&serde_yaml::to_string(&report)?)?,
    }
    Ok(ExitCode::SUCCESS)
}
