"""Preflight on a host, from the downloaded model files: vocabulary, context length, memory fit.

Pure functions over facts, so every rule is unit-tested without a host; the deploy feeds them the
`ModelSnapshot`, `AcceleratorMemory` and `MemoryBytes` facts."""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import ServeConfig

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1}
# Room for activations, CUDA graphs and the sampler beyond weights + KV cache (vLLM profiles the real
# number at start; this keeps preflight from passing configs that only fit on paper).
ACTIVATION_HEADROOM = 0.10


class PreflightError(Exception):
    pass


@dataclass
class Preflight:
    problems: list[str] = field(default_factory=list)
    vocab: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)

    def raise_if_failed(self, host: str) -> None:
        if self.problems:
            raise PreflightError("\n".join(f"{host}: preflight: {p}" for p in self.problems))


def _kv_dtype_bytes(cfg: ServeConfig, model: dict) -> int:
    """--dtype in the extra args wins (it is what vLLM uses); else the checkpoint's dtype."""
    args = cfg.vllm_extra_args
    dtype = None
    for i, arg in enumerate(args):
        if arg == "--dtype" and i + 1 < len(args):
            dtype = args[i + 1]
        elif arg.startswith("--dtype="):
            dtype = arg.split("=", 1)[1]
    if dtype in (None, "auto"):
        dtype = model.get("torch_dtype") or "bfloat16"
    return DTYPE_BYTES.get(str(dtype), 2)


def kv_bytes_per_token(cfg: ServeConfig, model: dict) -> int:
    """layers x KV heads x head dim x 2 (K and V) x dtype bytes."""
    return (
        model["num_hidden_layers"]
        * model["num_key_value_heads"]
        * model["head_dim"]
        * 2
        * _kv_dtype_bytes(cfg, model)
    )


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
            "heterogeneous vocabulary accepted (use_heterogeneous_vocab recorded in speculative_config)"
            if heterogeneous
            else "refused: vocabularies differ"
        ),
    }
    if not same and not heterogeneous:
        result.problems.append(
            f"draft {cfg.draft_model} has vocab_size {draft['vocab_size']} (tokenizer "
            f"{draft.get('tokenizer_vocab_size')}) but target {cfg.target_model} has {target['vocab_size']} "
            f"(tokenizer {target.get('tokenizer_vocab_size')}). Either pick a draft that shares the target's "
            'tokenizer, or record the decision with speculative_config "use_heterogeneous_vocab": true '
            "(vLLM >= 0.25, method draft_model, greedy drafting only)."
        )


def check_context(cfg: ServeConfig, target: dict, draft: dict, result: Preflight) -> None:
    wanted = cfg.effective_max_model_len
    for role, model in (("target", target), ("draft", draft)):
        limit = model.get("max_position_embeddings")
        if limit and wanted > limit:
            result.problems.append(
                f"max_model_len {wanted} exceeds the {role} {model['repo']}'s max_position_embeddings {limit}; "
                f"lower max_model_len (>= prompt_len + output_len) or choose another {role}"
            )


def check_memory(
    cfg: ServeConfig,
    target: dict,
    draft: dict,
    accelerators: list[int],
    ram: dict,
    result: Preflight,
) -> None:
    tokens = cfg.effective_max_num_seqs * cfg.effective_max_model_len
    kv_per_token = kv_bytes_per_token(cfg, target) + kv_bytes_per_token(cfg, draft)
    kv_needed = kv_per_token * tokens
    weights = target["weight_bytes"] + draft["weight_bytes"]
    mechanism, amount = cfg.memory_mechanism
    numbers = {
        "weights_bytes": weights,
        "target_weight_bytes": target["weight_bytes"],
        "draft_weight_bytes": draft["weight_bytes"],
        "kv_bytes_per_token": kv_per_token,
        "kv_tokens_needed": tokens,
        "kv_bytes_needed": kv_needed,
        "mechanism": mechanism,
        "mechanism_value": amount,
    }
    device_total = accelerators[0] if accelerators else ram["total"]
    numbers["device"] = "gpu" if accelerators else "cpu"
    numbers["device_memory_bytes"] = device_total
    if mechanism == "kv_cache_memory_bytes":
        kv_budget = int(amount)
        numbers["kv_budget_bytes"] = kv_budget
        if kv_budget < kv_needed:
            result.problems.append(
                f"kv_cache_memory_bytes {kv_budget} holds {kv_budget // kv_per_token} tokens but max_num_seqs "
                f"{cfg.effective_max_num_seqs} x max_model_len {cfg.effective_max_model_len} = {tokens} tokens "
                f"need {kv_needed} bytes (target + draft KV, {kv_per_token} bytes/token); raise the budget or "
                "lower max_num_seqs/max_model_len"
            )
        total_needed = int((weights + kv_budget) * (1 + ACTIVATION_HEADROOM))
        available = device_total if accelerators else ram["available"]
        if total_needed > available:
            result.problems.append(
                f"weights {weights} + KV budget {kv_budget} (+{int(ACTIVATION_HEADROOM * 100)}% headroom) = "
                f"{total_needed} bytes exceed the {numbers['device']} memory available, {available} bytes"
            )
    else:
        budget = int(device_total * float(amount))
        kv_budget = budget - int(weights * (1 + ACTIVATION_HEADROOM))
        numbers["kv_budget_bytes"] = kv_budget
        if kv_budget < kv_needed:
            result.problems.append(
                f"gpu_memory_utilization {amount} of {device_total} bytes leaves {max(kv_budget, 0)} bytes for the "
                f"KV cache after target + draft weights ({weights} bytes, +{int(ACTIVATION_HEADROOM * 100)}%); "
                f"{tokens} tokens (max_num_seqs x max_model_len) need {kv_needed} bytes for target + draft; "
                "raise gpu_memory_utilization, lower max_num_seqs/max_model_len, or use a bigger accelerator"
            )
    result.memory = numbers


def evaluate(
    cfg: ServeConfig, target: dict, draft: dict | None, accelerators: list[int], ram: dict
) -> Preflight:
    result = Preflight()
    if draft is None:  # methods without a draft model (ngram, suffix): nothing to compare
        draft = {
            "repo": None,
            "vocab_size": target["vocab_size"],
            "tokenizer_vocab_size": target.get("tokenizer_vocab_size"),
            "weight_bytes": 0,
            "num_hidden_layers": 0,
            "num_key_value_heads": 0,
            "head_dim": 0,
            "max_position_embeddings": None,
        }
    check_vocab(cfg, target, draft, result)
    check_context(cfg, target, draft, result)
    check_memory(cfg, target, draft, accelerators, ram, result)
    return result
