"""Preflight rules on fixed facts (what the ModelSnapshot/AcceleratorMemory/MemoryBytes facts return)."""

from specdeploy.config import config_from_data
from specdeploy.preflight import evaluate, kv_bytes_per_token

GIB = 1 << 30


def model(
    repo,
    vocab=151936,
    tokenizer=151669,
    layers=36,
    kv_heads=8,
    head_dim=128,
    weights=16 * GIB,
    max_pos=40960,
    dtype="bfloat16",
):
    return {
        "repo": repo,
        "vocab_size": vocab,
        "tokenizer_vocab_size": tokenizer,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "weight_bytes": weights,
        "max_position_embeddings": max_pos,
        "torch_dtype": dtype,
    }


TARGET = model("Qwen/Qwen3-8B")
DRAFT = model("Qwen/Qwen3-0.6B", layers=28, weights=int(1.2 * GIB))
H200 = [143771 * 1024 * 1024]
RAM = {"total": 256 * GIB, "available": 200 * GIB}


def cfg(valid_data, **changes):
    data = {**valid_data, **changes}
    return config_from_data(data)


def test_kv_per_token_is_layers_heads_dim_two_dtype(valid_data):
    c = cfg(valid_data)
    assert kv_bytes_per_token(c, TARGET) == 36 * 8 * 128 * 2 * 2
    c = cfg(valid_data, vllm_extra_args=["--dtype", "float32"])
    assert kv_bytes_per_token(c, TARGET) == 36 * 8 * 128 * 2 * 4  # --dtype wins over the checkpoint


def test_qwen_pair_fits_on_h200(valid_data):
    result = evaluate(cfg(valid_data), TARGET, DRAFT, H200, RAM)
    assert result.problems == []
    assert result.vocab["decision"] == "shared vocabulary"
    assert result.memory["kv_bytes_needed"] == (36 + 28) * 8 * 128 * 2 * 2 * 4 * 512
    assert result.memory["device"] == "gpu"


def test_vocab_mismatch_refused_with_both_sizes_and_two_ways_forward(valid_data):
    other = model("other/draft", vocab=32000, tokenizer=32000, layers=2, weights=GIB)
    result = evaluate(cfg(valid_data), TARGET, other, H200, RAM)
    (problem,) = result.problems
    assert "vocab_size 32000" in problem and "has 151936" in problem
    assert (
        "pick a draft that shares the target's tokenizer" in problem
        and "use_heterogeneous_vocab" in problem
    )
    assert result.vocab["decision"] == "refused: vocabularies differ"


def test_vocab_mismatch_accepted_when_recorded(valid_data):
    spec = {**valid_data["speculative_config"], "use_heterogeneous_vocab": True}
    other = model("other/draft", vocab=32000, tokenizer=32000, layers=2, weights=GIB)
    result = evaluate(cfg(valid_data, speculative_config=spec), TARGET, other, H200, RAM)
    assert result.problems == []
    assert result.vocab["decision"].startswith("heterogeneous vocabulary accepted")


def test_max_model_len_beyond_draft_positions(valid_data):
    short = model("Qwen/Qwen3-0.6B", layers=28, weights=GIB, max_pos=2048)
    result = evaluate(cfg(valid_data, max_model_len=4096), TARGET, short, H200, RAM)
    assert result.problems == [
        "max_model_len 4096 exceeds the draft Qwen/Qwen3-0.6B's max_position_embeddings "
        "2048; lower max_model_len (>= prompt_len + output_len) or choose another draft"
    ]


def test_utilisation_too_small_for_weights_and_kv(valid_data):
    result = evaluate(cfg(valid_data, gpu_memory_utilization=0.1), TARGET, DRAFT, H200, RAM)
    (problem,) = result.problems
    assert problem.startswith("gpu_memory_utilization 0.1 of ")
    assert "need" in problem and "for target + draft" in problem


def test_kv_budget_smaller_than_batching_limits(valid_data):
    data = {k: v for k, v in valid_data.items() if k != "gpu_memory_utilization"}
    result = evaluate(cfg(data, kv_cache_memory_bytes=64 << 20), TARGET, DRAFT, H200, RAM)
    (problem,) = result.problems
    assert problem.startswith(
        "kv_cache_memory_bytes 67108864 holds 256 tokens but max_num_seqs 4 x "
        "max_model_len 512 = 2048 tokens need"
    )


def test_cpu_host_checks_ram(valid_data):
    data = {k: v for k, v in valid_data.items() if k != "gpu_memory_utilization"}
    small_ram = {"total": 8 * GIB, "available": 4 * GIB}
    result = evaluate(cfg(data, kv_cache_memory_bytes=GIB), TARGET, DRAFT, [], small_ram)
    assert any("exceed the cpu memory available" in p for p in result.problems)
