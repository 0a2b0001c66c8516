#!/usr/bin/env bash
# The device calls of the H200 load proof (README.md), from the root of the checkout the device
# call sends, with this script's folder (prepare.sh's DIR, e.g. .gpu/gpu39b) carried. State lives in
# /tmp, which survives between calls only while the machine stays warm (30 s after each call).
#   recv N          copy carried part N of the vLLM 0.26.0 pack to /tmp/parts
#   start S ROUNDS  unpack, copy models and plan, start device_run.py in its own session with S
#                   seconds and ROUNDS measured rounds; then wait like `wait 480`
#   wait MAXS       wait for the runner (at most MAXS s); its files to $OUT
set -uo pipefail
c=$(dirname "$0"); po=/tmp/po
wait_runner() {
  local maxs=$1 t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$maxs" ] && kill -0 "$(cat $po/pid)" 2>/dev/null; do sleep 5; done
  cp $po/rounds.json $po/results.tar.gz $po/logs.tar.gz $po/run.log $po/gpu.txt "$OUT"/ 2>/dev/null
  nvidia-smi --query-gpu=memory.used,temperature.gpu,clocks.sm --format=csv,noheader
  kill -0 "$(cat $po/pid)" 2>/dev/null && echo "RUNNER STILL RUNNING" || echo "RUNNER FINISHED"
  tail -n 60 $po/run.log
}
case "$1" in
  recv)
    mkdir -p /tmp/parts && cp $c/pack/part-0"$2" /tmp/parts/ && ls -la /tmp/parts
    nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader ;;
  start)
    for f in $c/pack/part-*; do cp -n "$f" /tmp/parts/; done
    (cd /tmp/parts && sha256sum -c "$OLDPWD/$c/pack/SHA256SUMS") || exit 2
    if [ ! -d /tmp/site/vllm ]; then mkdir -p /tmp/site; t=$SECONDS
      cat /tmp/parts/part-* | xz -dc -T0 | tar -C /tmp/site -x || exit 3
      echo "unpacked in $((SECONDS - t)) s"; fi
    rm -rf /tmp/models && cp -r $c/models /tmp/models
    cp $c/plan.json $c/device_run.py $c/device_common.py /tmp/
    export PYTHONPATH=/tmp/site
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" || exit 4
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > /tmp/gpu.txt
    mkdir -p $po && cp /tmp/gpu.txt $po/
    setsid nohup python3 -u /tmp/device_run.py --plan /tmp/plan.json --budget "$2" \
      --rounds "$3" --out $po > $po/run.log 2>&1 < /dev/null &
    echo $! > $po/pid
    wait_runner 480 ;;
  wait) wait_runner "$2" ;;
esac
