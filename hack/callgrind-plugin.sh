#!/bin/sh
# Runs the kubelet plugin under valgrind's callgrind, writing one profile per kubelet call:
# a dump after each NodePrepareResources and NodeUnprepareResources answer, so each file
# holds one call and whatever the plugin did since the previous one (the background work
# between calls included). Instruction counts do not drift with the machine's speed the
# way CPU time does (docs/architecture.md, "Counted instructions per call").
#
#   GPU_DRA_PLUGIN_BIN=hack/callgrind-plugin.sh GPU_DRA_BENCH_HARNESS_ONLY=1 \
#       cargo bench --bench prepare
#   hack/callgrind-calls.sh            # instructions per call, in call order
#
# CALLGRIND_OUT (default /tmp/gpu-dra-callgrind) is where the profiles go; GPU_DRA_REAL_BIN
# the binary to profile (default: the release build next to this script's checkout).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
out=${CALLGRIND_OUT:-/tmp/gpu-dra-callgrind}
mkdir -p "$out"
call='core::ptr::drop_in_place<<gpu_dra::kubelet::dra::DraV1<*as gpu_dra::kubelet::proto::dra_v1::dra_plugin_server::DraPlugin>::node_'
exec valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" --dump-instr=no \
    "--dump-after=${call}prepare_resources*" \
    "--dump-after=${call}unprepare_resources*" \
    "${GPU_DRA_REAL_BIN:-$here/target/release/gpu-dra}" "$@" 2>>"$out/valgrind.log"
