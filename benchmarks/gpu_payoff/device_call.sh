#!/usr/bin/env bash
# The commands the device calls run (from the repo root on the H200 machine). State lives in /tmp,
# which survives between calls only while the machine stays warm (30 s after each call).
#   recv N        copy carried part N of the vLLM pack (.gpu/pack) to /tmp/parts
#   start BUDGET  check + unpack the pack, copy models/plan/queue, start device_run.py in its own
#                 session with BUDGET seconds, then wait like `wait 560`
#   wait MAXS     wait for the runner (at most MAXS s), copy its files to $OUT, print the tail
#   queue         replace the runner's queue with the carried benchmarks/gpu_payoff/queue.txt
set -uo pipefail
here=benchmarks/gpu_payoff; po=/tmp/po
unxz() { if command -v xz >/dev/null; then xz -dc -T0; else python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)"; fi; }
wait_runner() {
  local maxs=$1 t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$maxs" ] && [ -f $po/pid ] && kill -0 "$(cat $po/pid)" 2>/dev/null; do sleep 5; done
  cp $po/summary.json $po/logs.tar.gz $po/run.log "$OUT"/ 2>/dev/null
  nvidia-smi --query-gpu=memory.used,temperature.gpu,clocks.sm --format=csv,noheader
  kill -0 "$(cat $po/pid 2>/dev/null)" 2>/dev/null && echo "RUNNER STILL RUNNING" || echo "RUNNER FINISHED"
  tail -n 40 $po/run.log
}
case "$1" in
  recv)
    mkdir -p /tmp/parts && cp .gpu/pack/vllm026.tar.xz.part-0"$2" /tmp/parts/ && ls -la /tmp/parts
    nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader; python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())" ;;
  start)
    for f in .gpu/pack/vllm026.tar.xz.part-*; do cp -n "$f" /tmp/parts/; done
    (cd /tmp/parts && sha256sum -c "$OLDPWD/.gpu/pack/SHA256SUMS") || exit 2
    if [ ! -d /tmp/site/vllm ]; then mkdir -p /tmp/site; t=$SECONDS; cat /tmp/parts/vllm026.tar.xz.part-* | unxz | tar -C /tmp/site -x || exit 3; echo "unpacked in $((SECONDS - t)) s"; fi
    rm -rf /tmp/models && cp -r .gpu/models /tmp/models && cp .gpu/plan.json $here/device_run.py $here/device_common.py /tmp/ && cp $here/queue.txt /tmp/queue.txt
    export PYTHONPATH=/tmp/site
    python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" || exit 4
    mkdir -p $po
    setsid nohup python3 -u /tmp/device_run.py --plan /tmp/plan.json --arms @/tmp/queue.txt --budget "$2" --out $po > $po/run.log 2>&1 < /dev/null &
    echo $! > $po/pid
    wait_runner 535 ;;
  wait) wait_runner "$2" ;;
  queue) cp $here/queue.txt /tmp/queue.txt && cat /tmp/queue.txt ;;
esac
