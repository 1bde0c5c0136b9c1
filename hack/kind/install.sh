#!/usr/bin/env bash
# Installs (or upgrades) the gpu-dra chart with simulated GPUs into the kind cluster and waits
# until every labelled worker publishes its ResourceSlices.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<USAGE
Usage: hack/kind/install.sh [--build] [extra helm arguments...]

helm upgrade --install ${HELM_RELEASE} into namespace ${HELM_NAMESPACE} of context
${KUBE_CONTEXT}, with deployments/helm/gpu-dra/values-sim.yaml and image ${IMAGE}.
  --build   first build the image and load it into the cluster (hack/kind/build-image.sh)
Extra arguments go to helm, e.g. --set logging.format=json.
Environment: KIND_CLUSTER_NAME, IMAGE_REPOSITORY, IMAGE_TAG, HELM_RELEASE, HELM_NAMESPACE,
WAIT_SECONDS (default 180).
USAGE
}
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  usage
  exit 0
fi
if [ "${1:-}" = "--build" ]; then
  shift
  "${REPO_ROOT}/hack/kind/build-image.sh"
fi
need helm kubectl
wait_seconds="${WAIT_SECONDS:-180}"

log "installing chart ${CHART_DIR} as ${HELM_RELEASE} (image ${IMAGE})"
helm upgrade --install "${HELM_RELEASE}" "${CHART_DIR}" \
  --kube-context "${KUBE_CONTEXT}" \
  --namespace "${HELM_NAMESPACE}" --create-namespace \
  -f "${CHART_DIR}/values-sim.yaml" \
  --set image.repository="${IMAGE_REPOSITORY}" --set image.tag="${IMAGE_TAG}" \
  --wait --timeout "${wait_seconds}s" "$@"

log "waiting for every labelled node to publish ResourceSlices"
mapfile -t nodes < <(kubectl --context "${KUBE_CONTEXT}" get nodes -l gpu-dra.dev/sim-preset \
  -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
if [ "${#nodes[@]}" -eq 0 ]; then
  echo "error: no node carries the gpu-dra.dev/sim-preset label; see hack/kind/kind-config.yaml" >&2
  exit 1
fi
deadline=$((SECONDS + wait_seconds))
for node in "${nodes[@]}"; do
  until [ -n "$(kubectl --context "${KUBE_CONTEXT}" get resourceslices \
    --field-selector "spec.nodeName=${node}" -o name)" ]; do
    if [ "${SECONDS}" -ge "${deadline}" ]; then
      echo "error: node ${node} published no ResourceSlice within ${wait_seconds}s; plugin logs:" >&2
      kubectl --context "${KUBE_CONTEXT}" -n "${HELM_NAMESPACE}" logs --tail 50 \
        -l "app.kubernetes.io/instance=${HELM_RELEASE}" --all-containers --prefix >&2 || true
      exit 1
    fi
    sleep 2
  done
  echo "    ${node}: $(kubectl --context "${KUBE_CONTEXT}" get resourceslices \
    --field-selector "spec.nodeName=${node}" -o name | wc -l) ResourceSlices"
done
log "ready: hack/kind/demo.sh runs the examples, hack/e2e.sh the e2e suite"
