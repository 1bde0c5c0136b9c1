//! The `gpu-dra` binary: flag parsing and the edge where library errors become exit codes.

fn main() {}
