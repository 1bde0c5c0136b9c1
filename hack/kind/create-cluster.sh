#!/usr/bin/env bash
# Creates a kind cluster with DRA and CDI enabled and three workers labelled for simulated
# GPU presets: dgx-h100 (dynamic MIG), dgx-a100 (pre-partitioned MIG) and l4-x4 (GPUs shared
# by consumable capacity).
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<USAGE
Usage: hack/kind/create-cluster.sh

Creates kind cluster '${KIND_CLUSTER_NAME}' (node image ${KIND_NODE_IMAGE}) from
hack/kind/kind-config.yaml and switches kubectl to context ${KUBE_CONTEXT}.
Environment: KIND_CLUSTER_NAME, KIND_NODE_IMAGE.
Next: hack/kind/build-image.sh, then hack/kind/install.sh.
USAGE
}
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  usage
  exit 0
fi
need kind kubectl

if kind get clusters 2>/dev/null | grep -qx "${KIND_CLUSTER_NAME}"; then
  log "kind cluster ${KIND_CLUSTER_NAME} already exists; using it"
else
  log "creating kind cluster ${KIND_CLUSTER_NAME} (${KIND_NODE_IMAGE})"
  kind create cluster --name "${KIND_CLUSTER_NAME}" --image "${KIND_NODE_IMAGE}" \
    --config "${REPO_ROOT}/hack/kind/kind-config.yaml" --wait 120s
fi
kubectl config use-context "${KUBE_CONTEXT}" >/dev/null
kubectl get nodes -L gpu-dra.dev/sim-preset
