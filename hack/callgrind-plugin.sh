#!/usr/bin/env bash
# Runs the kubelet plugin under valgrind's callgrind, writing one profile per kubelet prepare
# call: a dump when the call's future is dropped, so each file holds one call and whatever
# the plugin did since the previous one (the background work between calls and any
# unprepare calls in between included). Instruction counts do not drift with the machine's
# speed the way CPU time does (docs/architecture.md, "Counted instructions per call").
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  cat <<'USAGE'
Usage: GPU_DRA_PLUGIN_BIN=hack/callgrind-plugin.sh GPU_DRA_BENCH_HARNESS_ONLY=1 \
         cargo bench --bench prepare
       then hack/callgrind-calls.sh to list the instructions per call.
  The bench starts this script with the plugin's arguments (it needs valgrind).
  CALLGRIND_OUT     where the profiles go (default /tmp/gpu-dra-callgrind)
  GPU_DRA_REAL_BIN  the binary to profile (default: target/release/gpu-dra of this checkout)
  CALLGRIND_DUMP_INSTR  yes: keep instruction addresses, for hack/callgrind-footprint.py
                    (default no)
USAGE
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
out=${CALLGRIND_OUT:-/tmp/gpu-dra-callgrind}
mkdir -p "$out"
call='core::ptr::drop_in_place<<gpu_dra::kubelet::dra::DraV1<*as gpu_dra::kubelet::proto::dra_v1::dra_plugin_server::DraPlugin>::node_'
exec valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" "--dump-instr=${CALLGRIND_DUMP_INSTR:-no}" \
  "--dump-after=${call}prepare_resources*" \
  "${GPU_DRA_REAL_BIN:-$here/target/release/gpu-dra}" "$@" 2>>"$out/valgrind.log"
