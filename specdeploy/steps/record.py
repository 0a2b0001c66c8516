"""Step 7: the deployment record on the host: every decision, and what the smoke benchmark saw."""

from __future__ import annotations

import json
import time
from io import StringIO

from pyinfra import host

from .. import datasets
from ..bench import summarize
from ..config import ServeConfig
from ..render import RenderedUnit


def record_path(cfg: ServeConfig) -> str:
    return f"{cfg.state_dir}/records/deployment.json"


def build_record(
    cfg: ServeConfig,
    unit: RenderedUnit,
    *,
    vllm_version: str,
    snapshots: dict,
    preflight,
    health: dict | None,
    smoke: dict | None,
    started: float,
    role: str = "speculative",
    gate: dict | None = None,
    timings: dict | None = None,
) -> dict:
    w = cfg.workload
    return {
        "schema": 1,
        "host": host.name,
        "role": role,
        "target": {
            "model": cfg.target_model,
            "revision": cfg.target_revision,
            "resolved_sha": (snapshots.get("target") or {}).get("sha"),
        },
        "draft": {
            "model": cfg.draft_model,
            "revision": cfg.draft_revision,
            "resolved_sha": (snapshots.get("draft") or {}).get("sha"),
        },
        "speculative_config": cfg.speculative_config,
        "vocab": preflight.vocab,
        "memory": preflight.memory,
        "workload": {
            "prompt_len": w.prompt_len,
            "output_len": w.output_len,
            "dataset": w.dataset,
            "dataset_path": w.dataset_path,
            "num_prompts": w.num_prompts,
            "seed": w.seed,
            "request_rate": w.request_rate,
            "max_concurrency": w.max_concurrency,
            "request_set": datasets.describe(w.dataset_path, w.dataset),  # sha256, rows
        },
        "limits": {
            "max_model_len": cfg.effective_max_model_len,
            "max_num_seqs": cfg.effective_max_num_seqs,
            "max_num_batched_tokens": cfg.effective_max_num_batched_tokens,
            "memory": dict([cfg.memory_mechanism]),
        },
        "vllm": {"package": cfg.vllm_package, "version": vllm_version},
        "unit": {"name": unit.name, "sha256": unit.sha256, "argv": unit.argv},
        "health": health,
        "smoke": summarize(smoke) if smoke else None,
        "smoke_counters": (smoke or {}).get("specdeploy", {}).get("server_counters"),
        "gate": gate,
        "timings": timings,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.time() - started, 1),
    }


def write_record(cfg: ServeConfig, record: dict) -> None:
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    path = record_path(cfg)
    host.put_file(StringIO(text), f"{path}.tmp")
    host.run_shell_command(command=f"mv -f {path}.tmp {path} && chmod 644 {path}")
