"""Render the H200 load proof's plan (issue 39) with the product's own code: for each arm (the
baseline, fixed k = 1, and k = 3 with the issue's per-batch-size schedule) the host
data passes `specdeploy check` (checks/host_data.check_config, whose warnings are kept), the server
is the measurement unit a compare would start (render/units.render_unit: its argv, after `vllm
serve`, via steps/proof.serve_words, and its Environment=), and each load level's benchmark is
host/bench.bench_args at workload.at_level(level), labelled `<arm>@c<concurrency>` as
measure/load_flow labels its runs, so decide/load_rule reads the results unchanged.

The three servers of a round share the GPU (gpu_memory_utilization 0.23 each, one port each) so
that every round is one set of fresh starts; device_run.py benchmarks one server at a time. The
fixed k = 3 arm of the first recording (h200-0.26.0) is dropped: three starts a round is what let
five rounds fit the device time (README.md), and the proof's fixed arm is k = 1.

The plan of `python -m benchmarks.device prepare gpu_load DIR` (benchmarks/device).
"""

from __future__ import annotations

import json

from specdeploy.checks.host_data import check_config, check_warnings
from specdeploy.decide.load_rule import SCHEDULE_KEY, level_label
from specdeploy.host.bench import bench_args
from specdeploy.render.units import render_unit, service_environment
from specdeploy.steps.proof import serve_words

MODELS = "/tmp/models"  # benchmarks/gpu_payoff/make_models.py: config.json + a small tokenizer
RESULTS = "/tmp/results"
SCHEDULE = [[1, 4, 3], [5, 24, 1], [25, 64, 0]]  # the (shared/gpu/load-sweep-2026-12-04)
LEVELS = [  # concurrency 1, 16, 64; 8, 48 and 128 requests (the earlier sweep's)
    {"concurrency": 1, "num_prompts": 8},
    {"concurrency": 16, "num_prompts": 48},
    {"concurrency": 64, "num_prompts": 128},
]
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def speculative(k: int, length: float, schedule: list | None = None) -> dict:
    """draft_model with vLLM's synthetic acceptance (dummy weights accept nothing real)."""
    out = {
        "method": "draft_model",
        "model": f"{MODELS}/draft",
        "num_speculative_tokens": k,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": length,
    }
    return out | ({SCHEDULE_KEY: schedule} if schedule else {})


# arm -> (speculative_config, role): the acceptance lengths of the earlier sweep; async scheduling
# on every speculative arm (vLLM 0.26 turns it off for draft_model unless asked)
ARMS = {
    "baseline": (speculative(1, 1.8), "baseline"),
    "k1": (speculative(1, 1.8), "speculative"),
    "schedule": (speculative(3, 2.5, SCHEDULE), "speculative"),
}


def host_data(spec: dict, port: int) -> dict:
    return {
        "vllm_version": "0.26.0",
        "target_model": f"{MODELS}/target",
        "served_model_name": "m",
        "speculative_config": spec,
        "max_model_len": 1024,
        "max_num_seqs": 64,
        "gpu_memory_utilization": 0.23,
        "enable_prefix_caching": False,
        "vllm_port": port,
        "vllm_extra_args": [
            "--load-format",
            "dummy",
            "--async-scheduling",
            "--compilation-config",
            json.dumps({"cudagraph_capture_sizes": CAPTURE_SIZES}),
        ],
        # no VLLM_ENABLE_STARTUP_PLAN (the first recording's): every start profiles its own
        # memory, in a window device_run.py keeps clear of the other servers' allocations; in
        # that recording the k = 1 and k = 3 servers never applied a saved plan anyway
        "vllm_env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "TOKENIZERS_PARALLELISM": "false"},
        "workload": {
            "prompt_len": 256,
            "output_len": 128,
            "request_rate": 1000.0,
            "max_concurrency": 64,
            "num_prompts": 8,
            "dataset": "random",
            "seed": 0,
            "load_levels": LEVELS,
        },
    }


def build() -> dict:
    plan = {}
    for i, (arm, (spec, role)) in enumerate(ARMS.items()):
        data = host_data(spec, 8000 + i)
        cfg = check_config(arm, data)  # raises ConfigError with every problem
        warnings = [str(w) for w in check_warnings(arm, data)]
        unit = render_unit(cfg, role, prefix_caching=False, measurement_arm=arm)
        base_url = f"http://127.0.0.1:{cfg.vllm_port}"
        bench = {}
        for level in cfg.workload.effective_load_levels:
            label = level_label(arm, level.concurrency)
            bench[str(level.concurrency)] = bench_args(
                cfg,
                base_url=base_url,
                tokenizer=cfg.target_model,
                result_dir=RESULTS,
                result_filename=f"{label}.json",
                workload=cfg.workload.at_level(level),
                label=label,
            )
        plan[arm] = {
            "serve": serve_words(cfg, unit.argv),
            "unit_argv": unit.argv,
            "env": service_environment(cfg),
            "port": cfg.vllm_port,
            "served_name": cfg.effective_served_name,
            "speculative_config": cfg.speculative_config if role == "speculative" else None,
            "check_warnings": warnings,
            "bench": bench,
        }
    return plan
