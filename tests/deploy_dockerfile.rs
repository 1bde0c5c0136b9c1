//! What can be checked of the container image without a container engine: the Dockerfile
//! builds the crate's binary with the toolchain the crate needs and ships exactly it.

mod deploy_support;

use std::fs;

use deploy_support::repo;

fn dockerfile() -> String {
    fs::read_to_string(repo().join("deployments/container/Dockerfile")).unwrap()
}

/// The value of `key = "value"` in Cargo.toml's `section` (a tiny reader: the file is ours).
fn cargo_value(section: &str, key: &str) -> String {
    let text = fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == section;
        } else if in_section
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == key
        {
            return v.trim().trim_matches('"').to_string();
        }
    }
    panic!("Cargo.toml has no {key} in {section}");
}

/// `ARG NAME=value` default of the Dockerfile.
fn arg_default(text: &str, name: &str) -> String {
    let prefix = format!("ARG {name}=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("Dockerfile has no ARG {name}"))
        .to_string()
}

#[test]
fn builder_uses_the_toolchain_the_crate_declares() {
    let text = dockerfile();
    let image = arg_default(&text, "RUST_IMAGE");
    let version = image
        .strip_prefix("rust:")
        .and_then(|tag| tag.split('-').next())
        .unwrap_or_else(|| panic!("builder image {image} is not an official rust image"));
    let got = (version.to_string(), cargo_value("[package]", "edition"));
    // rust-version is the oldest toolchain that builds the crate; edition 2024 needs >= 1.85.
    let want = (cargo_value("[package]", "rust-version"), "2024".to_string());
    assert_eq!(got, want);
}

#[test]
fn image_ships_the_dist_binary_cargo_builds_and_runs_it() {
    let text = dockerfile();
    let bin = cargo_value("[[bin]]", "name");
    let copy = text
        .lines()
        .find(|l| l.starts_with("COPY --from=build "))
        .expect("the runtime stage copies from the builder");
    let parts: Vec<&str> = copy.split_whitespace().collect();
    let entrypoint = text
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .expect("an ENTRYPOINT");
    let got = (
        text.contains(&format!(
            "cargo build --profile dist --locked --target \"$target\" --bin {bin}"
        )),
        text.contains(&format!("cp \"target/$target/dist/{bin}\" /{bin}")),
        cargo_value("[profile.dist]", "inherits"),
        parts[2].to_string(),
        entrypoint.to_string(),
    );
    // tini as PID 1 reaps the MPS daemons the plugin detaches, then runs the binary.
    let want = (
        true,
        true,
        "release".to_string(),
        format!("/{bin}"),
        format!("[\"/usr/bin/tini\", \"--\", \"{}\"]", parts[3]),
    );
    assert_eq!(got, want);
}

#[test]
fn image_is_multi_stage_with_a_slim_runtime_and_oci_labels() {
    let text = dockerfile();
    let stages: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    let runtime = arg_default(&text, "RUNTIME_IMAGE");
    let labels = ["title", "description", "version", "licenses"]
        .map(|l| text.contains(&format!("org.opencontainers.image.{l}=")));
    let got = (stages, runtime.starts_with("rust:"), labels);
    let want = (
        vec!["FROM ${RUST_IMAGE} AS build", "FROM ${RUNTIME_IMAGE}"],
        false,
        [true; 4],
    );
    assert_eq!(got, want);
}

#[test]
fn build_context_leaves_out_the_target_dir() {
    let ignore = fs::read_to_string(repo().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim() == "target"), "{ignore}");
}
