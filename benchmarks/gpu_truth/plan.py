"""The H200 plan: server starts that test the preflight against vLLM and sample the payoff.

Every row is host data validated by `specdeploy.checks.host_data.check_config`; argv comes from
`specdeploy.render.argv.serve_args` / `specdeploy.host.bench.bench_args`. On the 2-GPU machine,
phase 1 runs two lanes at once (lane A on GPU 0 and CPUs 0-15, lane B on GPU 1 and CPUs 16-31);
phase 2 uses both GPUs. Rows run in the order listed, each lane skipping what its budget no longer
allows, so the list is in priority order. Rows with `bench` are payoff samples too: a fresh server
per sample, the first of each arm discarded (it compiles cold).

The plans of `python -m benchmarks.device prepare gpu_truth DIR` (`build`) and of `... prepare
gpu_truth_swing DIR` (`build_second`: the swing experiment and the TP=2 repeats of `swing_run.py`).
"""

from __future__ import annotations

import json

from benchmarks.gpu_payoff.plan import (
    CAPTURE_SIZES,
    workload,
    workload_data,
)
from benchmarks.gpu_payoff.plan import ENV as PAYOFF_ENV
from specdeploy.checks.host_data import check_config
from specdeploy.host.bench import bench_args
from specdeploy.render.argv import serve_args

HF_HOME = "/tmp/hf"
SHA = "0" * 39 + "1"  # make_weights.REVISION_SHA
T8, T32, D06 = "specdeploy/qwen3-8b-arch", "specdeploy/qwen3-32b-arch", "specdeploy/qwen3-0.6b-arch"
GIB = 1 << 30
CONCURRENCY = {1: 16, 8: 24}  # concurrency -> prompts
ENV = PAYOFF_ENV | {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def path(repo: str) -> str:
    return f"{HF_HOME}/hub/models--{repo.replace('/', '--')}/snapshots/{SHA}"


def spec(k: int, length: float) -> dict:
    return {
        "method": "draft_model",
        "model": path(D06),
        "num_speculative_tokens": k,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": length,
    }


def row(
    rid: str,
    *,
    lane: str,
    target: str = T8,
    k: int | None = 1,
    length: float = 2.0,
    tp: int = 1,
    eager: bool = True,
    util: float | None = None,
    kv_bytes: int | None = None,
    hog_gib: int = 0,
    arm: str | None = None,
    note: str = "",
    extra_args: tuple[str, ...] = (),
) -> dict:
    extra = ["--load-format", "dummy", *extra_args]
    extra += (
        ["--enforce-eager"]
        if eager
        else [
            "--compilation-config",
            json.dumps({"cudagraph_capture_sizes": CAPTURE_SIZES}),
        ]
    )
    if k is not None:
        extra.append("--async-scheduling")  # as the payoff map's headline arms
    if tp > 1:
        extra += ["--tensor-parallel-size", str(tp)]
    # a server per GPU, as on a shared host: the preflight reads the GPUs this selects
    gpus = {"A": "0", "B": "1", "S": "0"}.get(lane, "0,1")
    port = 8000 if lane in ("A", "P2", "S") else 8001
    data = workload_data(
        path(target), spec(k or 1, length), extra, ENV | {"CUDA_VISIBLE_DEVICES": gpus}, port
    )
    if util is not None:
        data["gpu_memory_utilization"] = util
    if kv_bytes is not None:
        data["kv_cache_memory_bytes"] = kv_bytes
    return {
        "id": rid,
        "lane": lane,
        "data": data,
        "target_repo": target,
        "draft_repo": D06 if k is not None else None,
        "speculative": k is not None,
        "tp": tp,
        "hog_gib": hog_gib,
        "arm": arm,
        "note": note,
    }


def rows() -> list[dict]:
    out = []
    # Lane A (GPU 0): the speculative payoff arm at TP 1, then eager boundary rows.
    for n in range(3):
        out.append(row(f"A_k1_{n}", lane="A", eager=False, util=0.85, arm="tp1_k1_L2.0"))
    out += [
        row("A_util020", lane="A", util=0.20, note="8B+0.6B: small KV cache, fits"),
        row("A_util0116", lane="A", util=0.116, note="8B+0.6B: 0.116 x GPU < weights"),
        row("A_kv1g", lane="A", kv_bytes=GIB, note="4096 tokens: < max_num_seqs x max_model_len"),
        row("A_kv128m", lane="A", kv_bytes=128 << 20, note="512 tokens < one 1024 sequence"),
        row("A_kv126g", lane="A", kv_bytes=126 * GIB, note="weights + 126 GiB > GPU: OOM"),
        row("A_k1_3", lane="A", eager=False, util=0.85, arm="tp1_k1_L2.0"),
    ]
    # Lane B (GPU 1): the baseline arm at TP 1, memory already in use, the larger target.
    for n in range(3):
        out.append(row(f"B_base_{n}", lane="B", k=None, eager=False, util=0.85, arm="tp1_base"))
    out += [
        row("B_hog20_util092", lane="B", util=0.92, hog_gib=20, note="20 GiB used by another"),
        row("B_hog20_util080", lane="B", util=0.80, hog_gib=20, note="fits beside 20 GiB"),
        row("B_hog20_kv4g", lane="B", kv_bytes=4 * GIB, hog_gib=20, note="default 0.92 check"),
        row("B_32b_util092", lane="B", target=T32, util=0.92, note="32B+0.6B on one H200"),
        row("B_32b_util044", lane="B", target=T32, util=0.44, note="32B weights > 0.44 x GPU"),
        row("B_base_3", lane="B", k=None, eager=False, util=0.85, arm="tp1_base"),
    ]
    # Phase 2 (both GPUs): tensor parallelism.
    out += [
        row("P2_32b_tp2_util030", lane="P2", target=T32, tp=2, util=0.30, note="fits only at TP 2"),
        row("P2_tp4", lane="P2", tp=4, util=0.85, note="4 GPUs wanted, 2 present"),
        row("P2_base_tp2", lane="P2", k=None, tp=2, eager=False, util=0.85, arm="tp2_base"),
        row("P2_k1_tp2", lane="P2", tp=2, eager=False, util=0.85, arm="tp2_k1_L2.0"),
        row(
            "P2_k2_tp2", lane="P2", k=2, length=2.5, tp=2, eager=False, util=0.85, arm="tp2_k2_L2.5"
        ),
        row("P2_32b_tp2_util022", lane="P2", target=T32, tp=2, util=0.22, note="TP 2 too small"),
    ]
    return out


PROFILER = {
    "profiler": "torch",
    "torch_profiler_dir": "/tmp/gt_prof",
    "torch_profiler_with_stack": False,
    "torch_profiler_dump_cuda_time_total": False,
    "ignore_frontend": True,
    "max_iterations": 150,
}
REPEATS = 4  # per arm: the first start is discarded, 3 kept


def second_rows() -> list[dict]:
    """The second H200 x2 session: the swing experiment (one TP=1 k=1 server, `swing_run.py`),
    then base and k=1 L=2.0 at TP=2 on fresh servers, interleaved, REPEATS starts each."""
    out = [
        row(
            "S_k1_tp1",
            lane="S",
            eager=False,
            util=0.85,
            note="swing experiment",
            extra_args=("--profiler-config", json.dumps(PROFILER)),
        )
    ]
    for n in range(REPEATS):
        out.append(
            row(f"R2_base_{n}", lane="P2", k=None, tp=2, eager=False, util=0.85, arm="tp2_base")
        )
        out.append(row(f"R2_k1_{n}", lane="P2", tp=2, eager=False, util=0.85, arm="tp2_k1_L2.0"))
    for r in out:
        if r["arm"]:
            r["load"] = {str(c): n for c, n in CONCURRENCY.items()}  # for client.py
    return out


def build(second: bool = False) -> list[dict]:
    plan = []
    for r in second_rows() if second else rows():
        cfg = check_config(r["id"], r["data"])  # raises ConfigError with every problem
        r["serve"] = serve_args(cfg, speculative=r["speculative"], prefix_caching=False)
        r["env"] = cfg.vllm_env
        r["port"] = cfg.vllm_port
        if r["arm"] and not second:
            r["bench"] = {
                str(conc): bench_args(
                    cfg,
                    base_url=f"http://127.0.0.1:{cfg.vllm_port}",
                    tokenizer=cfg.target_model,
                    result_dir="/tmp/gt_results",
                    result_filename=f"{r['id']}_c{conc}.json",
                    workload=workload(conc, n),
                    label=r["id"],
                )
                for conc, n in CONCURRENCY.items()
            }
        plan.append(r)
    return plan


def build_second() -> list[dict]:
    return build(second=True)
