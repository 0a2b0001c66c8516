"""Render what a deploy would hand the host's vLLM on the H200 (vLLM 0.26.0): the product's own
argv (render/units.render_unit, so steps/proof.serve_words of it), the unit's environment
(steps/proof.unit_environment) and the proof command (steps/proof.proof_command) — for one config
the release accepts and one it refuses. The device then runs that command with that stdin, as
steps/proof.prove does through pyinfra (device_run.py).

Both configs pass `specdeploy check` (checks/host_data.check_config): the release table for 0.26.0
allows every key. The bad one asks for a synthetic acceptance length vLLM 0.26.0 refuses for its k
(SpeculativeConfig: "synthetic_acceptance_length must be in [1, k + 1]"), a rule no table holds.

The plan of `python -m benchmarks.device prepare host_proof DIR`: the requests (`good`, `bad`),
the proof `command` and what was `rendered` (argv, environment and the check's verdict of both).
"""

from __future__ import annotations

from specdeploy.checks.host_data import check_config
from specdeploy.render.units import render_unit
from specdeploy.steps.proof import proof_command, serve_words, unit_environment

# The architectures the device's HF cache holds (benchmarks/gpu_truth/make_weights.py writes them
# as specdeploy's weights step leaves them: refs/main, a complete snapshot, real-shape shards).
HOST_DATA = {
    "vllm_package": "vllm",
    "vllm_version": "0.26.0",
    "target_model": "specdeploy/qwen3-8b-arch",
    "target_revision": "main",
    "draft_revision": "main",
    "gpu_memory_utilization": 0.9,
    "vllm_api_key": "recorded-not-a-secret",  # reaches the proof on stdin, never argv
    "workload": {
        "prompt_len": 512,
        "output_len": 256,
        "request_rate": 4.0,
        "max_concurrency": 16,
        "num_prompts": 64,
    },
}
SPECULATIVE = {
    "method": "draft_model",
    "model": "specdeploy/qwen3-0.6b-arch",
    "rejection_sample_method": "synthetic",
    "synthetic_acceptance_length": 2.5,
}
CONFIGS = {
    "good": {**SPECULATIVE, "num_speculative_tokens": 3},  # L 2.5 <= k + 1 = 4
    "bad": {**SPECULATIVE, "num_speculative_tokens": 1},  # L 2.5 > k + 1 = 2
}


def build() -> dict:
    plan: dict = {"rendered": {}}
    for name, speculative in CONFIGS.items():
        cfg = check_config("h200", {**HOST_DATA, "speculative_config": speculative})
        unit = render_unit(cfg, "speculative")
        request = {
            "argv": serve_words(cfg, unit.argv),
            "env": unit_environment(cfg),
            "engine_config": True,
        }
        plan[name] = request
        plan["rendered"][name] = {"check": "passed", "unit": unit.name, "argv": unit.argv}
        plan["command"] = proof_command(cfg)
    return plan
