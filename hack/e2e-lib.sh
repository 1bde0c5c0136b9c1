# Helpers of hack/e2e.sh (sourced, not run): kubectl wrappers, manifest builders and the
# checks every case shares. They use the settings hack/e2e.sh defines before sourcing.
# shellcheck shell=bash
# shellcheck disable=SC2154

k() {
  kubectl -n "${namespace}" "$@"
}
log() {
  echo "==> $*"
}
# Fails the current case: the message goes to stderr, the case function returns non-zero.
fail() {
  echo "    FAIL: $*" >&2
  return 1
}
expect_eq() {
  local what="$1" want="$2" got="$3"
  if [ "${want}" != "${got}" ]; then
    fail "${what}: want '${want}', got '${got}'"
  fi
}
expect_nonempty() {
  local what="$1" got="$2"
  if [ -z "${got}" ]; then
    fail "${what} is empty"
  fi
}

# The head of a pod running $image for $1 seconds (a container list follows).
pod_spec_head() {
  cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
YAML
}
# One container $1 holding claim $2 (optionally only request $3).
container() {
  cat <<YAML
  - name: $1
    image: ${image}
    command: ["sh", "-c", "sleep 3600"]
    resources:
      claims:
      - name: $2
YAML
  if [ -n "${3:-}" ]; then
    echo "        request: $3"
  fi
}

wait_ready() {
  local pod="$1"
  if ! k wait --for=condition=Ready "pod/${pod}" --timeout="${timeout}s" >/dev/null; then
    k describe "pod/${pod}" | tail -n 20 >&2
    fail "pod ${pod} is not ready after ${timeout}s (events above)"
  fi
}

# printenv of one variable in a container ("" when unset).
pod_env() {
  k exec "$1" -c "$2" -- printenv "$3" || true
}

# Every `DRA_GPU_UUID_*` value a container sees, sorted, space separated.
uuid_env() {
  k exec "$1" -c "$2" -- env | sed -n 's/^DRA_GPU_UUID_[^=]*=//p' | sort | tr '\n' ' ' | sed 's/ $//'
}

# The ResourceClaim a pod's claim entry $2 resolved to.
claim_of() {
  k get pod "$1" -o jsonpath="{.status.resourceClaimStatuses[?(@.name==\"$2\")].resourceClaimName}"
}

# "pool device" lines of a claim's allocation for this driver.
allocated() {
  k get resourceclaim "$1" -o jsonpath="{range .status.allocation.devices.results[?(@.driver==\"${driver}\")]}{.pool}{\" \"}{.device}{\"\\n\"}{end}"
}

# A string attribute of a published device.
device_attr() {
  local pool="$1" device="$2" attr="$3"
  kubectl get resourceslices -o jsonpath="{.items[?(@.spec.pool.name==\"${pool}\")].spec.devices[?(@.name==\"${device}\")].attributes.${attr}.string}"
}

# "request pool device" lines of a claim's allocation for this driver.
allocated_by_request() {
  k get resourceclaim "$1" -o jsonpath="{range .status.allocation.devices.results[?(@.driver==\"${driver}\")]}{.request}{\" \"}{.pool}{\" \"}{.device}{\"\\n\"}{end}"
}

# Checks that a running pod's container sees exactly the devices it was given, through the
# CDI spec's env: NVIDIA_VISIBLE_DEVICES is `void` (a spec-wide value reaches every container
# given any device of the claim, so it must name none), and the per-device
# `DRA_GPU_UUID_<device>` variables hold the UUIDs of the claim's devices — of request $4
# only when the container names one. Devices whose slice publishes a `uuid` (full GPUs,
# existing MIG devices) must be seen; dynamic MIG devices get their UUID when carved, so they
# only bound how many other UUIDs may appear. Prints the container's UUIDs, sorted, space
# separated.
check_sees_claim() {
  local pod="$1" ctr="$2" claim="$3" request="${4:-}"
  local visible uuids uuid req pool device published want="" carved=0 others=0
  local given="claim ${claim}${request:+ request ${request}}"
  visible="$(pod_env "${pod}" "${ctr}" NVIDIA_VISIBLE_DEVICES)"
  if [ "${visible}" != void ]; then
    fail "${pod}/${ctr}: NVIDIA_VISIBLE_DEVICES=${visible}, want void: the container's devices are in DRA_GPU_UUID_*" || return 1
  fi
  uuids="$(uuid_env "${pod}" "${ctr}")"
  expect_nonempty "DRA_GPU_UUID_* in ${pod}/${ctr}" "${uuids}" || return 1
  while read -r req pool device; do
    [ -n "${device}" ] || continue
    [ -z "${request}" ] || [ "${req}" = "${request}" ] || continue
    published="$(device_attr "${pool}" "${device}" uuid)"
    if [ -z "${published}" ]; then
      carved=$((carved + 1))
    elif [[ " ${uuids} " != *" ${published} "* ]]; then
      fail "${pod}/${ctr} does not see ${device} (${published}) of ${given}; it sees ${uuids}" || return 1
    else
      want="${want} ${published}"
    fi
  done < <(allocated_by_request "${claim}")
  for uuid in ${uuids}; do
    [[ "${want} " == *" ${uuid} "* ]] || others=$((others + 1))
  done
  if [ "${others}" -gt "${carved}" ]; then
    fail "${pod}/${ctr} sees ${uuids}: UUIDs that are not devices of ${given}" || return 1
  fi
  echo "${uuids}"
}

# Waits until the claim's CDI spec file is gone from the node's CDI root, looking through a
# helper pod with the CDI root mounted read-only.
check_cdi_gone() {
  local node="$1" claim_uid="$2" inspector deadline
  inspector="cdi-inspector-$(echo "${node}" | tr -c 'a-z0-9-\n' '-' | cut -c1-40)"
  if ! k get pod "${inspector}" >/dev/null 2>&1; then
    k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: ${inspector}
spec:
  nodeName: ${node}
  terminationGracePeriodSeconds: 1
  tolerations: [{operator: Exists}]
  containers:
  - name: ls
    image: ${image}
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts: [{name: cdi, mountPath: /cdi, readOnly: true}]
  volumes: [{name: cdi, hostPath: {path: ${cdi_root}}}]
YAML
  fi
  wait_ready "${inspector}" || return 1
  deadline=$((SECONDS + timeout))
  # The listing is read whole before matching: `ls | grep -q` under pipefail could fail on
  # SIGPIPE and pass for "gone".
  local listing
  while listing="$(k exec "${inspector}" -- ls /cdi)" && [[ "${listing}" == *"${claim_uid}"* ]]; do
    if [ "${SECONDS}" -ge "${deadline}" ]; then
      fail "CDI spec of claim ${claim_uid} still in ${cdi_root} on ${node} after ${timeout}s" || return 1
    fi
    sleep 2
  done
}

# Deletes the pods, then checks the claim is released: a template's claim is deleted with its
# pod, a named claim loses its allocation; and its CDI spec is gone from the node.
check_cleanup() {
  local claim="$1" named="$2"
  shift 2
  local uid node deadline
  uid="$(k get resourceclaim "${claim}" -o jsonpath='{.metadata.uid}')"
  node="$(k get pod "$1" -o jsonpath='{.spec.nodeName}')"
  k delete pod "$@" --wait=true >/dev/null
  if [ "${named}" = named ]; then
    deadline=$((SECONDS + timeout))
    until [ -z "$(k get resourceclaim "${claim}" -o jsonpath='{.status.allocation}')" ]; do
      if [ "${SECONDS}" -ge "${deadline}" ]; then
        fail "claim ${claim} still allocated ${timeout}s after its pods were deleted" || return 1
      fi
      sleep 2
    done
    k delete resourceclaim "${claim}" --wait=true >/dev/null
  elif ! k wait --for=delete "resourceclaim/${claim}" --timeout="${timeout}s" >/dev/null 2>&1; then
    fail "claim ${claim} not deleted ${timeout}s after its pod" || return 1
  fi
  check_cdi_gone "${node}" "${uid}"
}

# A ResourceClaimTemplate $1 with one request `gpu` of class $2 and CEL selector $3, plus
# optional extra YAML for the request ($4, indented as the request's fields) and for the
# claim spec ($5, indented as `devices` fields).
template() {
  cat <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: $1
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: $2
          selectors:
          - cel:
              expression: "$3"
${4:-}
${5:-}
YAML
}

# An opaque GpuConfig for request `gpu` with the given `sharing` body (indented).
gpu_config() {
  cat <<YAML
      config:
      - requests: ["gpu"]
        opaque:
          driver: ${driver}
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing:
$1
YAML
}
