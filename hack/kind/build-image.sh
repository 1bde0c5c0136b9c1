#!/usr/bin/env bash
# Builds the gpu-dra image from deployments/container/Dockerfile and loads it into the kind
# cluster's nodes (no registry needed).
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<USAGE
Usage: hack/kind/build-image.sh [--no-load]

Builds ${IMAGE} with ${CONTAINER_TOOL} and loads it into kind cluster '${KIND_CLUSTER_NAME}'.
  --no-load   build only
Environment: IMAGE_REPOSITORY, IMAGE_TAG, CONTAINER_TOOL (docker|podman), KIND_CLUSTER_NAME.
USAGE
}
load=true
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  --no-load) load=false ;;
  "") ;;
  *) echo "error: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac
need "${CONTAINER_TOOL}"

log "building ${IMAGE}"
"${CONTAINER_TOOL}" build -f "${REPO_ROOT}/deployments/container/Dockerfile" -t "${IMAGE}" "${REPO_ROOT}"

if [ "${load}" = true ]; then
  need kind
  log "loading ${IMAGE} into kind cluster ${KIND_CLUSTER_NAME}"
  if [ "${CONTAINER_TOOL}" = docker ]; then
    kind load docker-image "${IMAGE}" --name "${KIND_CLUSTER_NAME}"
  else
    # kind reads docker's image store only; other engines hand over an archive.
    archive="$(mktemp -t gpu-dra-image.XXXXXX.tar)"
    trap 'rm -f "${archive}"' EXIT
    "${CONTAINER_TOOL}" save -o "${archive}" "${IMAGE}"
    kind load image-archive "${archive}" --name "${KIND_CLUSTER_NAME}"
  fi
fi
