//! The command line is a public contract: every verb the top-level help lists has a help page
//! that exits 0 and names the flags (with their short forms and environment variables) that the
//! documentation promises: docs/configuration.md (kubelet-plugin), docs/compute-domains*.md
//! (compute-domain-plugin, imex-daemon, compute-domain-controller), docs/troubleshooting.md
//! (doctor), docs/explain.md, docs/capacity.md, the README (inventory, cel, sim-fault).
//!
//! Not a snapshot of the help text: wording may change, flags and env vars may not go missing.

use std::collections::BTreeSet;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-dra");

/// A promised flag: its heading as `--help` prints it (`-o, --output` or `--node-name`), and
/// the environment variable it reads, if the documentation names one.
type Flag = (&'static str, Option<&'static str>);

/// Per verb, the flags its documentation promises. Every verb of the top-level help must be
/// here, so a new verb gets its promised flags listed.
const PROMISED: &[(&str, &[Flag])] = &[
    (
        "demo",
        &[
            ("--sim-node", Some("GPU_DRA_SIM_NODE")),
            ("--driver-name", Some("GPU_DRA_DRIVER_NAME")),
        ],
    ),
    (
        "inventory",
        &[
            ("--gpu-backend", Some("GPU_DRA_GPU_BACKEND")),
            ("--sim-node", Some("GPU_DRA_SIM_NODE")),
            ("--nvml-lib", Some("GPU_DRA_NVML_LIB")),
            ("--gpu-mig-policies", Some("GPU_DRA_GPU_MIG_POLICIES")),
            ("--state-dir", Some("GPU_DRA_STATE_DIR")),
            ("--mig-profiles", Some("GPU_DRA_MIG_PROFILES")),
            ("--slice-layout", Some("GPU_DRA_SLICE_LAYOUT")),
            ("--mig-attributes", Some("GPU_DRA_MIG_ATTRIBUTES")),
            ("-o, --output", None),
            ("--list-presets", None),
            ("--print-preset", None),
        ],
    ),
    (
        "explain",
        &[
            ("--claim", None),
            ("--sim-node", None),
            ("--slices", None),
            ("--classes", None),
            ("--allocated", None),
            // KUBECONFIG stands in for it only without another source, which clap's `env`
            // cannot say: read in src/cli/explain.rs, checked in tests/cli_explain.rs.
            ("--kubeconfig", None),
            ("--in-cluster", None),
            ("--node", None),
            ("--mig-profiles", Some("GPU_DRA_MIG_PROFILES")),
            ("--slice-layout", Some("GPU_DRA_SLICE_LAYOUT")),
            ("--mig-attributes", Some("GPU_DRA_MIG_ATTRIBUTES")),
            ("-o, --output", None),
        ],
    ),
    (
        "kubelet-plugin",
        &[
            ("--driver-name", Some("GPU_DRA_DRIVER_NAME")),
            ("--node-name", Some("NODE_NAME")),
            ("--kubeconfig", Some("KUBECONFIG")),
            ("--gpu-backend", Some("GPU_DRA_GPU_BACKEND")),
            ("--sim-node", Some("GPU_DRA_SIM_NODE")),
            ("--nvml-lib", Some("GPU_DRA_NVML_LIB")),
            ("--simulated-host", Some("GPU_DRA_SIMULATED_HOST")),
            ("--mig-policy", Some("GPU_DRA_MIG_POLICY")),
            ("--mig-profiles", Some("GPU_DRA_MIG_PROFILES")),
            ("--slice-layout", Some("GPU_DRA_SLICE_LAYOUT")),
            ("--mig-attributes", Some("GPU_DRA_MIG_ATTRIBUTES")),
            ("--plugin-dir", Some("GPU_DRA_PLUGIN_DIR")),
            ("--registry-dir", Some("GPU_DRA_REGISTRY_DIR")),
            ("--pod-uid", Some("POD_UID")),
            ("--cdi-root", Some("GPU_DRA_CDI_ROOT")),
            ("--driver-root", Some("GPU_DRA_DRIVER_ROOT")),
            ("--host-driver-root", Some("GPU_DRA_HOST_DRIVER_ROOT")),
            ("--state-dir", Some("GPU_DRA_STATE_DIR")),
            ("--inventory-interval", Some("GPU_DRA_INVENTORY_INTERVAL")),
            ("--orphan-grace-period", Some("GPU_DRA_ORPHAN_GRACE_PERIOD")),
            ("--health-policy", Some("GPU_DRA_HEALTH_POLICY")),
            ("--shared-gpus", Some("GPU_DRA_SHARED_GPUS")),
            ("--log-level", Some("GPU_DRA_LOG_LEVEL")),
            ("--metrics-addr", Some("GPU_DRA_METRICS_ADDR")),
        ],
    ),
    (
        "compute-domain-plugin",
        &[
            ("--node-name", Some("NODE_NAME")),
            ("--gpu-backend", Some("GPU_DRA_GPU_BACKEND")),
            ("--plugin-dir", Some("GPU_DRA_PLUGIN_DIR")),
            ("--cdi-root", Some("GPU_DRA_CDI_ROOT")),
            ("--namespace", Some("POD_NAMESPACE")),
            ("--clique-id", Some("GPU_DRA_CLIQUE_ID")),
            ("--max-domains", Some("GPU_DRA_MAX_DOMAINS")),
            (
                "--daemon-ready-timeout",
                Some("GPU_DRA_DAEMON_READY_TIMEOUT"),
            ),
            ("--imex-mode", Some("GPU_DRA_IMEX_MODE")),
            ("--imex-host-socket", Some("GPU_DRA_IMEX_HOST_SOCKET")),
            ("--imex-ctl-bin", Some("GPU_DRA_IMEX_CTL_BIN")),
            ("--driver-root", Some("GPU_DRA_DRIVER_ROOT")),
            ("--metrics-addr", Some("GPU_DRA_METRICS_ADDR")),
        ],
    ),
    (
        "sim-fault",
        &[("--state-dir", Some("GPU_DRA_SIM_STATE_DIR"))],
    ),
    (
        "capacity",
        &[
            ("--slices", None),
            ("--claims", None),
            ("--nodes", None),
            ("--kubeconfig", Some("KUBECONFIG")),
            ("--in-cluster", None),
            ("--node", None),
            ("--pool-label", None),
            ("--detail", None),
            ("-o, --output", None),
        ],
    ),
    (
        "imex-daemon",
        &[
            ("--node-name", Some("NODE_NAME")),
            ("--pod-ip", Some("POD_IP")),
            ("--namespace", Some("POD_NAMESPACE")),
            ("--kubeconfig", Some("KUBECONFIG")),
            ("--config-dir", Some("IMEX_CONFIG_DIR")),
            ("--imex-bin", None),
            ("--imex-ctl-bin", None),
            ("--simulated-imex", Some("GPU_DRA_SIMULATED_IMEX")),
            ("--domain-uid", Some("COMPUTE_DOMAIN_UUID")),
            ("--domain-name", Some("COMPUTE_DOMAIN_NAME")),
            ("--domain-namespace", Some("COMPUTE_DOMAIN_NAMESPACE")),
            ("--clique", Some("CLIQUE_ID")),
        ],
    ),
    (
        "doctor",
        &[
            ("--driver-name", Some("GPU_DRA_DRIVER_NAME")),
            ("--node-name", Some("NODE_NAME")),
            ("--kubeconfig", Some("KUBECONFIG")),
            ("--gpu-backend", Some("GPU_DRA_GPU_BACKEND")),
            ("--sim-node", Some("GPU_DRA_SIM_NODE")),
            ("--plugin-dir", Some("GPU_DRA_PLUGIN_DIR")),
            ("--registry-dir", Some("GPU_DRA_REGISTRY_DIR")),
            ("--cdi-root", Some("GPU_DRA_CDI_ROOT")),
            ("--driver-root", Some("GPU_DRA_DRIVER_ROOT")),
            ("--state-dir", Some("GPU_DRA_STATE_DIR")),
            ("--containerd-config", None),
            ("--crio-config", None),
            ("--quick", None),
            ("-o, --output", None),
        ],
    ),
    (
        "compute-domain-controller",
        &[
            ("--kubeconfig", Some("KUBECONFIG")),
            ("--log-format", Some("GPU_DRA_LOG_FORMAT")),
            ("--log-level", Some("GPU_DRA_LOG_LEVEL")),
            ("--namespace", Some("POD_NAMESPACE")),
            ("--image", Some("GPU_DRA_IMEX_IMAGE")),
            (
                "--daemon-service-account",
                Some("GPU_DRA_IMEX_SERVICE_ACCOUNT"),
            ),
            ("--leader-election", Some("GPU_DRA_LEADER_ELECTION")),
            ("--identity", Some("POD_NAME")),
            ("--metrics-addr", Some("GPU_DRA_METRICS_ADDR")),
        ],
    ),
    (
        "cel",
        &[
            ("-e, --expression", None),
            ("-d, --device", None),
            ("--driver", None),
        ],
    ),
];

/// `sim-fault`'s faults and their flags (docs/configuration.md, fault injection).
const FAULTS: &[(&str, &[Flag])] = &[
    (
        "xid",
        &[("--gpu", None), ("--code", None), ("--gpu-instance", None)],
    ),
    ("ecc", &[("--gpu", None), ("--double-bit", None)]),
    ("lost", &[("--gpu", None)]),
    ("recover", &[("--gpu", None)]),
    ("add-gpu", &[("--model", None)]),
    ("remove-gpu", &[("--gpu", None)]),
    (
        "load",
        &[
            ("--gpu", None),
            ("--sm", None),
            ("--power", None),
            ("--memory-mib", None),
            ("--temperature", None),
            ("--clear", None),
        ],
    ),
];

/// Runs the binary with `args` and no environment, so no variable of the test's shows up in
/// (or changes) a help page.
fn gpu_dra(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"))
}

/// The help page `args` print, checked to exit 0 with nothing on stderr.
fn help_page(args: &[&str]) -> String {
    let out = gpu_dra(args);
    let stdout = String::from_utf8(out.stdout).expect("help is UTF-8");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "gpu-dra {}: exit {:?}, stderr {stderr:?}",
        args.join(" "),
        out.status.code()
    );
    stdout
}

/// The subcommands a help page lists under `Commands:`, without clap's own `help`.
fn commands(page: &str) -> BTreeSet<String> {
    page.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// A help page's options: each one's heading (`-o, --output` or `--node-name`, without the
/// value name) and the text of its entry (help, env var, default).
fn options(page: &str) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in page.lines().skip_while(|l| *l != "Options:").skip(1) {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with('-') && indent <= 6 {
            let heading = trimmed
                .split_once(" <")
                .map_or(trimmed, |(flag, _)| flag)
                .split("  ")
                .next()
                .unwrap_or_default()
                .trim_end()
                .to_string();
            entries.push((heading, trimmed.to_string()));
        } else if let Some((_, text)) = entries.last_mut() {
            text.push(' ');
            text.push_str(trimmed);
        }
    }
    entries
}

/// Asserts that the help page of `args` names each flag, with its env var where promised.
fn assert_names_flags(args: &[&str], page: &str, flags: &[Flag]) {
    let options = options(page);
    let command = args.join(" ");
    assert!(
        options.iter().any(|(heading, _)| heading == "-h, --help"),
        "gpu-dra {command}: no options parsed from\n{page}"
    );
    for (flag, env) in flags {
        let Some((_, text)) = options.iter().find(|(heading, _)| heading == flag) else {
            let headings: Vec<&str> = options.iter().map(|(h, _)| h.as_str()).collect();
            panic!("gpu-dra {command}: no `{flag}` among {headings:?}");
        };
        if let Some(env) = env {
            assert!(
                text.contains(&format!("[env: {env}=")),
                "gpu-dra {command}: `{flag}` does not read {env}: {text}"
            );
        }
    }
}

#[test]
fn every_verb_of_the_top_level_help_has_a_help_page_naming_its_promised_flags() {
    let top = help_page(&["--help"]);
    let listed = commands(&top);
    let promised: BTreeSet<String> = PROMISED.iter().map(|(v, _)| v.to_string()).collect();
    assert_eq!(
        listed, promised,
        "the top-level help's verbs differ from the verbs this test checks (add a new verb's \
         promised flags to PROMISED)"
    );
    for (verb, flags) in PROMISED {
        let page = help_page(&[verb, "--help"]);
        let summary = page.lines().next().unwrap_or_default();
        assert!(
            !summary.trim().is_empty() && !summary.starts_with("Usage:"),
            "gpu-dra {verb} --help has no summary line:\n{page}"
        );
        assert!(
            page.contains(&format!("Usage: gpu-dra {verb} ")),
            "gpu-dra {verb} --help has no usage line:\n{page}"
        );
        assert_names_flags(&[verb, "--help"], &page, flags);
        // `help VERB` and `VERB -h` are the same contract.
        assert_eq!(
            help_page(&["help", verb]),
            page,
            "gpu-dra help {verb} differs from gpu-dra {verb} --help"
        );
        assert_names_flags(&[verb, "-h"], &help_page(&[verb, "-h"]), flags);
    }
}

#[test]
fn every_fault_of_sim_fault_has_a_help_page_naming_its_flags() {
    let page = help_page(&["sim-fault", "--help"]);
    let listed = commands(&page);
    let promised: BTreeSet<String> = FAULTS.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(listed, promised, "sim-fault's faults changed");
    for (fault, flags) in FAULTS {
        let args = ["sim-fault", fault, "--help"];
        let page = help_page(&args);
        // The usage line names sim-fault's own required flag before the fault.
        let usage = page
            .lines()
            .find(|l| l.starts_with("Usage: gpu-dra sim-fault "))
            .unwrap_or_default();
        assert!(
            usage.contains(&format!(" {fault} ")),
            "gpu-dra sim-fault {fault} --help has no usage line:\n{page}"
        );
        assert_names_flags(&args, &page, flags);
    }
}

#[test]
fn an_unknown_flag_is_bad_input_on_every_verb() {
    for (verb, _) in PROMISED {
        let out = gpu_dra(&[verb, "--no-such-flag"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "gpu-dra {verb} --no-such-flag: {stderr}"
        );
        assert!(
            stderr.contains("unexpected argument '--no-such-flag'"),
            "gpu-dra {verb} --no-such-flag: {stderr}"
        );
    }
}
