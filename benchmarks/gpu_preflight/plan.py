"""Build what benchmarks/gpu_preflight's device run needs, from specdeploy's own code: the host data
of the running server and of the re-deploys the preflight is asked about, the server's rendered
`vllm serve` argv, this service's unit names and the `Accelerators` fact's command for them.

The running server is the one recorded on 2026-12-01 (tests/facts/Accelerators/2026-12-01/
server_argv.txt): Qwen3-8B + Qwen3-0.6B architecture, dummy weights, k=1, synthetic acceptance
length 2.0, gpu_memory_utilization 0.55, eager, async scheduling (`benchmarks.gpu_truth.plan.row`).

The plan of `python -m benchmarks.device prepare gpu_preflight DIR` (and of bench_early).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_truth.plan import D06, HF_HOME, T8, row
from specdeploy.checks.host_data import check_config
from specdeploy.host.facts.nvidia import ACCELERATOR_COMMAND, accelerator_command
from specdeploy.host.facts.vllm import ModelSnapshot
from specdeploy.render.argv import serve_args

# name -> host data; "redeploy" is the running server's own data
CONFIGS = {
    "redeploy": row("redeploy", lane="S", util=0.55)["data"],
    "k2": row("k2", lane="S", k=2, length=2.5, util=0.55)["data"],
    "util060": row("util060", lane="S", util=0.60)["data"],
    "util092": row("util092", lane="S", util=0.92)["data"],
}
# what the ModelSnapshot fact read from the checkpoints on the H200: its fixtures, by repo
SNAPSHOTS = Path(__file__).parents[2] / "tests" / "facts" / "ModelSnapshot"
MODELS = {
    fact["repo"]: fact
    for fact in (json.loads(p.read_text())["fact"] for p in SNAPSHOTS.glob("*.json"))
    if fact
}
HOG_GIB = 40  # the other process beside the running server (60 GiB: the unit tests)


def plan_for(running, configs: dict) -> dict:
    """The device run's plan for the server of config `running` (its rendered argv, environment,
    port and unit names, the fact's command for those units), and the host data `configs` the
    preflight is asked about beside it."""
    units = running.service_units
    return {
        "configs": configs,
        "serve": serve_args(running, speculative=True, prefix_caching=False),
        "env": running.vllm_env,
        "port": running.vllm_port,
        "served_model_name": "m",
        "unit": running.unit_names["speculative"],
        "units": units,
        "command": accelerator_command(units),
        "base_command": ACCELERATOR_COMMAND,
        "model_facts_commands": {
            role: ModelSnapshot().command(hf_home=HF_HOME, repo=repo, revision="main")
            for role, repo in (("target", T8), ("draft", D06))
        },
        "hog_gib": HOG_GIB,
        # what the ModelSnapshot fact read from the same checkpoints on 2026-12-01: used only if
        # the fact's own command fails on the device
        "model_facts_recorded": {
            role: MODELS[repo] for role, repo in (("target", T8), ("draft", D06))
        },
    }


def build() -> dict:
    return plan_for(check_config("redeploy", CONFIGS["redeploy"]), CONFIGS)
