#!/usr/bin/env bash
# Renders the Helm chart for the default and the sim values and asks the API server of the
# current kubeconfig to accept every object (server-side dry run: nothing is stored).
# The namespace must exist (default: default) because namespaced objects are validated in it.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<USAGE
Usage: hack/dry-run-chart.sh [-n NAMESPACE] [values-file...]

Default values files: deployments/helm/gpu-dra/values.yaml and values-sim.yaml.
Needs helm and kubectl, and a cluster serving resource.k8s.io/v1 (Kubernetes 1.34+).
USAGE
}
namespace=default
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    -n | --namespace)
      [ "$#" -ge 2 ] || { echo "error: $1 needs a namespace" >&2; exit 2; }
      namespace="$2"
      shift 2
      ;;
    -*) echo "error: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
chart=deployments/helm/gpu-dra
if [ "$#" -eq 0 ]; then
  set -- "$chart/values.yaml" "$chart/values-sim.yaml"
fi
for tool in helm kubectl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' is not on PATH" >&2; exit 1; }
done

status=0
for values in "$@"; do
  rendered="$(mktemp -t gpu-dra-chart.XXXXXX.yaml)"
  if ! helm template gpu-dra "$chart" --namespace "$namespace" -f "$values" >"$rendered"; then
    echo "FAIL  $values (helm template)"
    status=1
  elif kubectl apply --dry-run=server --namespace "$namespace" -f "$rendered" >/dev/null; then
    echo "ok    $values"
  else
    echo "FAIL  $values (rejected by the API server; the error is above)"
    status=1
  fi
  rm -f "$rendered"
done
exit "$status"
