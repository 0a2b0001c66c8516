#!/usr/bin/env bash
# Device commands for benchmarks/gpu_preflight, run from the repo root on the one-H200 machine, with
# the carried folder .devcarry-gpumem (see REPORT.md). The vLLM 0.26.0 pack travels in parts, one
# per call; each is copied to /tmp/parts, which lasts while the machine stays warm (30 s).
#   recv N   copy carried part N to /tmp/parts; with gp/ carried, also record the idle fact output
#   run S    copy the last part, unpack, write the checkpoints, run device_run.py (S s budget)
set -uo pipefail
c=.devcarry-gpumem
mkdir -p /tmp/parts
for f in $c/p*/vllm026.tar.xz.part-*; do [ -e "$f" ] && cp -n "$f" /tmp/parts/; done
ls -la /tmp/parts
case "$1" in
  recv)
    nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv,noheader
    cat /proc/self/cgroup; mkdir /sys/fs/cgroup/gp-probe && rmdir /sys/fs/cgroup/gp-probe && echo "cgroup: can make one"
    if [ -f $c/gp/plan.json ]; then
      python3 -c "import json; print(json.load(open('$c/gp/plan.json'))['command'])" > /tmp/cmd.sh
      bash /tmp/cmd.sh > "$OUT/fact_idle_call$2.txt"; cat "$OUT/fact_idle_call$2.txt"
    fi ;;
  run)
    (cd /tmp/parts && sha256sum -c "$OLDPWD/$c/gp/SHA256SUMS") || exit 2
    if [ ! -d /tmp/site/vllm ]; then mkdir -p /tmp/site; t=$SECONDS
      cat /tmp/parts/vllm026.tar.xz.part-* | xz -dc -T0 | tar -C /tmp/site -x || exit 3
      echo "unpacked in $((SECONDS - t)) s"; fi
    python3 $c/gp/benchmarks/gpu_truth/make_weights.py /tmp/hf || exit 5
    export PYTHONPATH=$PWD/$c/gp:/tmp/site
    python3 -c "import vllm, torch, pydantic; print('vllm', vllm.__version__, 'torch', torch.__version__)" || exit 4
    PYTHONUNBUFFERED=1 python3 $c/gp/benchmarks/gpu_preflight/device_run.py --plan $c/gp/plan.json \
      --out /tmp/gp_out --budget "$2" 2>&1 | tee /tmp/gp_run.log
    cp /tmp/gp_out/summary.json /tmp/gp_out/logs.tar.gz /tmp/gp_run.log "$OUT"/ 2>/dev/null
    ls -la "$OUT" ;;
esac
