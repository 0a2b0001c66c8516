#!/usr/bin/env bash
# Fill DIR (a folder of the checkout the device call sends, ignored by git: .gpu) with what the
# device calls carry: the vLLM 0.26.0 pack in parts small enough to travel beside the working tree,
# the rendered proof requests and command (render.py), the device script and the checkpoint writer.
# Usage: benchmarks/host_proof/prepare.sh DIR        (from the repo root; needs PyPI for the pack)
set -euo pipefail
out=${1:?usage: prepare.sh DIR}; here=benchmarks/host_proof
mkdir -p "$out/host_proof"
if [ ! -f "$out/pack/SHA256SUMS" ]; then
  tmp=$(mktemp -d); bash /work/shared/gpu/pack-vllm026.sh "$tmp"
  mkdir -p "$out/pack"; cat "$tmp"/vllm026.tar.xz.part-* | split -b 55M -d - "$out/pack/vllm026.tar.xz.part-"
  (cd "$out/pack" && sha256sum vllm026.tar.xz.part-* > SHA256SUMS); rm -rf "$tmp"
fi
PYTHONPATH=. python3 $here/render.py "$out/host_proof"
cp $here/device_proof.sh "$out/host_proof/"
mkdir -p "$out/host_proof/gpu_truth" "$out/host_proof/gpu_payoff"
cp benchmarks/gpu_truth/make_weights.py "$out/host_proof/gpu_truth/"
cp benchmarks/gpu_payoff/make_models.py "$out/host_proof/gpu_payoff/"
