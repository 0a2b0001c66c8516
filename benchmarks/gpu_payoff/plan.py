"""Build the device plan: every arm's `vllm serve` and `vllm bench serve` argv, from specdeploy's
code.

Each arm is one ServeConfig validated by `specdeploy.checks.host_data.check_config`; argv comes only
from `specdeploy.render.argv.serve_args` and `specdeploy.host.bench.bench_args`. Extra (unmanaged)
server flags go in `vllm_extra_args`, environment in `vllm_env`. Output: JSON consumed by
device_run.py on the H200.

The plan of `python -m benchmarks.device prepare gpu_payoff DIR` (benchmarks/device).
"""

from __future__ import annotations

import json

from specdeploy.checks.host_data import check_config
from specdeploy.config.schema import Workload
from specdeploy.host.bench import bench_args
from specdeploy.render.argv import serve_args

MODELS = "/tmp/models"  # device_run.py copies the architecture-only model folders here
RESULTS = "/tmp/results"
PORT = 8000
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 48]  # after vLLM rounds them to multiples of k+1, k<=5 at
# 8 concurrent requests still has a FULL decode graph: (k+1)*8 <= 48
PROMPT_LEN, OUTPUT_LEN = 256, 128
CONCURRENCY = {1: 8, 8: 24}  # concurrency -> number of prompts (8 requests at c=1, 3 waves at c=8)
ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
COMMON_EXTRA = [
    "--load-format",
    "dummy",
    "--compilation-config",
    json.dumps({"cudagraph_capture_sizes": CAPTURE_SIZES}),
]


def spec(k: int, length: float, **more) -> dict:
    return {
        "method": "draft_model",
        "model": f"{MODELS}/draft",
        "num_speculative_tokens": k,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": length,
        **more,
    }


def workload(conc: int, prompts: int) -> Workload:
    """The benchmark request set at one concurrency: random prompts, every request sent at once."""
    return Workload(
        prompt_len=PROMPT_LEN,
        output_len=OUTPUT_LEN,
        request_rate=1000.0,
        max_concurrency=conc,
        num_prompts=prompts,
        dataset="random",
        seed=0,
    )


def workload_data(
    target_model: str, speculative_config: dict, extra_args: list[str], env: dict, port: int
) -> dict:
    """Host data (a ServeConfig before `check_config`) shared by the H200 plans of gpu_payoff and
    gpu_truth: 1024-token context, 8 sequences, no prefix caching, the plan's workload."""
    return {
        "vllm_version": "0.26.0",
        "target_model": target_model,
        "served_model_name": "m",
        "speculative_config": speculative_config,
        "max_model_len": 1024,
        "max_num_seqs": 8,
        "enable_prefix_caching": False,
        "workload": {
            "prompt_len": PROMPT_LEN,
            "output_len": OUTPUT_LEN,
            "request_rate": 1000.0,
            "max_concurrency": 8,
            "num_prompts": 24,
            "dataset": "random",
            "seed": 0,
        },
        "vllm_extra_args": extra_args,
        "vllm_env": env,
        "vllm_port": port,
    }


def host_data(
    *,
    target: str = "target",
    speculative_config: dict,
    extra: list[str] = (),
    env: dict | None = None,
) -> dict:
    data = workload_data(
        f"{MODELS}/{target}",
        speculative_config,
        COMMON_EXTRA + list(extra),
        ENV | (env or {}),
        PORT,
    )
    return data | {"gpu_memory_utilization": 0.85}


def arms() -> dict[str, dict]:
    """name -> {data, speculative, meta}. Names say k, L and the scheduling mode."""
    out: dict[str, dict] = {}
    # Baselines: the real one (vLLM's defaults pick model runner V2 + async scheduling for a dense
    # Qwen3 without speculation), the V1 runner that draft_model is forced onto, and the draft
    # alone.
    unused = spec(1, 1.5)  # the baseline server never receives --speculative-config
    out["base"] = {
        "data": host_data(speculative_config=unused),
        "speculative": False,
        "meta": {"kind": "baseline"},
    }
    out["base_v1"] = {
        "data": host_data(speculative_config=unused, env={"VLLM_USE_V2_MODEL_RUNNER": "0"}),
        "speculative": False,
        "meta": {"kind": "baseline", "runner": "v1"},
    }
    out["draft_alone"] = {
        "data": host_data(
            target="draft",
            speculative_config={
                "method": "ngram",
                "num_speculative_tokens": 1,
                "prompt_lookup_max": 2,
            },
        ),
        "speculative": False,
        "meta": {"kind": "draft_alone"},
    }
    grid = {1: [1.5, 2.0], 2: [1.5, 2.5, 3.0], 3: [1.5, 2.5, 3.5], 5: [1.5, 2.5, 3.5]}
    for k, lengths in grid.items():
        for length in lengths:
            # vLLM 0.26 turns async scheduling off for draft_model unless asked (config/vllm.py), so
            # "sync" is what a default deployment gets; "--async-scheduling" is accepted for it.
            out[f"k{k}_L{length}_sync"] = {
                "data": host_data(speculative_config=spec(k, length)),
                "speculative": True,
                "meta": {"kind": "spec", "k": k, "L": length, "sched": "sync"},
            }
            out[f"k{k}_L{length}"] = {
                "data": host_data(speculative_config=spec(k, length), extra=["--async-scheduling"]),
                "speculative": True,
                "meta": {"kind": "spec", "k": k, "L": length, "sched": "async"},
            }
    out["k2_L2.5_drafteager"] = {
        "data": host_data(
            speculative_config=spec(2, 2.5, enforce_eager=True), extra=["--async-scheduling"]
        ),
        "speculative": True,
        "meta": {"kind": "spec", "k": 2, "L": 2.5, "sched": "async", "draft_eager": True},
    }
    return out


def build() -> dict:
    plan = {}
    for name, arm in arms().items():
        cfg = check_config(name, arm["data"])  # raises ConfigError with every problem
        tokenizer = cfg.target_model
        benches = {}
        for conc, n in CONCURRENCY.items():
            w = workload(conc, n)
            benches[str(conc)] = bench_args(
                cfg,
                base_url=f"http://127.0.0.1:{PORT}",
                tokenizer=tokenizer,
                result_dir=RESULTS,
                result_filename=f"{name}_c{conc}.json",
                workload=w,
                label=name,
            )
        plan[name] = {
            "serve": serve_args(cfg, speculative=arm["speculative"], prefix_caching=False),
            "env": cfg.vllm_env,
            "bench": benches,
            "served_name": cfg.effective_served_name,
            "port": cfg.vllm_port,
            "meta": arm["meta"],
            "speculative_config": cfg.speculative_config if arm["speculative"] else None,
        }
    return plan
