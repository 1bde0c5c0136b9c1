//! The chart's `telemetryInterval` (and `orphanGracePeriod`) as `helm template` renders it: it
//! reaches every plugin DaemonSet as `GPU_DRA_TELEMETRY_INTERVAL` (`GPU_DRA_ORPHAN_GRACE_PERIOD`)
//! in a form the plugin's own flag parser takes, and the values schema refuses what that
//! parser would not. Skipped with a notice when helm
//! is absent; `.ci/run` installs it.

mod deploy_support;

use std::path::Path;
use std::process::Command;

use deploy_support::{chart_dir, tool, yaml_documents};

const ENV: &str = "GPU_DRA_TELEMETRY_INTERVAL";

/// `helm template` of the chart with `extra` arguments: stdout, or stderr when it fails.
fn template(helm: &Path, extra: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let output = Command::new(helm)
        .args(["template", "gpu-dra", chart.to_str().unwrap()])
        .args(["--namespace", "gpu-dra"])
        .args(extra)
        .output()
        .expect("run helm");
    if output.status.success() {
        Ok(String::from_utf8(output.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The value of the variable `env` in each rendered DaemonSet's plugin container.
fn rendered_intervals(manifests: &str, env: &str) -> Vec<Option<String>> {
    yaml_documents(manifests)
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .map(|ds| {
            ds["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()?
                .iter()
                .find(|e| e["name"] == env)
                .and_then(|e| e["value"].as_str())
                .map(str::to_string)
        })
        .collect()
}

/// Whether the plugin binary's `--telemetry-interval` parser (the one `GPU_DRA_TELEMETRY_INTERVAL`
/// feeds) takes `value`.
fn plugin_accepts(value: &str) -> bool {
    plugin_flag_accepts("--telemetry-interval", value)
}

/// Whether the plugin binary's parser of `flag` takes `value`. `--help` after the flag stops
/// before the plugin starts, but only once the value has been parsed.
fn plugin_flag_accepts(flag: &str, value: &str) -> bool {
    let status = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["kubelet-plugin", flag, value, "--help"])
        .output()
        .expect("run gpu-dra")
        .status;
    status.success()
}

#[test]
fn the_telemetry_interval_reaches_every_plugin_daemonset_as_seconds_the_plugin_parses() {
    let Some(helm) = tool("helm", "the telemetry-interval chart checks") else {
        return;
    };
    let sim_values = chart_dir().join("values-sim.yaml").display().to_string();
    let cases: [(&[&str], &str); 6] = [
        (&[], "10s"),
        (&["--set", "telemetryInterval=30s"], "30s"),
        (&["--set", "telemetryInterval=45"], "45"),
        (&["--set-string", "telemetryInterval=5"], "5"),
        (&["--set", "telemetryInterval=2m"], "2m"),
        (&["-f", &sim_values, "--set", "telemetryInterval=2s"], "2s"),
    ];
    for (extra, want) in cases {
        let manifests = template(&helm, extra).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        let got = rendered_intervals(&manifests, ENV);
        assert!(!got.is_empty(), "{extra:?}: no DaemonSet rendered");
        assert_eq!(got, vec![Some(want.to_string()); got.len()], "{extra:?}");
        assert!(plugin_accepts(want), "the plugin refuses {want:?}");
        // The shared-claim refresh keeps its own default, in a form the plugin takes.
        let refresh = rendered_intervals(&manifests, "GPU_DRA_HOLDERS_REFRESH_INTERVAL");
        assert_eq!(
            refresh,
            vec![Some("30s".to_string()); got.len()],
            "{extra:?}"
        );
    }
}

#[test]
fn the_values_schema_refuses_an_interval_the_plugin_cannot_parse_and_names_the_field() {
    let Some(helm) = tool("helm", "the telemetry-interval chart checks") else {
        return;
    };
    for bad in ["1h", "1.5s", "10ms", "0s", "ten"] {
        assert!(!plugin_accepts(bad), "the plugin takes {bad:?} after all");
        let err = template(&helm, &["--set", &format!("telemetryInterval={bad}")])
            .expect_err(&format!("helm rendered telemetryInterval={bad}"));
        assert!(
            err.contains("/telemetryInterval") && err.contains(&format!("'{bad}'")),
            "{bad}: {err}"
        );
    }
    // Zero, as a number: the plugin refuses it too.
    assert!(!plugin_accepts("0"));
    let err = template(&helm, &["--set", "telemetryInterval=0"]).expect_err("interval 0");
    assert!(err.contains("/telemetryInterval"), "{err}");
}

#[test]
fn interval_flags_take_seconds_or_minutes_and_name_the_valid_forms_otherwise() {
    for flag in ["--telemetry-interval", "--inventory-interval"] {
        for good in ["10", "10s", "2m"] {
            let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
                .args(["kubelet-plugin", flag, good, "--help"])
                .output()
                .expect("run gpu-dra");
            assert!(out.status.success(), "{flag} {good}");
        }
        for (bad, why) in [
            ("1.5m", "give whole seconds (30 or 30s) or minutes (2m)"),
            ("0s", "is zero; give at least 1s"),
        ] {
            let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
                .args(["kubelet-plugin", flag, bad])
                .output()
                .expect("run gpu-dra");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{flag} {bad}: {err}");
            assert!(
                err.contains(flag) && err.contains(&format!("\"{bad}\"")) && err.contains(why),
                "{flag} {bad}: {err}"
            );
        }
    }
}

#[test]
fn the_orphan_grace_period_reaches_every_plugin_daemonset_and_the_schema_refuses_what_the_plugin_would()
 {
    let Some(helm) = tool("helm", "the orphan-grace-period chart checks") else {
        return;
    };
    let flag = "--orphan-grace-period";
    let cases: [(&[&str], &str); 4] = [
        (&[], "10m"),
        (&["--set", "orphanGracePeriod=0"], "0"),
        (&["--set", "orphanGracePeriod=30s"], "30s"),
        (&["--set", "orphanGracePeriod=90"], "90"),
    ];
    for (extra, want) in cases {
        let manifests = template(&helm, extra).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        let got = rendered_intervals(&manifests, "GPU_DRA_ORPHAN_GRACE_PERIOD");
        assert!(!got.is_empty(), "{extra:?}: no DaemonSet rendered");
        assert_eq!(got, vec![Some(want.to_string()); got.len()], "{extra:?}");
        assert!(
            plugin_flag_accepts(flag, want),
            "the plugin refuses {want:?}"
        );
    }
    for bad in ["1h", "1.5m", "10ms", "ten"] {
        assert!(
            !plugin_flag_accepts(flag, bad),
            "the plugin takes {bad:?} after all"
        );
        let err = template(&helm, &["--set", &format!("orphanGracePeriod={bad}")])
            .expect_err(&format!("helm rendered orphanGracePeriod={bad}"));
        assert!(err.contains("/orphanGracePeriod"), "{bad}: {err}");
    }
}
