#!/usr/bin/env bash
# End-to-end suite for gpu-dra against the cluster of the current kubeconfig (e.g. the kind
# cluster of hack/kind/, or real GPU nodes). Each case creates claims and pods, checks that the
# containers see their devices through the env of the claim's CDI spec, deletes them and checks
# that unprepare cleaned up: claims deallocated or deleted, the claim's CDI spec file gone.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: hack/e2e.sh [case...]

Cases (default: all): dedicated shared-claim mig-parent time-slicing mps consumable-capacity
                       quota health capacity-report

The cluster needs gpu-dra installed (hack/kind/install.sh, or the Helm chart on GPU nodes):
full H100 GPUs and dynamic MIG on H100s (kind: the dgx-h100 worker), full A100s (dgx-a100),
and for consumable-capacity GPUs published with sharing.sharedGpus=memory (l4-x4); a case
whose devices no node publishes fails with the reason. The quota case creates (and deletes) a
cluster-scoped DeviceClass, gpu-dra-e2e-mig-3g40gb, besides the namespace. The health case
needs simulated GPUs: it injects an XID with `gpu-dra sim-fault` in the plugin pod of an H100
node, checks the device taint and the scheduling around it, and resets the GPU. The
capacity-report case runs `gpu-dra capacity` on this machine against the same cluster
(the kubeconfig kubectl uses), so it needs the gpu-dra binary here.

Environment:
  E2E_NAMESPACE   namespace the suite creates and deletes (gpu-dra-e2e)
  E2E_IMAGE       container image with a shell, printenv and ls (busybox:1.36)
  E2E_TIMEOUT     seconds to wait for a pod or a cleanup (180)
  E2E_KEEP=1      keep the namespace after the run, to look around
  DRIVER_NAME     the driver's name (gpu.nvidia.com)
  CDI_ROOT        where the plugin writes CDI specs on the nodes (/var/run/cdi)
  PLUGIN_NAMESPACE  namespace of the gpu-dra plugin pods (gpu-dra)
  GPU_DRA         the gpu-dra binary for the capacity-report case (gpu-dra on PATH)
USAGE
}

namespace="${E2E_NAMESPACE:-gpu-dra-e2e}"
image="${E2E_IMAGE:-busybox:1.36}"
timeout="${E2E_TIMEOUT:-180}"
driver="${DRIVER_NAME:-gpu.nvidia.com}"
cdi_root="${CDI_ROOT:-/var/run/cdi}"
plugin_namespace="${PLUGIN_NAMESPACE:-gpu-dra}"
gpu_dra="${GPU_DRA:-gpu-dra}"
taint_key=gpu.nvidia.com/unhealthy
all_cases=(dedicated shared-claim mig-parent time-slicing mps consumable-capacity quota health
  capacity-report)
quota_class=gpu-dra-e2e-mig-3g40gb

# shellcheck source=e2e-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/e2e-lib.sh"

h100="device.attributes['${driver}'].productName.startsWith('NVIDIA H100')"
a100="device.attributes['${driver}'].productName.startsWith('NVIDIA A100')"

case_dedicated() {
  {
    template dedicated gpu.nvidia.com "${h100}"
    echo "---"
    pod_spec_head dedicated
    echo "  containers:"
    container ctr gpu
    echo "  resourceClaims: [{name: gpu, resourceClaimTemplateName: dedicated}]"
  } | k apply -f - >/dev/null
  wait_ready dedicated || return 1
  local claim
  claim="$(claim_of dedicated gpu)"
  check_sees_claim dedicated ctr "${claim}" >/dev/null || return 1
  check_cleanup "${claim}" template dedicated
}

case_shared_claim() {
  {
    cat <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: shared
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: "${a100}"
YAML
    for pod in shared-0 shared-1; do
      echo "---"
      pod_spec_head "${pod}"
      echo "  containers:"
      container ctr gpu
      echo "  resourceClaims: [{name: gpu, resourceClaimName: shared}]"
    done
  } | k apply -f - >/dev/null
  wait_ready shared-0 || return 1
  wait_ready shared-1 || return 1
  local first second
  first="$(check_sees_claim shared-0 ctr shared)" || return 1
  second="$(check_sees_claim shared-1 ctr shared)" || return 1
  expect_eq "GPU of the second pod sharing the claim" "${first}" "${second}" || return 1
  check_cleanup shared named shared-0 shared-1
}

case_mig_parent() {
  {
    cat <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: mig-parent
spec:
  spec:
    devices:
      requests:
      - name: small
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['${driver}'].profile == '1g.10gb'"
      - name: medium
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['${driver}'].profile == '2g.20gb'"
      constraints:
      - requests: ["small", "medium"]
        matchAttribute: "${driver}/parentUUID"
---
YAML
    pod_spec_head mig-parent
    echo "  containers:"
    container small mig small
    container medium mig medium
    echo "  resourceClaims: [{name: mig, resourceClaimTemplateName: mig-parent}]"
  } | k apply -f - >/dev/null
  wait_ready mig-parent || return 1
  local claim small medium parents
  claim="$(claim_of mig-parent mig)"
  small="$(check_sees_claim mig-parent small "${claim}" small)" || return 1
  medium="$(check_sees_claim mig-parent medium "${claim}" medium)" || return 1
  if [[ "${small}" != MIG-* || "${small}" == *" "* || "${medium}" != MIG-* || "${medium}" == *" "* ]]; then
    fail "containers should get one MIG device each, got '${small}' and '${medium}'" || return 1
  fi
  [ "${small}" != "${medium}" ] || fail "both containers see the same MIG device ${small}" || return 1
  parents="$(allocated "${claim}" | while read -r pool device; do
    device_attr "${pool}" "${device}" parentUUID
    echo
  done | sort -u | grep -c .)"
  expect_eq "distinct parentUUIDs of the allocated MIG devices" 1 "${parents}" || return 1
  check_cleanup "${claim}" template mig-parent
}

case_time_slicing() {
  {
    template time-slicing gpu.nvidia.com "${h100}" "" "$(gpu_config "$(cat <<'YAML'
              strategy: TimeSlicing
              timeSlicingConfig:
                interval: Long
YAML
)")"
    echo "---"
    pod_spec_head time-slicing
    echo "  containers:"
    container ctr0 gpu
    container ctr1 gpu
    echo "  resourceClaims: [{name: gpu, resourceClaimTemplateName: time-slicing}]"
  } | k apply -f - >/dev/null
  wait_ready time-slicing || return 1
  local claim first second
  claim="$(claim_of time-slicing gpu)"
  first="$(check_sees_claim time-slicing ctr0 "${claim}")" || return 1
  second="$(check_sees_claim time-slicing ctr1 "${claim}")" || return 1
  expect_eq "GPU of the second time-sliced container" "${first}" "${second}" || return 1
  check_cleanup "${claim}" template time-slicing
}

case_mps() {
  {
    template mps gpu.nvidia.com "${h100}" "" "$(gpu_config "$(cat <<'YAML'
              strategy: MPS
              mpsConfig:
                defaultActiveThreadPercentage: 50
                defaultPinnedDeviceMemoryLimit: 10Gi
YAML
)")"
    echo "---"
    pod_spec_head mps
    echo "  containers:"
    container ctr0 gpu
    container ctr1 gpu
    echo "  resourceClaims: [{name: gpu, resourceClaimTemplateName: mps}]"
  } | k apply -f - >/dev/null
  wait_ready mps || return 1
  local claim ctr
  claim="$(claim_of mps gpu)"
  for ctr in ctr0 ctr1; do
    check_sees_claim mps "${ctr}" "${claim}" >/dev/null || return 1
    expect_nonempty "CUDA_MPS_PIPE_DIRECTORY in ${ctr}" "$(pod_env mps "${ctr}" CUDA_MPS_PIPE_DIRECTORY)" || return 1
    expect_eq "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in ${ctr}" 50 \
      "$(pod_env mps "${ctr}" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)" || return 1
    expect_nonempty "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in ${ctr}" \
      "$(pod_env mps "${ctr}" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)" || return 1
  done
  check_cleanup "${claim}" template mps
}

case_consumable_capacity() {
  local shareable
  shareable="$(kubectl get resourceslices --field-selector "spec.driver=${driver}" \
    -o jsonpath='{.items[*].spec.devices[?(@.allowMultipleAllocations==true)].name}')"
  if [ -z "${shareable}" ]; then
    fail "no node publishes shareable devices: install with sharing.sharedGpus=memory (kind: the l4-x4 worker)" || return 1
  fi
  {
    template capacity gpu.nvidia.com "device.allowMultipleAllocations" "$(cat <<'YAML'
          capacity:
            requests:
              memory: 4Gi
YAML
)"
    for pod in capacity-0 capacity-1; do
      echo "---"
      pod_spec_head "${pod}"
      echo "  containers:"
      container ctr gpu
      echo "  resourceClaims: [{name: gpu, resourceClaimTemplateName: capacity}]"
    done
  } | k apply -f - >/dev/null
  local pod claim share consumed
  for pod in capacity-0 capacity-1; do
    wait_ready "${pod}" || return 1
    claim="$(claim_of "${pod}" gpu)"
    check_sees_claim "${pod}" ctr "${claim}" >/dev/null || return 1
    share="$(k get resourceclaim "${claim}" -o jsonpath='{.status.allocation.devices.results[0].shareID}')"
    expect_nonempty "shareID of claim ${claim}" "${share}" || return 1
    consumed="$(k get resourceclaim "${claim}" -o jsonpath='{.status.allocation.devices.results[0].consumedCapacity.memory}')"
    expect_eq "memory consumed by claim ${claim}" 4Gi "${consumed}" || return 1
    expect_nonempty "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in ${pod}" \
      "$(pod_env "${pod}" ctr CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)" || return 1
  done
  for pod in capacity-0 capacity-1; do
    check_cleanup "$(claim_of "${pod}" gpu)" template "${pod}" || return 1
  done
}

# A team capped at two 3g.40gb MIG devices (examples/quota-team-mig.yaml): a DeviceClass for
# the profile and a ResourceQuota on <class>.deviceclass.resource.k8s.io/devices. The API
# server charges claims when they are created, so no pod is needed to see the third refused.
case_quota() {
  local key="${quota_class}.deviceclass.resource.k8s.io/devices" i out waited=0
  kubectl apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: ${quota_class}
spec:
  selectors:
  - cel:
      expression: "device.driver == '${driver}' && device.attributes['${driver}'].type == 'mig' && device.attributes['${driver}'].profile == '3g.40gb'"
YAML
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ResourceQuota
metadata:
  name: gpu-devices
spec:
  hard:
    ${key}: "2"
YAML
  # Admission enforces what the quota controller has copied into status.hard.
  until k get resourcequota gpu-devices -o jsonpath='{.status.hard}' | grep -q "${key}"; do
    [ "${waited}" -lt "${timeout}" ] || { fail "ResourceQuota gpu-devices has no status.hard after ${timeout}s"; return 1; }
    sleep 1
    waited=$((waited + 1))
  done
  for i in 0 1 2; do
    if out="$(k apply -f - 2>&1 <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: quota-${i}
spec:
  devices:
    requests:
    - name: mig
      exactly:
        deviceClassName: ${quota_class}
YAML
)"; then
      [ "${i}" -lt 2 ] || { fail "the third 3g.40gb claim was admitted; ResourceQuota gpu-devices should refuse it"; return 1; }
    elif [ "${i}" -lt 2 ]; then
      fail "claim quota-${i} was refused within the quota: ${out}"
      return 1
    elif [[ "${out}" != *"exceeded quota: gpu-devices"* ]]; then
      fail "claim quota-2 was refused, but not by the quota: ${out}"
      return 1
    fi
  done
  k delete resourceclaim quota-0 quota-1 --ignore-not-found >/dev/null
  kubectl delete deviceclass "${quota_class}" --ignore-not-found >/dev/null
}

# The value of device $2's health taint on node $1 ("" when it has none).
taint_of() {
  kubectl get resourceslices --field-selector "spec.nodeName=$1,spec.driver=${driver}" \
    -o jsonpath="{.items[*].spec.devices[?(@.name==\"$2\")].taints[?(@.key==\"${taint_key}\")].value}"
}

# Waits up to 10 s (issue 13: published within 2 s) for device $2 of node $1 to show taint
# value $3 ("" for none).
wait_taint() {
  local node="$1" device="$2" want="$3" got deadline=$((SECONDS + 10))
  until got="$(taint_of "${node}" "${device}")"; [ "${got}" = "${want}" ]; do
    if [ "${SECONDS}" -ge "${deadline}" ]; then
      fail "${device} on ${node}: health taint '${got}' 10s after the fault, want '${want}'" || return 1
    fi
    sleep 0.5
  done
}

# A critical XID on GPU 0 of a simulated H100 node: within seconds gpu-0 and its MIG
# placements carry the NoExecute taint, a pod whose claim wants that GPU stays unscheduled,
# one whose claim tolerates the taint gets it, and a reset removes the taint.
case_health() {
  local node pod
  node="$(kubectl get resourceslices --field-selector "spec.driver=${driver}" \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{" "}{.spec.devices[*].attributes.productName.string}{"\n"}{end}' |
    grep -m1 'NVIDIA H100' | cut -d' ' -f1 || true)"
  [ -n "${node}" ] || { fail "no node publishes H100 GPUs"; return 1; }
  pod="$(kubectl -n "${plugin_namespace}" get pods -l app.kubernetes.io/component=kubelet-plugin \
    --field-selector "spec.nodeName=${node}" -o jsonpath='{.items[0].metadata.name}')"
  [ -n "${pod}" ] || { fail "no gpu-dra plugin pod on ${node} in namespace ${plugin_namespace}"; return 1; }
  kubectl -n "${plugin_namespace}" exec "${pod}" -- gpu-dra sim-fault xid --gpu 0 --code 79 >/dev/null ||
    { fail "gpu-dra sim-fault in ${pod} failed (simulated GPUs only)"; return 1; }
  if ! health_checks "${node}"; then
    kubectl -n "${plugin_namespace}" exec "${pod}" -- gpu-dra sim-fault recover --gpu 0 >/dev/null || true
    return 1
  fi
  kubectl -n "${plugin_namespace}" exec "${pod}" -- gpu-dra sim-fault recover --gpu 0 >/dev/null
  wait_taint "${node}" gpu-0 "" || return 1
}

health_checks() {
  local node="$1" selector tolerate claim scheduled
  wait_taint "${node}" gpu-0 xid-79 || return 1
  expect_eq "health taint of gpu-0-mig-1g10gb-0 on ${node}" xid-79 "$(taint_of "${node}" gpu-0-mig-1g10gb-0)" || return 1
  selector="${h100} && device.attributes['${driver}'].index == 0"
  tolerate="          tolerations: [{key: ${taint_key}, operator: Exists}]"
  {
    template health-intolerant gpu.nvidia.com "${selector}"
    echo "---"
    template health-tolerant gpu.nvidia.com "${selector}" "${tolerate}"
    for name in health-intolerant health-tolerant; do
      echo "---"
      pod_spec_head "${name}"
      echo "  nodeSelector: {kubernetes.io/hostname: ${node}}"
      echo "  containers:"
      container ctr gpu
      echo "  resourceClaims: [{name: gpu, resourceClaimTemplateName: ${name}}]"
    done
  } | k apply -f - >/dev/null
  wait_ready health-tolerant || return 1
  claim="$(claim_of health-tolerant gpu)"
  expect_eq "device of claim ${claim}" "${node} gpu-0" "$(allocated "${claim}")" || return 1
  check_sees_claim health-tolerant ctr "${claim}" >/dev/null || return 1
  scheduled="$(k get pod health-intolerant -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].status}')"
  expect_eq "PodScheduled of health-intolerant (its claim does not tolerate the taint)" False "${scheduled}" || return 1
  k delete pod health-intolerant --wait=true >/dev/null
  check_cleanup "${claim}" template health-tolerant
}

cleanup() {
  kubectl delete deviceclass "${quota_class}" --ignore-not-found >/dev/null 2>&1 || true
  if [ "${E2E_KEEP:-0}" = 1 ]; then
    echo "namespace ${namespace} kept (E2E_KEEP=1)"
  else
    kubectl delete namespace "${namespace}" --ignore-not-found --wait=false >/dev/null || true
  fi
}

# The operator's view, read live from this cluster: `gpu-dra capacity --node` shows the
# namespace, pod and claim holding the MIG device the scheduler allocated to a pod.
case_capacity_report() {
  {
    template capacity-report mig.nvidia.com "device.attributes['${driver}'].profile == '3g.40gb'"
    echo "---"
    pod_spec_head capacity-report
    echo "  containers:"
    container ctr gpu
    echo "  resourceClaims: [{name: gpu, resourceClaimTemplateName: capacity-report}]"
  } | k apply -f - >/dev/null
  wait_ready capacity-report || return 1
  local claim pool device report held
  claim="$(claim_of capacity-report gpu)"
  read -r pool device <<<"$(allocated "${claim}")"
  expect_nonempty "the device allocated to ${claim}" "${device:-}" || return 1
  if ! report="$("${gpu_dra}" capacity --driver-name "${driver}" --node "${pool}" 2>&1)"; then
    fail "${gpu_dra} capacity --node ${pool} failed: ${report}"
    return 1
  fi
  # Allocation rows: NODE GPU DEVICE PROFILE PLACEMENT NAMESPACE POD CLAIM.
  held="$(awk -v device="${device}" '$3 == device {print $6, $7, $8}' <<<"${report}")"
  expect_eq "namespace, pod and claim that gpu-dra capacity shows holding ${device}" \
    "${namespace} capacity-report ${claim}" "${held}" || return 1
  check_cleanup "${claim}" template capacity-report
}

main() {
  local cases=("$@") name failed=()
  case "${1:-}" in
    -h | --help) usage; exit 0 ;;
  esac
  [ "${#cases[@]}" -gt 0 ] || cases=("${all_cases[@]}")
  for name in "${cases[@]}"; do
    if ! declare -F "case_${name//-/_}" >/dev/null; then
      echo "error: unknown case '${name}'; cases: ${all_cases[*]}" >&2
      exit 2
    fi
  done
  command -v kubectl >/dev/null 2>&1 || { echo "error: kubectl is not on PATH" >&2; exit 1; }
  if [ -z "$(kubectl get resourceslices --field-selector "spec.driver=${driver}" -o name)" ]; then
    echo "error: no ResourceSlice of driver ${driver}: is gpu-dra installed?" >&2
    exit 1
  fi

  kubectl create namespace "${namespace}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  trap cleanup EXIT
  for name in "${cases[@]}"; do
    log "${name}"
    if "case_${name//-/_}"; then
      echo "    ok"
    else
      failed+=("${name}")
    fi
  done
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]} (of ${#cases[@]})" >&2
    exit 1
  fi
  echo "PASSED: ${#cases[@]} cases"
}

main "$@"
