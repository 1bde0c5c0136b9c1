# Shared settings of the hack/kind scripts (sourced, not run). Every value can be overridden
# from the environment.
# shellcheck shell=bash
# The variables are used by the scripts that source this file.
# shellcheck disable=SC2034

# The repository root, whatever directory the caller runs from.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KIND_CLUSTER_NAME="${KIND_CLUSTER_NAME:-gpu-dra}"
# Kubernetes 1.35: DRA (resource.k8s.io/v1) is GA; partitionable devices and consumable
# capacity are alpha and enabled in kind-config.yaml.
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.35.0}"
IMAGE_REPOSITORY="${IMAGE_REPOSITORY:-gpu-dra}"
IMAGE_TAG="${IMAGE_TAG:-dev}"
IMAGE="${IMAGE_REPOSITORY}:${IMAGE_TAG}"
# docker or podman.
CONTAINER_TOOL="${CONTAINER_TOOL:-docker}"
HELM_RELEASE="${HELM_RELEASE:-gpu-dra}"
HELM_NAMESPACE="${HELM_NAMESPACE:-gpu-dra}"
CHART_DIR="${REPO_ROOT}/deployments/helm/gpu-dra"
KUBE_CONTEXT="kind-${KIND_CLUSTER_NAME}"

# Exits with a message when a command the script needs is missing.
need() {
  local tool
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "error: '$tool' is not on PATH; install it first (see README.md, Quickstart)" >&2
      exit 1
    fi
  done
}

log() {
  echo "==> $*"
}
