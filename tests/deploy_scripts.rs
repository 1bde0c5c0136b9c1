//! The shell scripts under `hack/` and `.ci/`: conventional headers, a usage text, and
//! shellcheck clean (skipped with a notice when shellcheck is absent; `.ci/run` installs it).

mod deploy_support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use deploy_support::{repo, run, tool};

/// Scripts meant to be run, relative to the repository root.
const RUNNABLE: &[&str] = &[
    ".ci/run",
    "hack/callgrind-calls.sh",
    "hack/callgrind-plugin.sh",
    "hack/dry-run-chart.sh",
    "hack/dry-run-slices.sh",
    "hack/e2e.sh",
    "hack/kind/build-image.sh",
    "hack/kind/create-cluster.sh",
    "hack/kind/delete-cluster.sh",
    "hack/kind/demo.sh",
    "hack/kind/install.sh",
];

/// Files the scripts source.
const SOURCED: &[&str] = &["hack/e2e-lib.sh", "hack/kind/common.sh"];

/// Every `*.sh` under hack/ plus `.ci/run`, as `.ci/run` hands them to shellcheck.
fn all_scripts() -> Vec<String> {
    fn walk(dir: PathBuf, found: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(path, found);
            } else if path.extension().is_some_and(|e| e == "sh") {
                let relative = path.strip_prefix(repo()).unwrap();
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    let mut found = vec![".ci/run".to_string()];
    walk(repo().join("hack"), &mut found);
    found.sort();
    found
}

#[test]
fn every_script_is_listed_as_runnable_or_sourced() {
    let mut want: Vec<String> = RUNNABLE
        .iter()
        .chain(SOURCED)
        .map(|s| s.to_string())
        .collect();
    want.sort();
    assert_eq!(all_scripts(), want);
}

#[test]
fn runnable_scripts_are_executable_bash_with_strict_mode() {
    let got: Vec<(&str, bool, bool, bool)> = RUNNABLE
        .iter()
        .map(|script| {
            let path = repo().join(script);
            let text = fs::read_to_string(&path).unwrap();
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            (
                *script,
                mode & 0o111 != 0,
                text.starts_with("#!/usr/bin/env bash\n"),
                text.lines().any(|l| l == "set -euo pipefail"),
            )
        })
        .collect();
    let want: Vec<(&str, bool, bool, bool)> =
        RUNNABLE.iter().map(|s| (*s, true, true, true)).collect();
    assert_eq!(got, want);
}

#[test]
fn runnable_hack_scripts_print_usage_on_help() {
    let got: Vec<(&str, bool, bool)> = RUNNABLE
        .iter()
        .filter(|s| s.starts_with("hack/"))
        .map(|script| {
            let output = Command::new("bash")
                .arg(repo().join(script))
                .arg("--help")
                .env("PATH", "/usr/bin:/bin")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            (*script, output.status.success(), stdout.contains("Usage: "))
        })
        .collect();
    let want: Vec<(&str, bool, bool)> = RUNNABLE
        .iter()
        .filter(|s| s.starts_with("hack/"))
        .map(|s| (*s, true, true))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn e2e_rejects_an_unknown_case_naming_the_valid_ones() {
    let output = Command::new("bash")
        .arg(repo().join("hack/e2e.sh"))
        .arg("dedicatd")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let want = "error: unknown case 'dedicatd'; cases: dedicated shared-claim mig-parent time-slicing mps consumable-capacity quota health capacity-report\n";
    assert_eq!((output.status.code(), stderr.as_ref()), (Some(2), want));
}

#[test]
fn every_script_passes_shellcheck() {
    let Some(shellcheck) = tool("shellcheck", "the shellcheck run") else {
        return;
    };
    let scripts = all_scripts();
    let args: Vec<&str> = scripts.iter().map(String::as_str).collect();
    let report = run(&shellcheck, &args);
    assert_eq!(report, "");
}
