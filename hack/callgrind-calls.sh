#!/usr/bin/env bash
# Lists the profiles hack/callgrind-plugin.sh wrote: one line per kubelet prepare call, in
# order, with the instructions the plugin ran for it and since the call before. The first
# profile also holds the plugin's start-up.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  echo "Usage: hack/callgrind-calls.sh   (reads CALLGRIND_OUT, default /tmp/gpu-dra-callgrind)"
  exit 0
fi
out=${CALLGRIND_OUT:-/tmp/gpu-dra-callgrind}
n=1
while [ -f "$out/callgrind.out.$n" ]; do
  total=$(sed -n 's/^summary: *//p; s/^totals: *//p' "$out/callgrind.out.$n" | head -n 1)
  printf '%5d %12s\n' "$n" "$total"
  n=$((n + 1))
done
if [ "$n" -eq 1 ]; then
  echo "error: no profiles in $out; run the prepare bench with hack/callgrind-plugin.sh first" >&2
  exit 1
fi
