#!/usr/bin/env bash
# Fill DIR (an ignored folder of the checkout the device call sends: /work/main/.gpu/gpu39) with
# what the device calls carry: the vLLM 0.26.0 pack in 50 MiB parts (beside the ~11 MiB tree, under
# the 64 MiB a call carries), the model folders, the rendered plan and the device scripts.
# Usage: benchmarks/gpu_load/prepare.sh PACKDIR DIR   (PACKDIR: pack-vllm026.sh's output)
set -euo pipefail
pack=${1:?usage: prepare.sh PACKDIR DIR}; out=${2:?usage: prepare.sh PACKDIR DIR}; here=benchmarks/gpu_load
mkdir -p "$out/pack"
if [ ! -f "$out/pack/SHA256SUMS" ]; then
  cat "$pack"/vllm026.tar.xz.part-* | split -b 50M -d - "$out/pack/part-"
  (cd "$out/pack" && sha256sum part-* > SHA256SUMS)
fi
[ -d "$out/models" ] || python3 benchmarks/gpu_payoff/make_models.py "$out/models"
PYTHONPATH=. python3 $here/render.py "$out/plan.json"
cp $here/device.sh $here/device_run.py benchmarks/gpu_payoff/device_common.py "$out/"
