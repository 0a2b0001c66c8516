#!/usr/bin/env bash
# Device commands for benchmarks/gpu_snapshot_path, run from the checkout's root on the one-H200
# machine, with the carried folders .gpu/snapshot-path/{p0,p1,p2,gp} that prepare.sh fills (git
# ignores /.gpu/). The vLLM 0.26.0 pack travels in three parts, one per call, copied to
# /tmp/parts, which lasts while the machine stays warm (30 s between calls).
#   recv N   copy carried part N to /tmp/parts; N=1 also writes the HF cache (make_cache.py)
#   run S    unpack vLLM, run device_run.py with an S s budget, copy its outputs to $OUT
set -uo pipefail
c=.gpu/snapshot-path
g=$c/gp
mkdir -p /tmp/parts
for f in $c/p*/vllm026.tar.xz.part-*; do [ -e "$f" ] && cp -n "$f" /tmp/parts/; done
ls -la /tmp/parts
hf=$(python3 -c "import json; print(json.load(open('$g/plan.json'))['hf_home'])")
make_cache() {
  python3 $g/benchmarks/gpu_snapshot_path/make_cache.py $g/plan.json 2>&1 | tee "$OUT/make_cache.txt"
  (cd "$hf/hub" && find . -maxdepth 4 -printf '%y %s %p -> %l\n' | sort) >> "$OUT/make_cache.txt"
}
case "$1" in
  recv)
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader
    python3 -c "import sys, torch, transformers, huggingface_hub as h, safetensors, tokenizers; \
print(sys.version.split()[0], torch.__version__, transformers.__version__, h.__version__, \
safetensors.__version__, tokenizers.__version__)"
    if [ "$2" = 1 ]; then make_cache; fi ;;
  run)
    (cd /tmp/parts && sha256sum -c "$OLDPWD/$g/SHA256SUMS") || exit 2
    if [ ! -d /tmp/site/vllm ]; then mkdir -p /tmp/site; t=$SECONDS
      cat /tmp/parts/vllm026.tar.xz.part-* | xz -dc -T0 | tar -C /tmp/site -x || exit 3
      echo "unpacked in $((SECONDS - t)) s"; fi
    [ -f "$hf/made.json" ] || make_cache
    PYTHONUNBUFFERED=1 python3 $g/benchmarks/gpu_snapshot_path/device_run.py --plan $g/plan.json \
      --out /tmp/sp_out --site /tmp/site --budget "$2" 2>&1 | tee /tmp/sp_run.log
    cp /tmp/sp_out/summary.json /tmp/sp_run.log "$hf/made.json" "$OUT"/
    tar -C /tmp/sp_out -czf "$OUT/serve_logs.tar.gz" . && ls -la "$OUT" ;;
esac
