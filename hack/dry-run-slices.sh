#!/usr/bin/env bash
# Checks that the API server of the current kubeconfig accepts the ResourceSlices gpu-dra
# publishes for every simulated preset (server-side dry run: nothing is stored).
# Usage: hack/dry-run-slices.sh [preset...]   (needs kubectl and a cluster with resource.k8s.io/v1)
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  echo "Usage: hack/dry-run-slices.sh [preset...]   (default: every built-in preset)"
  exit 0
fi
cd "$(dirname "$0")/.."
cargo build --quiet --release --bin gpu-dra
bin=target/release/gpu-dra
if [ "$#" -eq 0 ]; then
  set -- mixed dgx-a100 dgx-a100-80 dgx-h100 dgx-h200 dgx-b200 hgx-h100-16 a30-x4 l4-x4 rtx4090
fi
status=0
for preset in "$@"; do
  if "$bin" inventory --sim-node "$preset" -o yaml | kubectl create --dry-run=server -f - >/dev/null; then
    echo "ok    $preset"
  else
    echo "FAIL  $preset"
    status=1
  fi
done
exit "$status"
