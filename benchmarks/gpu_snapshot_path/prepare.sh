#!/usr/bin/env bash
# Fill the carried folders for the device calls, in the checkout the device tool sends (CHECKOUT,
# default /work/main; its .gitignore ignores /.gpu/): p0..p2 (one pack part each, pack.sh), gp
# (plan.json rendered here by plan.py, SHA256SUMS, this folder's scripts and the two helpers they
# import). Run from this worktree's root:  bash benchmarks/gpu_snapshot_path/prepare.sh PACKDIR
set -euo pipefail
pack=${1:?usage: prepare.sh PACKDIR}; checkout=${CHECKOUT:-/work/main}
c=$checkout/.gpu/snapshot-path
git -C "$checkout" check-ignore -q .gpu/snapshot-path || { echo "not ignored in $checkout"; exit 1; }
rm -rf "$c"; mkdir -p "$c"/gp/benchmarks/{gpu_snapshot_path,gpu_payoff,gpu_truth}
for n in 0 1 2; do mkdir -p "$c/p$n"; cp "$pack/vllm026.tar.xz.part-0$n" "$c/p$n/"; done
cp "$pack/SHA256SUMS" "$c/gp/"
python -m benchmarks.gpu_snapshot_path.plan "$c/gp/plan.json"
cp benchmarks/gpu_snapshot_path/*.py benchmarks/gpu_snapshot_path/*.sh "$c/gp/benchmarks/gpu_snapshot_path/"
cp benchmarks/gpu_payoff/make_models.py "$c/gp/benchmarks/gpu_payoff/"
cp benchmarks/gpu_truth/make_weights.py "$c/gp/benchmarks/gpu_truth/"
du -sh "$c"/*
