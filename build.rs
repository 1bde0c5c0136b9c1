//! Compiles the kubelet-facing protocols in `proto/` with protox, a pure-Rust protobuf compiler,
//! so a fresh machine needs no `protoc` to build the crate.

const PROTOS: [&str; 5] = [
    "proto/pluginregistration/api.proto",
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
    "proto/dra-health/v1alpha1/api.proto",
    "proto/dra-health/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        // Ordered maps keep responses deterministic, so tests can compare whole messages.
        .btree_map(".")
        .compile_fds(descriptors)?;
    Ok(())
}
