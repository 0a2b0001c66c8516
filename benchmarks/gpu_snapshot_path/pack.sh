#!/usr/bin/env bash
# Pack vLLM 0.26.0 for the one-H200 device (torch 2.11.0+cu130 preinstalled, no network) in three
# parts of ~44 MiB, as benchmarks/gpu_preflight did: shared/gpu/vllm026-requirements.txt's wheels,
# the FA2 kernel and vllm-rs removed (pack-vllm026.sh), gpu_payoff/pack.sh's trims, xz -3 (-9 does
# not finish on a 2-core control machine), split -n 3 so each part + the checkout stays < 64 MiB.
# Usage: pack.sh OUTDIR
set -euo pipefail
out=${1:?usage: pack.sh OUTDIR}
req=${SHARED_GPU:-/work/shared/gpu}/vllm026-requirements.txt
work=$(mktemp -d); mkdir -p "$out" "$work/site"
PIP_CONSTRAINT= python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -r "$req" -d "$work/wheels"
for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/site"; done
s=$work/site
rm -rf "$s"/vllm/vllm_flash_attn/_vllm_fa2_C*.so "$s"/vllm/vllm-rs \
  "$s"/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so \
  "$s"/vllm/third_party/deep_gemm/include "$s"/vllm/third_party/fmha_sm100/cutlass \
  "$s"/mistral_common/data/tekken_*.json "$s"/pycountry/locales \
  "$s"/supervisor/tests "$s"/dill/tests "$s"/jsonschema/tests
rm -f "$out"/vllm026.tar.xz.part-*
tar -C "$s" -cf - . | xz -3 -T2 > "$work/vllm026.tar.xz"
split -n 3 -d "$work/vllm026.tar.xz" "$out/vllm026.tar.xz.part-"
(cd "$out" && sha256sum vllm026.tar.xz.part-* > SHA256SUMS)
rm -rf "$work"; ls -la "$out"
