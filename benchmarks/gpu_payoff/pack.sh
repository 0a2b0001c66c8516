#!/usr/bin/env bash
# Pack vLLM 0.26.0 for the H200 device in TWO carried parts instead of three.
# Reuses ../../../shared/gpu/pack-vllm026.sh (download + FA2/vllm-rs removal), then drops what a bf16
# Qwen3 run on Hopper never loads, so the xz tarball (~121 MiB) fits two device calls (<=64 MiB each, repo included):
#   deep_gemm's builds for other Pythons and its JIT headers, fmha_sm100 (Blackwell) headers,
#   mistral_common's Tekken vocab files, pycountry's translations, packages' own tests.
# Usage: pack.sh OUTDIR [SITE_DIR]   (SITE_DIR: an already unpacked tree, skips the download)
# Device side (parts in D): cat D/vllm026.tar.xz.part-* | xz -dc -T0 | tar -C /tmp/site -x
set -euo pipefail
out=${1:?usage: pack.sh OUTDIR [SITE_DIR]}; site=${2:-}
shared=${SHARED_GPU:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/gpu}
work=$(mktemp -d); mkdir -p "$out"
if [ -z "$site" ]; then
  bash "$shared/pack-vllm026.sh" "$work/parts3"
  mkdir -p "$work/site"; cat "$work"/parts3/vllm026.tar.xz.part-* | xz -dc | tar -C "$work/site" -x
  site=$work/site
fi
rm -rf "$site"/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so \
       "$site"/vllm/third_party/deep_gemm/include "$site"/vllm/third_party/fmha_sm100/cutlass \
       "$site"/mistral_common/data/tekken_*.json "$site"/pycountry/locales \
       "$site"/supervisor/tests "$site"/dill/tests "$site"/jsonschema/tests
rm -f "$out"/vllm026.tar.xz.part-*
tar -C "$site" -cf - . | xz -9 -T0 > "$work/vllm026.tar.xz"
split -n 2 -d "$work/vllm026.tar.xz" "$out/vllm026.tar.xz.part-"  # two halves, ~60.7 MiB each
(cd "$out" && sha256sum vllm026.tar.xz.part-* > SHA256SUMS)
rm -rf "$work"; ls -la "$out"
