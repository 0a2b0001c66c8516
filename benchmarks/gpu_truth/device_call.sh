#!/usr/bin/env bash
# Device commands for benchmarks/gpu_truth, run from the repo root on the H200 x2 machine, with the
# carried folder .gpu-carry (see REPORT.md). State lives in /tmp while the machine stays warm.
#   recv N        copy carried part N of the vLLM 0.26.0 pack to /tmp/parts
#   start BUDGET PHASE1 WAITS   unpack, write the checkpoints, start device_run.py detached, wait
#   start2 BUDGET SWINGCAP WAITS   the same, then swing_run.py on gt/plan2.json (issue 15, second
#                 session: the swing experiment, then TP=2 repeats), wait
#   wait MAXS     wait for the runner, copy its files to $OUT
set -uo pipefail
c=.gpu-carry; po=/tmp/gt_out
wait_runner() {
  local maxs=$1 t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$maxs" ] && kill -0 "$(cat $po/pid 2>/dev/null)" 2>/dev/null; do sleep 5; done
  cp $po/summary.json $po/model_facts.json $po/logs.tar.gz $po/run.log "$OUT"/ 2>/dev/null
  kill -0 "$(cat $po/pid 2>/dev/null)" 2>/dev/null && echo "RUNNER STILL RUNNING" || echo "RUNNER FINISHED"
  tail -n 45 $po/run.log
}
case "$1" in
  recv)
    mkdir -p /tmp/parts && cp $c/pack/vllm026.tar.xz.part-0"$2" /tmp/parts/ && ls -la /tmp/parts
    nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv,noheader
    python3 -c "import torch; print(torch.__version__, torch.cuda.device_count())"; nproc ;;
  start|start2)
    for f in $c/pack/vllm026.tar.xz.part-*; do cp -n "$f" /tmp/parts/; done
    (cd /tmp/parts && sha256sum -c "$OLDPWD/$c/pack/SHA256SUMS") || exit 2
    if [ ! -d /tmp/site/vllm ]; then mkdir -p /tmp/site; t=$SECONDS
      cat /tmp/parts/vllm026.tar.xz.part-* | xz -dc -T0 | tar -C /tmp/site -x || exit 3; echo "unpacked in $((SECONDS - t)) s"; fi
    python3 $c/gt/benchmarks/gpu_truth/make_weights.py /tmp/hf || exit 5
    export PYTHONPATH=/tmp/site
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" || exit 4
    mkdir -p $po
    if [ "$1" = start2 ]; then
      setsid nohup python3 -u $c/gt/benchmarks/gpu_truth/swing_run.py --plan $c/gt/plan2.json \
        --budget "$2" --swing-cap "$3" --out $po > $po/run.log 2>&1 < /dev/null &
      echo $! > $po/pid
      wait_runner "$4"; exit
    fi
    setsid nohup python3 -u $c/gt/benchmarks/gpu_truth/device_run.py --plan $c/gt/plan.json \
      --budget "$2" --phase1 "$3" --command $c/gt/accel_command.sh \
      --model-facts $c/gt/model_facts.py --out $po > $po/run.log 2>&1 < /dev/null &
    echo $! > $po/pid
    wait_runner "$4" ;;
  wait) wait_runner "$2" ;;
esac
