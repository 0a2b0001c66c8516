"""Build benchmarks/gpu_snapshot_path's device plan from specdeploy's own code: the host data of a
GPU host whose target and draft are pinned to commits, its rendered `specdeploy-vllm.service`
(argv and Environment=), and the same argv in the form before b05bf20 (the draft named by repo id).

The host is shaped like a production GPU host (vllm 0.26.0, the default install_dir and state_dir,
so hf_home is /var/lib/specdeploy/hf); its models are small Qwen3-architecture checkpoints that
`make_cache.py` writes on the device with random weights into that HF cache, at the commit shas
named here (40 hex, as the Hub's). Only the flags a one-H200 test machine needs are in
vllm_extra_args (--enforce-eager: no compile, so two starts fit the device budget) and vllm_env
(no FlashInfer in the carried tree; NVLink multicast off, as the device's KINDS.md asks).

The plan of `python -m benchmarks.device prepare gpu_snapshot_path DIR` (benchmarks/device).
"""

from __future__ import annotations

import hashlib

from benchmarks.gpu_payoff.make_models import COMMON
from benchmarks.gpu_payoff.make_models import DRAFT as QWEN3_0_6B
from specdeploy.checks.host_data import check_config
from specdeploy.host.facts.cuda_boot import CudaBootInfo
from specdeploy.render.argv import serve_args, speculative_json, unit_exec_argv
from specdeploy.render.units import render_unit, service_environment

TARGET = "specdeploy-gpu/qwen3-1.7b-arch-random"
DRAFT = "specdeploy-gpu/qwen3-0.6b-arch-random"
# Values from Qwen/Qwen3-1.7B and Qwen/Qwen3-0.6B config.json (same vocabulary, 151936).
CONFIGS = {
    TARGET: COMMON
    | {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
    },
    DRAFT: QWEN3_0_6B,  # gpu_payoff's draft: Qwen/Qwen3-0.6B's shape
}


def sha(repo: str) -> str:
    """A commit sha for each generated repo (40 hex, stable)."""
    return hashlib.sha1(f"specdeploy gpu_snapshot_path {repo}".encode()).hexdigest()


HOST_DATA = {
    "vllm_package": "vllm",
    "vllm_version": "0.26.0",
    "target_model": TARGET,
    "target_revision": sha(TARGET),
    "served_model_name": "qwen3-1.7b-arch",
    "speculative_config": {
        "method": "draft_model",
        "model": DRAFT,
        "revision": sha(DRAFT),
        "num_speculative_tokens": 3,
    },
    "workload": {
        "prompt_len": 256,
        "output_len": 128,
        "request_rate": 4.0,
        "max_concurrency": 4,
        "num_prompts": 16,
        "dataset": "random",
    },
    "max_model_len": 1024,
    "max_num_seqs": 8,
    "gpu_memory_utilization": 0.5,
    "vllm_port": 8000,
    "vllm_extra_args": ["--enforce-eager"],
    "vllm_env": {
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    },
}


def build() -> dict:
    cfg = check_config("gpu-snapshot-path", HOST_DATA)
    unit = render_unit(cfg, "speculative", cuda_boot=CudaBootInfo())
    argv = unit.argv
    assert unit_exec_argv(unit.text) == argv, "ExecStart= does not read back as the argv"
    assert argv[len(cfg.vllm_cli) + 1 :] == serve_args(cfg)
    # Before b05bf20, serve_args wrote the host data's speculative_config unchanged.
    i = argv.index("--speculative-config") + 1
    old = argv[:i] + [speculative_json(cfg.speculative_config)] + argv[i + 1 :]
    return {
        "host_data": HOST_DATA,
        "hf_home": cfg.hf_home,
        "server_home": cfg.server_home,
        "vllm_cli": cfg.vllm_cli,
        "unit_name": unit.name,
        "unit_text": unit.text,
        "env": service_environment(cfg),
        "port": cfg.vllm_port,
        "served_model_name": cfg.effective_served_name,
        "models": {
            repo: {"sha": sha(repo), "config": CONFIGS[repo], "role": role}
            for repo, role in ((TARGET, "target"), (DRAFT, "draft"))
        },
        "forms": {"snapshot_path": argv, "repo_id": old},
    }
