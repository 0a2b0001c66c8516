#!/bin/bash
# benchmarks/suite_cpu/demo_cpu.sh LOG: `make demo` as on a new machine (an empty sandbox cache of
# its own, no pip cache, its own state dir), with the machine's busy core-seconds and steal from
# /proc/stat over the whole run, and a 5-s timeline in LOG.cpu (epoch, busy %, steal % of one core).
# It takes down a fleet left in that state dir by an earlier run, removes the cache and state dir,
# and leaves the demo's fleet up (`specdeploy-sandbox down` with the same SPECDEPLOY_STATE_DIR
# removes it). Runs from the checkout it lives in, whatever the current directory.
set -u
LOG=$(realpath -m "$1")
cd "$(dirname "$0")/../.." || exit 1
CACHE=${DEMO_CACHE:-/var/cache/specdeploy-newmachine}
STATE=${DEMO_STATE_DIR:-/run/specdeploy/demo-new}
HZ=$(getconf CLK_TCK)
snap() { read -r _ a b c _ _ f g h _ < /proc/stat; echo "$((a + b + c + f + g)) $h"; }
# an earlier run's fleet first: removing its state dir alone would leave its hosts running
SPECDEPLOY_CACHE=$CACHE SPECDEPLOY_STATE_DIR=$STATE specdeploy-sandbox down >/dev/null 2>&1
rm -rf "$CACHE" "$STATE" "$LOG.cpu"
(
  read -r pb ps <<<"$(snap)"
  while sleep 5; do
    read -r nb ns <<<"$(snap)"
    echo "$(date +%s) $(((nb - pb) * 100 / (5 * HZ))) $(((ns - ps) * 100 / (5 * HZ)))" >>"$LOG.cpu"
    pb=$nb ps=$ns
  done
) &
SAMPLER=$!
read -r B0 S0 <<<"$(snap)"
T0=$(date +%s.%N)
SPECDEPLOY_CACHE=$CACHE SPECDEPLOY_STATE_DIR=$STATE PIP_NO_CACHE_DIR=1 make demo >"$LOG" 2>&1
RC=$?
read -r B1 S1 <<<"$(snap)"
T1=$(date +%s.%N)
kill "$SAMPLER"
python3 -c "w = $T1 - $T0; b = ($B1 - $B0) / $HZ; s = ($S1 - $S0) / $HZ
print(f'demo rc=$RC: {w:.0f} s wall, {b:.0f} busy core-s ({b / w:.2f} cores), steal {s:.0f} s')" |
  tee -a "$LOG"
