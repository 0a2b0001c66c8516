#!/usr/bin/env bash
# Device commands for benchmarks/bench_early, run from the repo root on the one-H200 machine with
# the carried folder .devcarry-bench (REPORT.md): the vLLM 0.26.0 pack in three parts, one a call,
# copied to /tmp/parts (it lasts while the machine stays warm, 30 s).
#   recv     copy the carried part to /tmp/parts
#   run      copy the last part, unpack, write the checkpoints, run device_run.py
set -uo pipefail
c=.devcarry-bench
mkdir -p /tmp/parts
for f in $c/p*/vllm026.tar.xz.part-*; do [ -e "$f" ] && cp -n "$f" /tmp/parts/; done
ls -la /tmp/parts
if [ "$1" = run ]; then
  (cd /tmp/parts && sha256sum -c "$OLDPWD/$c/gp/SHA256SUMS") || exit 2
  if [ ! -d /tmp/site/vllm ]; then mkdir -p /tmp/site; t=$SECONDS
    cat /tmp/parts/vllm026.tar.xz.part-* | xz -dc -T0 | tar -C /tmp/site -x || exit 3
    echo "unpacked in $((SECONDS - t)) s"; fi
  python3 $c/gp/benchmarks/gpu_truth/make_weights.py /tmp/hf || exit 5
  export PYTHONPATH=$PWD/$c/gp:/tmp/site
  python3 -c "import vllm, torch, prometheus_client; print('vllm', vllm.__version__, 'torch', torch.__version__)" || exit 4
  which curl setsid timeout nohup
  PYTHONUNBUFFERED=1 timeout 500 python3 $c/gp/benchmarks/bench_early/device_run.py \
    --plan $c/gp/plan.json --out "$OUT/bench_early" 2>&1 | tee "$OUT/run.log"
  ls -la "$OUT"/bench_early
fi
