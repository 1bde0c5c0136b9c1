#!/bin/sh
# Lists the profiles hack/callgrind-plugin.sh wrote: one line per kubelet call, in order,
# with the instructions the plugin ran for it (and since the call before) and the call
# that ended the profile. The first profile also holds the plugin's start-up.
set -eu
out=${CALLGRIND_OUT:-/tmp/gpu-dra-callgrind}
n=1
while [ -f "$out/callgrind.out.$n" ]; do
    f="$out/callgrind.out.$n"
    total=$(sed -n 's/^summary: *//p; s/^totals: *//p' "$f" | head -n 1)
    verb=$(sed -n 's/^desc: Trigger:.*::node_\([a-z]*\)_resources.*/\1/p' "$f" | head -n 1)
    printf '%5d %12s %s\n' "$n" "$total" "$verb"
    n=$((n + 1))
done
