#!/usr/bin/env bash
# Deletes the kind cluster the other hack/kind scripts created.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  echo "Usage: hack/kind/delete-cluster.sh   (deletes kind cluster '${KIND_CLUSTER_NAME}'; env KIND_CLUSTER_NAME)"
  exit 0
fi
need kind
kind delete cluster --name "${KIND_CLUSTER_NAME}"
