//! Shared by the `deploy_*` tests: the repository paths and the external tools (helm,
//! shellcheck) that `.ci/run` installs. A test needing a missing tool prints a notice and
//! passes, so `cargo test` works on a machine without them; CI always has them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Helm chart's directory.
pub fn chart_dir() -> PathBuf {
    repo().join("deployments/helm/gpu-dra")
}

/// `name` on PATH, or where `.ci/run` caches it (`target/ci-tools/bin`); `None` (after
/// printing why the caller skips) when neither has it.
pub fn tool(name: &str, skipping: &str) -> Option<PathBuf> {
    let cached = repo().join("target/ci-tools/bin").join(name);
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    let found = on_path.or_else(|| cached.is_file().then_some(cached));
    if found.is_none() {
        eprintln!(
            "notice: `{name}` not found on PATH or in target/ci-tools/bin; skipping {skipping} (.ci/run installs it)"
        );
    }
    found
}

/// Runs a command, panicking with its stderr when it fails; returns stdout.
pub fn run(program: &Path, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed:\n{}{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Reads a YAML file as JSON values (for the schema validator and comparisons).
pub fn yaml_file(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    serde_json::to_value(yaml).unwrap()
}

/// Every non-empty document of a multi-document YAML stream.
pub fn yaml_documents(text: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap();
            serde_json::to_value(value).unwrap()
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The chart rendered by `helm template` (release `gpu-dra`, namespace `gpu-dra`) with
/// `extra` arguments, as documents; panics with helm's stderr when it refuses.
pub fn render_chart(helm: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "gpu-dra",
        chart.to_str().unwrap(),
        "--namespace",
        "gpu-dra",
    ];
    args.extend_from_slice(extra);
    yaml_documents(&run(helm, &args))
}

/// A rendered container's env entries by name: the literal value, or `fieldRef:<path>` for a
/// downward-API field.
pub fn container_env(container: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match e.get("value") {
                Some(v) => v.as_str().unwrap().to_string(),
                None => format!(
                    "fieldRef:{}",
                    e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap()
                ),
            };
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect()
}
