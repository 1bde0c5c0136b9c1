#!/usr/bin/env bash
# Runs the seed talk's examples (examples/*.yaml) in the kind cluster and shows which GPUs each
# pod got, as the pods themselves print them from the env the CDI spec sets: one
# DRA_GPU_UUID_<device> per device given to the container (NVIDIA_VISIBLE_DEVICES is void).
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<USAGE
Usage: hack/kind/demo.sh [--delete]

Applies every examples/*.yaml into namespace \$DEMO_NAMESPACE (default gpu-dra-demo) of
context ${KUBE_CONTEXT}, waits for the pods and prints their GPU env.
  --delete   remove the demo namespace (and so its claims) instead
USAGE
}
namespace="${DEMO_NAMESPACE:-gpu-dra-demo}"
kubectl_() {
  kubectl --context "${KUBE_CONTEXT}" "$@"
}
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  --delete)
    need kubectl
    kubectl_ delete namespace "${namespace}" --ignore-not-found --wait
    exit 0
    ;;
  "") ;;
  *) echo "error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac
need kubectl

kubectl_ create namespace "${namespace}" --dry-run=client -o yaml | kubectl_ apply -f - >/dev/null
for example in "${REPO_ROOT}"/examples/*.yaml; do
  log "applying examples/$(basename "${example}")"
  kubectl_ -n "${namespace}" apply -f "${example}"
done

log "waiting for the pods (image pulls can take a minute)"
if ! kubectl_ -n "${namespace}" wait --for=condition=Ready pod --all --timeout=300s; then
  kubectl_ -n "${namespace}" get pods -o wide
  echo "error: not every pod is ready; 'kubectl -n ${namespace} describe pod NAME' says why" >&2
  exit 1
fi
kubectl_ -n "${namespace}" get pods -o wide
kubectl_ -n "${namespace}" get resourceclaims

for pod in $(kubectl_ -n "${namespace}" get pods -o jsonpath='{.items[*].metadata.name}'); do
  log "${pod}"
  kubectl_ -n "${namespace}" logs "${pod}" --all-containers --prefix
done
log "done: hack/kind/demo.sh --delete removes the pods and releases their GPUs"
